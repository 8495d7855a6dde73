#pragma once
// The Eigen CPU backend: activations are row-major float matrices [tokens, features]; every op accumulates in
// fp32 and is written plainly, because this backend is also the oracle the CUDA backend is tested against.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include <Eigen/Core>

namespace ling::cpu {

struct KdaState;  // cpu/kda.hpp

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vector = Eigen::VectorXf;
using RowVector = Eigen::RowVectorXf;
using ConstMatrixRef = Eigen::Ref<Matrix const>;
using MatrixRef = Eigen::Ref<Matrix>;

// The tag that selects CPU overloads of forward_prefill / forward_decode (DESIGN.md decision 2), and the statistics
// the forward gathers on the way.
struct Backend {
  // Smallest Routing::margin of every token routed since the owner last reset it (runtime::Session resets it at each
  // prefill/decode): tells a comparison against another engine when a different expert choice is legitimate.
  float min_routing_margin = std::numeric_limits<float>::infinity();
  // When set, the recurrent KDA layers of a T-token forward append their state after each of its first T - 1 tokens
  // here (layer by layer, token by token), so the owner can put a layer back to any earlier token of that call
  // (runtime::Session::rewind, for speculative decoding: a KDA state cannot be rewound otherwise, spec §2).
  std::vector<KdaState>* kda_checkpoints = nullptr;
};

// Elementwise activations (own namespace: cpu/short_conv.hpp defines its own cpu::silu).
namespace ops {
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
}  // namespace ops

// y = w ⊙ x / sqrt(mean(x²) + eps) per row of length w.size(), statistics in fp32.
inline void rms_norm_rows(float const* x, float* y, std::int64_t n, std::int64_t dim, float const* w, float eps) {
  for (std::int64_t i = 0; i < n; ++i) {
    float const* xi = x + i * dim;
    float* yi = y + i * dim;
    float ss = 0.f;
    for (std::int64_t d = 0; d < dim; ++d) ss += xi[d] * xi[d];
    float inv = 1.0f / std::sqrt(ss / float(dim) + eps);
    for (std::int64_t d = 0; d < dim; ++d) yi[d] = w[d] * (xi[d] * inv);
  }
}

}  // namespace ling::cpu
