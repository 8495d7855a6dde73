#pragma once
// Static or dynamic dimensions, Eigen-style (DESIGN.md decision 1). `Extent<N>` is a compile-time constant;
// `Extent<ling::dynamic>` holds a runtime value read from config.json. Both read as `e()`, so one code path
// serves a fully static spec (ling3_flash.hpp) and the dynamic one (dynamic.hpp).
#include <cstdint>
#include <string>
#include <string_view>

#include "ling/core/error.hpp"

namespace ling {

inline constexpr std::int64_t dynamic = -1;

template <std::int64_t N>
class Extent {
  static_assert(N >= 0 || N == dynamic, "an extent is a size >= 0 or ling::dynamic");

 public:
  static constexpr bool is_static = true;
  constexpr Extent() = default;
  // Accepts only N: a static dimension refuses a config that does not match (the error names the key).
  constexpr Extent(std::int64_t v, std::string_view key, std::string_view source = "config.json") {
    if (v != N)
      fail(ErrorCode::kConfig, std::string(source) + ": '" + std::string(key) + "' is " + std::to_string(v) +
                                   " but this model type is built for " + std::to_string(N));
  }
  constexpr std::int64_t operator()() const noexcept { return N; }
};

template <>
class Extent<dynamic> {
 public:
  static constexpr bool is_static = false;
  constexpr Extent() = default;
  constexpr Extent(std::int64_t v, std::string_view key, std::string_view source = "config.json") : v_(v) {
    if (v < 0) fail(ErrorCode::kConfig, std::string(source) + ": '" + std::string(key) + "' is negative");
  }
  constexpr std::int64_t operator()() const noexcept { return v_; }

 private:
  std::int64_t v_ = 0;
};

}  // namespace ling
