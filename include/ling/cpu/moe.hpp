#pragma once
// CPU MoE FFN (spec §2): tokens are grouped per chosen expert, so prefill runs each expert once as a
// matrix-matrix product over its tokens; decode is the same with one token.
#include <vector>

#include "ling/cpu/mlp.hpp"
#include "ling/cpu/router.hpp"
#include "ling/layers/moe.hpp"

namespace ling::cpu {

template <std::int64_t kH, std::int64_t kE, std::int64_t kW, std::int64_t kS, class P>
void forward_prefill(Backend& be, layers::Moe<kH, kE, kW, kS, P> const& l, ConstMatrixRef x, Matrix& y) {
  using Layer = layers::Moe<kH, kE, kW, kS, P>;
  std::int64_t const tokens = x.rows(), experts = l.config.router.experts();
  require(std::int64_t(l.weights.experts.size()) == experts, ErrorCode::kShape, "Moe: expert count differs from num_experts");
  typename Layer::RouterLayer router{l.config.router, l.weights.router};
  std::vector<layers::Routing> routes = route(be, router, x);
  // Per expert: which tokens and with what weight.
  std::vector<std::vector<std::pair<std::int64_t, float>>> by_expert(static_cast<std::size_t>(experts));
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::size_t i = 0; i < routes[std::size_t(t)].experts.size(); ++i)
      by_expert[std::size_t(routes[std::size_t(t)].experts[i])].push_back({t, routes[std::size_t(t)].weights[i]});
  y.setZero(tokens, x.cols());
  Matrix xs, ys;
  for (std::int64_t e = 0; e < experts; ++e) {
    auto const& list = by_expert[std::size_t(e)];
    if (list.empty()) continue;
    xs.resize(std::int64_t(list.size()), x.cols());
    for (std::size_t i = 0; i < list.size(); ++i) xs.row(std::int64_t(i)) = x.row(list[i].first);
    typename Layer::Expert expert{l.config.expert, l.weights.experts[std::size_t(e)]};
    forward_prefill(be, expert, xs, ys);
    for (std::size_t i = 0; i < list.size(); ++i) y.row(list[i].first) += list[i].second * ys.row(std::int64_t(i));
  }
  if (l.has_shared()) {
    typename Layer::Shared shared{l.config.shared, l.weights.shared};
    forward_prefill(be, shared, x, ys);
    y += ys;
  }
}
template <std::int64_t kH, std::int64_t kE, std::int64_t kW, std::int64_t kS, class P>
void forward_decode(Backend& be, layers::Moe<kH, kE, kW, kS, P> const& l, ConstMatrixRef x, Matrix& y) {
  forward_prefill(be, l, x, y);
}

}  // namespace ling::cpu
