// Tests of the CPU KDA core (spec §2 "KDA mixer"): the recurrent form against a double-precision per-token
// reference written here from the spec equations, the chunked form against the recurrent one, split sequences,
// the building blocks, and config errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "ling/cpu/kda.hpp"
#include "ling/cpu/short_conv.hpp"

namespace {

using ling::cpu::KdaCoreConfig;
using ling::cpu::KdaCoreWeights;
using ling::cpu::KdaState;

// ---- a naive reference in double, spelled out from spec §2 (no library helper is called) -------------------------
struct Reference {
  int heads, dim, kernel;
  bool safe;
  double lower_bound, eps;
  std::vector<double> q_conv, k_conv, v_conv, a_log, dt_bias, o_norm;
  std::vector<double> S;                                 // [H][K][V]
  std::vector<std::vector<double>> past_q, past_k, past_v;  // raw inputs of the last kernel-1 tokens, oldest first

  int width() const { return heads * dim; }

  static double conv_silu(std::vector<double> const& w, int kernel, std::vector<std::vector<double>> const& past,
                          std::vector<double> const& cur, int i) {
    double acc = w[i * kernel + kernel - 1] * cur[i];
    for (int j = 0; j < kernel - 1; ++j) acc += w[i * kernel + j] * past[j][i];  // past[j] is token t-(kernel-1)+j
    return acc / (1.0 + std::exp(-acc));
  }
  static void push(std::vector<std::vector<double>>& past, std::vector<double> const& cur) {
    if (past.empty()) return;
    past.erase(past.begin());
    past.push_back(cur);
  }

