// CPU layers against independent references: Linear in every policy (matrix-vector and matrix-matrix), RMSNorm,
// SwiGLU with its clamp, the grouped router, MoE, the KDA mixer (chunked prefill vs token-by-token decode) and the
// DecoderLayer composition; the router's selection margin and its aggregate over a Session's call.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "ling/cpu/decoder_layer.hpp"
#include "ling/cpu/kda_mixer.hpp"
#include "ling/cpu/linear.hpp"
#include "ling/cpu/mlp.hpp"
#include "ling/cpu/moe.hpp"
#include "ling/cpu/rms_norm.hpp"
#include "ling/cpu/router.hpp"
#include "ling/runtime/session.hpp"
#include "random_weights.hpp"

using namespace ling;
using Lin = layers::Linear<quant::DefaultPolicies>;
using Dyn = Extent<dynamic>;

namespace {

// y = x Wᵀ in double from element decode (MatrixView::at), independent of the tiled row path.
Eigen::MatrixXd reference_linear(Lin const& w, cpu::Matrix const& x) {
  Eigen::MatrixXd y(x.rows(), w.rows());
  w.visit([&](auto const& v) {
    for (std::int64_t t = 0; t < x.rows(); ++t)
      for (std::int64_t r = 0; r < v.rows; ++r) {
        double acc = 0;
        for (std::int64_t c = 0; c < v.cols; ++c) acc += double(v.at(r, c)) * double(x(t, c));
        y(t, r) = acc;
      }
  });
  return y;
}

Lin quantized(std::string_view policy, std::vector<float> const& w, std::int64_t rows, std::int64_t cols) {
  using namespace quant;
  if (policy == "bf16") {
    std::vector<Bfloat16> d;
    for (float x : w) d.push_back(bf16_from_float(x));
    return Lin::owned<Bf16>(d, {}, rows, cols);
  }
  if (policy == "f16") {
    std::vector<Half> d;
    for (float x : w) d.push_back(half_from_float(x));
    return Lin::owned<F16>(d, {}, rows, cols);
  }
  if (policy == "fp8-block") {
    std::vector<E4m3> d(std::size_t(rows * cols));
    std::vector<float> s(std::size_t(Fp8Block::scale_count(rows, cols)));
    Fp8Block::quantize(w.data(), rows, cols, d.data(), s.data(), true);
    return Lin::owned<Fp8Block>(d, s, rows, cols);
  }
  if (policy == "fp8-row") {
    std::vector<E4m3> d(std::size_t(rows * cols));
    std::vector<float> s(static_cast<std::size_t>(rows));
    Fp8Row::quantize([&](std::int64_t r, std::int64_t c) { return w[std::size_t(r * cols + c)]; }, rows, cols, d.data(), s.data());
    return Lin::owned<Fp8Row>(d, s, rows, cols);
  }
  std::vector<std::uint8_t> d(std::size_t(Mxfp4::storage_count(rows, cols)));
  std::vector<Ue8m0> s(std::size_t(Mxfp4::scale_count(rows, cols)));
  Mxfp4::quantize(w.data(), rows, cols, d.data(), s.data());
  return Lin::owned<Mxfp4>(d, s, rows, cols);
}

}  // namespace

TEST_CASE("Linear: every default policy, one token and many, against element-wise decode in double") {
  test::Rng rng;
  for (std::string_view p : {"f32", "bf16", "f16", "fp8-block", "fp8-row", "mxfp4"}) {
    CAPTURE(p);
    std::int64_t rows = 130, cols = p == "mxfp4" ? 192 : 200;  // partial FP8 blocks on both edges; tile edge 64
    auto w = rng.vec(rows * cols, 0.05f);
    Lin lin = p == "f32" ? layers::make_f32_linear<quant::DefaultPolicies>(w, rows, cols) : quantized(p, w, rows, cols);
    CHECK(lin.policy_name() == p);
    for (std::int64_t T : {1, 5, 70}) {
      cpu::Matrix x = rng.mat(T, cols);
      cpu::Matrix y = cpu::linear(lin, x);
      Eigen::MatrixXd ref = reference_linear(lin, x);
      CHECK((y.cast<double>() - ref).norm() / ref.norm() < 1e-6);
    }
    // Quantization error itself is bounded (sanity of the policies as used here).
    cpu::Matrix x = rng.mat(3, cols);
    cpu::Matrix exact = x * Eigen::Map<cpu::Matrix>(w.data(), rows, cols).transpose();
    double err = (cpu::linear(lin, x) - exact).norm() / exact.norm();
    CHECK(err < (p == "mxfp4" ? 0.2 : p.starts_with("fp8") ? 0.06 : 0.01));
  }
}

