// JsonWriter: builds one JSON document (the CLI's --json output, the
// control socket's replies).
//
// Compact output ({"a": 1, "b": [true, "x"]}). Strings are escaped per
// RFC 8259; bytes that are not valid UTF-8 (file names may hold any byte)
// become U+FFFD, so the output is always valid JSON. Misuse (a value where
// a key is due, unbalanced End*) is a bug and aborts.
//
// Thread safety: a value; one writer per thread.

#ifndef THINFS_CORE_JSON_H_
#define THINFS_CORE_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"

namespace thinfs {

class JsonWriter {
 public:
  JsonWriter& BeginObject() { return Open('{', true); }
  JsonWriter& EndObject() { return Close('}', true); }
  JsonWriter& BeginArray() { return Open('[', false); }
  JsonWriter& EndArray() { return Close(']', false); }

  // REQUIRES: inside an object, and no key pending.
  JsonWriter& Key(std::string_view key) {
    THINFS_CHECK(!stack_.empty() && stack_.back().object && !key_pending_);
    Separate();
    AppendString(key);
    out_ += ": ";
    key_pending_ = true;
    return *this;
  }

  JsonWriter& String(std::string_view s) {
    BeforeValue();
    AppendString(s);
    return *this;
  }
  JsonWriter& Uint(uint64_t v) {
    BeforeValue();
    out_ += std::to_string(v);
    return *this;
  }
  JsonWriter& Int(int64_t v) {
    BeforeValue();
    out_ += std::to_string(v);
    return *this;
  }
  JsonWriter& Bool(bool v) {
    BeforeValue();
    out_ += v ? "true" : "false";
    return *this;
  }
  JsonWriter& Null() {
    BeforeValue();
    out_ += "null";
    return *this;
  }

  // The document so far. Complete once every Begin* has been ended.
  const std::string& str() const { return out_; }
  bool complete() const { return stack_.empty() && !out_.empty(); }

  // Appends `s` to `out` as a quoted JSON string.
  static void Quote(std::string_view s, std::string* out) {
    static constexpr char kHex[] = "0123456789abcdef";
    out->push_back('"');
    size_t i = 0;
    while (i < s.size()) {
      auto c = static_cast<unsigned char>(s[i]);
      if (c < 0x80) {
        switch (c) {
          case '"':
            *out += "\\\"";
            break;
          case '\\':
            *out += "\\\\";
            break;
          case '\b':
            *out += "\\b";
            break;
          case '\f':
            *out += "\\f";
            break;
          case '\n':
            *out += "\\n";
            break;
          case '\r':
            *out += "\\r";
            break;
          case '\t':
            *out += "\\t";
            break;
          default:
            if (c < 0x20) {
              *out += "\\u00";
              out->push_back(kHex[c >> 4]);
              out->push_back(kHex[c & 0xf]);
            } else {
              out->push_back(static_cast<char>(c));
            }
        }
        ++i;
        continue;
      }
      size_t len = Utf8SequenceLength(s.substr(i));
      if (len == 0) {
        *out += "\\ufffd";
        ++i;
      } else {
        out->append(s.substr(i, len));
        i += len;
      }
    }
    out->push_back('"');
  }

 private:
  struct Level {
    bool object;
    bool first = true;
  };

  // Length of the valid UTF-8 multi-byte sequence at the start of `s`, or 0.
  // Rejects overlong forms, surrogates and code points above U+10FFFF.
  static size_t Utf8SequenceLength(std::string_view s) {
    auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
    auto cont = [&](size_t i) { return i < s.size() && (b(i) & 0xc0) == 0x80; };
    unsigned char c = b(0);
    if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
    if (c >= 0xe0 && c <= 0xef) {
      if (!cont(1) || !cont(2)) return 0;
      if (c == 0xe0 && b(1) < 0xa0) return 0;   // overlong
      if (c == 0xed && b(1) >= 0xa0) return 0;  // surrogate
      return 3;
    }
    if (c >= 0xf0 && c <= 0xf4) {
      if (!cont(1) || !cont(2) || !cont(3)) return 0;
      if (c == 0xf0 && b(1) < 0x90) return 0;   // overlong
      if (c == 0xf4 && b(1) >= 0x90) return 0;  // > U+10FFFF
      return 4;
    }
    return 0;
  }

  void Separate() {
    if (!stack_.back().first) out_ += ", ";
    stack_.back().first = false;
  }
  void BeforeValue() {
    if (stack_.empty()) {
      THINFS_CHECK(out_.empty());  // one top-level value
      return;
    }
    if (stack_.back().object) {
      THINFS_CHECK(key_pending_);
      key_pending_ = false;
    } else {
      Separate();
    }
  }
  JsonWriter& Open(char c, bool object) {
    BeforeValue();
    out_.push_back(c);
    stack_.push_back(Level{object});
    return *this;
  }
  JsonWriter& Close(char c, bool object) {
    THINFS_CHECK(!stack_.empty() && stack_.back().object == object && !key_pending_);
    stack_.pop_back();
    out_.push_back(c);
    return *this;
  }
  void AppendString(std::string_view s) { Quote(s, &out_); }

  std::string out_;
  std::vector<Level> stack_;
  bool key_pending_ = false;
};

}  // namespace thinfs

#endif  // THINFS_CORE_JSON_H_
