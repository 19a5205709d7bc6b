#include "core/admin_wire.h"

#include <cstdint>
#include <cstdio>

namespace thinfs {

const std::string* AdminRequest::Find(std::string_view key) const {
  for (const auto& [k, v] : args) {
    if (k == key) return &v;
  }
  return nullptr;
}

AdminReply AdminReply::Error(int exit_code, std::string message) {
  AdminReply r;
  r.exit_code = exit_code;
  r.error = std::move(message);
  // One line on stderr, whatever the message holds.
  for (char& c : r.error) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return r;
}

// --- Wire format -------------------------------------------------------------

namespace {

constexpr std::string_view kVersionLine = "thinfs-admin=1";
constexpr size_t kMaxKey = 32;

bool ValidKey(std::string_view key) {
  if (key.empty() || key.size() > kMaxKey) return false;
  for (char c : key) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
              c == '-';
    if (!ok) return false;
  }
  return true;
}

bool Plain(unsigned char c) { return c >= 0x21 && c <= 0x7e && c != '%'; }

void AppendEscaped(std::string_view value, std::string* out) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (char ch : value) {
    auto c = static_cast<unsigned char>(ch);
    if (Plain(c)) {
      out->push_back(ch);
    } else {
      out->push_back('%');
      out->push_back(kHex[c >> 4]);
      out->push_back(kHex[c & 0xf]);
    }
  }
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;  // lower case is not canonical
}

Result<std::string> Unescape(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    auto c = static_cast<unsigned char>(in[i]);
    if (c != '%') {
      if (!Plain(c)) return Status::InvalidArgument("unescaped byte in a value");
      out.push_back(static_cast<char>(c));
      continue;
    }
    if (i + 2 >= in.size()) {
      return Status::InvalidArgument("truncated escape");
    }
    int hi = HexDigit(in[i + 1]);
    int lo = HexDigit(in[i + 2]);
    if (hi < 0 || lo < 0) return Status::InvalidArgument("bad escape");
    auto decoded = static_cast<unsigned char>(hi * 16 + lo);
    if (Plain(decoded)) return Status::InvalidArgument("needless escape");
    out.push_back(static_cast<char>(decoded));
    i += 2;
  }
  return out;
}

void AppendLine(std::string_view key, std::string_view value, std::string* out) {
  out->append(key);
  out->push_back('=');
  AppendEscaped(value, out);
  out->push_back('\n');
}

std::string Frame(std::string body) {
  std::string frame(kAdminFrameHeader, '\0');
  auto n = static_cast<uint32_t>(body.size());
  for (size_t i = 0; i < kAdminFrameHeader; ++i) {
    frame[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  }
  frame += body;
  return frame;
}

// Splits a frame's body into (key, decoded value) lines.
Result<std::vector<std::pair<std::string, std::string>>> SplitBody(std::string_view frame,
                                                                   size_t max_frame) {
  THINFS_ASSIGN_OR_RETURN(size_t body_len,
                          DecodeAdminFrameHeader(frame.substr(0, kAdminFrameHeader), max_frame));
  if (frame.size() != kAdminFrameHeader + body_len) {
    return Status::InvalidArgument("frame length " + std::to_string(frame.size()) +
                                   " does not match its header (" +
                                   std::to_string(kAdminFrameHeader + body_len) + ")");
  }
  std::string_view body = frame.substr(kAdminFrameHeader);
  std::vector<std::pair<std::string, std::string>> lines;
  while (!body.empty()) {
    size_t nl = body.find('\n');
    if (nl == std::string_view::npos) return Status::InvalidArgument("unterminated line");
    std::string_view line = body.substr(0, nl);
    body.remove_prefix(nl + 1);
    size_t eq = line.find('=');
    if (eq == std::string_view::npos) return Status::InvalidArgument("line without '='");
    std::string_view key = line.substr(0, eq);
    if (!ValidKey(key)) return Status::InvalidArgument("bad key");
    THINFS_ASSIGN_OR_RETURN(std::string value, Unescape(line.substr(eq + 1)));
    lines.emplace_back(std::string(key), std::move(value));
  }
  return lines;
}

}  // namespace