TEST_CASE("RMSNorm against a double reference") {
  test::Rng rng;
  cpu::Backend be;
  layers::RmsNorm<> n;
  n.config = {Dyn(37, "dim"), 1e-6f};
  n.weights.weight = rng.vec(37, 0.2f, 1.f);
  cpu::Matrix x = rng.mat(4, 37, 3.f), y;
  cpu::forward_prefill(be, n, x, y);
  for (int t = 0; t < 4; ++t) {
    double ms = x.row(t).cast<double>().squaredNorm() / 37;
    for (int d = 0; d < 37; ++d)
      CHECK(y(t, d) == doctest::Approx(n.weights.weight[d] * x(t, d) / std::sqrt(ms + 1e-6)).epsilon(1e-6));
  }
}

TEST_CASE("SwiGLU with and without the clamp") {
  test::Rng rng;
  cpu::Backend be;
  layers::SwiGlu<> m;
  m.weights = {rng.linear(24, 16), rng.linear(24, 16), rng.linear(16, 24)};
  cpu::Matrix x = rng.mat(3, 16, 2.f);
  for (float limit : {0.f, 0.5f}) {
    m.config = {Dyn(16, "hidden"), Dyn(24, "width"), limit};
    REQUIRE(layers::SwiGlu<>::check(m.config, m.weights).is_ok());
    cpu::Matrix y;
    cpu::forward_decode(be, m, x, y);
    Eigen::MatrixXd a = reference_linear(m.weights.gate, x), b = reference_linear(m.weights.up, x);
    cpu::Matrix h(3, 24);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 24; ++j) {
        double s = a(i, j) / (1 + std::exp(-a(i, j))), u = b(i, j);
        if (limit > 0) s = std::min(s, double(limit)), u = std::clamp(u, -double(limit), double(limit));
        h(i, j) = float(s * u);
      }
    Eigen::MatrixXd ref = reference_linear(m.weights.down, h);
    CHECK((y.cast<double>() - ref).norm() / ref.norm() < 1e-5);
  }
}

TEST_CASE("router: grouped top-k on biased scores, weights from unbiased scores") {
  using R = layers::Router<>;
  R::Config c{Dyn(4, "h"), Dyn(8, "e"), 2, 4, 2, true, 2.5f};
  REQUIRE(R::can_implement(c).is_ok());
  // Scores (sigmoid of logits) chosen by hand: groups {0,1} {2,3} {4,5} {6,7}.
  float logits[8] = {2.0f, -1.0f, 0.5f, 0.4f, 3.0f, -3.0f, 0.0f, 0.1f};
  std::vector<float> bias(8, 0.f);
  // Group scores (top-2 sums): g0 = s(2)+s(-1), g1 = s(.5)+s(.4), g2 = s(3)+s(-3), g3 = s(0)+s(.1)
  // = 1.149, 1.221, 1.0, 1.025 -> keep g1, g0 -> experts {0,1,2,3}; top-2 = 0, 2.
  auto r = cpu::route_scores(c, logits, bias);
  REQUIRE(r.experts.size() == 2);
  CHECK(r.experts[0] == 0);
  CHECK(r.experts[1] == 2);
  auto sg = [](float x) { return 1 / (1 + std::exp(-x)); };
  CHECK(r.weights[0] == doctest::Approx(2.5 * sg(2.0f) / (sg(2.0f) + sg(0.5f))));
  CHECK(r.weights[1] == doctest::Approx(2.5 * sg(0.5f) / (sg(2.0f) + sg(0.5f))));
  // A bias moves selection (group 2 and expert 5 win) but not the weights, which use unbiased scores.
  bias[5] = 2.0f;
  r = cpu::route_scores(c, logits, bias);
  std::set<int> chosen(r.experts.begin(), r.experts.end());
  CHECK(chosen == std::set<int>{4, 5});
  CHECK(r.weights[0] + r.weights[1] == doctest::Approx(2.5));
  CHECK(r.weights[r.experts[0] == 5 ? 0 : 1] == doctest::Approx(2.5 * sg(-3.f) / (sg(-3.f) + sg(3.f))));
  // Without normalisation: scaling times the raw score.
  c.norm_topk_prob = false;
  c.n_group = 1;
  c.topk_group = 1;
  bias.assign(8, 0.f);
  r = cpu::route_scores(c, logits, bias);
  CHECK(r.experts[0] == 4);
  CHECK(r.weights[0] == doctest::Approx(2.5 * sg(3.0f)));
}

