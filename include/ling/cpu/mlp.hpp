#pragma once
// CPU SwiGLU MLP (spec §2), with the per-layer clamp.
#include <algorithm>

#include "ling/cpu/backend.hpp"
#include "ling/cpu/linear.hpp"
#include "ling/layers/mlp.hpp"

namespace ling::cpu {

// φ(a, b) in place into a: silu(a)⊙b, or min(silu(a), L) ⊙ clamp(b, −L, L) when L > 0.
inline void swiglu_activation(Matrix& a, Matrix const& b, float limit) {
  for (std::int64_t i = 0; i < a.size(); ++i) {
    float g = ops::silu(a.data()[i]), u = b.data()[i];
    if (limit > 0.f) {
      g = std::min(g, limit);
      u = std::clamp(u, -limit, limit);
    }
    a.data()[i] = g * u;
  }
}

template <std::int64_t kH, std::int64_t kW, class P>
void forward_prefill(Backend&, layers::SwiGlu<kH, kW, P> const& l, ConstMatrixRef x, Matrix& y) {
  Matrix a, b;
  linear(l.weights.gate, x, a);
  linear(l.weights.up, x, b);
  swiglu_activation(a, b, l.config.limit);
  linear(l.weights.down, a, y);
}
template <std::int64_t kH, std::int64_t kW, class P>
void forward_decode(Backend& be, layers::SwiGlu<kH, kW, P> const& l, ConstMatrixRef x, Matrix& y) {
  forward_prefill(be, l, x, y);
}

}  // namespace ling::cpu
