#pragma once
// y = x Wᵀ for a Linear in any policy: rows of W are dequantized (MatrixView<P>::row, i.e. the policy's decode)
// a tile at a time and multiplied in fp32 by Eigen. One token (matrix-vector) and many (matrix-matrix) share it.
#include <algorithm>

#include "ling/core/error.hpp"
#include "ling/cpu/backend.hpp"
#include "ling/layers/linear.hpp"

namespace ling::cpu {

inline constexpr std::int64_t kLinearTile = 64;

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
      for (std::int64_t i = 0; i < n; ++i) view.row(r0 + i, tile.row(i).data());
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

// The whole matrix in fp32 (for ops that reshape a weight, e.g. MLA's absorbed W_UK / W_UV).
template <class Policies>
Matrix dequantize(layers::Linear<Policies> const& w) {
  Matrix m(w.rows(), w.cols());
  for (std::int64_t r = 0; r < w.rows(); ++r) w.row(r, m.row(r).data());
  return m;
}

}  // namespace ling::cpu
