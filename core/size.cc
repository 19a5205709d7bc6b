#include "core/size.h"

#include <cctype>
#include <limits>

namespace thinfs {

namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsSpace(char c) { return c == ' ' || c == '\t'; }

// Appends rather than `"'" + std::string(text)`, which trips gcc 12's
// -Wrestrict false positive (GCC bug 105651) in Release builds.
std::string Quote(std::string_view text) {
  std::string q;
  q.reserve(text.size() + 2);
  q.push_back('\'');
  q.append(text);
  q.push_back('\'');
  return q;
}

// Returns the shift for a suffix letter, or -1.
int ShiftOf(char c) {
  switch (std::tolower(static_cast<unsigned char>(c))) {
    case 'k':
      return 10;
    case 'm':
      return 20;
    case 'g':
      return 30;
    case 't':
      return 40;
    case 'p':
      return 50;
    case 'e':
      return 60;
    default:
      return -1;
  }
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

}  // namespace

Result<uint64_t> ParseSize(std::string_view text) {
  if (text.empty()) return Status::InvalidArgument("empty size");
  const std::string q = Quote(text);
  if (text.front() == '-') return Status::InvalidArgument("negative size " + q);
  if (!IsDigit(text.front())) {
    return Status::InvalidArgument("invalid size " + q + ": expected a decimal number");
  }

  size_t i = 0;
  uint64_t value = 0;
  bool overflow = false;
  for (; i < text.size() && IsDigit(text[i]); ++i) {
    uint64_t digit = static_cast<uint64_t>(text[i] - '0');
    if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) overflow = true;
    if (!overflow) value = value * 10 + digit;
  }
  if (i < text.size() && (text[i] == '.' || text[i] == ',')) {
    return Status::InvalidArgument("invalid size " + q +
                                   ": fractional sizes are not supported, use a smaller unit");
  }
  if (overflow) return Status::InvalidArgument("size " + q + " does not fit in 64 bits");

  const size_t digits_end = i;
  while (i < text.size() && IsSpace(text[i])) ++i;
  std::string_view suffix = text.substr(i);
  if (suffix.empty() && i != digits_end) {
    return Status::InvalidArgument("invalid size " + q + ": unknown suffix ' ' (trailing blank)");
  }
  int shift = 0;
  if (suffix.empty() || EqualsIgnoreCase(suffix, "b")) {
    shift = 0;
  } else {
    shift = ShiftOf(suffix.front());
    std::string_view rest = suffix.substr(1);
    if (shift < 0 || !(rest.empty() || EqualsIgnoreCase(rest, "b") ||
                       EqualsIgnoreCase(rest, "ib"))) {
      return Status::InvalidArgument("invalid size " + q + ": unknown suffix '" +
                                     std::string(suffix) +
                                     "' (use K, M, G, T, P, E or KiB, MiB, GiB, TiB, PiB, EiB)");
    }
  }
  if (shift > 0 && value > (std::numeric_limits<uint64_t>::max() >> shift)) {
    return Status::InvalidArgument("size " + q + " does not fit in 64 bits");
  }
  return value << shift;
}

std::string FormatSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (unit < 6 && (bytes >> (10 * (unit + 1))) != 0) ++unit;
  const int shift = 10 * unit;
  const uint64_t whole = bytes >> shift;
  const uint64_t rem = shift == 0 ? 0 : bytes & ((uint64_t{1} << shift) - 1);
  // rem < 2^60, so rem * 100 fits only in 128 bits.
  const auto hundredths =
      static_cast<uint64_t>((static_cast<unsigned __int128>(rem) * 100) >> shift);
  std::string out = std::to_string(whole);
  if (hundredths != 0) {
    out += '.';
    out += static_cast<char>('0' + hundredths / 10);
    if (hundredths % 10 != 0) out += static_cast<char>('0' + hundredths % 10);
  }
  out += ' ';
  out += kUnits[unit];
  return out;
}

}  // namespace thinfs
