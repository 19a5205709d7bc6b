// Human sizes: parsing "64K", "10GiB", "4096" and printing "64 KiB".
//
// Suffixes are binary (K = 1024) whatever their spelling: K M G T P, with an
// optional "iB" (KiB, MiB, ...) or "B" (KB, MB, ...: still binary, like
// dd's "K" and util-linux), case-insensitive, optionally separated from the
// number by spaces. A bare "B" means bytes.
//
// Thread safety: pure functions.

#ifndef THINFS_CORE_SIZE_H_
#define THINFS_CORE_SIZE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace thinfs {

// Parses a non-negative decimal integer with an optional binary suffix.
// Returns kInvalidArgument, with a message quoting `text` and saying what is
// wrong, for an empty string, a sign, a fraction, junk, an unknown suffix or
// a value that does not fit in 64 bits.
Result<uint64_t> ParseSize(std::string_view text);

// "0 B", "512 B", "64 KiB", "1.5 GiB", "16 EiB": the largest binary unit
// not above `bytes`, with up to two decimals (truncated, trailing zeros
// dropped), so that exact sizes print exactly.
std::string FormatSize(uint64_t bytes);

}  // namespace thinfs

#endif  // THINFS_CORE_SIZE_H_
