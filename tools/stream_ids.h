// Stream identities of devices (docs/send-stream.md): what lets `thinfs
// receive` recognise the base of an incremental stream across pools, as a
// ZFS snapshot guid does.
//
// A device's identity is a 128-bit guid for its current content:
//   - a device received by `thinfs receive` keeps the guid of the stream it
//     came from, recorded in POOL/stream-guids, as long as its content is
//     unchanged (same mtime and size as recorded right after the receive);
//   - any other device (or a received one written since) has the derived
//     guid XXH3-128(pool uuid, device id, creation time, mtime, size), which
//     changes with every write, resize or discard.
// So the guid names one state of the data: a base that was modified on
// either side no longer matches, and an incremental stream is refused.
//
// POOL/stream-guids is a text file, replaced atomically (write, fsync,
// rename, fsync of the directory):
//   thinfs-stream-guids 1
//   <device id> <guid, 32 hex digits> <mtime_ns> <size>
// Entries of devices that no longer exist are dropped on the next write.
//
// Thread safety: an object is used by one thread. Record() serialises with
// every other Record() on the same pool, in any process (flock of
// POOL/stream-guids.lock), and merges what they recorded since Load():
// receives into a mounted pool can run at once.

#ifndef THINFS_TOOLS_STREAM_IDS_H_
#define THINFS_TOOLS_STREAM_IDS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/metadata.h"
#include "core/send_stream.h"
#include "core/status.h"

namespace thinfs::tools {

struct ReceivedGuid {
  StreamGuid guid;
  int64_t mtime_ns = 0;
  uint64_t size = 0;
};

class StreamGuids {
 public:
  // Reads POOL/stream-guids (absent: no entries). kCorruption for a
  // malformed file, naming the line.
  static Result<StreamGuids> Load(const std::string& pool_root);

  // The identity of `device` in the pool with `pool_uuid`.
  StreamGuid IdentityOf(const uint8_t (&pool_uuid)[16], const DeviceRecord& device) const;
  // The live device whose identity is `guid`, or nullptr. `modified` is set
  // when a device received with that guid exists but changed since.
  const DeviceRecord* FindByGuid(const StreamGuid& guid, const std::vector<DeviceRecord>& devices,
                                 const std::string** modified) const;

  // Records `guid` for device `id` with its state after the receive, on
  // top of the entries the file holds now (re-read under the lock), drops
  // entries of devices no longer in `devices` (those with a larger id than
  // any in it are kept: devices created since), and writes the file
  // atomically.
  Status Record(uint64_t id, const ReceivedGuid& entry, const std::vector<DeviceRecord>& devices);

 private:
  std::string path_;
  std::map<uint64_t, ReceivedGuid> entries_;
};

}  // namespace thinfs::tools

#endif  // THINFS_TOOLS_STREAM_IDS_H_
