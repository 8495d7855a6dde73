#pragma once
// Weights made on the GPU from a seed, in the storage formats of the -fp4 checkpoints (spec §3), so `ling bench`
// can run full-size Ling-3.0-flash without a 70 GB file and without a host copy. Values are counter-based hashes of
// (seed, tensor, index): the same seed gives the same model. Magnitudes are realistic: matrices ~ N(0, 1/cols) with
// power-of-two block scales that vary by ±1 octave between blocks (MXFP4: per 32 inputs; FP8: per 128×128 block).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string_view>

#include "ling/cuda/device_common.cuh"
#include "ling/cuda/model_ops.cuh"
#include "ling/cuda/runtime.hpp"

namespace ling::cuda::rnd {

inline std::uint64_t name_seed(std::uint64_t seed, std::string_view name) {
  std::uint64_t h = 1469598103934665603ull ^ seed;
  for (char c : name) h = (h ^ std::uint8_t(c)) * 1099511628211ull;
  return dev::mix64(h);
}

__device__ __forceinline__ int octave_jitter(std::uint64_t h) { return int(h % 3) - 1; }

__global__ void fill_fp8_block_kernel(E4m3* w, float* s, std::int64_t rows, std::int64_t cols, std::uint64_t seed, float sigma) {
  std::int64_t const nbc = (cols + 127) / 128, nblocks = ((rows + 127) / 128) * nbc;
  std::int64_t const stride = std::int64_t(gridDim.x) * blockDim.x;
  float const base = exp2f(rintf(log2f(sigma * 3.5f / 448.f)));
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < nblocks; i += stride)
    s[i] = base * exp2f(float(octave_jitter(dev::mix64(seed ^ (std::uint64_t(i) * 0x51ED27u)))));
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * cols; i += stride) {
    std::int64_t r = i / cols, c = i % cols;
    std::int64_t blk = (r / 128) * nbc + c / 128;
    float sc = base * exp2f(float(octave_jitter(dev::mix64(seed ^ (std::uint64_t(blk) * 0x51ED27u)))));
    float v = sigma * dev::normalish(dev::mix64(seed + 0x9E37ull * std::uint64_t(i) + 1));
    w[i] = e4m3_from_float(v / sc);
  }
}

__global__ void fill_mxfp4_kernel(std::uint8_t* w, std::uint8_t* s, std::int64_t rows, std::int64_t cols, std::uint64_t seed, float sigma) {
  std::int64_t const nb = cols / 32, nbytes = rows * (cols / 2);
  std::int64_t const stride = std::int64_t(gridDim.x) * blockDim.x;
  int const e0 = int(ceilf(log2f(sigma * 2.5f / 6.f)));
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * nb; i += stride)
    s[i] = std::uint8_t(127 + e0 + octave_jitter(dev::mix64(seed ^ (std::uint64_t(i) * 0xA24BAEDull))));
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < nbytes; i += stride) {
    std::int64_t r = i / (cols / 2), c = (i % (cols / 2)) * 2;
    std::int64_t blk = r * nb + c / 32;
    float sc = exp2f(float(e0 + octave_jitter(dev::mix64(seed ^ (std::uint64_t(blk) * 0xA24BAEDull)))));
    std::uint64_t h = dev::mix64(seed + 0x9E37ull * std::uint64_t(i) + 7);
    float v0 = sigma * dev::normalish(h), v1 = sigma * dev::normalish(dev::mix64(h));
    w[i] = std::uint8_t(e2m1_from_float(v0 / sc) | (e2m1_from_float(v1 / sc) << 4));
  }
}

__global__ void fill_bf16_kernel(std::uint16_t* w, std::int64_t n, std::uint64_t seed, float sigma) {
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    w[i] = bf16_from_float(sigma * dev::normalish(dev::mix64(seed + 0x9E37ull * std::uint64_t(i) + 3))).bits;
}

