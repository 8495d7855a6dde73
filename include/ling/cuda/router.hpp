#pragma once
// MoE router on the GPU (spec §2 "MoE FFN"), one launch, no host round trip: logits = W_r u (fp32 math),
// s = sigmoid(logits), selection on s + expert_bias, grouped top-k (group score = sum of the top-2 biased scores,
// keep topk_group groups), top-k among the kept experts; weights = routed_scaling * s_e / (sum s + 1e-20) when
// norm_topk_prob (else routed_scaling * s_e). Outputs idx[top_k] (int32, best first, ties to the lower index) and
// w[top_k] on the device. Every block computes logits; the last block to finish selects (and resets the counter,
// so the launch can be replayed in a CUDA graph). Kernel in router.cuh.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ling/core/error.hpp"
#include "ling/cuda/linear.hpp"
#include "ling/cuda/runtime.hpp"

namespace ling::cuda {

struct RouterParams {
  int top_k = 8;
  int n_group = 1;
  int topk_group = 1;
  float routed_scaling = 1.f;
  bool norm_topk_prob = true;
};

inline constexpr int kRouterMaxExperts = 1024;
inline constexpr int kRouterMaxTopK = 32;
inline constexpr int kRouterMaxGroups = 64;

inline Status can_implement_router(std::int64_t experts, RouterParams const& p) {
  if (experts <= 0 || experts > kRouterMaxExperts)
    return {ErrorCode::kUnsupported, "router: num_experts must be in 1..1024"};
  if (p.top_k <= 0 || p.top_k > kRouterMaxTopK || p.top_k > experts)
    return {ErrorCode::kConfig, "router: num_experts_per_tok must be in 1..min(32, num_experts)"};
  if (p.n_group <= 0 || p.n_group > kRouterMaxGroups || experts % p.n_group != 0)
    return {ErrorCode::kConfig, "router: n_group must divide num_experts (and be <= 64)"};
  if (p.topk_group <= 0 || p.topk_group > p.n_group || p.topk_group * (experts / p.n_group) < p.top_k)
    return {ErrorCode::kConfig, "router: topk_group must be in 1..n_group and keep at least top_k experts"};
  return Status::ok();
}

// Device scratch of one router: logits [E] and the block counter (zeroed here, re-zeroed by each launch).
class RouterWorkspace {
 public:
  RouterWorkspace() = default;
  explicit RouterWorkspace(std::int64_t experts)
      : buf_(std::size_t(experts) * sizeof(float) + 256, "router workspace"), experts_(experts) {
    check(cudaMemset(buf_.data(), 0, buf_.bytes()), "router workspace: memset");
  }
  float* logits() const { return reinterpret_cast<float*>(buf_.data<char>() + 256); }
  unsigned int* counter() const { return buf_.data<unsigned int>(); }
  std::int64_t experts() const { return experts_; }

 private:
  DeviceBuffer buf_;
  std::int64_t experts_ = 0;
};

// W_r [E, hidden] in any policy (BF16/F32 in the checkpoints); expert_bias fp32 [E] or null; u fp32 [hidden].
// Writes idx[top_k], weights[top_k]; `logits_out` (optional, [E]) receives the raw logits.
template <quant::weight_policy P>
cudaError_t launch_router(DeviceMatrix<P> const& w, float const* expert_bias, float const* u, RouterParams const& p,
                          RouterWorkspace const& ws, int* idx, float* weights, cudaStream_t stream);

}  // namespace ling::cuda
