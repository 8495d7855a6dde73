#pragma once
// CPU router (spec §2 "MoE FFN"): sigmoid scores, biased grouped top-k selection, unbiased weights.
#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "ling/cpu/backend.hpp"
#include "ling/cpu/linear.hpp"
#include "ling/layers/router.hpp"

namespace ling::cpu {

// Routes one token from its router logits [E].
template <class Config>
layers::Routing route_scores(Config const& c, float const* logits, std::vector<float> const& bias) {
  std::int64_t const e_count = c.experts(), group_size = e_count / c.n_group;
  std::vector<float> s(static_cast<std::size_t>(e_count)), sel(static_cast<std::size_t>(e_count));
  for (std::int64_t e = 0; e < e_count; ++e) {
    s[std::size_t(e)] = ops::sigmoid(logits[e]);
    sel[std::size_t(e)] = s[std::size_t(e)] + (bias.empty() ? 0.f : bias[std::size_t(e)]);
  }
  // Larger score first; ties go to the lower index (as a stable top-k).
  auto better = [](std::vector<float> const& v) {
    return [&v](std::int64_t a, std::int64_t b) { return v[std::size_t(a)] > v[std::size_t(b)] || (v[std::size_t(a)] == v[std::size_t(b)] && a < b); };
  };
  float group_margin = std::numeric_limits<float>::infinity();
  if (c.n_group > 1 && c.topk_group < c.n_group) {
    std::vector<float> group_score(static_cast<std::size_t>(c.n_group));
    for (std::int64_t g = 0; g < c.n_group; ++g) {
      std::vector<float> m(sel.begin() + g * group_size, sel.begin() + (g + 1) * group_size);
      std::int64_t top = std::min<std::int64_t>(2, group_size);
      std::partial_sort(m.begin(), m.begin() + top, m.end(), std::greater<float>());
      group_score[std::size_t(g)] = std::accumulate(m.begin(), m.begin() + top, 0.f);
    }
    std::vector<std::int64_t> order(static_cast<std::size_t>(c.n_group));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + c.topk_group, order.end(), better(group_score));
    float best_dropped = -std::numeric_limits<float>::infinity();
    for (std::int64_t i = c.topk_group; i < c.n_group; ++i)
      best_dropped = std::max(best_dropped, group_score[std::size_t(order[std::size_t(i)])]);
    group_margin = group_score[std::size_t(order[std::size_t(c.topk_group - 1)])] - best_dropped;
    std::vector<char> keep(std::size_t(c.n_group), 0);
    for (std::int64_t i = 0; i < c.topk_group; ++i) keep[std::size_t(order[std::size_t(i)])] = 1;
    for (std::int64_t e = 0; e < e_count; ++e)
      if (!keep[std::size_t(e / group_size)]) sel[std::size_t(e)] = -std::numeric_limits<float>::infinity();
  }
  std::vector<std::int64_t> idx(static_cast<std::size_t>(e_count));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + c.top_k, idx.end(), better(sel));
  layers::Routing r;
  // Experts of dropped groups are -inf, so the best non-chosen one comes from the kept groups; none left: +inf.
  float best_rest = -std::numeric_limits<float>::infinity();
  for (std::int64_t i = c.top_k; i < e_count; ++i)
    best_rest = std::max(best_rest, sel[std::size_t(idx[std::size_t(i)])]);
  r.margin = std::min(group_margin, sel[std::size_t(idx[std::size_t(c.top_k - 1)])] - best_rest);
  float sum = 0.f;
  for (std::int64_t i = 0; i < c.top_k; ++i) {
    r.experts.push_back(std::int32_t(idx[std::size_t(i)]));
    r.weights.push_back(s[std::size_t(idx[std::size_t(i)])]);
    sum += s[std::size_t(idx[std::size_t(i)])];
  }
  for (float& w : r.weights) {
    if (c.norm_topk_prob) w /= (sum + 1e-20f);
    w *= c.routed_scaling_factor;
  }
  return r;
}

template <std::int64_t kH, std::int64_t kE, class P>
std::vector<layers::Routing> route(Backend& be, layers::Router<kH, kE, P> const& l, ConstMatrixRef x) {
  Matrix logits;
  linear(l.weights.gate, x, logits);
  std::vector<layers::Routing> out;
  out.reserve(static_cast<std::size_t>(x.rows()));
  for (std::int64_t t = 0; t < x.rows(); ++t) {
    out.push_back(route_scores(l.config, logits.row(t).data(), l.weights.expert_bias));
    be.min_routing_margin = std::min(be.min_routing_margin, out.back().margin);
  }
  return out;
}

// The layer vocabulary: a router's "output" is the routing of each token.
template <std::int64_t kH, std::int64_t kE, class P>
std::vector<layers::Routing> forward_prefill(Backend& be, layers::Router<kH, kE, P> const& l, ConstMatrixRef x) {
  return route(be, l, x);
}
template <std::int64_t kH, std::int64_t kE, class P>
std::vector<layers::Routing> forward_decode(Backend& be, layers::Router<kH, kE, P> const& l, ConstMatrixRef x) {
  return route(be, l, x);
}

}  // namespace ling::cpu
