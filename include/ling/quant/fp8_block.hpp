#pragma once
// Block FP8 (the -fp8 checkpoints, and all but the routed experts of -fp4): E4M3 weights with one F32
// scale_inv per 128x128 block; edge blocks are partial. w[i,j] = e4m3(q[i,j]) * scale_inv[i/128, j/128].
#include <algorithm>
#include <cmath>

#include "ling/quant/concept.hpp"

namespace ling::quant {

struct Fp8Block {
  using policy_concept = weight_policy_tag;
  using storage_type = E4m3;
  using scale_type = float;
  static constexpr std::string_view name = "fp8-block";
  static constexpr std::int64_t kBlock = 128;
  static constexpr std::int64_t storage_count(std::int64_t rows, std::int64_t cols) { return rows * cols; }
  static constexpr std::int64_t scale_count(std::int64_t rows, std::int64_t cols) {
    return ceil_div(rows, kBlock) * ceil_div(cols, kBlock);
  }
  LING_HOST_DEVICE static float decode(storage_type const* w, scale_type const* s, std::int64_t, std::int64_t cols,
                                       std::int64_t r, std::int64_t c) {
    return to_float(w[r * cols + c]) * s[(r / kBlock) * ceil_div(cols, kBlock) + c / kBlock];
  }
  static void dequantize_row(storage_type const* w, scale_type const* s, std::int64_t, std::int64_t cols,
                             std::int64_t r, float* out) {
    scale_type const* srow = s + (r / kBlock) * ceil_div(cols, kBlock);
    for (std::int64_t c = 0; c < cols; ++c) out[c] = to_float(w[r * cols + c]) * srow[c / kBlock];
  }
  // Quantizes a float matrix: each block's scale maps its max |x| to 448 (power of two if ue8m0).
  static void quantize(float const* x, std::int64_t rows, std::int64_t cols, storage_type* w, scale_type* s,
                       bool ue8m0 = false) {
    std::int64_t nbc = ceil_div(cols, kBlock);
    for (std::int64_t br = 0; br < ceil_div(rows, kBlock); ++br)
      for (std::int64_t bc = 0; bc < nbc; ++bc) {
        std::int64_t r1 = std::min(rows, (br + 1) * kBlock), c1 = std::min(cols, (bc + 1) * kBlock);
        float amax = 0.f;
        for (std::int64_t r = br * kBlock; r < r1; ++r)
          for (std::int64_t c = bc * kBlock; c < c1; ++c) amax = std::max(amax, std::fabs(x[r * cols + c]));
        float scale = amax > 0.f ? amax / kE4m3Max : 1.f;
        if (ue8m0) scale = to_float(ue8m0_ceil(scale));
        s[br * nbc + bc] = scale;
        for (std::int64_t r = br * kBlock; r < r1; ++r)
          for (std::int64_t c = bc * kBlock; c < c1; ++c) w[r * cols + c] = e4m3_from_float(x[r * cols + c] / scale);
      }
  }
};
static_assert(weight_policy<Fp8Block>);

}  // namespace ling::quant