// f32: mean + sigma·z, or (log_uniform) log(U(1, 16)) for A_log
__global__ void fill_f32_kernel(float* p, std::int64_t n, std::uint64_t seed, float mean, float sigma, bool log_uniform) {
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    std::uint64_t h = dev::mix64(seed + 0x9E37ull * std::uint64_t(i) + 5);
    p[i] = log_uniform ? logf(1.f + 15.f * dev::uniform01(h)) : mean + sigma * dev::normalish(h);
  }
}

inline unsigned fill_grid() { return 132 * 16; }

inline void fill_matrix(ModelMatrix const& m, std::uint64_t seed, float sigma, cudaStream_t st = nullptr) {
  switch (m.format) {
    case MatFormat::kFp8Block:
      fill_fp8_block_kernel<<<fill_grid(), 256, 0, st>>>(static_cast<E4m3*>(const_cast<void*>(m.data)),
                                                        static_cast<float*>(const_cast<void*>(m.scales)), m.rows, m.cols, seed, sigma);
      break;
    case MatFormat::kMxfp4:
      fill_mxfp4_kernel<<<fill_grid(), 256, 0, st>>>(static_cast<std::uint8_t*>(const_cast<void*>(m.data)),
                                                    static_cast<std::uint8_t*>(const_cast<void*>(m.scales)), m.rows, m.cols, seed, sigma);
      break;
    case MatFormat::kBf16:
      fill_bf16_kernel<<<fill_grid(), 256, 0, st>>>(static_cast<std::uint16_t*>(const_cast<void*>(m.data)), m.rows * m.cols, seed, sigma);
      break;
    case MatFormat::kF32:
      fill_f32_kernel<<<fill_grid(), 256, 0, st>>>(static_cast<float*>(const_cast<void*>(m.data)), m.rows * m.cols, seed, 0.f, sigma, false);
      break;
    default: fail(ErrorCode::kUnsupported, "random weights: no generator for format " + std::string(to_string(m.format)));
  }
  check_launch("random fill");
}

inline void fill_vector(float* p, std::int64_t n, std::uint64_t seed, float mean, float sigma, bool log_uniform = false,
                        cudaStream_t st = nullptr) {
  fill_f32_kernel<<<fill_grid(), 256, 0, st>>>(p, n, seed, mean, sigma, log_uniform);
  check_launch("random fill");
}

// Online FP8-row quantization (quant::Fp8Row::quantize on the device): row r's scale maps max |w[r,:]| to 448.
template <MatFormat F>
__global__ void __launch_bounds__(256) quantize_fp8_rows_kernel(ModelMatrix src, E4m3* dst, float* scales) {
  __shared__ float scratch[32];
  std::int64_t const r = blockIdx.x;
  float amax = 0.f;
  for (std::int64_t c = threadIdx.x; c < src.cols; c += blockDim.x)
    amax = fmaxf(amax, fabsf(ops::Fmt<F>::at(src.data, src.scales, src.rows, src.cols, r, c)));
  amax = dev::block_max(amax, scratch);
  float const scale = amax > 0.f ? amax / kE4m3Max : 1.f;
  if (threadIdx.x == 0) scales[r] = scale;
  for (std::int64_t c = threadIdx.x; c < src.cols; c += blockDim.x)
    dst[r * src.cols + c] = e4m3_from_float(ops::Fmt<F>::at(src.data, src.scales, src.rows, src.cols, r, c) / scale);
}

inline void quantize_fp8_rows(ModelMatrix const& src, E4m3* dst, float* scales, cudaStream_t st = nullptr) {
  ops::dispatch_format(src.format, [&](auto f) {
    quantize_fp8_rows_kernel<decltype(f)::value><<<unsigned(src.rows), 256, 0, st>>>(src, dst, scales);
  });
  check_launch("quantize lm head");
}

// Random cache contents (bench contexts): bf16 N(0,1) rows, fp32 states N(0, sigma²).
inline void fill_bf16_values(std::uint16_t* p, std::int64_t n, std::uint64_t seed, float sigma, cudaStream_t st = nullptr) {
  fill_bf16_kernel<<<fill_grid(), 256, 0, st>>>(p, n, seed, sigma);
  check_launch("random cache");
}

}  // namespace ling::cuda::rnd