  // One token: inputs are rows of length P (b: H); returns the P outputs.
  std::vector<double> step(float const* xq, float const* xk, float const* xv, float const* f, float const* b,
                           float const* gout) {
    int const P = width(), K = dim;
    std::vector<double> aq(xq, xq + P), ak(xk, xk + P), av(xv, xv + P), cq(P), ck(P), cv(P);
    for (int i = 0; i < P; ++i) {
      cq[i] = conv_silu(q_conv, kernel, past_q, aq, i);
      ck[i] = conv_silu(k_conv, kernel, past_k, ak, i);
      cv[i] = conv_silu(v_conv, kernel, past_v, av, i);
    }
    push(past_q, aq), push(past_k, ak), push(past_v, av);
    std::vector<double> out(P);
    for (int h = 0; h < heads; ++h) {
      double nq = 0, nk = 0;
      for (int d = 0; d < K; ++d) nq += cq[h * K + d] * cq[h * K + d], nk += ck[h * K + d] * ck[h * K + d];
      std::vector<double> q(K), k(K), v(K), g(K);
      for (int d = 0; d < K; ++d) {
        q[d] = cq[h * K + d] / std::sqrt(nq + 1e-6) / std::sqrt(double(K));
        k[d] = ck[h * K + d] / std::sqrt(nk + 1e-6);
        v[d] = cv[h * K + d];
        double const x = double(f[h * K + d]) + dt_bias[h * K + d];
        if (safe) {
          g[d] = lower_bound / (1.0 + std::exp(-std::exp(a_log[h]) * x));
        } else {
          double const sp = x > 20.0 ? x : std::log(1.0 + std::exp(x));
          g[d] = -std::exp(a_log[h]) * sp;
        }
      }
      double const beta = 1.0 / (1.0 + std::exp(-double(b[h])));
      double* s = S.data() + std::size_t(h) * K * K;
      for (int i = 0; i < K; ++i)
        for (int j = 0; j < K; ++j) s[i * K + j] *= std::exp(g[i]);  // S <- Diag(exp g) S
      std::vector<double> stk(K, 0.0);                                  // S^T k
      for (int j = 0; j < K; ++j)
        for (int i = 0; i < K; ++i) stk[j] += s[i * K + j] * k[i];
      for (int i = 0; i < K; ++i)
        for (int j = 0; j < K; ++j) s[i * K + j] += beta * k[i] * (v[j] - stk[j]);
      std::vector<double> o(K, 0.0);  // o = S^T q
      for (int j = 0; j < K; ++j)
        for (int i = 0; i < K; ++i) o[j] += s[i * K + j] * q[i];
      double ms = 0;
      for (int j = 0; j < K; ++j) ms += o[j] * o[j];
      ms /= K;
      for (int j = 0; j < K; ++j)
        out[h * K + j] = o_norm[j] * o[j] / std::sqrt(ms + eps) / (1.0 + std::exp(-double(gout[h * K + j])));
    }
    return out;
  }
};

// ---- random problems ----------------------------------------------------------------------------------------------
enum class GateInput { kNormal, kStrong };  // kStrong pushes safe gates to the bound, Kimi gates far below it

struct Problem {
  KdaCoreConfig cfg;
  std::vector<float> q_conv, k_conv, v_conv, a_log, dt_bias, o_norm;
  KdaCoreWeights weights() const {
    return {q_conv.data(), k_conv.data(), v_conv.data(), a_log.data(), dt_bias.data(), o_norm.data()};
  }
};

struct Inputs {
  std::int64_t T = 0;
  std::vector<float> xq, xk, xv, f, b, g;
};

std::vector<float> randn(std::mt19937& rng, std::size_t n, float mean = 0.0f, float sd = 1.0f) {
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
std::vector<float> uniform(std::mt19937& rng, std::size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Problem make_problem(std::mt19937& rng, std::int64_t heads, std::int64_t dim, bool safe) {
  Problem p;
  p.cfg.heads = heads, p.cfg.head_dim = dim, p.cfg.conv_kernel = 4, p.cfg.safe_gate = safe;
  auto const P = static_cast<std::size_t>(heads * dim);
  p.q_conv = uniform(rng, P * 4, -0.7f, 0.7f);
  p.k_conv = uniform(rng, P * 4, -0.7f, 0.7f);
  p.v_conv = uniform(rng, P * 4, -0.7f, 0.7f);
  p.a_log = uniform(rng, static_cast<std::size_t>(heads), 0.0f, std::log(16.0f));  // A in [1, 16], as models init it
  p.dt_bias = uniform(rng, P, -2.0f, 0.5f);
  p.o_norm = uniform(rng, static_cast<std::size_t>(dim), 0.5f, 1.5f);
  return p;
}

Inputs make_inputs(std::mt19937& rng, Problem const& p, std::int64_t T, GateInput gate) {
  Inputs in;
  in.T = T;
  auto const n = static_cast<std::size_t>(T * p.cfg.width());
  in.xq = randn(rng, n), in.xk = randn(rng, n), in.xv = randn(rng, n, 0.0f, 2.0f);
  in.f = gate == GateInput::kStrong ? randn(rng, n, p.cfg.safe_gate ? 8.0f : 3.0f, 1.0f) : randn(rng, n);
  in.b = randn(rng, static_cast<std::size_t>(T * p.cfg.heads), 0.5f, 1.5f);
  in.g = randn(rng, n);
  return in;
}

Reference make_reference(Problem const& p, KdaState const& st) {
  Reference r;
  r.heads = int(p.cfg.heads), r.dim = int(p.cfg.head_dim), r.kernel = int(p.cfg.conv_kernel);
  r.safe = p.cfg.safe_gate, r.lower_bound = p.cfg.lower_bound, r.eps = p.cfg.norm_eps;
  auto d = [](std::vector<float> const& v) { return std::vector<double>(v.begin(), v.end()); };
  r.q_conv = d(p.q_conv), r.k_conv = d(p.k_conv), r.v_conv = d(p.v_conv);
  r.a_log = d(p.a_log), r.dt_bias = d(p.dt_bias), r.o_norm = d(p.o_norm);
  r.S = d(st.s);
  int const P = r.width();
  for (int j = 0; j < r.kernel - 1; ++j) {
    r.past_q.emplace_back(st.conv_q.begin() + j * P, st.conv_q.begin() + (j + 1) * P);
    r.past_k.emplace_back(st.conv_k.begin() + j * P, st.conv_k.begin() + (j + 1) * P);
    r.past_v.emplace_back(st.conv_v.begin() + j * P, st.conv_v.begin() + (j + 1) * P);
  }
  return r;
}

template <class A, class B>
double rel_l2(A const& got, B const& want) {
  REQUIRE(got.size() == want.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    double const e = double(got[i]) - double(want[i]);
    num += e * e, den += double(want[i]) * double(want[i]);
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

enum class Form { kRecurrent, kChunked };

std::vector<float> run(Form form, Problem const& p, KdaState& st, Inputs const& in, std::int64_t t0, std::int64_t T,
                       std::int64_t chunk = 64) {
  std::int64_t const P = p.cfg.width(), H = p.cfg.heads;
  std::vector<float> out(static_cast<std::size_t>(T * P), std::nanf(""));
  auto const w = p.weights();
  float const* xq = in.xq.data() + t0 * P;
  float const* xk = in.xk.data() + t0 * P;
  float const* xv = in.xv.data() + t0 * P;
  float const* f = in.f.data() + t0 * P;
  float const* b = in.b.data() + t0 * H;
  float const* g = in.g.data() + t0 * P;
  if (form == Form::kRecurrent)
    ling::cpu::kda_forward_recurrent(p.cfg, w, st, T, xq, xk, xv, f, b, g, out.data());
  else
    ling::cpu::kda_forward_chunked(p.cfg, w, st, T, xq, xk, xv, f, b, g, out.data(), chunk);
  return out;
}

// A realistic non-zero state: 50 random tokens through the recurrent form from zero.
KdaState warm_state(std::mt19937& rng, Problem const& p) {
  auto st = KdaState::zeros(p.cfg);
  auto const warm = make_inputs(rng, p, 50, GateInput::kNormal);
  run(Form::kRecurrent, p, st, warm, 0, 50);
  return st;
}

double max_state_err(KdaState const& a, KdaState const& b) {
  double e = rel_l2(a.s, b.s);
  e = std::max(e, rel_l2(a.conv_q, b.conv_q));
  e = std::max(e, rel_l2(a.conv_k, b.conv_k));
  return std::max(e, rel_l2(a.conv_v, b.conv_v));
}

}  // namespace

TEST_CASE("recurrent form matches a double-precision per-token reference") {
  std::mt19937 rng(1234);
  double worst = 0;
  for (bool safe : {true, false})
    for (GateInput gi : {GateInput::kNormal, GateInput::kStrong})
      for (bool warm : {false, true}) {
        auto const p = make_problem(rng, 3, 16, safe);
        auto st = warm ? warm_state(rng, p) : KdaState::zeros(p.cfg);
        auto ref = make_reference(p, st);
        std::int64_t const T = 70, P = p.cfg.width(), H = p.cfg.heads;
        auto const in = make_inputs(rng, p, T, gi);
        auto const out = run(Form::kRecurrent, p, st, in, 0, T);
        std::vector<double> want;
        for (std::int64_t t = 0; t < T; ++t) {
          auto const o = ref.step(in.xq.data() + t * P, in.xk.data() + t * P, in.xv.data() + t * P, in.f.data() + t * P,
                                  in.b.data() + t * H, in.g.data() + t * P);
          want.insert(want.end(), o.begin(), o.end());
        }
        double const e_out = rel_l2(out, want), e_s = rel_l2(st.s, ref.S);
        std::vector<double> win;
        for (auto const& r : ref.past_v) win.insert(win.end(), r.begin(), r.end());
        double const e_w = rel_l2(st.conv_v, win);
        CAPTURE(safe);
        CAPTURE(gi);
        CAPTURE(warm);
        CHECK(e_out < 2e-5);
        CHECK(e_s < 2e-5);
        CHECK(e_w == 0.0);
        worst = std::max({worst, e_out, e_s});
      }
  std::printf("[kda] recurrent vs double reference: worst rel L2 %.3g\n", worst);
}

TEST_CASE("chunked form equals the recurrent form (outputs and final state)") {
  std::mt19937 rng(42);
  std::uniform_int_distribution<std::int64_t> random_t(2, 300);
  double worst_out = 0, worst_state = 0;
  std::vector<std::int64_t> lengths = {1, 2, 63, 64, 65, 200, random_t(rng), random_t(rng)};
  for (bool safe : {true, false})
    for (GateInput gi : {GateInput::kNormal, GateInput::kStrong})
      for (bool warm : {false, true})
        for (auto T : lengths) {
          auto const p = make_problem(rng, 2, 32, safe);
          auto st_r = warm ? warm_state(rng, p) : KdaState::zeros(p.cfg);
          auto st_c = st_r;
          auto const in = make_inputs(rng, p, T, gi);
          auto const out_r = run(Form::kRecurrent, p, st_r, in, 0, T);
          auto const out_c = run(Form::kChunked, p, st_c, in, 0, T);
          double const e_out = rel_l2(out_c, out_r), e_st = max_state_err(st_c, st_r);
          CAPTURE(safe);
          CAPTURE(gi);
          CAPTURE(warm);
          CAPTURE(T);
          CHECK(e_out <= 1e-5);
          CHECK(e_st <= 1e-5);
          worst_out = std::max(worst_out, e_out), worst_state = std::max(worst_state, e_st);
        }
  std::printf("[kda] chunked vs recurrent (H=2, K=32): worst rel L2 out %.3g, state %.3g\n", worst_out, worst_state);
}

TEST_CASE("chunked form at Ling's head size (K=128), strong gates, non-zero state") {
  std::mt19937 rng(7);
  double worst = 0;
  for (bool safe : {true, false}) {
    auto const p = make_problem(rng, 1, 128, safe);
    auto st_r = warm_state(rng, p);
    auto st_c = st_r;
    auto const in = make_inputs(rng, p, 200, GateInput::kStrong);
    auto const out_r = run(Form::kRecurrent, p, st_r, in, 0, 200);
    auto const out_c = run(Form::kChunked, p, st_c, in, 0, 200);
    double const e = std::max(rel_l2(out_c, out_r), max_state_err(st_c, st_r));
    CAPTURE(safe);
    CHECK(e <= 1e-5);
    worst = std::max(worst, e);
    // Other chunk sizes give the same (16 = one sub-chunk, 100 = ragged sub-chunks).
    for (std::int64_t chunk : {16, 100}) {
      auto st = warm_state(rng, p);
      auto st_ref = st;
      auto const o1 = run(Form::kChunked, p, st, in, 0, 200, chunk);
      auto const o2 = run(Form::kRecurrent, p, st_ref, in, 0, 200);
      CHECK(rel_l2(o1, o2) <= 1e-5);
    }
  }
  std::printf("[kda] chunked vs recurrent (K=128, strong gates): worst rel L2 %.3g\n", worst);
}

TEST_CASE("extreme gates: steep sub-chunks take the exact pairwise path, no overflow or NaN") {
  std::mt19937 rng(11);
  for (int kind = 0; kind < 2; ++kind) {
    auto p = make_problem(rng, 2, 32, kind == 0);
    if (kind == 0) p.cfg.lower_bound = -10.0f;  // 16 tokens at the bound decay by 160 > the factored limit
    auto st_r = warm_state(rng, p);
    auto st_c = st_r;
    auto in = make_inputs(rng, p, 150, GateInput::kStrong);
    if (kind == 1)
      for (std::size_t i = 0; i < in.f.size(); i += 3) in.f[i] = 50.0f;  // Kimi gates near -800 per token
    auto const out_r = run(Form::kRecurrent, p, st_r, in, 0, 150);
    auto const out_c = run(Form::kChunked, p, st_c, in, 0, 150);
    bool finite = true;
    for (float x : out_c) finite = finite && std::isfinite(x);
    for (float x : st_c.s) finite = finite && std::isfinite(x);
    CAPTURE(kind);
    CHECK(finite);
    double const e = std::max(rel_l2(out_c, out_r), max_state_err(st_c, st_r));
    CHECK(e <= 1e-5);
    std::printf("[kda] extreme gates (%s): chunked vs recurrent rel L2 %.3g\n", kind == 0 ? "safe, bound -10" : "Kimi, g~-800",
                e);
  }
}

TEST_CASE("prefill 37 tokens then 30 one-token steps equals one pass") {
  std::mt19937 rng(99);
  for (bool safe : {true, false}) {
    auto const p = make_problem(rng, 2, 32, safe);
    auto const in = make_inputs(rng, p, 67, GateInput::kNormal);
    auto st_once_r = KdaState::zeros(p.cfg), st_once_c = KdaState::zeros(p.cfg), st_split = KdaState::zeros(p.cfg);
    auto const once_r = run(Form::kRecurrent, p, st_once_r, in, 0, 67);
    auto const once_c = run(Form::kChunked, p, st_once_c, in, 0, 67);
    auto split = run(Form::kChunked, p, st_split, in, 0, 37);
    for (std::int64_t t = 37; t < 67; ++t) {
      auto const o = run(Form::kRecurrent, p, st_split, in, t, 1);
      split.insert(split.end(), o.begin(), o.end());
    }
    CAPTURE(safe);
    double const e_r = rel_l2(split, once_r), e_c = rel_l2(split, once_c);
    CHECK(e_r <= 1e-5);
    CHECK(e_c <= 1e-5);
    CHECK(max_state_err(st_split, st_once_r) <= 1e-5);
    CHECK(max_state_err(st_split, st_once_c) <= 1e-5);
    std::printf("[kda] split (37 chunked + 30 steps) vs one pass: rel L2 %.3g (recurrent) %.3g (chunked)\n", e_r, e_c);
  }
}

TEST_CASE("short conv: step and T-token forms against the equation") {
  std::mt19937 rng(5);
  std::int64_t const C = 7, W = 4, T = 9;
  auto const w = uniform(rng, C * W, -1.0f, 1.0f);
  auto const x = randn(rng, C * T);
  auto const hist0 = randn(rng, C * (W - 1));
  // Expected: extended sequence [hist0; x], y[t] = silu(sum_j w[:, j] * E[t + j]).
  std::vector<double> want(C * T);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (std::int64_t j = 0; j < W; ++j) {
        std::int64_t const e = t + j;
        double const src = e < W - 1 ? hist0[e * C + c] : x[(e - (W - 1)) * C + c];
        acc += double(w[c * W + j]) * src;
      }
      want[t * C + c] = acc / (1 + std::exp(-acc));
    }
  std::vector<float> win_a = hist0, win_b = hist0, ya(C * T), yb(C * T);
  ling::cpu::short_conv_forward(C, W, w.data(), win_a.data(), T, x.data(), ya.data());
  for (std::int64_t t = 0; t < T; ++t)
    ling::cpu::short_conv_step(C, W, w.data(), win_b.data(), x.data() + t * C, yb.data() + t * C);
  CHECK(rel_l2(ya, want) < 1e-6);
  CHECK(rel_l2(yb, want) < 1e-6);
  std::vector<float> last(x.end() - (W - 1) * C, x.end());
  CHECK(win_a == last);
  CHECK(win_b == last);
  // Fewer tokens than the window: the window keeps part of its old rows.
  std::vector<float> win_c = hist0, yc(C);
  ling::cpu::short_conv_forward(C, W, w.data(), win_c.data(), 1, x.data(), yc.data(), ling::cpu::ConvActivation::kNone);
  for (std::int64_t c = 0; c < C; ++c) {
    CHECK(win_c[c] == hist0[C + c]);
    CHECK(win_c[2 * C + c] == x[c]);
  }
}

TEST_CASE("gates and l2norm: known values") {
  CHECK(ling::cpu::kda_safe_gate(0.0f, 1.0f, -5.0f) == doctest::Approx(-2.5));
  CHECK(ling::cpu::kda_safe_gate(100.0f, 0.0f, -5.0f) == doctest::Approx(-5.0));
  CHECK(ling::cpu::kda_safe_gate(-100.0f, 0.0f, -5.0f) == doctest::Approx(0.0));
  CHECK(ling::cpu::kda_softplus_gate(0.0f, std::log(2.0f)) == doctest::Approx(-2.0 * std::log(2.0)));
  CHECK(ling::cpu::kda_softplus_gate(30.0f, 0.0f) == doctest::Approx(-30.0));
  // The row form agrees with the scalar gates (both kinds, including softplus's linear branch above 20).
  for (bool safe : {true, false}) {
    KdaCoreConfig cfg{2, 4};
    cfg.safe_gate = safe;
    std::vector<float> const a_log = {0.3f, 2.0f}, dt = {0.1f, -0.2f, 0.3f, 0.0f, 1.0f, -1.0f, 0.5f, 2.0f};
    std::vector<float> const f = {-30.0f, -1.0f, 0.0f, 0.5f, 1.0f, 5.0f, 19.5f, 25.0f};
    std::vector<float> g(8);
    ling::cpu::kda_gates(cfg, a_log.data(), dt.data(), 1, f.data(), g.data());
    for (int i = 0; i < 8; ++i) {
      float const x = f[i] + dt[i], a = a_log[i / 4];
      double const want = safe ? ling::cpu::kda_safe_gate(x, a, -5.0f) : ling::cpu::kda_softplus_gate(x, a);
      CHECK(g[i] == doctest::Approx(want).epsilon(1e-6));
      CHECK(g[i] <= 0.0f);
    }
  }
  float v[2] = {3.0f, 4.0f};
  ling::cpu::l2norm(v, 2);
  CHECK(v[0] == doctest::Approx(3.0 / std::sqrt(25.0 + 1e-6)));
  CHECK(v[1] == doctest::Approx(4.0 / std::sqrt(25.0 + 1e-6)));
  CHECK(ling::cpu::state_bytes(KdaCoreConfig{32, 128}) == 4 * (32 * 128 * 128 + 3 * 3 * 4096));
}

TEST_CASE("bad configs and states give an error naming the field") {
  auto message = [](ling::Status const& s) { return s.message(); };
  KdaCoreConfig cfg{0, 16};
  auto st = ling::cpu::validate(cfg);
  CHECK_FALSE(st.is_ok());
  CHECK(st.code() == ling::ErrorCode::kConfig);
  CHECK(message(st).find("heads") != std::string::npos);
  cfg = {2, 0};
  CHECK(message(ling::cpu::validate(cfg)).find("head_dim") != std::string::npos);
  cfg = {2, 16, 0};
  CHECK(message(ling::cpu::validate(cfg)).find("conv_kernel") != std::string::npos);
  cfg = {2, 16};
  cfg.lower_bound = 1.0f;
  CHECK(message(ling::cpu::validate(cfg)).find("lower_bound") != std::string::npos);
  cfg = {2, 16};
  CHECK(ling::cpu::can_implement(cfg).is_ok());
  CHECK_THROWS_AS(KdaState::zeros(KdaCoreConfig{0, 16}), ling::Error);

  // A state made for another head_dim does not fit: the forward names the field instead of reading past the end.
  std::mt19937 rng(3);
  auto const p = make_problem(rng, 2, 16, true);
  auto wrong = KdaState::zeros(KdaCoreConfig{2, 8});
  CHECK(message(ling::cpu::validate(p.cfg, wrong)).find("KdaState.s") != std::string::npos);
  auto const in = make_inputs(rng, p, 3, GateInput::kNormal);
  try {
    run(Form::kChunked, p, wrong, in, 0, 3);
    FAIL("no error for a state of the wrong head_dim");
  } catch (ling::Error const& e) {
    CHECK(e.code() == ling::ErrorCode::kShape);
    CHECK(std::string(e.what()).find("KdaState.s") != std::string::npos);
  }
  auto good = KdaState::zeros(p.cfg);
  Problem missing = p;
  missing.a_log.clear();
  auto w = missing.weights();
  w.a_log = nullptr;
  std::vector<float> out(3 * 32);
  try {
    ling::cpu::kda_forward_recurrent(p.cfg, w, good, 3, in.xq.data(), in.xk.data(), in.xv.data(), in.f.data(),
                                     in.b.data(), in.g.data(), out.data());
    FAIL("no error for a null weight");
  } catch (ling::Error const& e) {
    CHECK(std::string(e.what()).find("a_log") != std::string::npos);
  }
  // T = 0 is a no-op that leaves the state alone.
  auto before = good.s;
  ling::cpu::kda_forward_chunked(p.cfg, p.weights(), good, 0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                 nullptr);
  CHECK(good.s == before);
}