TEST_CASE("router: random scores against a brute-force reference over kept groups") {
  test::Rng rng;
  using R = layers::Router<>;
  R::Config c{Dyn(4, "h"), Dyn(64, "e"), 6, 8, 3, true, 1.7f};
  for (int trial = 0; trial < 50; ++trial) {
    auto logits = rng.vec(64);
    auto bias = rng.vec(64, 0.3f);
    auto r = cpu::route_scores(c, logits.data(), bias);
    std::vector<double> s(64), sb(64);
    for (int e = 0; e < 64; ++e) s[e] = 1 / (1 + std::exp(-double(logits[e]))), sb[e] = s[e] + bias[e];
    std::vector<std::pair<double, int>> groups;
    for (int g = 0; g < 8; ++g) {
      std::vector<double> v(sb.begin() + g * 8, sb.begin() + g * 8 + 8);
      std::sort(v.rbegin(), v.rend());
      groups.push_back({v[0] + v[1], g});
    }
    std::sort(groups.rbegin(), groups.rend());
    std::vector<std::pair<double, int>> cand;
    for (int i = 0; i < 3; ++i)
      for (int e = groups[i].second * 8; e < groups[i].second * 8 + 8; ++e) cand.push_back({sb[e], e});
    std::sort(cand.rbegin(), cand.rend());
    // Margin: the smaller of the k-th over the (k+1)-th kept expert and the 3rd over the 4th group.
    double margin = std::min(cand[5].first - cand[6].first, groups[2].first - groups[3].first);
    CHECK(std::abs(r.margin - margin) < 1e-6);
    double sum = 0;
    for (int i = 0; i < 6; ++i) sum += s[cand[i].second];
    for (int i = 0; i < 6; ++i) {
      CHECK(r.experts[i] == cand[i].second);
      CHECK(r.weights[i] == doctest::Approx(1.7 * s[cand[i].second] / sum).epsilon(1e-5));
    }
  }
}

