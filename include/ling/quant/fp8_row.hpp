#pragma once
// Row FP8: E4M3 weights with one F32 scale per output row. Used for the online FP8 LM head: quantize() turns a
// BF16 matrix into this at load, halving the bytes the head reads per token.
#include <algorithm>
#include <cmath>

#include "ling/quant/concept.hpp"

namespace ling::quant {

struct Fp8Row {
  using policy_concept = weight_policy_tag;
  using storage_type = E4m3;
  using scale_type = float;
  static constexpr std::string_view name = "fp8-row";
  static constexpr std::int64_t storage_count(std::int64_t rows, std::int64_t cols) { return rows * cols; }
  static constexpr std::int64_t scale_count(std::int64_t rows, std::int64_t) { return rows; }
  LING_HOST_DEVICE static float decode(storage_type const* w, scale_type const* s, std::int64_t, std::int64_t cols,
                                       std::int64_t r, std::int64_t c) {
    return to_float(w[r * cols + c]) * s[r];
  }
  static void dequantize_row(storage_type const* w, scale_type const* s, std::int64_t, std::int64_t cols,
                             std::int64_t r, float* out) {
    for (std::int64_t c = 0; c < cols; ++c) out[c] = to_float(w[r * cols + c]) * s[r];
  }
  // Row r's scale maps its max |x| to 448. `get(r, c)` yields the source element (any format).
  template <class Get>
  static void quantize(Get&& get, std::int64_t rows, std::int64_t cols, storage_type* w, scale_type* s) {
    for (std::int64_t r = 0; r < rows; ++r) {
      float amax = 0.f;
      for (std::int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(float(get(r, c))));
      float scale = amax > 0.f ? amax / kE4m3Max : 1.f;
      s[r] = scale;
      for (std::int64_t c = 0; c < cols; ++c) w[r * cols + c] = e4m3_from_float(float(get(r, c)) / scale);
    }
  }
};
static_assert(weight_policy<Fp8Row>);

}  // namespace ling::quant
