#pragma once
// The KDA core on the CPU (spec §2 "KDA mixer"): everything between the input projections and o_proj —
// short conv + SiLU, q/k l2norm, beta, the gate, the delta-rule recurrence and the gated output RMSNorm —
// in the per-token recurrent form (decode; the test oracle) and the chunked WY/UT form (prefill).
// Plain C++/Eigen, fp32 storage and accumulation; the chunked form keeps its within-chunk cumulative gates in
// double so that differences of sums that reach hundreds stay exact to fp32 precision.
#include <Eigen/Core>
#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ling/core/error.hpp"
#include "ling/cpu/short_conv.hpp"

namespace ling::cpu {

struct KdaCoreConfig {
  std::int64_t heads = 0, head_dim = 0;  // H, K = V = head_dim, P = H*K
  std::int64_t conv_kernel = 4;           // short_conv_kernel_size
  bool safe_gate = true;                  // g = lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias))
  float lower_bound = -5.0f;              // else (Kimi): g = -exp(A_log[h]) * softplus(f + dt_bias)
  float norm_eps = 1e-6f;                 // o_norm RMSNorm eps (rms_norm_eps)

  std::int64_t width() const noexcept { return heads * head_dim; }  // P
};

struct KdaCoreWeights {        // all fp32, row-major, non-owning
  float const* q_conv = nullptr;  // [P, conv_kernel] (q_conv1d.weight [P,1,4]); w[:, conv_kernel-1] multiplies the current token
  float const* k_conv = nullptr;
  float const* v_conv = nullptr;
  float const* a_log = nullptr;    // [H]
  float const* dt_bias = nullptr;  // [P]
  float const* o_norm = nullptr;   // [K], shared by heads
};

inline constexpr float kKdaL2NormEps = 1e-6f;  // l2norm(x) = x / sqrt(sum x^2 + 1e-6), fixed by the model code

// ---- validation -------------------------------------------------------------------------------------------------

inline Status validate(KdaCoreConfig const& cfg) {
  auto bad = [](std::string msg) { return Status(ErrorCode::kConfig, std::move(msg)); };
  if (cfg.heads <= 0 || cfg.heads > (1 << 16))
    return bad("KdaCoreConfig.heads (num_attention_heads) must be in [1, 65536], got " + std::to_string(cfg.heads));
  if (cfg.head_dim <= 0 || cfg.head_dim > (1 << 12))
    return bad("KdaCoreConfig.head_dim must be in [1, 4096], got " + std::to_string(cfg.head_dim));
  if (cfg.conv_kernel < 1 || cfg.conv_kernel > 64)
    return bad("KdaCoreConfig.conv_kernel (short_conv_kernel_size) must be in [1, 64], got " +
               std::to_string(cfg.conv_kernel));
  if (cfg.safe_gate && !(std::isfinite(cfg.lower_bound) && cfg.lower_bound < 0.0f))
    return bad("KdaCoreConfig.lower_bound (kda_lower_bound) must be finite and negative, got " +
               std::to_string(cfg.lower_bound));
  if (!(std::isfinite(cfg.norm_eps) && cfg.norm_eps > 0.0f))
    return bad("KdaCoreConfig.norm_eps (rms_norm_eps) must be finite and positive, got " + std::to_string(cfg.norm_eps));
  return Status::ok();
}
inline Status can_implement(KdaCoreConfig const& cfg) { return validate(cfg); }

inline Status validate(KdaCoreConfig const& cfg, KdaCoreWeights const& w) {
  if (auto st = validate(cfg); !st) return st;
  auto null = [](char const* field) {
    return Status(ErrorCode::kInvalidArgument, std::string("KdaCoreWeights.") + field + " is null");
  };
  if (!w.q_conv) return null("q_conv");
  if (!w.k_conv) return null("k_conv");
  if (!w.v_conv) return null("v_conv");
  if (!w.a_log) return null("a_log");
  if (!w.dt_bias) return null("dt_bias");
  if (!w.o_norm) return null("o_norm");
  return Status::ok();
}

// Bytes of one layer's cache: S [H,K,V] fp32 plus three conv windows [conv_kernel-1, P] fp32.
inline std::int64_t state_bytes(KdaCoreConfig const& cfg) {
  std::int64_t const p = cfg.width();
  return static_cast<std::int64_t>(sizeof(float)) * (cfg.heads * cfg.head_dim * cfg.head_dim + 3 * (cfg.conv_kernel - 1) * p);
}

struct KdaState {                             // one layer's cache
  std::vector<float> s;                       // [H, K, V] fp32 recurrent state, zero at start
  std::vector<float> conv_q, conv_k, conv_v;  // [conv_kernel-1, P] the last raw inputs, oldest first