TEST_CASE("router: margin is the smallest gap at the top-k and the group boundary") {
  using R = layers::Router<>;
  std::vector<float> logits(8, 0.f);  // every score sigmoid(0) = 0.5, so the bias alone orders the experts
  // Ungrouped, top-2 of 4: a near tie between the 2nd (0.7) and the 3rd (0.6999) expert.
  R::Config c{Dyn(4, "h"), Dyn(4, "e"), 2, 1, 1, true, 1.f};
  REQUIRE(R::can_implement(c).is_ok());
  std::vector<float> bias{0.3f, 0.2f, 0.2f - 1e-4f, 0.f};
  auto r = cpu::route_scores(c, logits.data(), bias);
  CHECK(std::set<int>(r.experts.begin(), r.experts.end()) == std::set<int>{0, 1});
  CHECK(r.margin == (0.5f + 0.2f) - (0.5f + (0.2f - 1e-4f)));
  CHECK(r.margin == doctest::Approx(1e-4).epsilon(1e-2));
  // An exact tie is a zero margin (the lower index wins it).
  bias[2] = 0.2f;
  CHECK(cpu::route_scores(c, logits.data(), bias).margin == 0.f);
  // Every expert chosen: no boundary, +inf.
  c.top_k = 4;
  CHECK(std::isinf(cpu::route_scores(c, logits.data(), bias).margin));
  // Grouped, 4 groups of 2, keep 2, top-2. Group scores (top-2 sums) 1.4, 1.8, 1.0, 1.399: g1 and g0 kept, g3 the
  // best dropped, 1e-3 behind; the kept experts' scores 0.9, 0.5, 1.0, 0.8 give a top-k gap of 0.1, so the group
  // gap is the margin.
  R::Config g{Dyn(4, "h"), Dyn(8, "e"), 2, 4, 2, true, 1.f};
  REQUIRE(R::can_implement(g).is_ok());
  bias = {0.4f, 0.f, 0.5f, 0.3f, 0.f, 0.f, 0.2f, 0.199f};
  r = cpu::route_scores(g, logits.data(), bias);
  CHECK(std::set<int>(r.experts.begin(), r.experts.end()) == std::set<int>{0, 2});
  CHECK(r.margin == doctest::Approx(1e-3).epsilon(1e-3));
  // Group 3 far behind: the top-k gap (1.0 and 0.9 chosen, 0.8 the best left in the kept groups) is the margin.
  bias[6] = bias[7] = 0.f;
  r = cpu::route_scores(g, logits.data(), bias);
  CHECK(r.margin == doctest::Approx(0.1).epsilon(1e-4));
  // A dropped group's expert does not count, however close: groups 1.449, 1.9, 1.75, 1.0 keep g1 and g2 (gap 0.301);
  // 1.0 and 0.95 are chosen, 0.9 is the best left in the kept groups (gap 0.05), not 0.949 of the dropped g0.
  bias = {0.449f, 0.f, 0.5f, 0.4f, 0.45f, 0.3f, 0.f, 0.f};
  r = cpu::route_scores(g, logits.data(), bias);
  CHECK(std::set<int>(r.experts.begin(), r.experts.end()) == std::set<int>{2, 4});
  CHECK(r.margin == doctest::Approx(0.05).epsilon(1e-4));
}

TEST_CASE("MoE: grouped-by-expert prefill equals a per-token reference; decode equals prefill") {
  test::Rng rng;
  cpu::Backend be;
  using M = layers::Moe<>;
  M m;
  m.config.router = {Dyn(16, "h"), Dyn(8, "e"), 3, 2, 1, true, 2.0f};
  m.config.expert = {Dyn(16, "h"), Dyn(12, "w"), 0.8f};
  m.config.shared = {Dyn(16, "h"), Dyn(20, "s"), 1.5f};
  REQUIRE(M::can_implement(m.config).is_ok());
  m.weights.router.gate = rng.linear(8, 16);
  m.weights.router.expert_bias = rng.vec(8, 0.1f);
  for (int e = 0; e < 8; ++e) m.weights.experts.push_back({rng.linear(12, 16), rng.linear(12, 16), rng.linear(16, 12)});
  m.weights.shared = {rng.linear(20, 16), rng.linear(20, 16), rng.linear(16, 20)};
  cpu::Matrix x = rng.mat(9, 16), y;
  cpu::forward_prefill(be, m, x, y);
  float const prefill_margin = be.min_routing_margin;
  float token_min = std::numeric_limits<float>::infinity();
  cpu::Matrix ref = cpu::Matrix::Zero(9, 16), row;
  for (int t = 0; t < 9; ++t) {
    M::RouterLayer router{m.config.router, m.weights.router};
    auto r = cpu::route(be, router, x.middleRows(t, 1))[0];
    token_min = std::min(token_min, r.margin);
    for (std::size_t i = 0; i < r.experts.size(); ++i) {
      M::Expert ex{m.config.expert, m.weights.experts[std::size_t(r.experts[i])]};
      cpu::forward_decode(be, ex, x.middleRows(t, 1), row);
      ref.row(t) += r.weights[i] * row;
    }
    M::Shared sh{m.config.shared, m.weights.shared};
    cpu::forward_decode(be, sh, x.middleRows(t, 1), row);
    ref.row(t) += row;
  }
  CHECK(test::rel_l2(y, ref) < 1e-6);
  // The backend keeps the smallest margin over the tokens routed.
  CHECK(std::isfinite(prefill_margin));
  CHECK(prefill_margin == token_min);
  cpu::Matrix y1;
  cpu::forward_decode(be, m, x.middleRows(4, 1), y1);
  CHECK(test::rel_l2(y1, y.middleRows(4, 1)) < 1e-6);
}

