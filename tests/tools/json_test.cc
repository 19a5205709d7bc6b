#include "tools/json.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/tools/json_parser.h"

namespace thinfs::tools {
namespace {

using thinfs::testing::JsonParser;
using thinfs::testing::JsonValue;

std::string Quoted(std::string_view s) {
  std::string out;
  JsonWriter::Quote(s, &out);
  return out;
}

TEST(JsonWriterTest, EscapesStrings) {
  EXPECT_EQ(Quoted("plain"), "\"plain\"");
  EXPECT_EQ(Quoted("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(Quoted("\n\t\r\b\f"), "\"\\n\\t\\r\\b\\f\"");
  EXPECT_EQ(Quoted(std::string("\x01\x1f", 2)), "\"\\u0001\\u001f\"");
  EXPECT_EQ(Quoted(std::string("nul\0x", 5)), "\"nul\\u0000x\"");
  EXPECT_EQ(Quoted("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
}

TEST(JsonWriterTest, InvalidUtf8BecomesReplacementCharacter) {
  EXPECT_EQ(Quoted("a\xff" "b"), "\"a\\ufffdb\"");
  EXPECT_EQ(Quoted("\xc3"), "\"\\ufffd\"");                      // truncated
  EXPECT_EQ(Quoted("\xc0\xaf"), "\"\\ufffd\\ufffd\"");           // overlong
  EXPECT_EQ(Quoted("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");  // surrogate
  EXPECT_EQ(Quoted("\xf4\x90\x80\x80"), "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");
}

TEST(JsonWriterTest, DocumentRoundTripsThroughAParser) {
  JsonWriter j;
  j.BeginObject()
      .Key("name").String("pool \"a\"\n\xff")
      .Key("n").Uint(18446744073709551615u)
      .Key("neg").Int(-5)
      .Key("ok").Bool(true)
      .Key("none").Null()
      .Key("list").BeginArray().Uint(1).String("x").BeginObject().EndObject().EndArray()
      .Key("empty").BeginArray().EndArray()
      .EndObject();
  EXPECT_TRUE(j.complete());
  std::string error;
  std::optional<JsonValue> v = JsonParser::Parse(j.str(), &error);
  ASSERT_TRUE(v.has_value()) << error << ": " << j.str();
  EXPECT_EQ((*v)["name"].string, "pool \"a\"\n\xef\xbf\xbd");
  EXPECT_EQ((*v)["n"].number, "18446744073709551615");
  EXPECT_EQ((*v)["neg"].number, "-5");
  EXPECT_TRUE((*v)["ok"].boolean);
  EXPECT_EQ((*v)["none"].type, JsonValue::Type::kNull);
  ASSERT_EQ((*v)["list"].array.size(), 3u);
  EXPECT_EQ((*v)["list"].array[1].string, "x");
  EXPECT_TRUE((*v)["empty"].array.empty());
}

TEST(JsonWriterTest, IncompleteUntilClosed) {
  JsonWriter j;
  j.BeginObject().Key("a").BeginArray();
  EXPECT_FALSE(j.complete());
  j.EndArray().EndObject();
  EXPECT_TRUE(j.complete());
  EXPECT_EQ(j.str(), "{\"a\": []}");
}

TEST(JsonParserTest, RejectsInvalidDocuments) {
  std::string error;
  for (const char* bad : {"", "{", "{\"a\" 1}", "{\"a\": 1,}", "[1 2]", "\"raw\ncontrol\"",
                          "{\"a\": 1} x", "01", "{\"a\": 1, \"a\": 2}", "tru"}) {
    EXPECT_FALSE(JsonParser::Parse(bad, &error).has_value()) << bad;
  }
}

}  // namespace
}  // namespace thinfs::tools
