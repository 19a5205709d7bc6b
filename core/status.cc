#include "core/status.h"

#include <cerrno>
#include <cstring>

namespace thinfs {

Status Status::FromErrno(int err, const std::string& context) {
  char buf[128];
  // GNU strerror_r returns the message pointer (maybe not buf).
  const char* text = strerror_r(err, buf, sizeof buf);
  std::string msg = context + ": " + text;
  Code code = Code::kIOError;
  switch (err) {
    case ENOSPC:
      code = Code::kNoSpace;
      break;
    case EROFS:
      code = Code::kReadOnly;
      break;
    case ENOENT:
      code = Code::kNotFound;
      break;
    case EEXIST:
      code = Code::kExists;
      break;
    case EACCES:
    case EPERM:
      code = Code::kPermissionDenied;
      break;
    case EWOULDBLOCK:
      code = Code::kBusy;
      break;
    case EINVAL:
      code = Code::kInvalidArgument;
      break;
    case ENAMETOOLONG:
      code = Code::kNameTooLong;
      break;
    case ENOTSUP:
      code = Code::kNotSupported;
      break;
    default:
      break;
  }
  return Status(code, std::move(msg), err);
}

const char* Status::CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "OK";
    case Code::kNotFound:
      return "Not found";
    case Code::kExists:
      return "Already exists";
    case Code::kNoSpace:
      return "No space";
    case Code::kReadOnly:
      return "Read-only";
    case Code::kInvalidArgument:
      return "Invalid argument";
    case Code::kNameTooLong:
      return "Name too long";
    case Code::kIOError:
      return "I/O error";
    case Code::kCorruption:
      return "Corruption";
    case Code::kBusy:
      return "Busy";
    case Code::kNotSupported:
      return "Not supported";
    case Code::kPermissionDenied:
      return "Permission denied";
    case Code::kNotEmpty:
      return "Not empty";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  const std::string name = CodeName(code_);
  if (msg_.empty()) return name;
  // FromErrno's message ends with strerror's text, which for EACCES and
  // EINVAL is the code's name: say it once.
  if (msg_.ends_with(": " + name)) return msg_;
  return name + ": " + msg_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  Status s = *this;
  s.msg_ = context + ": " + msg_;
  return s;
}

}  // namespace thinfs
