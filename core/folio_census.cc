#include "core/folio_census.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

namespace thinfs {

Result<FolioCensus> CensusFolios(int fd, uint64_t offset, uint64_t len) {
  constexpr uint64_t kPage = 4096;
  constexpr uint64_t kPfnMask = (uint64_t{1} << 55) - 1;
  constexpr uint64_t kPresent = uint64_t{1} << 63;
  constexpr uint64_t kHead = uint64_t{1} << 15;  // KPF_COMPOUND_HEAD
  constexpr uint64_t kTail = uint64_t{1} << 16;  // KPF_COMPOUND_TAIL
  constexpr uint64_t kMaxFolioPages = 512;       // a PMD's worth: 2 MiB
  if (offset % kPage != 0 || len % kPage != 0) {
    return Status::InvalidArgument("folio census of an unaligned range");
  }
  FolioCensus c;
  if (len == 0) return c;
  const int pagemap = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (pagemap < 0) return Status::FromErrno(errno, "open /proc/self/pagemap");
  const int kflags = ::open("/proc/kpageflags", O_RDONLY | O_CLOEXEC);
  if (kflags < 0) {
    const int err = errno;
    ::close(pagemap);
    return Status::FromErrno(err, "open /proc/kpageflags (root only)");
  }
  void* m = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(offset));
  auto done = [&](Status s) -> Result<FolioCensus> {
    if (m != MAP_FAILED) ::munmap(m, len);
    ::close(kflags);
    ::close(pagemap);
    if (!s.ok()) return s;
    return c;
  };
  if (m == MAP_FAILED) return done(Status::FromErrno(errno, "mmap for a folio census"));
  const auto* base = static_cast<const unsigned char*>(m);
  const uint64_t pages = len / kPage;
  std::vector<unsigned char> resident(pages);
  if (::mincore(const_cast<unsigned char*>(base), len, resident.data()) != 0) {
    return done(Status::FromErrno(errno, "mincore"));
  }
  // Map each cached page into this process, so that pagemap knows it.
  for (uint64_t i = 0; i < pages; ++i) {
    if (resident[i] & 1) (void)*static_cast<const volatile unsigned char*>(base + i * kPage);
  }
  std::vector<uint64_t> entries(pages);
  const auto va = reinterpret_cast<uintptr_t>(base);
  const auto want = static_cast<ssize_t>(pages * 8);
  if (::pread(pagemap, entries.data(), pages * 8, static_cast<off_t>(va / kPage * 8)) != want) {
    return done(Status::FromErrno(errno, "read /proc/self/pagemap"));
  }
  for (uint64_t i = 0; i < pages; ++i) {
    const uint64_t pfn = entries[i] & kPfnMask;
    if (!(resident[i] & 1) || !(entries[i] & kPresent) || pfn == 0) {
      ++c.uncached;
      continue;
    }
    uint64_t flags = 0;
    if (::pread(kflags, &flags, 8, static_cast<off_t>(pfn * 8)) != 8) {
      return done(Status::FromErrno(errno, "read /proc/kpageflags"));
    }
    // A folio starts here, or (first page) one from before the range
    // reaches into it: either way a read of the range copies it.
    if (!(flags & kTail) || i == 0) {
      ++c.folios;
      uint64_t head = pfn;
      if (flags & kTail) {
        // Walk back to the head: a folio's frames are contiguous.
        for (uint64_t back = 1; back < kMaxFolioPages && back <= pfn; ++back) {
          uint64_t f = 0;
          if (::pread(kflags, &f, 8, static_cast<off_t>((pfn - back) * 8)) != 8) break;
          if (!(f & kTail)) {
            head = pfn - back;
            break;
          }
        }
      }
      uint64_t size = 1;
      if (head != pfn || (flags & kHead)) {
        // Its tail frames follow the head.
        std::vector<uint64_t> next(kMaxFolioPages - 1);
        const ssize_t got =
            ::pread(kflags, next.data(), next.size() * 8, static_cast<off_t>((head + 1) * 8));
        for (ssize_t k = 0; k < got / 8 && (next[static_cast<size_t>(k)] & kTail); ++k) ++size;
      }
      c.folio_pages += size;
    }
  }
  return done(Status::Ok());
}

}  // namespace thinfs
