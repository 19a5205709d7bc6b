// libFuzzer target for the control socket's decoders (core/admin.h): any
// input must be rejected or decode to a message that re-encodes to exactly
// the same bytes.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/admin.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view frame(reinterpret_cast<const char*>(data), size);
  thinfs::Result<thinfs::AdminRequest> request = thinfs::DecodeAdminRequest(frame);
  if (request.ok()) {
    thinfs::Result<std::string> again = thinfs::EncodeAdminRequest(*request);
    if (!again.ok() || *again != frame) std::abort();
  }
  thinfs::Result<thinfs::AdminReply> reply = thinfs::DecodeAdminReply(frame);
  if (reply.ok() && thinfs::EncodeAdminReply(*reply) != frame) std::abort();
  return 0;
}
