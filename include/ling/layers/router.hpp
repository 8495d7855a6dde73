#pragma once
// MoE router (spec §2 "MoE FFN"): sigmoid scores in fp32, expert bias for selection only, grouped top-k
// (group score = sum of the top-2 biased scores of each group; keep topk_group groups), weights from the unbiased
// scores, normalised over the chosen experts when norm_topk_prob, times routed_scaling_factor.
#include <cstdint>
#include <limits>
#include <vector>

#include "ling/core/error.hpp"
#include "ling/core/extents.hpp"
#include "ling/layers/linear.hpp"
#include "ling/quant/policies.hpp"

namespace ling::layers {

template <std::int64_t kHidden = dynamic, std::int64_t kExperts = dynamic, class Policies = quant::DefaultPolicies>
struct Router {
  struct Config {
    Extent<kHidden> hidden;
    Extent<kExperts> experts;
    std::int64_t top_k = 1, n_group = 1, topk_group = 1;
    bool norm_topk_prob = true;
    float routed_scaling_factor = 1.f;
  };
  struct Weights {
    Linear<Policies> gate;           // [experts, hidden]
    std::vector<float> expert_bias;  // [experts] or empty
  };
  Config config;
  Weights weights;

  static Status can_implement(Config const& c) {
    if (c.experts() <= 0 || c.top_k <= 0 || c.top_k > c.experts())
      return {ErrorCode::kConfig, "Router: num_experts_per_tok must be in 1..num_experts"};
    if (c.n_group <= 0 || c.experts() % c.n_group != 0)
      return {ErrorCode::kConfig, "Router: n_group must divide num_experts"};
    if (c.topk_group <= 0 || c.topk_group > c.n_group)
      return {ErrorCode::kConfig, "Router: topk_group must be in 1..n_group"};
    if (c.topk_group * (c.experts() / c.n_group) < c.top_k)
      return {ErrorCode::kConfig, "Router: the kept groups hold fewer than num_experts_per_tok experts"};
    return Status::ok();
  }
  static constexpr std::int64_t state_bytes(Config const&) { return 0; }
};

// The routing of one token: chosen experts and their weights. `margin` is the smallest gap, in biased-score units,
// at any selection boundary (the k-th chosen expert over the best non-chosen one of the kept groups; with grouped
// selection also the topk_group-th group score over the best dropped group's): another engine whose scores differ
// by more than this may legitimately choose other experts. +inf where nothing was left out.
struct Routing {
  std::vector<std::int32_t> experts;
  std::vector<float> weights;
  float margin = std::numeric_limits<float>::infinity();
};

}  // namespace ling::layers
