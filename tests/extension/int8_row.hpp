#pragma once
// A weight policy defined OUTSIDE the library (docs/adding-a-policy.md): symmetric INT8 with one float scale per
// output row. w[r, c] = q[r, c] · scale[r], scale[r] = max_c |w[r, c]| / 127. Nothing under include/ knows it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "ling/quant/concept.hpp"

namespace ext {

struct Int8Row {
  using policy_concept = ling::quant::weight_policy_tag;  // the explicit opt-in
  using storage_type = std::int8_t;
  using scale_type = float;
  static constexpr std::string_view name = "int8-row";
  static constexpr std::int64_t storage_count(std::int64_t rows, std::int64_t cols) { return rows * cols; }
  static constexpr std::int64_t scale_count(std::int64_t rows, std::int64_t) { return rows; }
  static float decode(storage_type const* w, scale_type const* s, std::int64_t, std::int64_t cols, std::int64_t r,
                      std::int64_t c) {
    return float(w[r * cols + c]) * s[r];
  }
  // Quantizes a row-major float matrix.
  static void quantize(float const* x, std::int64_t rows, std::int64_t cols, storage_type* w, scale_type* s) {
    for (std::int64_t r = 0; r < rows; ++r) {
      float amax = 0.f;
      for (std::int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(x[r * cols + c]));
      float scale = amax > 0.f ? amax / 127.f : 1.f;
      s[r] = scale;
      for (std::int64_t c = 0; c < cols; ++c)
        w[r * cols + c] = std::int8_t(std::clamp(std::lround(x[r * cols + c] / scale), -127L, 127L));
    }
  }
};
static_assert(ling::quant::weight_policy<Int8Row>);

}  // namespace ext
