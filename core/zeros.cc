#include "core/zeros.h"

#include <cstdint>
#include <cstring>

namespace thinfs {

bool IsAllZero(std::span<const std::byte> buf) {
  constexpr size_t kHead = 16;
  const std::byte* p = buf.data();
  const size_t n = buf.size();
  if (n < kHead) {
    for (size_t i = 0; i < n; ++i) {
      if (p[i] != std::byte{0}) return false;
    }
    return true;
  }
  // The first 16 bytes zero, then the buffer compared with itself shifted
  // by 16: byte i + 16 equals byte i for every i, so by induction every
  // byte is zero. glibc's memcmp reads vectors at a time, which a
  // word-at-a-time loop with an early exit does not compile to (three
  // times the bytes per second on a block of zeros; docs/benchmarks.md,
  // lever 53).
  uint64_t head[2];
  std::memcpy(head, p, kHead);
  if ((head[0] | head[1]) != 0) return false;
  return std::memcmp(p, p + kHead, n - kHead) == 0;
}

}  // namespace thinfs
