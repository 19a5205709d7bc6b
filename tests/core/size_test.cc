#include "core/size.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

namespace thinfs {
namespace {

uint64_t ParseOk(const std::string& text) {
  Result<uint64_t> r = ParseSize(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().ToString();
  return r.ok() ? *r : 0;
}

std::string ParseError(const std::string& text) {
  Result<uint64_t> r = ParseSize(text);
  EXPECT_FALSE(r.ok()) << text << " parsed as " << (r.ok() ? *r : 0);
  if (r.ok()) return "";
  EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
  return r.status().message();
}

TEST(ParseSizeTest, PlainBytes) {
  EXPECT_EQ(ParseOk("0"), 0u);
  EXPECT_EQ(ParseOk("1"), 1u);
  EXPECT_EQ(ParseOk("4096"), 4096u);
  EXPECT_EQ(ParseOk("4096B"), 4096u);
  EXPECT_EQ(ParseOk("007"), 7u);
}

TEST(ParseSizeTest, BinarySuffixesAnyCase) {
  EXPECT_EQ(ParseOk("64K"), 64u << 10);
  EXPECT_EQ(ParseOk("64k"), 64u << 10);
  EXPECT_EQ(ParseOk("64KiB"), 64u << 10);
  EXPECT_EQ(ParseOk("64kib"), 64u << 10);
  EXPECT_EQ(ParseOk("64KB"), 64u << 10);
  EXPECT_EQ(ParseOk("64 KiB"), 64u << 10);
  EXPECT_EQ(ParseOk("3M"), uint64_t{3} << 20);
  EXPECT_EQ(ParseOk("3MiB"), uint64_t{3} << 20);
  EXPECT_EQ(ParseOk("10G"), uint64_t{10} << 30);
  EXPECT_EQ(ParseOk("10gib"), uint64_t{10} << 30);
  EXPECT_EQ(ParseOk("1T"), uint64_t{1} << 40);
  EXPECT_EQ(ParseOk("1TiB"), uint64_t{1} << 40);
  EXPECT_EQ(ParseOk("2P"), uint64_t{2} << 50);
  EXPECT_EQ(ParseOk("2PiB"), uint64_t{2} << 50);
  EXPECT_EQ(ParseOk("15E"), uint64_t{15} << 60);
}

TEST(ParseSizeTest, LargestValues) {
  EXPECT_EQ(ParseOk("18446744073709551615"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(ParseOk("16383P"), uint64_t{16383} << 50);
  EXPECT_EQ(ParseOk("17179869183G"), uint64_t{17179869183} << 30);
}

TEST(ParseSizeTest, Overflow) {
  EXPECT_NE(ParseError("18446744073709551616").find("does not fit in 64 bits"), std::string::npos);
  EXPECT_NE(ParseError("99999999999999999999999").find("64 bits"), std::string::npos);
  EXPECT_NE(ParseError("16384P").find("64 bits"), std::string::npos);
  EXPECT_NE(ParseError("16E").find("64 bits"), std::string::npos);
  EXPECT_NE(ParseError("17179869184G").find("64 bits"), std::string::npos);
  EXPECT_NE(ParseError("18014398509481984K").find("64 bits"), std::string::npos);
}

TEST(ParseSizeTest, Empty) { EXPECT_EQ(ParseError(""), "empty size"); }

TEST(ParseSizeTest, Negative) {
  EXPECT_EQ(ParseError("-1"), "negative size '-1'");
  EXPECT_EQ(ParseError("-64K"), "negative size '-64K'");
}

TEST(ParseSizeTest, Fractional) {
  EXPECT_NE(ParseError("1.5G").find("fractional"), std::string::npos);
  EXPECT_NE(ParseError("0.5").find("fractional"), std::string::npos);
  EXPECT_NE(ParseError("1,5G").find("fractional"), std::string::npos);
}

TEST(ParseSizeTest, Junk) {
  EXPECT_EQ(ParseError("abc"), "invalid size 'abc': expected a decimal number");
  EXPECT_NE(ParseError("+5").find("expected a decimal number"), std::string::npos);
  EXPECT_NE(ParseError(" 5").find("expected a decimal number"), std::string::npos);
  EXPECT_NE(ParseError("0x10").find("unknown suffix 'x10'"), std::string::npos);
  EXPECT_NE(ParseError("10X").find("unknown suffix 'X'"), std::string::npos);
  EXPECT_NE(ParseError("10KK").find("unknown suffix 'KK'"), std::string::npos);
  EXPECT_NE(ParseError("10Kibibytes").find("unknown suffix"), std::string::npos);
  EXPECT_NE(ParseError("10 ").find("unknown suffix"), std::string::npos) << "trailing blank";
  EXPECT_NE(ParseError("1e9").find("unknown suffix 'e9'"), std::string::npos);
  EXPECT_NE(ParseError("10iB").find("unknown suffix"), std::string::npos);
}

TEST(FormatSizeTest, ExactUnits) {
  EXPECT_EQ(FormatSize(0), "0 B");
  EXPECT_EQ(FormatSize(1), "1 B");
  EXPECT_EQ(FormatSize(1023), "1023 B");
  EXPECT_EQ(FormatSize(1024), "1 KiB");
  EXPECT_EQ(FormatSize(64 * 1024), "64 KiB");
  EXPECT_EQ(FormatSize(uint64_t{1} << 30), "1 GiB");
  EXPECT_EQ(FormatSize(uint64_t{1} << 40), "1 TiB");
  EXPECT_EQ(FormatSize(uint64_t{5} << 50), "5 PiB");
  EXPECT_EQ(FormatSize(uint64_t{8} << 60), "8 EiB");
}

TEST(FormatSizeTest, Fractions) {
  EXPECT_EQ(FormatSize(uint64_t{3} << 29), "1.5 GiB");
  EXPECT_EQ(FormatSize((uint64_t{1} << 30) + (uint64_t{1} << 30) / 4), "1.25 GiB");
  EXPECT_EQ(FormatSize(1024 + 52), "1.05 KiB");
  // Truncated, never rounded up into the next unit.
  EXPECT_EQ(FormatSize((uint64_t{1} << 20) - 1), "1023.99 KiB");
  EXPECT_EQ(FormatSize(std::numeric_limits<uint64_t>::max()), "15.99 EiB");
}

TEST(FormatSizeTest, RoundTripsThroughParse) {
  for (uint64_t v : {uint64_t{0}, uint64_t{4096}, uint64_t{65536}, uint64_t{1} << 30,
                     uint64_t{7} << 40}) {
    EXPECT_EQ(ParseOk(FormatSize(v)), v) << FormatSize(v);
  }
}

}  // namespace
}  // namespace thinfs