TEST_CASE("MoE: Session::routing_margin covers the last prefill/decode of a checkpoint") {
  auto s = runtime::Session::open(std::string(LING_TEST_DATA) + "/ling-a-bf16");
  CHECK(std::isinf(s.routing_margin()));  // nothing routed yet
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 23; ++i) prompt.push_back(std::int32_t((i * 37 + 11) % s.vocab_size()));
  auto l = s.prefill(prompt);
  float const prefill_margin = s.routing_margin();
  CHECK(std::isfinite(prefill_margin));
  CHECK(prefill_margin > 0.f);
  // The MTP layer's own routing does not change it (the margin describes the main model's call).
  std::int32_t const next = std::int32_t(std::max_element(l.begin(), l.end()) - l.begin());
  if (s.has_mtp()) {
    std::vector<std::int32_t> following(prompt.begin() + 1, prompt.end());
    following.push_back(next);
    (void)s.mtp_after(following);
    CHECK(s.routing_margin() == prefill_margin);
  }
  // A decode routes one token and reports that token's margin alone.
  (void)s.decode(next);
  float const decode_margin = s.routing_margin();
  CHECK(std::isfinite(decode_margin));
  CHECK(decode_margin > 0.f);
  MESSAGE("ling-a-bf16 routing margin: prefill " << prefill_margin << ", decode " << decode_margin);
}

namespace {
layers::KdaMixer<> make_kda(test::Rng& rng, bool low_rank, bool safe) {
  layers::KdaMixer<> l;
  auto& c = l.config;
  c.hidden = Dyn(32, "hidden");
  c.heads = Dyn(3, "heads");
  c.head_dim = Dyn(8, "head_dim");
  c.low_rank_fg = low_rank;
  c.safe_gate = safe;
  c.lower_bound = -5.f;
  std::int64_t P = 24;
  auto& w = l.weights;
  w.q_proj = rng.linear(P, 32), w.k_proj = rng.linear(P, 32), w.v_proj = rng.linear(P, 32);
  if (low_rank) {
    w.f_a_proj = rng.linear(8, 32), w.f_b_proj = rng.linear(P, 8), w.g_a_proj = rng.linear(8, 32), w.g_b_proj = rng.linear(P, 8);
  } else {
    w.f_proj = rng.linear(P, 32), w.g_proj = rng.linear(P, 32);
  }
  w.b_proj = rng.linear(3, 32);
  w.q_conv = rng.vec(P * 4, 0.5f), w.k_conv = rng.vec(P * 4, 0.5f), w.v_conv = rng.vec(P * 4, 0.5f);
  w.a_log = rng.vec(3, 0.3f);
  w.dt_bias = rng.vec(P, 0.3f);
  w.o_norm = rng.vec(8, 0.1f, 1.f);
  w.o_proj = rng.linear(32, P);
  REQUIRE(layers::KdaMixer<>::can_implement(c).is_ok());
  return l;
}
}  // namespace