  static KdaState zeros(KdaCoreConfig const& cfg) {
    validate(cfg).throw_if_error();
    KdaState st;
    st.s.assign(static_cast<std::size_t>(cfg.heads * cfg.head_dim * cfg.head_dim), 0.0f);
    auto const window = static_cast<std::size_t>((cfg.conv_kernel - 1) * cfg.width());
    st.conv_q.assign(window, 0.0f);
    st.conv_k.assign(window, 0.0f);
    st.conv_v.assign(window, 0.0f);
    return st;
  }
  void reset() {
    std::fill(s.begin(), s.end(), 0.0f);
    std::fill(conv_q.begin(), conv_q.end(), 0.0f);
    std::fill(conv_k.begin(), conv_k.end(), 0.0f);
    std::fill(conv_v.begin(), conv_v.end(), 0.0f);
  }
};

// A state whose sizes do not fit the config (e.g. made for another head_dim) is an error naming the field.
inline Status validate(KdaCoreConfig const& cfg, KdaState const& st) {
  if (auto s = validate(cfg); !s) return s;
  auto const want_s = static_cast<std::size_t>(cfg.heads * cfg.head_dim * cfg.head_dim);
  auto const want_w = static_cast<std::size_t>((cfg.conv_kernel - 1) * cfg.width());
  auto wrong = [](char const* field, std::size_t got, std::size_t want) {
    return Status(ErrorCode::kShape, std::string("KdaState.") + field + " has " + std::to_string(got) +
                                         " floats, the config (heads, head_dim, conv_kernel) needs " + std::to_string(want));
  };
  if (st.s.size() != want_s) return wrong("s", st.s.size(), want_s);
  if (st.conv_q.size() != want_w) return wrong("conv_q", st.conv_q.size(), want_w);
  if (st.conv_k.size() != want_w) return wrong("conv_k", st.conv_k.size(), want_w);
  if (st.conv_v.size() != want_w) return wrong("conv_v", st.conv_v.size(), want_w);
  return Status::ok();
}

// ---- building blocks (also the CUDA backend's references) -----------------------------------------------------

inline float sigmoid(float x) noexcept { return 1.0f / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20), as the Kimi gate uses it.
inline float softplus(float x) noexcept { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// Safe (bounded) gate of one channel: x = f + dt_bias; result in (lower_bound, 0).
inline float kda_safe_gate(float x, float a_log, float lower_bound) noexcept {
  return lower_bound * sigmoid(std::exp(a_log) * x);
}
// Kimi gate of one channel: x = f + dt_bias; result <= 0, unbounded below.
inline float kda_softplus_gate(float x, float a_log) noexcept { return -std::exp(a_log) * softplus(x); }

// Log-decay gates for T tokens: g[t, h*K + d] from f[t, h*K + d] (both [T, P]); the same formulas as the scalar
// gates above, written on Eigen arrays so the exponentials vectorize.
inline void kda_gates(KdaCoreConfig const& cfg, float const* a_log, float const* dt_bias, std::int64_t tokens,
                      float const* f, float* g) {
  std::int64_t const k = cfg.head_dim, p = cfg.width();
  Eigen::ArrayXf x(k);
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t h = 0; h < cfg.heads; ++h) {
      std::int64_t const i = t * p + h * k;
      float const rate = std::exp(a_log[h]);
      x = Eigen::Map<Eigen::ArrayXf const>(f + i, k) + Eigen::Map<Eigen::ArrayXf const>(dt_bias + h * k, k);
      Eigen::Map<Eigen::ArrayXf> out(g + i, k);
      if (cfg.safe_gate)
        out = cfg.lower_bound / (1.0f + (-rate * x).exp());
      else
        out = -rate * (x > 20.0f).select(x, x.min(20.0f).exp().log1p());
    }
}

// In place: x <- scale * x / sqrt(sum x^2 + eps) over n elements (fp32 sum).
inline void l2norm(float* x, std::int64_t n, float scale = 1.0f, float eps = kKdaL2NormEps) noexcept {
  float ss = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  float const r = scale / std::sqrt(ss + eps);
  for (std::int64_t i = 0; i < n; ++i) x[i] *= r;
}

// out = RMSNorm_V(o; weight, eps) * sigmoid(gate) over one head of n channels (out may alias o or gate).
inline void kda_gated_rms_norm(float const* o, float const* weight, float const* gate, std::int64_t n, float eps,
                               float* out) {
  Eigen::Map<Eigen::ArrayXf const> const ov(o, n), wv(weight, n), gv(gate, n);
  float const r = 1.0f / std::sqrt(ov.square().sum() / static_cast<float>(n) + eps);
  Eigen::Map<Eigen::ArrayXf>(out, n) = wv * (ov * r) / (1.0f + (-gv).exp());
}

namespace detail {

using RowMatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using StridedConst = Eigen::Map<RowMatrixF const, 0, Eigen::OuterStride<>>;
using Strided = Eigen::Map<RowMatrixF, 0, Eigen::OuterStride<>>;

// The per-token quantities both forms share, [T, P] (beta [T, H]).
struct KdaTokens {
  std::vector<float> q, k, v, g, beta;
};

inline void kda_check(KdaCoreConfig const& cfg, KdaCoreWeights const& w, KdaState const& st, std::int64_t tokens,
                      float const* x_q, float const* x_k, float const* x_v, float const* f, float const* b,
                      float const* g, float* out) {
  validate(cfg, w).throw_if_error();
  validate(cfg, st).throw_if_error();
  require(tokens >= 0, ErrorCode::kInvalidArgument, "kda_forward: token count T must be >= 0, got " + std::to_string(tokens));
  if (tokens == 0) return;
  auto need = [](void const* ptr, char const* name) {
    require(ptr != nullptr, ErrorCode::kInvalidArgument, std::string("kda_forward: input ") + name + " is null");
  };
  need(x_q, "x_q"), need(x_k, "x_k"), need(x_v, "x_v"), need(f, "f"), need(b, "b"), need(g, "g"), need(out, "out");
}

// Conv + SiLU (window updated), q/k l2norm (q scaled by K^-1/2), beta = sigmoid(b), log-decay gates.
inline KdaTokens kda_prepare(KdaCoreConfig const& cfg, KdaCoreWeights const& w, KdaState& st, std::int64_t tokens,
                             float const* x_q, float const* x_k, float const* x_v, float const* f, float const* b) {
  std::int64_t const p = cfg.width(), k = cfg.head_dim, h_n = cfg.heads;
  auto const n = static_cast<std::size_t>(tokens * p);
  KdaTokens in;
  in.q.resize(n), in.k.resize(n), in.v.resize(n), in.g.resize(n);
  in.beta.resize(static_cast<std::size_t>(tokens * h_n));
  short_conv_forward(p, cfg.conv_kernel, w.q_conv, st.conv_q.data(), tokens, x_q, in.q.data());
  short_conv_forward(p, cfg.conv_kernel, w.k_conv, st.conv_k.data(), tokens, x_k, in.k.data());
  short_conv_forward(p, cfg.conv_kernel, w.v_conv, st.conv_v.data(), tokens, x_v, in.v.data());
  float const q_scale = 1.0f / std::sqrt(static_cast<float>(k));
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t h = 0; h < h_n; ++h) {
      l2norm(in.q.data() + t * p + h * k, k, q_scale);
      l2norm(in.k.data() + t * p + h * k, k);
      in.beta[static_cast<std::size_t>(t * h_n + h)] = sigmoid(b[t * h_n + h]);
    }
  kda_gates(cfg, w.a_log, w.dt_bias, tokens, f, in.g.data());
  return in;
}

inline void kda_finish(KdaCoreConfig const& cfg, KdaCoreWeights const& w, std::int64_t tokens, float const* o,
                       float const* g_out, float* out) {
  std::int64_t const p = cfg.width(), k = cfg.head_dim;
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t h = 0; h < cfg.heads; ++h) {
      std::int64_t const i = t * p + h * k;
      kda_gated_rms_norm(o + i, w.o_norm, g_out + i, k, cfg.norm_eps, out + i);
    }
}

