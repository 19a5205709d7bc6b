// libFuzzer target for the size parser (core/size.h): any input is parsed
// or rejected without crashing; a parsed value prints back (FormatSize) to
// text that parses to the same value whenever that text is exact (has no
// decimals, which ParseSize rejects), and its plain decimal form parses to
// the same value too.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "core/size.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  thinfs::Result<uint64_t> parsed = thinfs::ParseSize(text);
  // Also treat the first 8 bytes as a value to print, so that FormatSize
  // sees every magnitude whatever the parser accepts.
  uint64_t raw = 0;
  std::memcpy(&raw, data, size < 8 ? size : 8);
  for (uint64_t v : {parsed.ok() ? *parsed : raw, raw}) {
    std::string printed = thinfs::FormatSize(v);
    thinfs::Result<uint64_t> again = thinfs::ParseSize(printed);
    if (printed.find('.') == std::string::npos) {
      if (!again.ok() || *again != v) std::abort();
    } else if (again.ok()) {
      std::abort();  // a fraction must be rejected
    }
    thinfs::Result<uint64_t> decimal = thinfs::ParseSize(std::to_string(v));
    if (!decimal.ok() || *decimal != v) std::abort();
  }
  return 0;
}
