#pragma once
// MXFP4 (OCP MX, the routed experts of -fp4): two E2M1 codes per byte, low nibble = even element, one UE8M0
// scale per 32 consecutive inputs of a row. Storage [rows, cols/2] bytes, scales [rows, cols/32].
#include <algorithm>
#include <cmath>

#include "ling/quant/concept.hpp"

namespace ling::quant {

struct Mxfp4 {
  using policy_concept = weight_policy_tag;
  using storage_type = std::uint8_t;
  using scale_type = Ue8m0;
  static constexpr std::string_view name = "mxfp4";
  static constexpr std::int64_t kBlock = 32;
  static constexpr std::int64_t storage_count(std::int64_t rows, std::int64_t cols) { return rows * (cols / 2); }
  static constexpr std::int64_t scale_count(std::int64_t rows, std::int64_t cols) { return rows * (cols / kBlock); }
  LING_HOST_DEVICE static float decode(storage_type const* w, scale_type const* s, std::int64_t, std::int64_t cols,
                                       std::int64_t r, std::int64_t c) {
    std::uint8_t byte = w[r * (cols / 2) + c / 2];
    std::uint8_t code = (c & 1) ? std::uint8_t(byte >> 4) : std::uint8_t(byte & 0xF);
    return e2m1_to_float(code) * to_float(s[r * (cols / kBlock) + c / kBlock]);
  }
  static void dequantize_row(storage_type const* w, scale_type const* s, std::int64_t, std::int64_t cols,
                             std::int64_t r, float* out) {
    storage_type const* wr = w + r * (cols / 2);
    scale_type const* sr = s + r * (cols / kBlock);
    for (std::int64_t c = 0; c < cols; c += 2) {
      float scale = to_float(sr[c / kBlock]);
      out[c] = e2m1_to_float(wr[c / 2] & 0xF) * scale;
      out[c + 1] = e2m1_to_float(wr[c / 2] >> 4) * scale;
    }
  }
  // Quantizes a float matrix (cols % 32 == 0): scale = 2^ceil(log2(amax / 6)), codes round to nearest even.
  static void quantize(float const* x, std::int64_t rows, std::int64_t cols, storage_type* w, scale_type* s) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t b = 0; b < cols / kBlock; ++b) {
        float const* xb = x + r * cols + b * kBlock;
        float amax = 0.f;
        for (std::int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
        Ue8m0 sc = amax > 0.f ? ue8m0_ceil(amax / 6.0f) : Ue8m0{127};
        s[r * (cols / kBlock) + b] = sc;
        float inv = 1.0f / to_float(sc);
        for (std::int64_t i = 0; i < kBlock; i += 2) {
          std::uint8_t lo = e2m1_from_float(xb[i] * inv), hi = e2m1_from_float(xb[i + 1] * inv);
          w[r * (cols / 2) + (b * kBlock + i) / 2] = std::uint8_t(lo | (hi << 4));
        }
      }
  }
};
static_assert(weight_policy<Mxfp4>);

}  // namespace ling::quant
