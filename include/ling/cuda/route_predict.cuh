#pragma once
// The router predictor's rows (CudaModel's LING_PREDICT; nvcc only): a MoE layer's router with its RMSNorm weight
// moved onto the layer's attention input, so that the layer's first launch (the attention projections, which stage
// x̂ = RMSNorm(h) ⊙ w_in) computes, beside its own rows, logits that approximate the router's on the MoE input
// RMSNorm(h + attn(h)) ⊙ w_post: P[e, j] = W_router[e, j] · w_post[j] / w_in[j]. The approximation drops only the
// attention's contribution to the residual stream (and the ratio of the two RMS factors). Where w_in[j] is 0 (or the
// ratio is not finite) column j is 0: x̂ carries nothing of h_j there.
// P is stored in the projections' own format, so it joins their launch as one more matrix: block FP8 (scale = the
// 128 × 128 tile's max |value| / 448), BF16 or F32. The predicted picks only steer prefetches into L2 (kda.cuh's
// look-ahead), so P's rounding changes no output of the model.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ling/cuda/device_common.cuh"
#include "ling/cuda/model_ops.cuh"
#include "ling/cuda/runtime.hpp"

namespace ling::cuda {

inline bool route_predictor_format(MatFormat f) {
  return f == MatFormat::kFp8Block || f == MatFormat::kBf16 || f == MatFormat::kF32;
}

namespace kernels {

__device__ __forceinline__ float route_predictor_value(float w, float post, float in) {
  float const v = fabsf(in) > 0.f ? w * (post / in) : 0.f;
  return isfinite(v) ? v : 0.f;
}

// One block per 128 × 128 tile of P (grid: column tiles × row tiles).
template <MatFormat FS>
__global__ void __launch_bounds__(256)
    route_predictor_kernel(ModelMatrix src, float const* w_post, float const* w_in, ModelMatrix dst) {
  __shared__ float s_max[32];
  std::int64_t const rows = src.rows, cols = src.cols;
  std::int64_t const r0 = std::int64_t(blockIdx.y) * 128, c0 = std::int64_t(blockIdx.x) * 128;
  auto value = [&](int t, std::int64_t& r, std::int64_t& c) {
    r = r0 + t / 128, c = c0 + t % 128;
    if (r >= rows || c >= cols) return -1.f;  // outside the matrix (never a value: those are >= 0 in |.|)
    return route_predictor_value(ops::Fmt<FS>::at(src.data, src.scales, rows, cols, r, c), w_post[c], w_in[c]);
  };
  float scale = 1.f;
  if (dst.format == MatFormat::kFp8Block) {
    float amax = 0.f;
    for (int t = int(threadIdx.x); t < 128 * 128; t += int(blockDim.x)) {
      std::int64_t r, c;
      float const v = value(t, r, c);
      if (r < rows && c < cols) amax = fmaxf(amax, fabsf(v));
    }
    amax = dev::block_max(amax, s_max);
    scale = amax > 0.f ? amax / kE4m3Max : 1.f;
    if (threadIdx.x == 0)
      static_cast<float*>(const_cast<void*>(dst.scales))[blockIdx.y * ((cols + 127) / 128) + blockIdx.x] = scale;
  }
  for (int t = int(threadIdx.x); t < 128 * 128; t += int(blockDim.x)) {
    std::int64_t r, c;
    float const v = value(t, r, c);
    if (r >= rows || c >= cols) continue;
    std::int64_t const i = r * cols + c;
    switch (dst.format) {
      case MatFormat::kFp8Block:
        static_cast<E4m3*>(const_cast<void*>(dst.data))[i] = e4m3_from_float(v / scale);
        break;
      case MatFormat::kBf16:
        static_cast<std::uint16_t*>(const_cast<void*>(dst.data))[i] = bf16_from_float(v).bits;
        break;
      default:
        static_cast<float*>(const_cast<void*>(dst.data))[i] = v;
        break;
    }
  }
}

}  // namespace kernels

// P (dst: allocated by the caller, dst.rows × dst.cols = router's, a route_predictor_format) from the router and the
// two RMSNorm weights ([router.cols] fp32 each, device).
inline void build_route_predictor(ModelMatrix const& router, float const* w_post, float const* w_in,
                                  ModelMatrix const& dst, cudaStream_t st = nullptr) {
  require(route_predictor_format(dst.format) && dst.rows == router.rows && dst.cols == router.cols && dst.data &&
              (dst.format != MatFormat::kFp8Block || dst.scales),
          ErrorCode::kInternal, "route predictor: bad destination");
  dim3 const grid(unsigned((router.cols + 127) / 128), unsigned((router.rows + 127) / 128));
  ops::dispatch_format(router.format, [&](auto f) {
    kernels::route_predictor_kernel<decltype(f)::value><<<grid, 256, 0, st>>>(router, w_post, w_in, dst);
  });
  check_launch("route predictor");
}

}  // namespace ling::cuda
