#pragma once
// Host-side CUDA helpers shared by every CUDA file: error conversion, an owning device buffer, device presence.
// Compiles with a plain C++ compiler (only the runtime API header); kernels live in *.cuh.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdlib>
#include <string>
#include <utility>

#include "ling/core/error.hpp"

namespace ling::cuda {

inline Status to_status(cudaError_t e, std::string const& what) {
  if (e == cudaSuccess) return Status::ok();
  ErrorCode code = e == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kCuda;
  return Status(code, what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
inline void check(cudaError_t e, std::string const& what) { to_status(e, what).throw_if_error(); }
// After a launch: the launch error, then (in debug or when asked) the asynchronous one.
inline void check_launch(std::string const& what) { check(cudaGetLastError(), what); }

// An A/B switch of the environment turned off: `name` set to a value starting with '0' (unset: on).
inline bool env_off(char const* name) {
  char const* e = std::getenv(name);
  return e && *e == '0';
}
// An opt-in switch of the environment turned on: `name` set to a value starting with '1' (unset: off).
inline bool env_on(char const* name) {
  char const* e = std::getenv(name);
  return e && *e == '1';
}
// A numbered setting of the environment: the digit `name`'s value starts with, when it is 1..hi; else 0 (unset: 0).
inline int env_level(char const* name, int hi) {
  char const* e = std::getenv(name);
  return e && *e >= '1' && *e - '0' <= hi ? *e - '0' : 0;
}

// A number set in the environment (its value by std::atoi), or `fallback` when `name` is unset.
inline int env_int(char const* name, int fallback) {
  char const* e = std::getenv(name);
  return e ? std::atoi(e) : fallback;
}
// An attribute of the current device, or 0 when it cannot be read.
inline int current_device_attribute(cudaDeviceAttr attr) {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess) v = 0;
  return v;
}

inline bool device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

// An owning allocation of device memory. Allocation failure is kOutOfMemory naming what was asked for.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes, std::string const& what = "device buffer") : bytes_(bytes) {
    if (bytes == 0) return;
    cudaError_t e = cudaMalloc(&ptr_, bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      std::size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      fail(ErrorCode::kOutOfMemory, what + ": cannot allocate " + std::to_string(bytes) + " bytes on the GPU (" +
                                        std::to_string(free_b) + " of " + std::to_string(total_b) + " free)");
    }
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(DeviceBuffer const&) = delete;
  DeviceBuffer& operator=(DeviceBuffer const&) = delete;
  ~DeviceBuffer() { reset(); }

  void reset() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <class T = void>
  T* data() const { return static_cast<T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }
  void upload(void const* host, std::size_t n, std::size_t offset = 0) {
    check(cudaMemcpy(static_cast<char*>(ptr_) + offset, host, n, cudaMemcpyHostToDevice), "upload");
  }
  void download(void* host, std::size_t n, std::size_t offset = 0) const {
    check(cudaMemcpy(host, static_cast<char const*>(ptr_) + offset, n, cudaMemcpyDeviceToHost), "download");
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace ling::cuda
