#pragma once
// CPU gated MLA (spec §2 "Gated MLA mixer"). Both forms share the projections and the latent cache:
//  - naive (prefill): expand every cached latent through kv_b_proj into k_nope and v per head, attend per head;
//  - absorbed (decode): q̂_h = W_UK,hᵀ q_nope,h ∈ R^r, score = q̂_h·c + q_rope,h·k_rope (MQA over the cache with
//    score dim r+dr), o_h = W_UV,h (Σ p c). Scale 1/sqrt(dn+dr) in both.
#include <cmath>
#include <string>

#include "ling/cpu/backend.hpp"
#include "ling/cpu/linear.hpp"
#include "ling/layers/gated_mla.hpp"

namespace ling::cpu {

enum class MlaForm { kNaive, kAbsorbed };

// Interleaved RoPE on x[0..dim): pair j = (x[2j], x[2j+1]) turns by p·θ^(−2j/dim). The angle is formed in fp32
// as the reference does (inv_freq = 1/θ^(2j/dim) in fp32, times p in fp32), then cos/sin.
inline void rope_interleaved(float* x, std::int64_t dim, std::int64_t position, double theta) {
  for (std::int64_t j = 0; j < dim / 2; ++j) {
    float inv_freq = 1.0f / std::pow(float(theta), float(2 * j) / float(dim));
    float angle = float(position) * inv_freq;
    float c = float(std::cos(double(angle))), s = float(std::sin(double(angle)));
    float x0 = x[2 * j], x1 = x[2 * j + 1];
    x[2 * j] = x0 * c - x1 * s;
    x[2 * j + 1] = x0 * s + x1 * c;
  }
}

namespace detail {

// The query [T, H·(dn+dr)] with RoPE applied to each head's rope slice; positions start at `start`.
template <class Layer>
Matrix mla_query(Layer const& l, ConstMatrixRef x, std::int64_t start) {
  auto const& c = l.config;
  auto const& w = l.weights;
  Matrix q;
  if (c.q_lora_rank > 0) {
    Matrix qa = linear(w.q_a_proj, x);
    rms_norm_rows(qa.data(), qa.data(), qa.rows(), qa.cols(), w.q_a_norm.data(), c.eps);
    linear(w.q_b_proj, qa, q);
  } else {
    linear(w.q_proj, x, q);
  }
  std::int64_t const H = c.heads(), dn = c.nope_dim(), dr = c.rope_dim(), dq = c.qk_dim();
  require(q.cols() == H * dq, ErrorCode::kShape, "GatedMla: q_proj rows differ from heads·(qk_nope+qk_rope)");
  if (c.use_rope)
    for (std::int64_t t = 0; t < q.rows(); ++t)
      for (std::int64_t h = 0; h < H; ++h) rope_interleaved(q.row(t).data() + h * dq + dn, dr, start + t, c.rope_theta);
  return q;
}

// Appends [RMSNorm(c) | RoPE(k_rope)] of x's tokens to the cache.
template <class Layer>
void mla_append_latent(Layer const& l, typename Layer::State& st, ConstMatrixRef x) {
  auto const& c = l.config;
  std::int64_t const r = c.kv_rank(), dr = c.rope_dim(), ld = c.latent_dim();
  Matrix kv = linear(l.weights.kv_a_proj, x);
  require(kv.cols() == ld, ErrorCode::kShape, "GatedMla: kv_a_proj_with_mqa rows differ from kv_lora_rank+qk_rope");
  std::int64_t const need = (st.length + x.rows()) * ld;
  if (std::int64_t(st.latent.size()) < need) st.latent.resize(std::size_t(std::max(need, 2 * std::int64_t(st.latent.size()))));
  for (std::int64_t t = 0; t < x.rows(); ++t) {
    float* dst = st.latent.data() + (st.length + t) * ld;
    rms_norm_rows(kv.row(t).data(), dst, 1, r, l.weights.kv_a_norm.data(), c.eps);
    for (std::int64_t i = 0; i < dr; ++i) dst[r + i] = kv(t, r + i);
    if (c.use_rope) rope_interleaved(dst + r, dr, st.length + t, c.rope_theta);
  }
  st.length += x.rows();
}

inline void softmax_causal_row(float* s, std::int64_t valid) {
  float m = -INFINITY;
  for (std::int64_t i = 0; i < valid; ++i) m = std::max(m, s[i]);
  float sum = 0.f;
  for (std::int64_t i = 0; i < valid; ++i) sum += (s[i] = std::exp(s[i] - m));
  for (std::int64_t i = 0; i < valid; ++i) s[i] /= sum;
}

}  // namespace detail

// T tokens at positions state.length.. ; y [T, hidden].
template <std::int64_t kH, std::int64_t kN, std::int64_t kR, std::int64_t kDn, std::int64_t kDr, std::int64_t kDv, class P>
void mla_forward(Backend&, layers::GatedMla<kH, kN, kR, kDn, kDr, kDv, P> const& l,
                 typename layers::GatedMla<kH, kN, kR, kDn, kDr, kDv, P>::State& st, ConstMatrixRef x, Matrix& y,
                 MlaForm form) {
  auto const& c = l.config;
  std::int64_t const T = x.rows(), start = st.length, H = c.heads(), r = c.kv_rank(), dn = c.nope_dim(),
                     dr = c.rope_dim(), dv = c.value_dim(), dq = c.qk_dim(), ld = c.latent_dim();
  Matrix q = detail::mla_query(l, x, start);
  detail::mla_append_latent(l, st, x);
  std::int64_t const L = st.length;
  Eigen::Map<Matrix const> cache(st.latent.data(), L, ld);
  auto latent = cache.leftCols(r);
  auto k_rope = cache.rightCols(dr);
  float const scale = 1.0f / std::sqrt(float(dq));
  Matrix out(T, H * dv);
  Matrix wkvb = dequantize(l.weights.kv_b_proj);  // [H·(dn+dv), r]
  require(wkvb.rows() == H * (dn + dv) && wkvb.cols() == r, ErrorCode::kShape,
          "GatedMla: kv_b_proj is not [heads·(qk_nope+v), kv_lora_rank]");
  Matrix scores(T, L);
  if (form == MlaForm::kNaive) {
    Matrix kv = latent * wkvb.transpose();  // [L, H·(dn+dv)]
    for (std::int64_t h = 0; h < H; ++h) {
      auto k_nope = kv.middleCols(h * (dn + dv), dn);
      auto v = kv.middleCols(h * (dn + dv) + dn, dv);
      scores.noalias() = q.middleCols(h * dq, dn) * k_nope.transpose();
      scores.noalias() += q.middleCols(h * dq + dn, dr) * k_rope.transpose();
      scores *= scale;
      for (std::int64_t t = 0; t < T; ++t) detail::softmax_causal_row(scores.row(t).data(), start + t + 1);
      for (std::int64_t t = 0; t < T; ++t) scores.row(t).tail(L - start - t - 1).setZero();
      out.middleCols(h * dv, dv).noalias() = scores * v;
    }
  } else {
    for (std::int64_t h = 0; h < H; ++h) {
      auto w_uk = wkvb.middleRows(h * (dn + dv), dn);      // [dn, r]
      auto w_uv = wkvb.middleRows(h * (dn + dv) + dn, dv); // [dv, r]
      Matrix q_hat = q.middleCols(h * dq, dn) * w_uk;       // [T, r]
      scores.noalias() = q_hat * latent.transpose();
      scores.noalias() += q.middleCols(h * dq + dn, dr) * k_rope.transpose();
      scores *= scale;
      for (std::int64_t t = 0; t < T; ++t) detail::softmax_causal_row(scores.row(t).data(), start + t + 1);
      for (std::int64_t t = 0; t < T; ++t) scores.row(t).tail(L - start - t - 1).setZero();
      Matrix o_latent = scores * latent;                    // [T, r]
      out.middleCols(h * dv, dv).noalias() = o_latent * w_uv.transpose();
    }
  }
  if (c.gate != OutputGate::kNone) {
    Matrix g = linear(l.weights.g_proj, x);
    if (c.gate == OutputGate::kHeadWise) {
      require(g.cols() == H, ErrorCode::kShape, "GatedMla: head-wise g_proj must have heads rows");
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t h = 0; h < H; ++h) out.row(t).segment(h * dv, dv) *= ops::sigmoid(g(t, h));
    } else {
      require(g.cols() == H * dv, ErrorCode::kShape, "GatedMla: element-wise g_proj must have heads·v_head_dim rows");
      for (std::int64_t i = 0; i < out.size(); ++i) out.data()[i] *= ops::sigmoid(g.data()[i]);
    }
  }
  linear(l.weights.o_proj, out, y);
}

template <std::int64_t kH, std::int64_t kN, std::int64_t kR, std::int64_t kDn, std::int64_t kDr, std::int64_t kDv, class P>
void forward_prefill(Backend& be, layers::GatedMla<kH, kN, kR, kDn, kDr, kDv, P> const& l,
                     typename layers::GatedMla<kH, kN, kR, kDn, kDr, kDv, P>::State& st, ConstMatrixRef x, Matrix& y) {
  mla_forward(be, l, st, x, y, MlaForm::kNaive);
}
template <std::int64_t kH, std::int64_t kN, std::int64_t kR, std::int64_t kDn, std::int64_t kDr, std::int64_t kDv, class P>
void forward_decode(Backend& be, layers::GatedMla<kH, kN, kR, kDn, kDr, kDv, P> const& l,
                    typename layers::GatedMla<kH, kN, kR, kDn, kDr, kDv, P>::State& st, ConstMatrixRef x, Matrix& y) {
  mla_forward(be, l, st, x, y, MlaForm::kAbsorbed);
}

}  // namespace ling::cpu
