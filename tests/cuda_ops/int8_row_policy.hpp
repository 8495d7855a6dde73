#pragma once
// A weight policy defined outside the library (int8 weights, one fp32 scale per row): the generic CUDA kernels
// must run it through decode() alone, with no kernel written for it.
#include <cstdint>
#include <string_view>

#include "ling/quant/concept.hpp"

namespace ling::test {

struct Int8Row {
  using policy_concept = quant::weight_policy_tag;
  using storage_type = std::int8_t;
  using scale_type = float;
  static constexpr std::string_view name = "int8-row-test";
  static constexpr std::int64_t storage_count(std::int64_t rows, std::int64_t cols) { return rows * cols; }
  static constexpr std::int64_t scale_count(std::int64_t rows, std::int64_t) { return rows; }
  LING_HOST_DEVICE static float decode(storage_type const* w, scale_type const* s, std::int64_t, std::int64_t cols,
                                       std::int64_t r, std::int64_t c) {
    return float(w[r * cols + c]) * s[r];
  }
};
static_assert(quant::weight_policy<Int8Row>);

}  // namespace ling::test
