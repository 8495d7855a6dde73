#pragma once
// y = x Wᵀ for a Linear in any policy: rows of W are dequantized (MatrixView<P>::row, i.e. the policy's decode)
// a tile at a time and multiplied in fp32 by Eigen. One token (matrix-vector) and many (matrix-matrix) share it.
#include <algorithm>
#include <type_traits>

#include "ling/core/error.hpp"
#include "ling/cpu/backend.hpp"
#include "ling/layers/linear.hpp"
#include "ling/quant/policies.hpp"

namespace ling::cpu {

inline constexpr std::int64_t kLinearTile = 64;
// Up to this many input rows, each dequantized tile is applied row by row (matrix-vector products): Eigen's
// matrix-matrix product packs the tile first, which for 2 rows cost about as much as decoding it (perf, 2026-12-07:
// a two-token decode took ~1.7x a one-token one). Each row then also gets the one-row product's sums, bit for bit.
inline constexpr std::int64_t kLinearRowsByVector = 4;

namespace detail {
// Table decodes for the byte formats: the same values as the policies' decode (quant/), looked up instead of
// recomputed per element, which is what bounds the CPU path for FP8 and MXFP4 weights.
struct ByteTables {
  float e4m3[256];
  float e2m1_lo[256], e2m1_hi[256];
  ByteTables() {
    for (int b = 0; b < 256; ++b) {
      e4m3[b] = to_float(E4m3{std::uint8_t(b)});
      e2m1_lo[b] = e2m1_to_float(std::uint8_t(b & 0xF));
      e2m1_hi[b] = e2m1_to_float(std::uint8_t(b >> 4));
    }
  }
};
inline ByteTables const& byte_tables() {
  static ByteTables const t;
  return t;
}

// Row r of a matrix into out[0..cols): table paths for the shipped byte formats, the policy's own row/decode
// otherwise (any policy, including ones defined outside the library).
template <class View>
void dequantize_row(View const& v, std::int64_t r, float* out) {
  using P = typename View::policy;
  std::int64_t const cols = v.cols;
  if constexpr (std::is_same_v<P, quant::Fp8Block>) {
    auto const& t = byte_tables();
    E4m3 const* w = v.data + r * cols;
    float const* srow = v.scales + (r / P::kBlock) * quant::ceil_div(cols, P::kBlock);
    for (std::int64_t c0 = 0; c0 < cols; c0 += P::kBlock) {
      float const s = srow[c0 / P::kBlock];
      std::int64_t const c1 = std::min(cols, c0 + P::kBlock);
      for (std::int64_t c = c0; c < c1; ++c) out[c] = t.e4m3[w[c].bits] * s;
    }
  } else if constexpr (std::is_same_v<P, quant::Fp8Row>) {
    auto const& t = byte_tables();
    E4m3 const* w = v.data + r * cols;
    float const s = v.scales[r];
    for (std::int64_t c = 0; c < cols; ++c) out[c] = t.e4m3[w[c].bits] * s;
  } else if constexpr (std::is_same_v<P, quant::Mxfp4>) {
    auto const& t = byte_tables();
    std::uint8_t const* w = v.data + r * (cols / 2);
    Ue8m0 const* sr = v.scales + r * (cols / P::kBlock);
    for (std::int64_t c0 = 0; c0 < cols; c0 += P::kBlock) {
      float const s = to_float(sr[c0 / P::kBlock]);
      for (std::int64_t c = c0; c < c0 + P::kBlock; c += 2) {
        std::uint8_t const b = w[c / 2];
        out[c] = t.e2m1_lo[b] * s;
        out[c + 1] = t.e2m1_hi[b] * s;
      }
    }
  } else {
    v.row(r, out);
  }
}
}  // namespace detail

template <class Policies>
void linear(layers::Linear<Policies> const& w, ConstMatrixRef x, Matrix& y) {
  std::int64_t const rows = w.rows(), cols = w.cols();
  require(x.cols() == cols, ErrorCode::kShape,
          "linear: input has " + std::to_string(x.cols()) + " features, weight expects " + std::to_string(cols));
  y.resize(x.rows(), rows);
  w.visit([&](auto const& view) {
    Matrix tile(std::min(kLinearTile, rows), cols);
    for (std::int64_t r0 = 0; r0 < rows; r0 += kLinearTile) {
      std::int64_t n = std::min(kLinearTile, rows - r0);
      for (std::int64_t i = 0; i < n; ++i) detail::dequantize_row(view, r0 + i, tile.row(i).data());
      if (x.rows() <= kLinearRowsByVector)  // a few tokens (decode, a speculative step): matrix-vector products
        for (std::int64_t t = 0; t < x.rows(); ++t)
          y.row(t).segment(r0, n).noalias() = x.row(t) * tile.topRows(n).transpose();
      else
        y.middleCols(r0, n).noalias() = x * tile.topRows(n).transpose();
    }
  });
}

template <class Policies>
Matrix linear(layers::Linear<Policies> const& w, ConstMatrixRef x) {
  Matrix y;
  linear(w, x, y);
  return y;
}

template <class Policies>
void forward_prefill(Backend&, layers::Linear<Policies> const& w, ConstMatrixRef x, Matrix& y) { linear(w, x, y); }
template <class Policies>
void forward_decode(Backend&, layers::Linear<Policies> const& w, ConstMatrixRef x, Matrix& y) { linear(w, x, y); }

// The whole matrix in fp32 (for ops that reshape a weight, e.g. MLA's absorbed W_UK / W_UV).
template <class Policies>
Matrix dequantize(layers::Linear<Policies> const& w) {
  Matrix m(w.rows(), w.cols());
  for (std::int64_t r = 0; r < w.rows(); ++r) w.row(r, m.row(r).data());
  return m;
}

}  // namespace ling::cpu