// One chunk of n tokens of one head (spec §2, chunked form). Rows of q, k, v, g are `stride` apart; beta `beta_stride`.
// s: the head's K x K state, updated; o: n output rows, `stride` apart.
inline void kda_chunk(std::int64_t kd, std::int64_t n, std::int64_t stride, float const* q_ptr, float const* k_ptr,
                      float const* v_ptr, float const* g_ptr, float const* beta_ptr, std::int64_t beta_stride, float* s_ptr,
                      float* o_ptr) {
  constexpr std::int64_t kSub = 16;  // sub-chunk: cross-block decays are taken relative to its start
  // exp(-1e4) is 0 in any precision; the floor keeps -inf gates from making inf - inf in the differences.
  constexpr double kGateFloor = -1e4;
  constexpr double kMaxFactoredRange = 80.0;  // exp(80) ~ 5.5e34 and exp(-80) ~ 1.8e-35: normal fp32 values
  StridedConst const q(q_ptr, n, kd, Eigen::OuterStride<>(stride));
  StridedConst const kk(k_ptr, n, kd, Eigen::OuterStride<>(stride));
  StridedConst const v(v_ptr, n, kd, Eigen::OuterStride<>(stride));
  StridedConst const g(g_ptr, n, kd, Eigen::OuterStride<>(stride));
  Eigen::Map<RowMatrixF> s(s_ptr, kd, kd);
  Strided o(o_ptr, n, kd, Eigen::OuterStride<>(stride));

  // Inclusive cumulative log-decay within the chunk, in double: differences of sums near -320 stay exact.
  RowMatrixD cg(n, kd);
  for (std::int64_t t = 0; t < n; ++t) {
    auto const row = g.row(t).cast<double>().cwiseMax(kGateFloor);
    if (t == 0) cg.row(t) = row;
    else cg.row(t) = cg.row(t - 1) + row;
  }

  // A_kk (strictly lower) and A_qk (lower incl. diagonal): sum_d x_r[d] k_c[d] exp(G_r[d] - G_c[d]), r >= c.
  // Per sub-chunk, exp(G_r - G_c) = exp(G_r - G_ref) * exp(G_ref - G_c) with G_ref the cumulative gate just before
  // the sub-chunk: for earlier tokens c both factors are <= 1 (an underflow only drops a value below the true one);
  // for c inside the sub-chunk the second factor grows up to exp(range), range = the sub-chunk's own decay, which
  // the safe gate bounds by 16 * |lower_bound|. A steeper sub-chunk (Kimi gates) takes exact pairwise exponentials.
  RowMatrixF akk = RowMatrixF::Zero(n, n), aqk = RowMatrixF::Zero(n, n);
  RowMatrixF scratch;
  auto exp_of = [&scratch](auto const& diff) -> RowMatrixF const& {  // float exp of a double difference, vectorized
    scratch = diff.template cast<float>().cwiseMax(-87.0f);              // below e^-87: fp32 denormals; drop them
    scratch = scratch.array().exp().matrix();
    return scratch;
  };
  Eigen::RowVectorXd const zero_ref = Eigen::RowVectorXd::Zero(kd);
  for (std::int64_t i0 = 0; i0 < n; i0 += kSub) {
    std::int64_t const m = std::min(kSub, n - i0);
    Eigen::RowVectorXd const ref = i0 == 0 ? zero_ref : Eigen::RowVectorXd(cg.row(i0 - 1));
    double const range = (ref - cg.row(i0 + m - 1)).maxCoeff();
    bool const factored = range <= kMaxFactoredRange;
    std::int64_t const cols = factored ? i0 + m : i0;  // columns done by the factored product
    if (cols > 0) {
      RowMatrixF const after = exp_of(cg.middleRows(i0, m).rowwise() - ref);
      RowMatrixF const k_before = kk.topRows(cols).cwiseProduct(exp_of((-cg.topRows(cols)).rowwise() + ref));
      aqk.block(i0, 0, m, cols).noalias() = q.middleRows(i0, m).cwiseProduct(after) * k_before.transpose();
      akk.block(i0, 0, m, cols).noalias() = kk.middleRows(i0, m).cwiseProduct(after) * k_before.transpose();
      if (factored)  // keep only c <= r (A_qk) and c < r (A_kk) inside the diagonal block
        for (std::int64_t r = 0; r < m; ++r) {
          aqk.block(i0 + r, i0 + r + 1, 1, m - r - 1).setZero();
          akk.block(i0 + r, i0 + r, 1, m - r).setZero();
        }
    }
    if (!factored) {
      Eigen::RowVectorXf kc(kd);
      for (std::int64_t r = i0; r < i0 + m; ++r)
        for (std::int64_t c = i0; c <= r; ++c) {
          kc = kk.row(c).cwiseProduct(exp_of(cg.row(r) - cg.row(c)));
          aqk(r, c) = q.row(r).dot(kc);
          if (c < r) akk(r, c) = kk.row(r).dot(kc);
        }
    }
  }

  // (I + Diag(beta) A_kk) [U | W] = Diag(beta) [V | e^G * K]: the UT transform by forward substitution.
  Eigen::VectorXf beta(n);
  for (std::int64_t t = 0; t < n; ++t) beta(t) = beta_ptr[t * beta_stride];
  RowMatrixF const eg = exp_of(cg);  // decay since the chunk start, <= 1
  RowMatrixF lhs = beta.asDiagonal() * akk;
  lhs.diagonal().setOnes();
  RowMatrixF rhs(n, 2 * kd);
  rhs.leftCols(kd) = beta.asDiagonal() * v;
  rhs.rightCols(kd) = beta.asDiagonal() * kk.cwiseProduct(eg);
  lhs.triangularView<Eigen::UnitLower>().solveInPlace(rhs);

  // V' = U - W S;  O = (Q * e^G) S + A_qk V';  S <- Diag(e^{G_last}) S + (K * e^{G_last - G})^T V'.
  RowMatrixF v_new = rhs.leftCols(kd);
  v_new.noalias() -= rhs.rightCols(kd) * s;
  o.noalias() = q.cwiseProduct(eg) * s;
  o.noalias() += aqk.triangularView<Eigen::Lower>() * v_new;
  auto const last = cg.row(n - 1);
  Eigen::VectorXf const decay_last = last.cast<float>().array().exp().matrix().transpose();
  RowMatrixF const k_to_end = kk.cwiseProduct(exp_of((-cg).rowwise() + last));
  s = decay_last.asDiagonal() * s;
  s.noalias() += k_to_end.transpose() * v_new;
}

}  // namespace detail

