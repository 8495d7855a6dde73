#pragma once
// LM head kernels (declarations in lm_head.hpp). nvcc only.
// quantize_fp8_rows: one warp per row: amax, scale = amax / 448 (1 for an all-zero row), E4M3 = satfinite(x / scale)
// rounded to nearest even — the same arithmetic as quant::Fp8Row::quantize, so the bytes are identical.
// launch_lm_head: the matvec kernel with its argmax epilogue (block maximum, one 64-bit atomicMax per block, the last
// block writes the id and re-arms the workspace).
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "ling/cuda/linear.cuh"
#include "ling/cuda/lm_head.hpp"

namespace ling::cuda::kernels {

template <class Src>
__device__ __forceinline__ float load_elem(MatrixArgs const& m, std::int64_t r, std::int64_t c) {
  using S = typename Src::storage_type;
  auto const* w = static_cast<S const*>(m.data);
  if constexpr (has_fast_kernel<Src>) {
    if constexpr (std::is_same_v<S, float>) return w[r * m.ld + c];
    else return to_float(w[r * m.ld + c]);
  } else {
    return Src::decode(w, static_cast<typename Src::scale_type const*>(m.scales), m.rows, m.cols, r, c);
  }
}

template <class K>
__global__ void __launch_bounds__(kThreads) quantize_fp8_rows_kernel(MatrixArgs src, MatrixArgs dst) {
  using Src = policy_of<K>;
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  auto* out = static_cast<__nv_fp8_storage_t*>(const_cast<void*>(dst.data));
  auto* scales = static_cast<float*>(const_cast<void*>(dst.scales));
  for (std::int64_t r = std::int64_t(blockIdx.x) * kWarps + warp; r < src.rows; r += std::int64_t(gridDim.x) * kWarps) {
    float amax = 0.f;
    for (std::int64_t c = lane; c < src.cols; c += 32) amax = fmaxf(amax, fabsf(load_elem<Src>(src, r, c)));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float const scale = amax > 0.f ? amax / 448.0f : 1.0f;
    if (lane == 0) scales[r] = scale;
    for (std::int64_t c = lane; c < dst.ld; c += 32)
      out[r * dst.ld + c] = c < src.cols ? __nv_cvt_float_to_fp8(load_elem<Src>(src, r, c) / scale, __NV_SATFINITE, __NV_E4M3)
                                         : __nv_fp8_storage_t(0);
  }
}

template <class K>
void launch_quantize_fp8_rows_keyed(K, MatrixArgs const& src, MatrixArgs const& dst, cudaStream_t stream) {
  std::int64_t blocks = (src.rows + kWarps - 1) / kWarps;
  if (blocks > 8 * sm_count()) blocks = 8 * sm_count();
  quantize_fp8_rows_kernel<K><<<int(blocks), kThreads, 0, stream>>>(src, dst);
  check(cudaGetLastError(), "quantize_fp8_rows");
}

}  // namespace ling::cuda::kernels

namespace ling::cuda {

template <quant::weight_policy Src>
DeviceMatrix<quant::Fp8Row> quantize_fp8_rows(DeviceMatrix<Src> const& src, cudaStream_t stream) {
  using namespace kernels;
  DeviceMatrix<quant::Fp8Row> dst = DeviceMatrix<quant::Fp8Row>::allocate(src.rows(), src.cols());
  launch_quantize_fp8_rows_keyed(make_key<Src>(), src.args(), dst.args(), stream);
  return dst;
}

template <quant::weight_policy P>
cudaError_t launch_lm_head(DeviceMatrix<P> const& w, float const* x, float* logits, int* argmax,
                           ArgmaxWorkspace const* ws, cudaStream_t stream) {
  DeviceMatrix<P> const* one[1] = {&w};
  bool ok = false;
  kernels::MultiArgs a = kernels::multi_args<P>(one, 1, logits, nullptr, ok);
  if (!ok || !logits || (argmax && !ws)) return cudaErrorInvalidValue;
  kernels::ArgmaxArgs am{};
  if (argmax) am = kernels::ArgmaxArgs{ws->key(), ws->counter(), argmax};
  return kernels::launch_matvec_args<P>(a, x, InputPrologue{}, am, stream);
}

}  // namespace ling::cuda
