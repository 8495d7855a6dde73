#pragma once
// SwiGLU MLP (spec §2): y = W_down φ(W_gate u, W_up u); φ(a,b) = silu(a)⊙b, or with a limit L > 0
// min(silu(a), L) ⊙ clamp(b, −L, L). The dense MLP, each routed expert and the shared expert are all this layer.
#include <cstdint>

#include "ling/core/error.hpp"
#include "ling/core/extents.hpp"
#include "ling/layers/linear.hpp"
#include "ling/quant/policies.hpp"

namespace ling::layers {

template <std::int64_t kHidden = dynamic, std::int64_t kWidth = dynamic, class Policies = quant::DefaultPolicies>
struct SwiGlu {
  struct Config {
    Extent<kHidden> hidden;
    Extent<kWidth> width;
    float limit = 0.f;  // 0 = no clamp
  };
  struct Weights {
    Linear<Policies> gate, up, down;  // [width, hidden], [width, hidden], [hidden, width]
  };
  Config config;
  Weights weights;

  static Status can_implement(Config const& c) {
    if (c.hidden() <= 0 || c.width() <= 0) return {ErrorCode::kConfig, "SwiGlu: hidden and width must be > 0"};
    if (c.limit < 0.f) return {ErrorCode::kConfig, "SwiGlu: swiglu limit must be >= 0"};
    return Status::ok();
  }
  static constexpr std::int64_t state_bytes(Config const&) { return 0; }
  static Status check(Config const& c, Weights const& w) {
    if (w.gate.rows() != c.width() || w.gate.cols() != c.hidden() || w.up.rows() != c.width() ||
        w.up.cols() != c.hidden() || w.down.rows() != c.hidden() || w.down.cols() != c.width())
      return {ErrorCode::kShape, "SwiGlu: weight shapes do not match hidden/width"};
    return Status::ok();
  }
};

}  // namespace ling::layers
