// libFuzzer target for the size parser (core/size.h): any input is parsed
// or rejected without crashing. FormatSize of a value that is a whole
// number of its unit (what FormatSize promises to print exactly) parses
// back to the same value; any other printed value without decimals parses
// to at most the value (FormatSize truncates) and within 1% of it; printed
// decimals are rejected (ParseSize takes no fractions); the plain decimal
// form of any value parses to it.

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
    uint64_t unit = 1;
    while (unit <= v / 1024) unit *= 1024;
    if (v % unit == 0) {
      if (!again.ok() || *again != v) std::abort();
    } else if (printed.find('.') != std::string::npos) {
      if (again.ok()) std::abort();  // a fraction must be rejected
    } else if (!again.ok() || *again > v || *again < v - v / 100) {
      std::abort();
    }
    thinfs::Result<uint64_t> decimal = thinfs::ParseSize(std::to_string(v));
    if (!decimal.ok() || *decimal != v) std::abort();
  }
  return 0;
}