// ---- the two forms -------------------------------------------------------------------------------------------------

// Per-token recurrence (spec §2): per head S <- Diag(e^g) S; S <- S + beta k (v - S^T k)^T; o = S^T q.
// Inputs [T, P] (b: [T, H]) are projection outputs before conv/activations; out [T, P] is ready for o_proj.
// out may alias any input (all are consumed before out is written; g only element by element).
inline void kda_forward_recurrent(KdaCoreConfig const& cfg, KdaCoreWeights const& w, KdaState& state, std::int64_t T,
                                  float const* x_q, float const* x_k, float const* x_v, float const* f, float const* b,
                                  float const* g, float* out) {
  detail::kda_check(cfg, w, state, T, x_q, x_k, x_v, f, b, g, out);
  if (T == 0) return;
  auto const in = detail::kda_prepare(cfg, w, state, T, x_q, x_k, x_v, f, b);
  std::int64_t const p = cfg.width(), kd = cfg.head_dim, h_n = cfg.heads;
  std::vector<float> o(static_cast<std::size_t>(T * p));
  Eigen::RowVectorXf kv(kd), u(kd), acc(kd);
  std::vector<float> decay(static_cast<std::size_t>(kd));
  for (std::int64_t h = 0; h < h_n; ++h) {  // head-outer: the head's K x V state stays in cache across tokens
    float* s = state.s.data() + h * kd * kd;
    for (std::int64_t t = 0; t < T; ++t) {
      std::int64_t const base = t * p + h * kd;
      float const* q = in.q.data() + base;
      float const* k = in.k.data() + base;
      float const* v = in.v.data() + base;
      float const* gg = in.g.data() + base;
      float const beta = in.beta[static_cast<std::size_t>(t * h_n + h)];
      for (std::int64_t i = 0; i < kd; ++i) decay[i] = std::exp(gg[i]);
      kv.setZero();
      for (std::int64_t i = 0; i < kd; ++i)  // (Diag(e^g) S)^T k: a read-only pass over the state
        kv += (decay[i] * k[i]) * Eigen::Map<Eigen::RowVectorXf const>(s + i * kd, kd);
      u = beta * (Eigen::Map<Eigen::RowVectorXf const>(v, kd) - kv);
      acc.setZero();
      for (std::int64_t i = 0; i < kd; ++i) {  // decay, rank-1 update and S^T q in one read-write pass
        Eigen::Map<Eigen::RowVectorXf> row(s + i * kd, kd);
        row = decay[i] * row + k[i] * u;
        acc += q[i] * row;
      }
      Eigen::Map<Eigen::RowVectorXf>(o.data() + base, kd) = acc;
    }
  }
  detail::kda_finish(cfg, w, T, o.data(), g, out);
}

