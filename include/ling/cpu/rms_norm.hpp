#pragma once
// CPU RMSNorm (spec §2).
#include "ling/core/error.hpp"
#include "ling/cpu/backend.hpp"
#include "ling/layers/rms_norm.hpp"

namespace ling::cpu {

template <std::int64_t kDim>
void forward_prefill(Backend&, layers::RmsNorm<kDim> const& l, ConstMatrixRef x, Matrix& y) {
  std::int64_t const dim = l.config.dim();
  require(x.cols() == dim && std::int64_t(l.weights.weight.size()) == dim, ErrorCode::kShape,
          "RmsNorm: input or weight width differs from dim " + std::to_string(dim));
  y.resize(x.rows(), dim);
  for (std::int64_t t = 0; t < x.rows(); ++t)
    rms_norm_rows(x.row(t).data(), y.row(t).data(), 1, dim, l.weights.weight.data(), l.config.eps);
}
template <std::int64_t kDim>
void forward_decode(Backend& b, layers::RmsNorm<kDim> const& l, ConstMatrixRef x, Matrix& y) {
  forward_prefill(b, l, x, y);
}

}  // namespace ling::cpu
