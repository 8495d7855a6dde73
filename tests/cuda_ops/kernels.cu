// Explicit instantiations of the cuda-ops launchers the doctest files (.cpp, compiled by the host compiler) call.
#include "int8_row_policy.hpp"
#include "ling/cuda/bandwidth.cuh"
#include "ling/cuda/linear.cuh"
#include "ling/cuda/lm_head.cuh"
#include "ling/cuda/matvec_wg.cuh"
#include "ling/cuda/moe.cuh"
#include "ling/cuda/router.cuh"

namespace ling::cuda {

#define LING_TEST_MATVEC(P)                                                                                      \
  template cudaError_t launch_matvec<P>(DeviceMatrix<P> const&, float const*, float*, cudaStream_t, MatvecEpilogue); \
  template cudaError_t launch_matvec_multi<P>(std::span<DeviceMatrix<P> const* const>, float const*, float*, cudaStream_t);
LING_TEST_MATVEC(quant::Bf16)
LING_TEST_MATVEC(quant::F16)
LING_TEST_MATVEC(quant::F32)
LING_TEST_MATVEC(quant::Fp8Block)
LING_TEST_MATVEC(quant::Fp8Row)
LING_TEST_MATVEC(quant::Mxfp4)
LING_TEST_MATVEC(test::Int8Row)
#undef LING_TEST_MATVEC

template cudaError_t launch_router<quant::Bf16>(DeviceMatrix<quant::Bf16> const&, float const*, float const*,
                                                RouterParams const&, RouterWorkspace const&, int*, float*, cudaStream_t);
template cudaError_t launch_router<quant::F32>(DeviceMatrix<quant::F32> const&, float const*, float const*,
                                               RouterParams const&, RouterWorkspace const&, int*, float*, cudaStream_t);

#define LING_TEST_MOE(PE, PS)                                                                                         \
  template cudaError_t launch_moe_gate_up<PE, PS>(MoeWeights<PE, PS> const&, MoeStep const&, float const*, float*, \
                                                  cudaStream_t);                                                    \
  template cudaError_t launch_moe_down<PE, PS>(MoeWeights<PE, PS> const&, MoeStep const&, float const*, float const*, \
                                               float*, cudaStream_t);
template cudaError_t launch_matvec_multi_tail<quant::Fp8Block>(std::span<DeviceMatrix<quant::Fp8Block> const* const>,
                                                               float const*, float*, cudaStream_t, unsigned*, int);
template cudaError_t launch_matvec_multi_tail<quant::Bf16>(std::span<DeviceMatrix<quant::Bf16> const* const>,
                                                           float const*, float*, cudaStream_t, unsigned*, int);
#define LING_TEST_TOKENS(P)                                                                                   \
  template cudaError_t launch_matvec_multi_tokens<P>(std::span<DeviceMatrix<P> const* const>, float const*, int, \
                                                     float*, cudaStream_t, InputPrologue const&, float const*);
LING_TEST_TOKENS(quant::Fp8Block)
LING_TEST_TOKENS(quant::Fp8Row)
LING_TEST_TOKENS(quant::Bf16)
#undef LING_TEST_TOKENS
#define LING_TEST_PRELOAD(P) \
  template cudaError_t launch_matvec_multi_preload<P>(std::span<DeviceMatrix<P> const* const>, float const*, float*, cudaStream_t);
LING_TEST_PRELOAD(quant::Fp8Block)
LING_TEST_PRELOAD(quant::Fp8Row)
LING_TEST_PRELOAD(quant::Bf16)
LING_TEST_PRELOAD(quant::Mxfp4)
LING_TEST_PRELOAD(test::Int8Row)
#undef LING_TEST_PRELOAD
template cudaError_t launch_matvec_multi_wg<quant::Fp8Block>(std::span<DeviceMatrix<quant::Fp8Block> const* const>,
                                                             float const*, float*, cudaStream_t, InputPrologue const&,
                                                             float const*, int);
template cudaError_t launch_matvec_multi_wg<quant::Fp8Row>(std::span<DeviceMatrix<quant::Fp8Row> const* const>,
                                                           float const*, float*, cudaStream_t, InputPrologue const&,
                                                           float const*, int);
LING_TEST_MOE(quant::Mxfp4, quant::Fp8Block)
LING_TEST_MOE(quant::Fp8Block, quant::Fp8Block)
LING_TEST_MOE(quant::Bf16, quant::Bf16)
LING_TEST_MOE(test::Int8Row, quant::Bf16)
#undef LING_TEST_MOE

template DeviceMatrix<quant::Fp8Row> quantize_fp8_rows<quant::Bf16>(DeviceMatrix<quant::Bf16> const&, cudaStream_t);
template cudaError_t launch_lm_head<quant::Fp8Row>(DeviceMatrix<quant::Fp8Row> const&, float const*, float*, int*,
                                                   ArgmaxWorkspace const*, cudaStream_t);
template cudaError_t launch_lm_head<quant::Bf16>(DeviceMatrix<quant::Bf16> const&, float const*, float*, int*,
                                                 ArgmaxWorkspace const*, cudaStream_t);
template BandwidthResult measure_read_bandwidth<16>(std::size_t, int);

namespace test {

// MoE launch A's selection (kernels::router_select_fast) in one block of `experts` threads on given logits: the picks
// and weights to idx / w, and whether the candidate path ran to *cand (1) or the fallback (0).
__global__ void select_fast_kernel(kernels::RouteSel a, int* idx, float* w, int* cand) {
  extern __shared__ float4 smem_f4[];
  kernels::RouteAhead ra{};
  kernels::route_ahead_bias(a, ra);
  kernels::route_ahead_logits(a, ra);
  bool const c = kernels::router_select_fast(a, ra, true, reinterpret_cast<float*>(smem_f4), idx, w, nullptr, nullptr);
  if (threadIdx.x == 0) *cand = c ? 1 : 0;
}

cudaError_t launch_select_fast(float const* logits, float const* bias, int experts, RouterParams const& p, int* idx, float* w,
                               int* cand) {
  kernels::RouteSel const a{logits, bias, experts, p.top_k, p.n_group, p.topk_group, p.norm_topk_prob ? 1 : 0, p.routed_scaling};
  select_fast_kernel<<<1, unsigned(experts), std::size_t(2 * experts) * sizeof(float)>>>(a, idx, w, cand);
  return cudaGetLastError();
}

}  // namespace test
}  // namespace ling::cuda
