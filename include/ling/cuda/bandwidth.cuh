#pragma once
// Streaming-read bandwidth kernel (declaration in bandwidth.hpp). nvcc only.
// Each thread keeps four independent 16-byte loads in flight (grid-stride), folds them with xor, and writes only if
// the fold equals a value it cannot know in advance, so the loads cannot be optimised away.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "ling/cuda/bandwidth.hpp"
#include "ling/cuda/runtime.hpp"

namespace ling::cuda::kernels {

template <int kUnused = 0>
__global__ void __launch_bounds__(512) read_bandwidth_kernel(uint4 const* __restrict__ p, std::size_t n,
                                                             std::uint32_t sentinel, std::uint32_t* sink) {
  std::size_t const stride = std::size_t(gridDim.x) * blockDim.x;
  std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  std::uint32_t acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a, b, c, d;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a.x), "=r"(a.y), "=r"(a.z), "=r"(a.w) : "l"(p + i));
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(b.x), "=r"(b.y), "=r"(b.z), "=r"(b.w) : "l"(p + i + stride));
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(c.x), "=r"(c.y), "=r"(c.z), "=r"(c.w) : "l"(p + i + 2 * stride));
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(d.x), "=r"(d.y), "=r"(d.z), "=r"(d.w) : "l"(p + i + 3 * stride));
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    uint4 a = p[i];
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == sentinel) *sink = acc;
}

template <int kUnused = 0>
__global__ void fill_pattern_kernel(uint4* p, std::size_t n) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint32_t h = std::uint32_t(i) * 2654435761u;
    p[i] = make_uint4(h, h ^ 0x9E3779B9u, h + 0x7F4A7C15u, ~h);
  }
}

}  // namespace ling::cuda::kernels

namespace ling::cuda {

template <int kVecBytes>
BandwidthResult measure_read_bandwidth(std::size_t bytes, int reps) {
  static_assert(kVecBytes == 16, "the read kernel issues 16-byte loads");
  std::size_t const n = bytes / 16;
  require(n > 0 && reps > 0, ErrorCode::kInvalidArgument, "measure_read_bandwidth: bytes and reps must be positive");
  DeviceBuffer buf(n * 16, "bandwidth buffer"), sink(64, "bandwidth sink");
  int dev = 0, sms = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "multiprocessor count");
  kernels::fill_pattern_kernel<><<<sms * 8, 256>>>(buf.data<uint4>(), n);
  check(cudaGetLastError(), "bandwidth fill");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "cudaEventCreate");
  check(cudaEventCreate(&e1), "cudaEventCreate");
  int const blocks = sms * 4;
  BandwidthResult best;
  best.bytes = n * 16;
  for (int it = -1; it < reps; ++it) {  // it = -1: warm-up
    check(cudaEventRecord(e0), "cudaEventRecord");
    kernels::read_bandwidth_kernel<><<<blocks, 512>>>(buf.data<uint4>(), n, 0x12345678u ^ std::uint32_t(it), sink.data<std::uint32_t>());
    check(cudaGetLastError(), "read_bandwidth_kernel");
    check(cudaEventRecord(e1), "cudaEventRecord");
    check(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float ms = 0.f;
    check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    if (it >= 0 && (best.best_ms == 0 || ms < best.best_ms)) best.best_ms = ms;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  best.gb_per_s = double(best.bytes) / (best.best_ms * 1e-3) / 1e9;
  return best;
}

}  // namespace ling::cuda
