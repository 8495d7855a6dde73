#pragma once
// Gated MLA mixer (spec §2): low-rank latent attention, interleaved RoPE on the rope slice (or NoPE), an optional
// sigmoid output gate (head-wise or element-wise), optional q LoRA. The cache holds per token only the latent
// [c | k_rope] (r + dr floats): the naive form (prefill) expands it through kv_b_proj, the absorbed form (decode)
// folds W_UK into the query and W_UV after the attention.
#include <cstdint>
#include <vector>

#include "ling/core/error.hpp"
#include "ling/core/extents.hpp"
#include "ling/io/model_config.hpp"
#include "ling/layers/linear.hpp"
#include "ling/quant/policies.hpp"

namespace ling::layers {

template <std::int64_t kHidden = dynamic, std::int64_t kHeads = dynamic, std::int64_t kRank = dynamic,
          std::int64_t kNope = dynamic, std::int64_t kRope = dynamic, std::int64_t kValue = dynamic,
          class Policies = quant::DefaultPolicies>
struct GatedMla {
  struct Config {
    Extent<kHidden> hidden;
    Extent<kHeads> heads;
    Extent<kRank> kv_rank;    // r = kv_lora_rank
    Extent<kNope> nope_dim;   // dn
    Extent<kRope> rope_dim;   // dr
    Extent<kValue> value_dim; // dv
    std::int64_t q_lora_rank = 0;  // 0: one q_proj
    bool use_rope = true;          // false: NoPE (Kimi-Linear); the rope slice stays, unrotated
    double rope_theta = 10000.0;
    OutputGate gate = OutputGate::kHeadWise;
    float eps = 1e-6f;
    std::int64_t qk_dim() const { return nope_dim() + rope_dim(); }
    std::int64_t latent_dim() const { return kv_rank() + rope_dim(); }
  };
  struct Weights {
    Linear<Policies> q_proj;                 // [H·(dn+dr), hidden]     (no q LoRA)
    Linear<Policies> q_a_proj;               // [q_lora_rank, hidden]   (q LoRA)
    std::vector<float> q_a_norm;             // [q_lora_rank]
    Linear<Policies> q_b_proj;               // [H·(dn+dr), q_lora_rank]
    Linear<Policies> kv_a_proj;              // [r+dr, hidden]
    std::vector<float> kv_a_norm;            // [r]
    Linear<Policies> kv_b_proj;              // [H·(dn+dv), r]
    Linear<Policies> g_proj;                 // [H or H·dv, hidden], empty when ungated
    Linear<Policies> o_proj;                 // [hidden, H·dv] (Ling: attention.dense)
  };
  // The latent cache: row t = [RMSNorm(c_t) | RoPE(k_rope_t)].
  struct State {
    std::vector<float> latent;  // [capacity, r+dr]
    std::int64_t length = 0;
    void reset() { length = 0; }
  };
  Config config;
  Weights weights;

  static Status can_implement(Config const& c) {
    if (c.hidden() <= 0 || c.heads() <= 0 || c.kv_rank() <= 0 || c.value_dim() <= 0 || c.qk_dim() <= 0)
      return {ErrorCode::kConfig, "GatedMla: dimensions must be > 0"};
    if (c.use_rope && c.rope_dim() % 2 != 0) return {ErrorCode::kConfig, "GatedMla: qk_rope_head_dim must be even"};
    if (c.q_lora_rank < 0) return {ErrorCode::kConfig, "GatedMla: q_lora_rank must be >= 0"};
    return Status::ok();
  }
  // Cache bytes per token of context.
  static constexpr std::int64_t state_bytes(Config const& c) { return c.latent_dim() * std::int64_t(sizeof(float)); }
};

}  // namespace ling::layers
