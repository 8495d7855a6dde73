#pragma once
// MoE FFN (spec §2): y = Σ_{e∈top-k} w_e · Expert_e(u) + Shared(u). Composed of Router and SwiGlu layers.
#include <cstdint>
#include <vector>

#include "ling/layers/mlp.hpp"
#include "ling/layers/router.hpp"

namespace ling::layers {

template <std::int64_t kHidden = dynamic, std::int64_t kExperts = dynamic, std::int64_t kExpertWidth = dynamic,
          std::int64_t kSharedWidth = dynamic, class Policies = quant::DefaultPolicies>
struct Moe {
  using RouterLayer = Router<kHidden, kExperts, Policies>;
  using Expert = SwiGlu<kHidden, kExpertWidth, Policies>;
  using Shared = SwiGlu<kHidden, kSharedWidth, Policies>;
  struct Config {
    typename RouterLayer::Config router;
    typename Expert::Config expert;  // limit = expert_swiglu_limit of this layer
    typename Shared::Config shared;  // width 0 = no shared expert; limit = share_expert_swiglu_limit
  };
  struct Weights {
    typename RouterLayer::Weights router;
    std::vector<typename Expert::Weights> experts;
    typename Shared::Weights shared;
  };
  Config config;
  Weights weights;

  bool has_shared() const { return config.shared.width() > 0; }
  static Status can_implement(Config const& c) {
    if (auto s = RouterLayer::can_implement(c.router); !s) return s;
    if (auto s = Expert::can_implement(c.expert); !s) return s;
    if (c.shared.width() > 0)
      if (auto s = Shared::can_implement(c.shared); !s) return s;
    if (c.router.hidden() != c.expert.hidden()) return {ErrorCode::kConfig, "Moe: router and experts disagree on hidden"};
    return Status::ok();
  }
  static constexpr std::int64_t state_bytes(Config const&) { return 0; }
};

}  // namespace ling::layers
