#include "meta/thin_xml.h"

#include <expat.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

namespace thinfs::meta {

// ------------------------------------------------------------------ writer

void ThinXmlWriter::BeginSuperblock(const ThinSuperblock& sb) {
  // The uuid is ours (hex and dashes): nothing to escape.
  std::fprintf(out_,
               "<superblock uuid=\"%s\" time=\"%" PRIu64 "\" transaction=\"%" PRIu64
               "\" flags=\"%" PRIu64 "\" version=\"%" PRIu64 "\" data_block_size=\"%" PRIu64
               "\" nr_data_blocks=\"%" PRIu64 "\">\n",
               sb.uuid.c_str(), sb.time, sb.transaction, sb.flags, sb.version,
               sb.data_block_size, sb.nr_data_blocks);
}

void ThinXmlWriter::BeginDevice(const ThinDevice& d) {
  std::fprintf(out_,
               "  <device dev_id=\"%" PRIu64 "\" mapped_blocks=\"%" PRIu64
               "\" transaction=\"%" PRIu64 "\" creation_time=\"%" PRIu64
               "\" snap_time=\"%" PRIu64 "\">\n",
               d.dev_id, d.mapped_blocks, d.transaction, d.creation_time, d.snap_time);
}

void ThinXmlWriter::Map(uint64_t origin, uint64_t data, uint64_t time) {
  if (have_range_ && origin == range_.origin_begin + range_.length &&
      data == range_.data_begin + range_.length && time == range_.time) {
    range_.length++;
    return;
  }
  FlushRange();
  range_ = ThinRange{origin, data, 1, time};
  have_range_ = true;
}

void ThinXmlWriter::FlushRange() {
  if (!have_range_) return;
  if (range_.length == 1) {
    std::fprintf(out_,
                 "    <single_mapping origin_block=\"%" PRIu64 "\" data_block=\"%" PRIu64
                 "\" time=\"%" PRIu64 "\"/>\n",
                 range_.origin_begin, range_.data_begin, range_.time);
  } else {
    std::fprintf(out_,
                 "    <range_mapping origin_begin=\"%" PRIu64 "\" data_begin=\"%" PRIu64
                 "\" length=\"%" PRIu64 "\" time=\"%" PRIu64 "\"/>\n",
                 range_.origin_begin, range_.data_begin, range_.length, range_.time);
  }
  have_range_ = false;
}

void ThinXmlWriter::EndDevice() {
  FlushRange();
  std::fputs("  </device>\n", out_);
}

void ThinXmlWriter::EndSuperblock() { std::fputs("</superblock>\n", out_); }

Status ThinXmlWriter::Finish(const std::string& what) {
  if (std::fflush(out_) != 0 || std::ferror(out_)) {
    return Status::FromErrno(errno != 0 ? errno : EIO, "write " + what);
  }
  return Status::Ok();
}

// ------------------------------------------------------------------ parser

namespace {

enum class Where { kTop, kSuperblock, kDevice, kMapping, kDone };

struct ParseState {
  XML_Parser parser = nullptr;
  ThinXmlHandler* handler = nullptr;
  Where where = Where::kTop;
  ThinSuperblock sb;
  ThinDevice device;
  uint64_t device_blocks = 0;  // blocks mapped so far in the open device
  // The first error and where it happened.
  std::optional<Status> error;
  uint64_t line = 0;
  uint64_t column = 0;

  void Fail(Status s) {
    if (error) return;
    line = XML_GetCurrentLineNumber(parser);
    column = XML_GetCurrentColumnNumber(parser);
    error = std::move(s);
    XML_StopParser(parser, XML_FALSE);
  }
  void Fail(const std::string& message) { Fail(Status::InvalidArgument(message)); }
};

// Attribute lookup over expat's name/value array.
class Attrs {
 public:
  Attrs(const char* element, const XML_Char** atts) : element_(element), atts_(atts) {}

  const char* Find(const char* name) const {
    for (const XML_Char** a = atts_; a[0] != nullptr; a += 2) {
      if (std::strcmp(a[0], name) == 0) return a[1];
    }
    return nullptr;
  }

