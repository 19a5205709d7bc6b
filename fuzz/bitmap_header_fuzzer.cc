// libFuzzer target for the bitmap file's header and body validation
// (meta::BitmapSpaceMap::Open, layout in meta/format.h), past the
// checksums: the harness writes the input as a bitmap file and recomputes
// the header checksum (and, when asked, the body checksum) itself from the
// layout, so that what gets fuzzed is the validation of the fields.
//
// Input: one control byte, then up to 64 bytes of header fields
// (BitmapHeaderDisk, zero-padded), then the body. Control bits: 0 = fix
// the body checksum, 1 = put a nonzero byte in the reserved part of the
// header page (past the 64 bytes of fields), 2-3 = how many blocks fewer
// than the header's nr_blocks the caller expects (a superblock behind an
// interrupted grow). The caller expects 64 KiB blocks, as a validated
// superblock would give.
//
// Every file is refused or opens; an opened map must describe exactly the
// file: its free count is nr_blocks minus the set bits below nr_blocks, and
// the header's reserved bytes are zero (format.h: "must be zero in
// version 1").

#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "meta/bitmap_space_map.h"
#include "meta/format.h"

namespace {

using namespace thinfs::meta;

uint64_t GetLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void PutLe64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

constexpr uint64_t kExpectedBlockSize = 65536;
// Bodies beyond this are not written (the file is then short, and refused).
constexpr uint64_t kMaxBody = 1 << 16;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t control = data[0];
  const uint8_t* fields = data + 1;
  const size_t field_bytes = std::min<size_t>(size - 1, sizeof(BitmapHeaderDisk));
  const uint8_t* body_in = fields + field_bytes;
  const size_t body_bytes = size - 1 - field_bytes;

  std::vector<uint8_t> file(kBitmapHeaderSize, 0);
  std::memcpy(file.data(), fields, field_bytes);
  if (control & 2) file[64 + control % 64] = 0x5a;
  const uint64_t nr_blocks = GetLe64(file.data() + offsetof(BitmapHeaderDisk, nr_blocks));
  file.insert(file.end(), body_in, body_in + body_bytes);
  if (control & 1) {
    const uint64_t want = BitmapBodyBytes(nr_blocks);
    if (want <= kMaxBody && file.size() >= kBitmapHeaderSize + want) {
      PutLe64(file.data() + offsetof(BitmapHeaderDisk, body_checksum),
              XXH64(file.data() + kBitmapHeaderSize, want, kBitmapChecksumSeed));
    }
  }
  PutLe64(file.data() + offsetof(BitmapHeaderDisk, header_checksum), 0);
  PutLe64(file.data() + offsetof(BitmapHeaderDisk, header_checksum),
          XXH64(file.data(), kBitmapHeaderSize, kBitmapChecksumSeed));

  const int fd = ::memfd_create("bitmap", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  size_t done = 0;
  while (done < file.size()) {
    ssize_t n = ::write(fd, file.data() + done, file.size() - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  const uint64_t fewer = (control >> 2) & 3;
  const uint64_t expected_blocks = nr_blocks > fewer ? nr_blocks - fewer : nr_blocks;
  {
    auto map = BitmapSpaceMap::Open("/proc/self/fd/" + std::to_string(fd), expected_blocks,
                                    kExpectedBlockSize, true);
    if (map.ok()) {
      if ((*map)->total_blocks() != nr_blocks) std::abort();
      for (size_t i = offsetof(BitmapHeaderDisk, reserved);
           i < offsetof(BitmapHeaderDisk, body_checksum); ++i) {
        if (file[i] != 0) std::abort();
      }
      for (size_t i = sizeof(BitmapHeaderDisk); i < kBitmapHeaderSize; ++i) {
        if (file[i] != 0) std::abort();
      }
      uint64_t used = 0;
      for (uint64_t b = 0; b < nr_blocks; ++b) {
        const uint8_t byte = file[kBitmapHeaderSize + b / 8];
        used += (byte >> (b % 8)) & 1;
        if ((*map)->IsAllocated(thinfs::PoolBlock(b)) != (((byte >> (b % 8)) & 1) != 0)) {
          std::abort();
        }
      }
      if ((*map)->free_blocks() != nr_blocks - used) std::abort();
    }
  }
  ::close(fd);
  return 0;
}