Result<size_t> DecodeAdminFrameHeader(std::string_view header, size_t max_frame) {
  if (header.size() != kAdminFrameHeader) return Status::InvalidArgument("truncated frame header");
  uint32_t n = 0;
  for (size_t i = 0; i < kAdminFrameHeader; ++i) {
    n |= static_cast<uint32_t>(static_cast<unsigned char>(header[i])) << (8 * i);
  }
  if (n > max_frame - kAdminFrameHeader) {
    return Status::InvalidArgument("message of " + std::to_string(n) + " bytes exceeds the " +
                                   std::to_string(max_frame) + "-byte limit");
  }
  return static_cast<size_t>(n);
}

Result<std::string> EncodeAdminRequest(const AdminRequest& request) {
  if (!ValidKey(request.command)) {
    return Status::InvalidArgument("bad command '" + request.command + "'");
  }
  if (request.args.size() > kAdminMaxArgs) return Status::InvalidArgument("too many arguments");
  std::string body;
  body.append(kVersionLine).push_back('\n');
  AppendLine("command", request.command, &body);
  for (const auto& [key, value] : request.args) {
    if (!ValidKey(key) || key == "command" || key == "thinfs-admin") {
      return Status::InvalidArgument("bad argument name '" + key + "'");
    }
    AppendLine(key, value, &body);
  }
  if (body.size() > kAdminMaxRequestFrame - kAdminFrameHeader) {
    return Status::InvalidArgument("request too large (" + std::to_string(body.size()) +
                                   " bytes)");
  }
  return Frame(std::move(body));
}

Result<AdminRequest> DecodeAdminRequest(std::string_view frame) {
  THINFS_ASSIGN_OR_RETURN(auto lines, SplitBody(frame, kAdminMaxRequestFrame));
  if (lines.size() < 2 || lines[0].first != "thinfs-admin" || lines[0].second != "1") {
    return Status::InvalidArgument("not a thinfs-admin version 1 request");
  }
  if (lines[1].first != "command" || !ValidKey(lines[1].second)) {
    return Status::InvalidArgument("request without a valid command");
  }
  if (lines.size() - 2 > kAdminMaxArgs) return Status::InvalidArgument("too many arguments");
  AdminRequest req;
  req.command = lines[1].second;
  for (size_t i = 2; i < lines.size(); ++i) {
    const std::string& key = lines[i].first;
    if (key == "command" || key == "thinfs-admin" || req.Find(key) != nullptr) {
      return Status::InvalidArgument("duplicate argument '" + key + "'");
    }
    req.args.emplace_back(key, std::move(lines[i].second));
  }
  return req;
}

std::string EncodeAdminReply(const AdminReply& reply) {
  auto encode = [](const AdminReply& r) {
    std::string body;
    body.append(kVersionLine).push_back('\n');
    int code = (r.exit_code < 0 || r.exit_code > 255) ? kAdminFailure : r.exit_code;
    AppendLine("exit", std::to_string(code), &body);
    AppendLine("text", r.text, &body);
    AppendLine("json", r.json, &body);
    AppendLine("error", r.error, &body);
    return body;
  };
  std::string body = encode(reply);
  if (body.size() > kAdminMaxReplyFrame - kAdminFrameHeader) {
    body = encode(AdminReply::Error(
        kAdminFailure, "reply too large (" + std::to_string(body.size()) + " bytes)"));
  }
  return Frame(std::move(body));
}

Result<AdminReply> DecodeAdminReply(std::string_view frame) {
  THINFS_ASSIGN_OR_RETURN(auto lines, SplitBody(frame, kAdminMaxReplyFrame));
  static const char* const kKeys[] = {"thinfs-admin", "exit", "text", "json", "error"};
  if (lines.size() != 5) return Status::InvalidArgument("reply must have 5 lines");
  for (size_t i = 0; i < 5; ++i) {
    if (lines[i].first != kKeys[i]) {
      return Status::InvalidArgument(std::string("reply line ") + std::to_string(i + 1) +
                                     " must be '" + kKeys[i] + "'");
    }
  }
  if (lines[0].second != "1") return Status::InvalidArgument("unknown reply version");
  const std::string& e = lines[1].second;
  bool digits = !e.empty() && e.size() <= 3 && (e.size() == 1 || e[0] != '0');
  for (char c : e) digits = digits && c >= '0' && c <= '9';
  if (!digits || std::stoi(e) > 255) return Status::InvalidArgument("bad exit code");
  AdminReply r;
  r.exit_code = std::stoi(e);
  r.text = std::move(lines[2].second);
  r.json = std::move(lines[3].second);
  r.error = std::move(lines[4].second);
  return r;
}

}  // namespace thinfs