  // A required unsigned decimal number. Sets *error on failure.
  uint64_t Number(const char* name, std::string* error) const {
    if (!error->empty()) return 0;
    const char* v = Find(name);
    if (v == nullptr) {
      *error = "<" + std::string(element_) + "> lacks the attribute " + name;
      return 0;
    }
    std::string_view s(v);
    uint64_t n = 0;
    bool ok = !s.empty() && s.size() <= 20;
    for (char c : s) {
      if (!ok) break;
      if (c < '0' || c > '9') {
        ok = false;
        break;
      }
      const uint64_t d = static_cast<uint64_t>(c - '0');
      if (n > (UINT64_MAX - d) / 10) {
        ok = false;
        break;
      }
      n = n * 10 + d;
    }
    if (!ok) {
      *error = "<" + std::string(element_) + "> attribute " + name + "=\"" +
               std::string(s.substr(0, 40)) + "\" is not an unsigned 64-bit decimal number";
    }
    return n;
  }

 private:
  const char* element_;
  const XML_Char** atts_;
};

void OnStart(void* user, const XML_Char* name, const XML_Char** atts) {
  ParseState& st = *static_cast<ParseState*>(user);
  if (st.error) return;
  const std::string_view n(name);
  Attrs a(name, atts);
  std::string err;
  if (n == "superblock") {
    if (st.where != Where::kTop) return st.Fail("<superblock> must be the document's root");
    const char* uuid = a.Find("uuid");
    st.sb.uuid = uuid != nullptr ? uuid : "";
    st.sb.time = a.Number("time", &err);
    st.sb.transaction = a.Number("transaction", &err);
    st.sb.flags = a.Number("flags", &err);
    st.sb.version = a.Number("version", &err);
    st.sb.data_block_size = a.Number("data_block_size", &err);
    st.sb.nr_data_blocks = a.Number("nr_data_blocks", &err);
    if (!err.empty()) return st.Fail(err);
    if (st.sb.data_block_size == 0) return st.Fail("data_block_size must not be zero");
    st.where = Where::kSuperblock;
    if (Status s = st.handler->OnSuperblock(st.sb); !s.ok()) st.Fail(s);
    return;
  }
  if (n == "device") {
    if (st.where != Where::kSuperblock) {
      return st.Fail("<device> must be a child of <superblock>");
    }
    st.device.dev_id = a.Number("dev_id", &err);
    st.device.mapped_blocks = a.Number("mapped_blocks", &err);
    st.device.transaction = a.Number("transaction", &err);
    st.device.creation_time = a.Number("creation_time", &err);
    st.device.snap_time = a.Number("snap_time", &err);
    if (!err.empty()) return st.Fail(err);
    st.device_blocks = 0;
    st.where = Where::kDevice;
    if (Status s = st.handler->OnDevice(st.device); !s.ok()) st.Fail(s);
    return;
  }
  const bool single = n == "single_mapping";
  if (single || n == "range_mapping") {
    if (st.where != Where::kDevice) {
      return st.Fail("<" + std::string(n) + "> must be a child of <device>");
    }
    ThinRange r;
    if (single) {
      r.origin_begin = a.Number("origin_block", &err);
      r.data_begin = a.Number("data_block", &err);
      r.length = 1;
    } else {
      r.origin_begin = a.Number("origin_begin", &err);
      r.data_begin = a.Number("data_begin", &err);
      r.length = a.Number("length", &err);
    }
    r.time = a.Number("time", &err);
    if (!err.empty()) return st.Fail(err);
    if (r.length == 0) return st.Fail("range_mapping of length 0");
    if (r.origin_begin > UINT64_MAX - r.length) {
      return st.Fail("origin blocks " + std::to_string(r.origin_begin) + " + " +
                     std::to_string(r.length) + " overflow 64 bits");
    }
    if (r.data_begin >= st.sb.nr_data_blocks ||
        r.length > st.sb.nr_data_blocks - r.data_begin) {
      return st.Fail("data blocks " + std::to_string(r.data_begin) + ".." +
                     (r.data_begin > UINT64_MAX - r.length
                          ? std::string("(overflow)")
                          : std::to_string(r.data_begin + r.length - 1)) +
                     " of device " + std::to_string(st.device.dev_id) +
                     " lie beyond the data area (nr_data_blocks=" +
                     std::to_string(st.sb.nr_data_blocks) + ")");
    }
    if (r.length > UINT64_MAX - st.device_blocks) return st.Fail("mapped block count overflows");
    st.device_blocks += r.length;
    st.where = Where::kMapping;
    if (Status s = st.handler->OnMapping(r); !s.ok()) st.Fail(s);
    return;
  }
  st.Fail("unknown element <" + std::string(n) + ">");
}

void OnEnd(void* user, const XML_Char* name) {
  ParseState& st = *static_cast<ParseState*>(user);
  if (st.error) return;
  const std::string_view n(name);
  if (n == "device") {
    if (st.device_blocks != st.device.mapped_blocks) {
      return st.Fail("device " + std::to_string(st.device.dev_id) + " says mapped_blocks=" +
                     std::to_string(st.device.mapped_blocks) + " but its mappings cover " +
                     std::to_string(st.device_blocks) + " blocks");
    }
    st.where = Where::kSuperblock;
    if (Status s = st.handler->OnDeviceEnd(); !s.ok()) st.Fail(s);
  } else if (n == "superblock") {
    st.where = Where::kDone;
  } else {
    st.where = Where::kDevice;  // the end of a mapping (empty elements only)
  }
}

void OnText(void* user, const XML_Char* s, int len) {
  ParseState& st = *static_cast<ParseState*>(user);
  if (st.error) return;
  for (int i = 0; i < len; ++i) {
    const char c = s[i];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
      int end = i;
      while (end < len && end - i < 20 && s[end] != ' ' && s[end] != '\n' && s[end] != '<') ++end;
      return st.Fail("unexpected text '" + std::string(s + i, static_cast<size_t>(end - i)) + "'");
    }
  }
}

void OnDoctype(void* user, const XML_Char*, const XML_Char*, const XML_Char*, int) {
  static_cast<ParseState*>(user)->Fail("DOCTYPE declarations are not allowed");
}

void OnEntity(void* user, const XML_Char*, int, const XML_Char*, int, const XML_Char*,
              const XML_Char*, const XML_Char*, const XML_Char*) {
  static_cast<ParseState*>(user)->Fail("entity declarations are not allowed");
}

class Parser {
 public:
  explicit Parser(ThinXmlHandler* handler) {
    st_.parser = XML_ParserCreate("UTF-8");
    st_.handler = handler;
    XML_SetUserData(st_.parser, &st_);
    XML_SetElementHandler(st_.parser, OnStart, OnEnd);
    XML_SetCharacterDataHandler(st_.parser, OnText);
    XML_SetStartDoctypeDeclHandler(st_.parser, OnDoctype);
    XML_SetEntityDeclHandler(st_.parser, OnEntity);
  }
  ~Parser() { XML_ParserFree(st_.parser); }
  Parser(const Parser&) = delete;
  Parser& operator=(const Parser&) = delete;

