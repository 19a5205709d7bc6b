// Status and Result<T>: the error vocabulary of thinfs.
//
// A Status is either OK or carries a Code, an optional saved errno and a
// human-readable message with context ("pwrite pool: Input/output error").
// Result<T> holds either a T or a non-OK Status. Both are [[nodiscard]]:
// every fallible call's outcome must be looked at.
//
// Thread safety: values; distinct objects may be used from distinct threads.

#ifndef THINFS_CORE_STATUS_H_
#define THINFS_CORE_STATUS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace thinfs {

class [[nodiscard]] Status {
 public:
  enum class Code : uint8_t {
    kOk = 0,
    kNotFound,
    kExists,
    kNoSpace,
    kReadOnly,
    kInvalidArgument,
    kNameTooLong,
    kIOError,
    kCorruption,
    kBusy,
    kNotSupported,
    kPermissionDenied,
    kNotEmpty,
  };

  Status() = default;

  static Status Ok() { return Status(); }
  static Status NotFound(std::string msg) { return {Code::kNotFound, std::move(msg)}; }
  static Status Exists(std::string msg) { return {Code::kExists, std::move(msg)}; }
  static Status NoSpace(std::string msg) { return {Code::kNoSpace, std::move(msg)}; }
  static Status ReadOnly(std::string msg) { return {Code::kReadOnly, std::move(msg)}; }
  static Status InvalidArgument(std::string msg) {
    return {Code::kInvalidArgument, std::move(msg)};
  }
  static Status NameTooLong(std::string msg) { return {Code::kNameTooLong, std::move(msg)}; }
  static Status IOError(std::string msg) { return {Code::kIOError, std::move(msg)}; }
  static Status Corruption(std::string msg) { return {Code::kCorruption, std::move(msg)}; }
  static Status Busy(std::string msg) { return {Code::kBusy, std::move(msg)}; }
  static Status NotSupported(std::string msg) { return {Code::kNotSupported, std::move(msg)}; }
  static Status PermissionDenied(std::string msg) {
    return {Code::kPermissionDenied, std::move(msg)};
  }
  static Status NotEmpty(std::string msg) { return {Code::kNotEmpty, std::move(msg)}; }

  // Keeps `err` (an errno value) and prefixes `context` to strerror(err).
  // ENOSPC becomes kNoSpace, EROFS kReadOnly, ENOENT kNotFound, EEXIST
  // kExists, EACCES/EPERM kPermissionDenied, EWOULDBLOCK kBusy; anything
  // else is kIOError with the errno saved.
  static Status FromErrno(int err, const std::string& context);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  // The saved errno, or 0 when the status did not come from one.
  int saved_errno() const { return errno_; }
  const std::string& message() const { return msg_; }

  bool IsNotFound() const { return code_ == Code::kNotFound; }
  bool IsNoSpace() const { return code_ == Code::kNoSpace; }
  bool IsCorruption() const { return code_ == Code::kCorruption; }
  bool IsInvalidArgument() const { return code_ == Code::kInvalidArgument; }

  // "Corruption: bitmap header checksum mismatch (expected ..., found ...)".
  std::string ToString() const;
  static const char* CodeName(Code code);

  // Returns a copy with `context + ": "` prefixed to the message.
  Status WithContext(const std::string& context) const;

 private:
  Status(Code code, std::string msg, int err = 0)
      : code_(code), errno_(err), msg_(std::move(msg)) {}

  Code code_ = Code::kOk;
  int errno_ = 0;
  std::string msg_;
};

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).ok()) v_ = Status::IOError("Result built from an OK Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }

  // REQUIRES: ok().
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace thinfs

// Returns early from the calling function when `expr` is not OK.
#define THINFS_RETURN_IF_ERROR(expr)            \
  do {                                          \
    ::thinfs::Status thinfs_status_ = (expr);   \
    if (!thinfs_status_.ok()) return thinfs_status_; \
  } while (0)

#define THINFS_CONCAT_INNER_(a, b) a##b
#define THINFS_CONCAT_(a, b) THINFS_CONCAT_INNER_(a, b)

// `THINFS_ASSIGN_OR_RETURN(auto x, F());` assigns F()'s value or returns its
// Status from the calling function.
#define THINFS_ASSIGN_OR_RETURN(lhs, rexpr)                                \
  auto THINFS_CONCAT_(thinfs_result_, __LINE__) = (rexpr);                 \
  if (!THINFS_CONCAT_(thinfs_result_, __LINE__).ok())                      \
    return THINFS_CONCAT_(thinfs_result_, __LINE__).status();              \
  lhs = std::move(THINFS_CONCAT_(thinfs_result_, __LINE__)).value()

#endif  // THINFS_CORE_STATUS_H_
