// A small strict JSON parser for tests: checks that the CLI's --json output
// is valid JSON (RFC 8259) and gives access to its values.

#ifndef THINFS_TESTS_TOOLS_JSON_PARSER_H_
#define THINFS_TESTS_TOOLS_JSON_PARSER_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace thinfs::testing {

struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  std::string number;  // as written
  std::string string;  // decoded (UTF-8)
  std::vector<JsonValue> array;
  std::map<std::string, JsonValue> object;

  bool Has(const std::string& key) const { return object.count(key) != 0; }
  const JsonValue& operator[](const std::string& key) const { return object.at(key); }
  uint64_t AsUint() const { return std::stoull(number); }
};

class JsonParser {
 public:
  // Returns nullopt (and sets error) unless `text` is exactly one JSON value,
  // optionally surrounded by whitespace.
  static std::optional<JsonValue> Parse(std::string_view text, std::string* error) {
    JsonParser p(text);
    JsonValue v;
    if (!p.Value(&v, 0) || (p.SkipWs(), p.pos_ != text.size())) {
      *error = "invalid JSON at offset " + std::to_string(p.pos_);
      return std::nullopt;
    }
    return v;
  }

 private:
  explicit JsonParser(std::string_view t) : t_(t) {}

  void SkipWs() {
    while (pos_ < t_.size() && (t_[pos_] == ' ' || t_[pos_] == '\n' || t_[pos_] == '\t' ||
                                t_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Eat(char c) {
    SkipWs();
    if (pos_ < t_.size() && t_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Literal(std::string_view word) {
    if (t_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }
  bool Hex4(uint32_t* out) {
    if (pos_ + 4 > t_.size()) return false;
    *out = 0;
    for (int i = 0; i < 4; ++i) {
      char c = t_[pos_++];
      *out <<= 4;
      if (c >= '0' && c <= '9') {
        *out |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        *out |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        *out |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return false;
      }
    }
    return true;
  }
  bool String(std::string* out) {
    if (!Eat('"')) return false;
    while (pos_ < t_.size()) {
      auto c = static_cast<unsigned char>(t_[pos_++]);
      if (c == '"') return true;
      if (c < 0x20) return false;  // raw control characters are invalid
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        continue;
      }
      if (pos_ >= t_.size()) return false;
      char e = t_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp = 0;
          if (!Hex4(&cp)) return false;
          AppendUtf8(cp, out);
          break;
        }
        default:
          return false;
      }
    }
    return false;
  }
  bool Number(std::string* out) {
    size_t start = pos_;
    if (pos_ < t_.size() && t_[pos_] == '-') ++pos_;
    size_t digits = pos_;
    while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') ++pos_;
    if (pos_ == digits) return false;
    if (t_[digits] == '0' && pos_ - digits > 1) return false;  // leading zero
    *out = std::string(t_.substr(start, pos_ - start));
    return true;
  }
  bool Value(JsonValue* v, int depth) {
    if (depth > 64) return false;
    SkipWs();
    if (pos_ >= t_.size()) return false;
    char c = t_[pos_];
    if (c == '{') {
      ++pos_;
      v->type = JsonValue::Type::kObject;
      if (Eat('}')) return true;
      do {
        std::string key;
        SkipWs();
        if (!String(&key) || !Eat(':')) return false;
        if (v->object.count(key) != 0) return false;  // duplicate key
        if (!Value(&v->object[key], depth + 1)) return false;
      } while (Eat(','));
      return Eat('}');
    }
    if (c == '[') {
      ++pos_;
      v->type = JsonValue::Type::kArray;
      if (Eat(']')) return true;
      do {
        v->array.emplace_back();
        if (!Value(&v->array.back(), depth + 1)) return false;
      } while (Eat(','));
      return Eat(']');
    }
    if (c == '"') {
      v->type = JsonValue::Type::kString;
      return String(&v->string);
    }
    if (Literal("true")) {
      v->type = JsonValue::Type::kBool;
      v->boolean = true;
      return true;
    }
    if (Literal("false")) {
      v->type = JsonValue::Type::kBool;
      return true;
    }
    if (Literal("null")) return true;
    v->type = JsonValue::Type::kNumber;
    return Number(&v->number);
  }

  std::string_view t_;
  size_t pos_ = 0;
};

// Parses `text`; a parse error fails the current test (and returns null).
inline JsonValue ParseJson(const std::string& text) {
  std::string error;
  std::optional<JsonValue> v = JsonParser::Parse(text, &error);
  EXPECT_TRUE(v.has_value()) << error << ":\n" << text;
  return v.value_or(JsonValue());
}

}  // namespace thinfs::testing

#endif  // THINFS_TESTS_TOOLS_JSON_PARSER_H_
