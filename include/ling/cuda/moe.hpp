#pragma once
// Fused MoE for one token (spec §2 "MoE FFN"), two launches:
//  A  h[s] = φ(W_gate[e_s] u, W_up[e_s] u) for the top_k routed experts e_s = idx[s] (read from device memory) and,
//     as slot top_k, the shared expert with its own clamp; φ(a,b) = min(silu(a), L) * clamp(b, -L, L) when L > 0,
//     else silu(a) * b.
//  B  out = residual + Σ_s w_s W_down[e_s] h[s] + W_down_shared h[top_k]   (out may alias residual).
// Routed experts of a layer are stored as three batched DeviceMatrix (gate, up [E, inter, hidden]; down
// [E, hidden, inter]), one allocation each, indexed by expert id. Kernels in moe.cuh.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "ling/cuda/linear.hpp"

namespace ling::cuda {

// Which launches run MXFP4 experts on int8 dot products (moe.cuh): 1 (default) launch A only, 0 neither, 2 both;
// from LING_MOE_Q8, read at each launch.
inline int moe_q8_mode() {
  char const* e = std::getenv("LING_MOE_Q8");
  return e && *e == '0' ? 0 : e && *e == '2' ? 2 : 1;
}

// Launches of MoE launch A's wgmma instance (LING_MOE_DIAG_A=9, a trial; moe.cuh routed_decode_wgmma) in this process:
// the tests check that the instance ran, since the launcher falls back to the default where it does not apply.
inline std::atomic<int>& moe_wg_a_launches() {
  static std::atomic<int> n{0};
  return n;
}

// The pace (SM cycles) given to the last MoE launch A in this process, or -1 before any: `ling bench`
// prints it and the tests check it (moe.cuh, moe_pace.hpp).
inline std::atomic<int>& moe_pace_used() {
  static std::atomic<int> n{-1};
  return n;
}

template <quant::weight_policy PE, quant::weight_policy PS = PE>
struct MoeWeights {
  DeviceMatrix<PE> gate, up, down;                       // count = num_experts
  DeviceMatrix<PS> shared_gate, shared_up, shared_down;  // count 1, or empty (no shared expert)

  std::int64_t hidden() const { return gate.cols(); }
  std::int64_t inter() const { return gate.rows(); }
  std::int64_t shared_inter() const { return shared_gate.empty() ? 0 : shared_gate.rows(); }
  bool has_shared() const { return !shared_gate.empty(); }
  // fp32 elements of the intermediate buffer h: top_k * inter + shared_inter.
  std::int64_t h_elements(int top_k) const { return std::int64_t(top_k) * inter() + shared_inter(); }
  // Weight bytes one token reads (top_k routed experts + the shared one).
  std::int64_t bytes_per_token(int top_k) const {
    std::int64_t b = std::int64_t(top_k) * (gate.bytes_per_matrix() + up.bytes_per_matrix() + down.bytes_per_matrix());
    if (has_shared()) b += shared_gate.bytes_per_matrix() + shared_up.bytes_per_matrix() + shared_down.bytes_per_matrix();
    return b;
  }
};

struct MoeStep {
  int const* idx = nullptr;         // [top_k] expert ids (device)
  float const* weights = nullptr;   // [top_k] routing weights (device)
  int top_k = 8;
  float routed_limit = 0.f;         // L of the routed experts (0: no clamp)
  float shared_limit = 0.f;         // L of the shared expert
};

inline constexpr int kMoeMaxTopK = 32;

inline Status can_implement_moe(std::int64_t hidden, std::int64_t inter, int top_k) {
  if (top_k <= 0 || top_k > kMoeMaxTopK) return {ErrorCode::kUnsupported, "moe: top_k must be in 1..32"};
  if (hidden <= 0 || inter <= 0) return {ErrorCode::kShape, "moe: empty expert matrices"};
  return Status::ok();
}

// Launch A: u fp32 [hidden] -> h fp32 [h_elements(top_k)].
template <quant::weight_policy PE, quant::weight_policy PS>
cudaError_t launch_moe_gate_up(MoeWeights<PE, PS> const& w, MoeStep const& step, float const* u, float* h,
                               cudaStream_t stream);
// Launch B: out[hidden] = residual + combine (residual may be null: out = combine; may alias out).
template <quant::weight_policy PE, quant::weight_policy PS>
cudaError_t launch_moe_down(MoeWeights<PE, PS> const& w, MoeStep const& step, float const* h, float const* residual,
                            float* out, cudaStream_t stream);
// Both launches.
template <quant::weight_policy PE, quant::weight_policy PS>
cudaError_t launch_moe(MoeWeights<PE, PS> const& w, MoeStep const& step, float const* u, float* h,
                       float const* residual, float* out, cudaStream_t stream) {
  cudaError_t e = launch_moe_gate_up(w, step, u, h, stream);
  if (e != cudaSuccess) return e;
  return launch_moe_down(w, step, h, residual, out, stream);
}

}  // namespace ling::cuda
