#pragma once
// Plain formats: BF16 (the default of a checkpoint), F16 and F32. No scales.
#include "ling/quant/concept.hpp"

namespace ling::quant {

template <class T, char const* kName>
struct Plain {
  using policy_concept = weight_policy_tag;
  using storage_type = T;
  using scale_type = NoScale;
  static constexpr std::string_view name = kName;
  static constexpr std::int64_t storage_count(std::int64_t rows, std::int64_t cols) { return rows * cols; }
  static constexpr std::int64_t scale_count(std::int64_t, std::int64_t) { return 0; }
  LING_HOST_DEVICE static float decode(storage_type const* w, scale_type const*, std::int64_t, std::int64_t cols,
                                       std::int64_t r, std::int64_t c) {
    if constexpr (std::same_as<T, float>) return w[r * cols + c];
    else return to_float(w[r * cols + c]);
  }
};

inline constexpr char kBf16Name[] = "bf16";
inline constexpr char kF16Name[] = "f16";
inline constexpr char kF32Name[] = "f32";
using Bf16 = Plain<Bfloat16, kBf16Name>;
using F16 = Plain<Half, kF16Name>;
using F32 = Plain<float, kF32Name>;
static_assert(weight_policy<Bf16> && weight_policy<F16> && weight_policy<F32>);

}  // namespace ling::quant
