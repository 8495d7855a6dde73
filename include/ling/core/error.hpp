#pragma once
// ling::Error: every failure at the API is one of these, with a code and a message that names the
// file, tensor or field at fault. Headers never exit() or abort().
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace ling {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,  // a caller passed something out of range (token id, flag value)
  kIo,               // a file could not be opened, mapped or read
  kFormat,           // a file is malformed (safetensors header, JSON, tokenizer.json)
  kConfig,           // config.json is inconsistent or does not fit the requested spec
  kMissingTensor,    // a checkpoint lacks a tensor the model needs
  kUnexpectedTensor, // a checkpoint holds a tensor the model does not know
  kShape,            // a tensor has the wrong shape or dtype
  kOutOfRange,       // context overflow, index past an end
  kOutOfMemory,      // host or device memory does not suffice
  kUnsupported,      // a feature this build or backend does not implement
  kCuda,             // a CUDA call failed
  kInternal,         // a broken invariant inside the library
};

constexpr std::string_view to_string(ErrorCode c) noexcept {
  switch (c) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kIo: return "i/o error";
    case ErrorCode::kFormat: return "format error";
    case ErrorCode::kConfig: return "config error";
    case ErrorCode::kMissingTensor: return "missing tensor";
    case ErrorCode::kUnexpectedTensor: return "unexpected tensor";
    case ErrorCode::kShape: return "shape error";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kOutOfMemory: return "out of memory";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kCuda: return "cuda error";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown error";
}

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string const& message)
      : std::runtime_error(std::string(to_string(code)) + ": " + message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// Status: what launchers and can_implement() return; the runtime turns a failed one into an Error.
class Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }
  bool is_ok() const noexcept { return code_ == ErrorCode::kOk; }
  explicit operator bool() const noexcept { return is_ok(); }
  ErrorCode code() const noexcept { return code_; }
  std::string const& message() const noexcept { return message_; }
  void throw_if_error() const {
    if (!is_ok()) throw Error(code_, message_);
  }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

[[noreturn]] inline void fail(ErrorCode code, std::string const& message) { throw Error(code, message); }

inline void require(bool condition, ErrorCode code, std::string const& message) {
  if (!condition) fail(code, message);
}

}  // namespace ling
