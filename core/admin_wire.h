// The control socket's requests and replies (POOL/control.sock): what a
// management command asks, what it answers, and the wire format both travel
// in. The engine's side (RunAdmin) is in core/admin.h; this header needs no
// engine, so the CLI's front binary (tools/front.cc), which starts without
// the engine linked in, talks to a mount daemon with it alone.
//
// Thread safety: the codec is pure.

#ifndef THINFS_CORE_ADMIN_WIRE_H_
#define THINFS_CORE_ADMIN_WIRE_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace thinfs {

// Exit codes, as the CLI's (tools/cli.h).
inline constexpr int kAdminOk = 0;
inline constexpr int kAdminUsage = 1;    // bad or missing argument, bad name or size
inline constexpr int kAdminFailure = 2;  // the operation failed (no such device, exists, ...)

// A command and its arguments. Commands and their argument keys:
//   create      name, size              size: ParseSize syntax ("10G")
//   snapshot    source, name
//   delete      name
//   resize      name, size
//   rename      from, to
//   list
//   status
//   grow        size                    grows the data area to size (ParseSize);
//                                       refuses to shrink
//   mountpoint                          (daemon only) where the pool is mounted
// Every command takes json=0|1 (default 0): the reply's `json` is filled in
// either case; `text` only without it.
struct AdminRequest {
  std::string command;
  std::vector<std::pair<std::string, std::string>> args;

  // The value of `key`, or nullptr.
  const std::string* Find(std::string_view key) const;
};

struct AdminReply {
  int exit_code = kAdminOk;
  std::string text;   // for stdout ("" when the request asked for JSON)
  std::string json;   // one JSON document ("" on failure)
  std::string error;  // one line, no newline, for stderr ("" on success)

  static AdminReply Error(int exit_code, std::string message);
};

// --- Wire format of the control socket ------------------------------------
//
// One connection carries one request and then one reply, each a frame:
//
//   frame = length (uint32, little-endian) followed by `length` body bytes
//   body  = line*, every line "key=value\n"
//   key   = 1 to 32 characters of [a-z0-9_.-]
//   value = bytes, each byte outside 0x21-0x7e and each '%' written as %XX
//           (two upper-case hex digits); no other byte may be escaped, so
//           every value has exactly one encoding
//
// A request body is "thinfs-admin=1", "command=NAME", then one line per
// argument (keys unique, at most kAdminMaxArgs). A reply body is exactly
// "thinfs-admin=1", "exit=N" (0-255, no leading zero), "text=...",
// "json=...", "error=...", in that order. A request frame holds at most
// kAdminMaxRequestFrame bytes, header included; a reply frame at most
// kAdminMaxReplyFrame. The decoders accept nothing else: a wrong length,
// version, key, order, escape or line ending is kInvalidArgument.

inline constexpr size_t kAdminFrameHeader = 4;
inline constexpr size_t kAdminMaxRequestFrame = 64 * 1024;
inline constexpr size_t kAdminMaxReplyFrame = 16 * 1024 * 1024;
inline constexpr size_t kAdminMaxArgs = 64;

// Returns the frame, or kInvalidArgument for a bad command or key, too many
// arguments or a frame above kAdminMaxRequestFrame.
Result<std::string> EncodeAdminRequest(const AdminRequest& request);
Result<AdminRequest> DecodeAdminRequest(std::string_view frame);
// A reply too large for a frame is replaced by an error reply saying so.
std::string EncodeAdminReply(const AdminReply& reply);
Result<AdminReply> DecodeAdminReply(std::string_view frame);
// The body length announced by the first kAdminFrameHeader bytes of a frame.
// kInvalidArgument when `header` is not 4 bytes or the frame would exceed
// `max_frame`.
Result<size_t> DecodeAdminFrameHeader(std::string_view header, size_t max_frame);

}  // namespace thinfs

#endif  // THINFS_CORE_ADMIN_WIRE_H_
