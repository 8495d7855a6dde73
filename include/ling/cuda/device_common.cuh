#pragma once
// Device helpers shared by the model kernels (norm, embedding, KDA, MLA, the private matvec/MoE/head paths):
// warp/block reductions, vector loads, fast decoding of E4M3 / E2M1 / BF16 into fp32. nvcc only.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ling/core/dtypes.hpp"

namespace ling::cuda::dev {

inline constexpr int kWarp = 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A reduction over the whole block (warp_reduce within warps, then across the warps' results; lanes past the last
// warp contribute `identity`); `scratch` holds >= 32 floats. Every thread gets the result.
template <class WarpReduce>
__device__ __forceinline__ float block_reduce(float v, float* scratch, WarpReduce warp_reduce, float identity) {
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_reduce(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_reduce(lane < nwarps ? scratch[lane] : identity);
}
// Sum over the whole block; `scratch` holds >= 32 floats. Every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  return block_reduce(
      v, scratch, [](float x) { return warp_sum(x); }, 0.f);
}
// Maximum over the whole block; `scratch` holds >= 32 floats. Every thread gets the result.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce(
      v, scratch, [](float x) { return warp_max(x); }, __int_as_float(0xff800000));  // -inf
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.0f + __expf(-x)); }
__device__ __forceinline__ float softplusf_(float x) { return x > 20.f ? x : log1pf(__expf(x)); }

__device__ __forceinline__ float bf16_to_float(std::uint16_t b) { return __uint_as_float(std::uint32_t(b) << 16); }

// 4 E4M3 bytes (little end = first element) -> 4 floats, through the hardware fp8x2 -> half2 conversion.
__device__ __forceinline__ void e4m3x4_to_float(std::uint32_t w, float* out) {
  __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w & 0xFFFFu), __NV_E4M3);
  __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w >> 16), __NV_E4M3);
  float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
  out[0] = a.x;
  out[1] = a.y;
  out[2] = b.x;
  out[3] = b.y;
}

// 8 E2M1 codes of a 32-bit word (element 2i in the low nibble of byte i, 2i+1 in the high one) -> 8 floats,
// each 2^-14 times its true value (the code's bits placed in a half's exponent/mantissa; fold 2^14 into the scale).
__device__ __forceinline__ void e2m1x8_to_float_scaled(std::uint32_t w, float* out) {
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    std::uint32_t t = (w >> (8 * b)) & 0xFFu;
    std::uint32_t pair = (t & 0xFu) | ((t & 0xF0u) << 12);  // element 2b at bits 0..3, 2b+1 at bits 16..19
    std::uint32_t h = ((pair & 0x00070007u) << 9) | ((pair & 0x00080008u) << 12);
    __half2_raw r;
    r.x = std::uint16_t(h & 0xFFFFu);
    r.y = std::uint16_t(h >> 16);
    float2 f = __half22float2(__half2(r));
    out[2 * b] = f.x;
    out[2 * b + 1] = f.y;
  }
}
inline constexpr float kE2m1HalfFactor = 16384.0f;  // 2^14

__device__ __forceinline__ float ue8m0_to_float(std::uint8_t s) {
  if (s == 0xFF) return __uint_as_float(0x7FC00000u);
  if (s == 0) return __uint_as_float(0x00400000u);
  return __uint_as_float(std::uint32_t(s) << 23);
}

// Cheap counter-based random numbers (splitmix64 finalizer): uniform in [0,1) and approximately normal.
__host__ __device__ __forceinline__ std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__device__ __forceinline__ float uniform01(std::uint64_t h) { return float(h >> 40) * (1.0f / 16777216.0f); }
// Irwin-Hall of 4 uniforms from one hash: mean 0, variance 1, tails clipped at ±3.46.
__device__ __forceinline__ float normalish(std::uint64_t h) {
  float s = float(h & 0xFFFFu) + float((h >> 16) & 0xFFFFu) + float((h >> 32) & 0xFFFFu) + float(h >> 48);
  return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

}  // namespace ling::cuda::dev
