#include "core/device_name.h"

namespace thinfs {

Status ValidateDeviceName(const std::string& name) {
  if (name.empty()) return Status::InvalidArgument("device name is empty");
  if (name.size() > 128) {
    return Status::NameTooLong("device name is longer than 128 characters");
  }
  if (name[0] == '.') return Status::InvalidArgument("device name must not start with '.'");
  for (char c : name) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '+' || c == '-';
    if (!ok) {
      return Status::InvalidArgument("device name '" + name +
                                     "' has a character outside [A-Za-z0-9._+-]");
    }
  }
  return Status::Ok();
}

}  // namespace thinfs