TEST_CASE("KDA mixer: chunked prefill equals token-by-token recurrent decode; state carries across calls") {
  test::Rng rng;
  cpu::Backend be;
  for (auto [low_rank, safe] : {std::pair{false, true}, std::pair{true, false}}) {
    auto l = make_kda(rng, low_rank, safe);
    cpu::Matrix x = rng.mat(150, 32), y_pre, y_step(150, 32), row;
    auto s1 = layers::KdaMixer<>::make_state(l.config), s2 = s1, s3 = s1;
    cpu::forward_prefill(be, l, s1, x, y_pre);
    for (int t = 0; t < 150; ++t) {
      cpu::forward_decode(be, l, s2, x.middleRows(t, 1), row);
      y_step.row(t) = row;
    }
    CHECK(test::rel_l2(y_pre, y_step) < 1e-5);
    // Two prefills of 70 + 80 continue one stream.
    cpu::Matrix a, b;
    cpu::forward_prefill(be, l, s3, x.topRows(70), a);
    cpu::forward_prefill(be, l, s3, x.bottomRows(80), b);
    CHECK(test::rel_l2(b, y_step.bottomRows(80)) < 1e-5);
    CHECK(layers::KdaMixer<>::state_bytes(l.config) == 4 * (3 * 8 * 8 + 3 * 3 * 24));
  }
}

TEST_CASE("DecoderLayer composes x + Mixer(norm x) and h + Ffn(norm h)") {
  test::Rng rng;
  cpu::Backend be;
  using Mlp = layers::SwiGlu<>;
  using Kda = layers::KdaMixer<>;
  layers::DecoderLayer<layers::OneOf<Kda>, layers::OneOf<Mlp>> d;
  d.input_norm = {{Dyn(32, "h"), 1e-6f}, {rng.vec(32, 0.1f, 1.f)}};
  d.post_norm = {{Dyn(32, "h"), 1e-6f}, {rng.vec(32, 0.1f, 1.f)}};
  d.mixer.layer = make_kda(rng, false, true);
  Mlp mlp;
  mlp.config = {Dyn(32, "h"), Dyn(40, "w"), 0.f};
  mlp.weights = {rng.linear(40, 32), rng.linear(40, 32), rng.linear(32, 40)};
  d.ffn.layer = mlp;
  auto st = d.make_state();
  cpu::Matrix x = rng.mat(6, 32), y;
  cpu::forward_prefill(be, d, st, x, y);
  // By hand.
  auto ks = Kda::make_state(d.mixer.as<Kda>().config);
  cpu::Matrix n, m, h, f;
  cpu::forward_prefill(be, d.input_norm, x, n);
  cpu::forward_prefill(be, d.mixer.as<Kda>(), ks, n, m);
  h = x + m;
  cpu::forward_prefill(be, d.post_norm, h, n);
  cpu::forward_prefill(be, mlp, n, f);
  CHECK(test::rel_l2(y, h + f) < 1e-7);
  CHECK(std::get<Kda::State>(st).s == ks.s);
}

TEST_CASE("layer vocabulary: Linear and Router through forward_prefill/forward_decode, DecoderLayer state_bytes") {
  test::Rng rng;
  cpu::Backend be;
  Lin w = rng.linear(7, 5);
  cpu::Matrix x = rng.mat(3, 5), y1, y2;
  cpu::forward_prefill(be, w, x, y1);
  cpu::forward_decode(be, w, x.middleRows(1, 1), y2);
  CHECK(test::rel_l2(y2, y1.middleRows(1, 1)) < 1e-7);
  layers::Router<> r{{Dyn(5, "h"), Dyn(4, "e"), 2, 1, 1, true, 1.f}, {rng.linear(4, 5), {}}};
  auto routes = cpu::forward_prefill(be, r, x);
  CHECK(routes.size() == 3);
  CHECK(routes[0].weights[0] + routes[0].weights[1] == doctest::Approx(1.0));
  using Kda = layers::KdaMixer<>;
  layers::DecoderLayer<Kda, layers::SwiGlu<>> d;
  d.mixer = make_kda(rng, false, true);
  d.input_norm.config.dim = d.post_norm.config.dim = Dyn(32, "h");
  CHECK(d.can_implement().is_ok());
  CHECK(d.state_bytes() == Kda::state_bytes(d.mixer.config));
}