  // Feeds one piece; `last` for the final one. Returns the first error.
  Status Feed(const char* data, size_t len, bool last) {
    if (st_.parser == nullptr) return Status::IOError("out of memory creating the XML parser");
    constexpr size_t kMaxPiece = size_t{1} << 30;  // expat takes an int length
    if (len > kMaxPiece) return Status::InvalidArgument("XML piece too large");
    if (XML_Parse(st_.parser, data, static_cast<int>(len), last ? XML_TRUE : XML_FALSE) ==
        XML_STATUS_ERROR) {
      if (st_.error) {
        Status s = *st_.error;
        return s.WithContext(std::to_string(st_.line) + ":" + std::to_string(st_.column));
      }
      return Status::InvalidArgument(
          std::to_string(XML_GetCurrentLineNumber(st_.parser)) + ":" +
          std::to_string(XML_GetCurrentColumnNumber(st_.parser)) + ": " +
          XML_ErrorString(XML_GetErrorCode(st_.parser)));
    }
    if (last && st_.where != Where::kDone) {
      // expat accepts a document whose root is not <superblock> only if
      // OnStart did not object; reaching here means no root at all.
      return Status::InvalidArgument(std::to_string(XML_GetCurrentLineNumber(st_.parser)) + ":" +
                                     std::to_string(XML_GetCurrentColumnNumber(st_.parser)) +
                                     ": no <superblock> element");
    }
    return Status::Ok();
  }

 private:
  ParseState st_;
};

}  // namespace

Status ParseThinXml(std::FILE* in, ThinXmlHandler* handler,
                    const std::function<void(uint64_t bytes)>& progress) {
  Parser p(handler);
  std::vector<char> buf(1 << 20);
  uint64_t total = 0;
  while (true) {
    const size_t n = std::fread(buf.data(), 1, buf.size(), in);
    if (n < buf.size() && std::ferror(in)) return Status::FromErrno(errno, "read");
    const bool last = n < buf.size();
    THINFS_RETURN_IF_ERROR(p.Feed(buf.data(), n, last));
    total += n;
    if (progress) progress(total);
    if (last) return Status::Ok();
  }
}

Status ParseThinXml(const std::string& text, ThinXmlHandler* handler) {
  Parser p(handler);
  return p.Feed(text.data(), text.size(), /*last=*/true);
}

}  // namespace thinfs::meta
