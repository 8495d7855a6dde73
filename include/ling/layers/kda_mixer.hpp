#pragma once
// KDA mixer (spec §2 "KDA mixer"): the projections around the KDA core (cpu/kda.hpp). q, k, v, b and o are plain
// projections; f and g are full rank (Ling: f_proj, g_proj) or low rank with rank head_dim (Kimi-Linear:
// f_b(f_a u), g_b(g_a u)). The State is the core's: S [H,K,V] fp32 plus the three conv windows.
#include <cstdint>
#include <vector>

#include "ling/core/error.hpp"
#include "ling/core/extents.hpp"
#include "ling/cpu/kda.hpp"
#include "ling/layers/linear.hpp"
#include "ling/quant/policies.hpp"

namespace ling::layers {

template <std::int64_t kHidden = dynamic, std::int64_t kHeads = dynamic, std::int64_t kHeadDim = dynamic,
          class Policies = quant::DefaultPolicies>
struct KdaMixer {
  struct Config {
    Extent<kHidden> hidden;
    Extent<kHeads> heads;
    Extent<kHeadDim> head_dim;  // K = V
    std::int64_t conv_kernel = 4;
    bool low_rank_fg = false;   // !no_kda_lora
    bool safe_gate = true;
    float lower_bound = -5.0f;
    float eps = 1e-6f;
    std::int64_t width() const { return heads() * head_dim(); }  // P
    cpu::KdaCoreConfig core() const {
      return {heads(), head_dim(), conv_kernel, safe_gate, lower_bound, eps};
    }
  };
  struct Weights {
    Linear<Policies> q_proj, k_proj, v_proj;    // [P, hidden]
    Linear<Policies> f_proj, g_proj;            // [P, hidden] (full rank)
    Linear<Policies> f_a_proj, f_b_proj;        // [K, hidden], [P, K] (low rank)
    Linear<Policies> g_a_proj, g_b_proj;
    Linear<Policies> b_proj;                    // [H, hidden]
    std::vector<float> q_conv, k_conv, v_conv;  // [P, conv_kernel]
    std::vector<float> a_log;                   // [H]
    std::vector<float> dt_bias;                 // [P]
    std::vector<float> o_norm;                  // [K]
    Linear<Policies> o_proj;                    // [hidden, P]
    cpu::KdaCoreWeights core() const {
      return {q_conv.data(), k_conv.data(), v_conv.data(), a_log.data(), dt_bias.data(), o_norm.data()};
    }
  };
  using State = cpu::KdaState;
  Config config;
  Weights weights;

  static Status can_implement(Config const& c) {
    if (c.hidden() <= 0) return {ErrorCode::kConfig, "KdaMixer: hidden_size must be > 0"};
    return cpu::can_implement(c.core());
  }
  static std::int64_t state_bytes(Config const& c) { return cpu::state_bytes(c.core()); }
  static State make_state(Config const& c) { return cpu::KdaState::zeros(c.core()); }
};

}  // namespace ling::layers