// Chunked WY/UT form (spec §2) for prefill: same inputs, outputs and state update as the recurrent form (equal to
// ~1e-6 relative L2 in fp32). Its flop count is about the recurrent one's; it exists for the GEMM-shaped work
// (the GPU's tensor cores), and on the CPU it is the independent check of the recurrent form and vice versa.
inline void kda_forward_chunked(KdaCoreConfig const& cfg, KdaCoreWeights const& w, KdaState& state, std::int64_t T,
                                float const* x_q, float const* x_k, float const* x_v, float const* f, float const* b,
                                float const* g, float* out, std::int64_t chunk = 64) {
  detail::kda_check(cfg, w, state, T, x_q, x_k, x_v, f, b, g, out);
  require(chunk >= 1 && chunk <= 1024, ErrorCode::kInvalidArgument,
          "kda_forward_chunked: chunk must be in [1, 1024], got " + std::to_string(chunk));
  if (T == 0) return;
  auto const in = detail::kda_prepare(cfg, w, state, T, x_q, x_k, x_v, f, b);
  std::int64_t const p = cfg.width(), kd = cfg.head_dim, h_n = cfg.heads;
  std::vector<float> o(static_cast<std::size_t>(T * p));
  for (std::int64_t h = 0; h < h_n; ++h)
    for (std::int64_t t0 = 0; t0 < T; t0 += chunk) {
      std::int64_t const n = std::min(chunk, T - t0), base = t0 * p + h * kd;
      detail::kda_chunk(kd, n, p, in.q.data() + base, in.k.data() + base, in.v.data() + base, in.g.data() + base,
                        in.beta.data() + t0 * h_n + h, h_n, state.s.data() + h * kd * kd, o.data() + base);
    }
  detail::kda_finish(cfg, w, T, o.data(), g, out);
}

}  // namespace ling::cpu
