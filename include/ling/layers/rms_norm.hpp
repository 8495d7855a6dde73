#pragma once
// RMSNorm (spec §2): y = w ⊙ x / sqrt(mean(x²) + eps), statistics in fp32.
#include <cstdint>
#include <string>
#include <vector>

#include "ling/core/error.hpp"
#include "ling/core/extents.hpp"

namespace ling::layers {

template <std::int64_t kDim = dynamic>
struct RmsNorm {
  struct Config {
    Extent<kDim> dim;
    float eps = 1e-6f;
  };
  struct Weights {
    std::vector<float> weight;  // [dim]
  };
  Config config;
  Weights weights;

  static Status can_implement(Config const& c) {
    if (c.dim() <= 0) return {ErrorCode::kConfig, "RmsNorm: dim must be > 0"};
    if (!(c.eps > 0.f)) return {ErrorCode::kConfig, "RmsNorm: eps must be > 0"};
    return Status::ok();
  }
  static constexpr std::int64_t state_bytes(Config const&) { return 0; }
};

}  // namespace ling::layers
