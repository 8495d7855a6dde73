#pragma once
// Fused MoE kernels (declarations in moe.hpp; spec §2 "MoE FFN"). nvcc only.
// Launch A: one warp task = row r of one slot (top_k routed experts, then the shared expert): the gate and up rows
//   are read together (NR = 2, one pass over the staged input) and φ is applied in the epilogue.
// Launch B: one warp task = output row r: lanes own the 16-byte chunks of the concatenated down rows of all top_k
//   experts (so all their loads are in flight together), each chunk weighted by its expert's routing weight; then
//   the shared expert's down row; one warp sum; plus the residual.
#include <cuda_runtime.h>

#include "ling/cuda/linear.cuh"
#include "ling/cuda/moe.hpp"

namespace ling::cuda::kernels {

inline constexpr int kMoeFlatUnroll = 8;  // chunks per lane per batch in launch B

__device__ __forceinline__ float swiglu(float a, float b, float limit) {
  float s = a / (1.0f + expf(-a));
  if (limit > 0.f) {
    s = fminf(s, limit);
    b = fminf(fmaxf(b, -limit), limit);
  }
  return s * b;
}

template <class P>
__device__ __forceinline__ void const* batch_data(MatrixArgs const& m, int e) {
  return static_cast<char const*>(m.data) + std::int64_t(e) * m.data_stride;
}
template <class P>
__device__ __forceinline__ void const* batch_scales(MatrixArgs const& m, int e) {
  return m.scales ? static_cast<char const*>(m.scales) + std::int64_t(e) * m.scale_stride : nullptr;
}

struct MoeArgs {
  MatrixArgs gate, up, down, sgate, sup, sdown;
  int const* idx;
  float const* weights;
  int top_k;
  int has_shared;
  float routed_limit, shared_limit;
};

// Stages idx into shared memory; an id out of range becomes -1 (its outputs turn NaN, never a wild read).
__device__ __forceinline__ void stage_idx(int* s_idx, float* s_w, MoeArgs const& a) {
  for (int s = threadIdx.x; s < a.top_k; s += blockDim.x) {
    int e = a.idx[s];
    s_idx[s] = (e >= 0 && e < a.gate.count) ? e : -1;
    if (s_w) s_w[s] = a.weights[s];
  }
}

template <class KE, class KS>
__global__ void __launch_bounds__(kThreads) moe_gate_up_kernel(MoeArgs a, float const* __restrict__ u, float* h) {
  using PE = policy_of<KE>;
  using PS = policy_of<KS>;
  extern __shared__ float4 smem_f4[];
  float* xs = reinterpret_cast<float*>(smem_f4);
  __shared__ int s_idx[kMoeMaxTopK];
  std::int64_t n_stage = staged_elems<PE>(a.gate);
  if (a.has_shared && staged_elems<PS>(a.sgate) > n_stage) n_stage = staged_elems<PS>(a.sgate);
  stage_x(xs, u, a.gate.cols, n_stage);
  stage_idx(s_idx, nullptr, a);
  __syncthreads();

  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  std::int64_t const inter = a.gate.rows, routed = std::int64_t(a.top_k) * inter;
  std::int64_t const total = routed + (a.has_shared ? a.sgate.rows : 0);
  for (std::int64_t t = std::int64_t(blockIdx.x) * kWarps + warp; t < total; t += std::int64_t(gridDim.x) * kWarps) {
    float acc[2] = {0.f, 0.f};
    float g, v, limit;
    if (t < routed) {
      int const s = int(t / inter);
      std::int64_t const r = t - std::int64_t(s) * inter;
      int const e = s_idx[s];
      int const ee = e < 0 ? 0 : e;
      void const* data[2] = {batch_data<PE>(a.gate, ee), batch_data<PE>(a.up, ee)};
      void const* scales[2] = {batch_scales<PE>(a.gate, ee), batch_scales<PE>(a.up, ee)};
      std::int64_t rr[2] = {r, r};
      bool valid[2] = {true, true};
      RowDot<PE>::template lane_dot<2>(data, scales, rr, valid, a.gate, xs, acc);
      g = warp_sum(acc[0]) * RowDot<PE>::row_scale(scales[0], r);
      v = warp_sum(acc[1]) * RowDot<PE>::row_scale(scales[1], r);
      if (e < 0) g = __uint_as_float(0x7FC00000u);
      limit = a.routed_limit;
    } else {
      std::int64_t const r = t - routed;
      void const* data[2] = {a.sgate.data, a.sup.data};
      void const* scales[2] = {a.sgate.scales, a.sup.scales};
      std::int64_t rr[2] = {r, r};
      bool valid[2] = {true, true};
      RowDot<PS>::template lane_dot<2>(data, scales, rr, valid, a.sgate, xs, acc);
      g = warp_sum(acc[0]) * RowDot<PS>::row_scale(scales[0], r);
      v = warp_sum(acc[1]) * RowDot<PS>::row_scale(scales[1], r);
      limit = a.shared_limit;
    }
    if (lane == 0) h[t] = swiglu(g, v, limit);
  }
}

// Lane partial of the concatenated down rows r of the top_k experts (fast layout), chunk-weighted.
template <class P>
__device__ __forceinline__ float down_routed_fast(MoeArgs const& a, int const* s_idx, float const* s_w, std::int64_t r,
                                                  float const* xs, int seg) {
  using Ops = FastOps<P>;
  using S = typename P::storage_type;
  int const lane = threadIdx.x & 31;
  MatrixArgs const& m = a.down;
  int const cpe = int(m.ld * std::int64_t(sizeof(S)) / 16);  // chunks per expert row
  int const nq = a.top_k * cpe;
  std::int64_t const row_off = r * m.ld * std::int64_t(sizeof(S));
  float acc = 0.f;
  for (int base = lane; base < nq; base += 32 * kMoeFlatUnroll) {
    uint4 v[kMoeFlatUnroll][1];
    float sc[kMoeFlatUnroll];
    int xoff[kMoeFlatUnroll];
#pragma unroll
    for (int u = 0; u < kMoeFlatUnroll; ++u) {
      int const q = base + 32 * u;
      int const s = q / cpe, j = q - s * cpe;
      int const e = q < nq ? s_idx[s] : -1;
      if (e >= 0) {
        char const* row = static_cast<char const*>(batch_data<P>(m, e)) + row_off;
        void const* scl = batch_scales<P>(m, e);
        v[u][0] = ld_stream(reinterpret_cast<uint4 const*>(row) + j);
        sc[u] = Ops::chunk_scale(scl, m, r, j) * RowDot<P>::row_scale(scl, r) * s_w[s];
      } else {
        v[u][0] = make_uint4(0, 0, 0, 0);
        sc[u] = q < nq ? __uint_as_float(0x7FC00000u) : 0.f;  // bad expert id: NaN, visibly
      }
      xoff[u] = xpad(s * seg + j * Ops::kElems);
    }
#pragma unroll
    for (int u = 0; u < kMoeFlatUnroll; ++u) {
      if (base + 32 * u < nq) {
        float d[1];
        Ops::template dot<1>(v[u], xs + xoff[u], d);
        acc = fmaf(sc[u], d[0], acc);
      }
    }
  }
  return acc;
}

// Generic policies: element by element through P::decode.
template <class P>
__device__ __forceinline__ float down_routed_generic(MoeArgs const& a, int const* s_idx, float const* s_w,
                                                     std::int64_t r, float const* xs, int seg) {
  using S = typename P::storage_type;
  using Sc = typename P::scale_type;
  int const lane = threadIdx.x & 31;
  MatrixArgs const& m = a.down;
  float acc = 0.f;
  for (int s = 0; s < a.top_k; ++s) {
    int const e = s_idx[s];
    if (e < 0) return __uint_as_float(0x7FC00000u);
    auto const* w = static_cast<S const*>(batch_data<P>(m, e));
    auto const* sc = static_cast<Sc const*>(batch_scales<P>(m, e));
    float part = 0.f;
    for (std::int64_t c = lane; c < m.cols; c += 32) part += P::decode(w, sc, m.rows, m.cols, r, c) * xs[xpad(s * seg + int(c))];
    acc = fmaf(s_w[s], part, acc);
  }
  return acc * RowDot<P>::row_scale(nullptr, 0);
}

template <class KE, class KS>
__global__ void __launch_bounds__(kThreads) moe_down_kernel(MoeArgs a, float const* __restrict__ h,
                                                            float const* residual, float* out) {
  using PE = policy_of<KE>;
  using PS = policy_of<KS>;
  extern __shared__ float4 smem_f4[];
  float* xs = reinterpret_cast<float*>(smem_f4);
  __shared__ int s_idx[kMoeMaxTopK];
  __shared__ float s_w[kMoeMaxTopK];
  int const seg = int(round32(staged_elems<PE>(a.down)));
  std::int64_t const inter = a.down.cols;
  // routed slots: h[s*inter + c] at segment s (each padded to seg); the shared expert's h at segment top_k
  int const top_k = a.top_k;
  std::int64_t const shared_n = a.has_shared ? a.sdown.cols : 0;
  stage(xs, std::int64_t(top_k) * seg + (a.has_shared ? round32(staged_elems<PS>(a.sdown)) : 0), [=](int c) {
    int const s = c / seg < top_k ? c / seg : top_k, j = c - s * seg;
    if (s < top_k) return j < inter ? h[s * inter + j] : 0.f;
    return j < shared_n ? h[std::int64_t(top_k) * inter + j] : 0.f;
  });
  stage_idx(s_idx, s_w, a);
  __syncthreads();

  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  std::int64_t const rows = a.down.rows;
  for (std::int64_t r = std::int64_t(blockIdx.x) * kWarps + warp; r < rows; r += std::int64_t(gridDim.x) * kWarps) {
    float acc;
    if constexpr (RowDot<PE>::kFast) acc = down_routed_fast<PE>(a, s_idx, s_w, r, xs, seg);
    else acc = down_routed_generic<PE>(a, s_idx, s_w, r, xs, seg);
    if (a.has_shared) {
      void const* data[1] = {a.sdown.data};
      void const* scales[1] = {a.sdown.scales};
      std::int64_t rr[1] = {r};
      bool valid[1] = {true};
      float sacc[1] = {0.f};
      RowDot<PS>::template lane_dot<1>(data, scales, rr, valid, a.sdown, xs + xpad(a.top_k * seg), sacc);
      // row_scale is per row (FP8-row); fold it into the lane partial before the sum
      acc = fmaf(sacc[0], RowDot<PS>::row_scale(a.sdown.scales, r), acc);
    }
    float const v = warp_sum(acc);
    if (lane == 0) out[r] = residual ? residual[r] + v : v;
  }
}

template <class PE, class PS>
MoeArgs moe_args(MoeWeights<PE, PS> const& w, MoeStep const& step) {
  MoeArgs a{};
  a.gate = w.gate.args();
  a.up = w.up.args();
  a.down = w.down.args();
  a.has_shared = w.has_shared() ? 1 : 0;
  if (a.has_shared) {
    a.sgate = w.shared_gate.args();
    a.sup = w.shared_up.args();
    a.sdown = w.shared_down.args();
  }
  a.idx = step.idx;
  a.weights = step.weights;
  a.top_k = step.top_k;
  a.routed_limit = step.routed_limit;
  a.shared_limit = step.shared_limit;
  return a;
}

template <class PE, class PS>
bool moe_shapes_ok(MoeWeights<PE, PS> const& w, MoeStep const& step) {
  if (step.top_k <= 0 || step.top_k > kMoeMaxTopK || !step.idx || !step.weights) return false;
  if (w.gate.empty() || w.up.rows() != w.gate.rows() || w.up.cols() != w.gate.cols() || w.up.count() != w.gate.count())
    return false;
  if (w.down.rows() != w.gate.cols() || w.down.cols() != w.gate.rows() || w.down.count() != w.gate.count()) return false;
  if (w.has_shared()) {
    if (w.shared_gate.cols() != w.gate.cols() || w.shared_up.rows() != w.shared_gate.rows() ||
        w.shared_up.cols() != w.gate.cols() || w.shared_down.rows() != w.gate.cols() ||
        w.shared_down.cols() != w.shared_gate.rows())
      return false;
  }
  return true;
}

template <class KE, class KS>
cudaError_t launch_moe_gate_up_keyed(KE, KS, MoeArgs const& a, float const* u, float* h, cudaStream_t stream) {
  using PE = policy_of<KE>;
  using PS = policy_of<KS>;
  std::int64_t n_stage = staged_elems<PE>(a.gate);
  if (a.has_shared && staged_elems<PS>(a.sgate) > n_stage) n_stage = staged_elems<PS>(a.sgate);
  std::size_t const smem = std::size_t(xs_floats(n_stage)) * sizeof(float);
  auto kernel = moe_gate_up_kernel<KE, KS>;
  std::int64_t const tasks = std::int64_t(a.top_k) * a.gate.rows + (a.has_shared ? a.sgate.rows : 0);
  int blocks = 0;
  cudaError_t e = persistent_grid(kernel, smem, (tasks + kWarps - 1) / kWarps, blocks);
  if (e != cudaSuccess) return e;
  kernel<<<blocks, kThreads, smem, stream>>>(a, u, h);
  return cudaGetLastError();
}

template <class KE, class KS>
cudaError_t launch_moe_down_keyed(KE, KS, MoeArgs const& a, float const* h, float const* residual, float* out,
                                  cudaStream_t stream) {
  using PE = policy_of<KE>;
  using PS = policy_of<KS>;
  std::int64_t const seg = round32(staged_elems<PE>(a.down));
  std::int64_t n = seg * a.top_k + (a.has_shared ? round32(staged_elems<PS>(a.sdown)) : 0);
  std::size_t const smem = std::size_t(xs_floats(n)) * sizeof(float);
  auto kernel = moe_down_kernel<KE, KS>;
  int blocks = 0;
  cudaError_t e = persistent_grid(kernel, smem, (a.down.rows + kWarps - 1) / kWarps, blocks);
  if (e != cudaSuccess) return e;
  kernel<<<blocks, kThreads, smem, stream>>>(a, h, residual, out);
  return cudaGetLastError();
}

}  // namespace ling::cuda::kernels

namespace ling::cuda {

template <quant::weight_policy PE, quant::weight_policy PS>
cudaError_t launch_moe_gate_up(MoeWeights<PE, PS> const& w, MoeStep const& step, float const* u, float* h,
                               cudaStream_t stream) {
  using namespace kernels;
  if (!moe_shapes_ok(w, step)) return cudaErrorInvalidValue;
  return launch_moe_gate_up_keyed(make_key<PE>(), make_key<PS>(), moe_args(w, step), u, h, stream);
}

template <quant::weight_policy PE, quant::weight_policy PS>
cudaError_t launch_moe_down(MoeWeights<PE, PS> const& w, MoeStep const& step, float const* h, float const* residual,
                            float* out, cudaStream_t stream) {
  using namespace kernels;
  if (!moe_shapes_ok(w, step)) return cudaErrorInvalidValue;
  return launch_moe_down_keyed(make_key<PE>(), make_key<PS>(), moe_args(w, step), h, residual, out, stream);
}

}  // namespace ling::cuda
