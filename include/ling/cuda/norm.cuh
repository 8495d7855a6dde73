#pragma once
// RMSNorm kernel: one block per row. The model fuses RMSNorm into the matvec that consumes it
// (model_ops.cuh, Prologue::kRmsNorm); this standalone form serves prefill and tests.
#include "ling/cuda/device_common.cuh"
#include "ling/cuda/norm.hpp"
#include "ling/cuda/runtime.hpp"

namespace ling::cuda {

template <int = 0>  // a template, so that every translation unit of a program may hold it
__global__ void __launch_bounds__(256) rms_norm_kernel(RmsNormArgs a) {
  __shared__ float scratch[32];
  float const* x = a.x + std::int64_t(blockIdx.x) * a.dim;
  float* y = a.y + std::int64_t(blockIdx.x) * a.dim;
  float ss = 0.f;
  for (std::int64_t i = threadIdx.x; i < a.dim; i += blockDim.x) ss += x[i] * x[i];
  float inv = rsqrtf(dev::block_sum(ss, scratch) / float(a.dim) + a.eps);
  for (std::int64_t i = threadIdx.x; i < a.dim; i += blockDim.x) y[i] = a.w[i] * (x[i] * inv);
}

inline void rms_norm(RmsNormArgs const& a, cudaStream_t st = nullptr) {
  if (a.rows <= 0) return;
  require(a.dim > 0, ErrorCode::kInvalidArgument, "rms_norm: dim must be > 0");
  rms_norm_kernel<0><<<unsigned(a.rows), 256, 0, st>>>(a);
  check_launch("rms_norm");
}

}  // namespace ling::cuda
