#pragma once
// RMSNorm on the GPU (spec §2: y = w ⊙ x / sqrt(mean(x²) + eps), fp32 statistics). Launcher in norm.cuh.
#include <cstdint>

namespace ling::cuda {
struct RmsNormArgs {
  float const* x = nullptr;  // [rows, dim]
  float const* w = nullptr;  // [dim]
  float* y = nullptr;        // [rows, dim]; may alias x
  std::int64_t rows = 0, dim = 0;
  float eps = 1e-6f;
};
}  // namespace ling::cuda
