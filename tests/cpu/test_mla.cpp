// Gated MLA: the naive (prefill) and absorbed (decode) forms agree on random inputs, and token-by-token decode
// equals one prefill. Also an independent per-head reference with explicit k/v for one small case.
#include <doctest/doctest.h>

#include "ling/cpu/gated_mla.hpp"
#include "random_weights.hpp"

using namespace ling;

namespace {
using Mla = layers::GatedMla<>;

Mla make_mla(test::Rng& rng, std::int64_t q_lora, OutputGate gate, bool rope) {
  Mla l;
  auto& c = l.config;
  c.hidden = Extent<dynamic>(48, "hidden");
  c.heads = Extent<dynamic>(4, "heads");
  c.kv_rank = Extent<dynamic>(32, "kv_lora_rank");
  c.nope_dim = Extent<dynamic>(16, "nope");
  c.rope_dim = Extent<dynamic>(8, "rope");
  c.value_dim = Extent<dynamic>(12, "v");
  c.q_lora_rank = q_lora;
  c.use_rope = rope;
  c.rope_theta = 6e6;
  c.gate = gate;
  auto& w = l.weights;
  std::int64_t H = 4, dq = 24;
  if (q_lora) {
    w.q_a_proj = rng.linear(q_lora, 48);
    w.q_a_norm = rng.vec(q_lora, 0.1f, 1.f);
    w.q_b_proj = rng.linear(H * dq, q_lora);
  } else {
    w.q_proj = rng.linear(H * dq, 48);
  }
  w.kv_a_proj = rng.linear(32 + 8, 48);
  w.kv_a_norm = rng.vec(32, 0.1f, 1.f);
  w.kv_b_proj = rng.linear(H * (16 + 12), 32);
  if (gate == OutputGate::kHeadWise) w.g_proj = rng.linear(H, 48);
  if (gate == OutputGate::kElementWise) w.g_proj = rng.linear(H * 12, 48);
  w.o_proj = rng.linear(48, H * 12);
  REQUIRE(Mla::can_implement(c).is_ok());
  return l;
}
}  // namespace

TEST_CASE("MLA naive and absorbed forms agree (lengths 1, 63, 64, 65, 200)") {
  test::Rng rng;
  cpu::Backend be;
  for (auto [q_lora, gate, rope] : {std::tuple{0L, OutputGate::kHeadWise, true}, std::tuple{16L, OutputGate::kElementWise, true},
                                    std::tuple{0L, OutputGate::kNone, false}}) {
    Mla l = make_mla(rng, q_lora, gate, rope);
    for (std::int64_t T : {1, 63, 64, 65, 200}) {
      CAPTURE(T);
      cpu::Matrix x = rng.mat(T, 48);
      Mla::State s1, s2, s3;
      cpu::Matrix y_naive, y_abs, y_step;
      cpu::forward_prefill(be, l, s1, x, y_naive);
      cpu::forward_decode(be, l, s2, x, y_abs);
      CHECK(test::rel_l2(y_abs, y_naive) < 1e-5);
      // token by token through decode
      cpu::Matrix row;
      y_step.resize(T, 48);
      for (std::int64_t t = 0; t < T; ++t) {
        cpu::forward_decode(be, l, s3, x.middleRows(t, 1), row);
        y_step.row(t) = row;
      }
      CHECK(test::rel_l2(y_step, y_naive) < 1e-5);
      CHECK(s3.length == T);
    }
  }
}

TEST_CASE("MLA matches an explicit per-head reference") {
  test::Rng rng;
  cpu::Backend be;
  Mla l = make_mla(rng, 0, OutputGate::kHeadWise, true);
  std::int64_t T = 5, H = 4, dn = 16, dr = 8, dv = 12, r = 32;
  cpu::Matrix x = rng.mat(T, 48);
  Mla::State st;
  cpu::Matrix y;
  cpu::forward_prefill(be, l, st, x, y);
  // reference: explicit q, k, v per head with RoPE by complex multiplication
  cpu::Matrix wq = cpu::dequantize(l.weights.q_proj), wkva = cpu::dequantize(l.weights.kv_a_proj),
              wkvb = cpu::dequantize(l.weights.kv_b_proj), wg = cpu::dequantize(l.weights.g_proj),
              wo = cpu::dequantize(l.weights.o_proj);
  auto rope = [&](Eigen::VectorXd v, int p) {
    for (int j = 0; j < dr / 2; ++j) {
      double ang = p * std::pow(6e6, -2.0 * j / dr);
      std::complex<double> z(v[2 * j], v[2 * j + 1]);
      z *= std::polar(1.0, ang);
      v[2 * j] = z.real(), v[2 * j + 1] = z.imag();
    }
    return v;
  };
  Eigen::MatrixXd out = Eigen::MatrixXd::Zero(T, H * dv);
  std::vector<Eigen::VectorXd> c(T), kr(T);
  for (int t = 0; t < T; ++t) {
    Eigen::VectorXd kv = (wkva.cast<double>() * x.row(t).transpose().cast<double>());
    Eigen::VectorXd cc = kv.head(r);
    double ms = cc.squaredNorm() / r;
    for (int i = 0; i < r; ++i) cc[i] = cc[i] / std::sqrt(ms + 1e-6) * l.weights.kv_a_norm[i];
    c[t] = cc;
    kr[t] = rope(kv.tail(dr), t);
  }
  for (int t = 0; t < T; ++t) {
    Eigen::VectorXd q = wq.cast<double>() * x.row(t).transpose().cast<double>();
    Eigen::VectorXd g = wg.cast<double>() * x.row(t).transpose().cast<double>();
    for (int h = 0; h < H; ++h) {
      Eigen::VectorXd qn = q.segment(h * 24, dn), qr = rope(q.segment(h * 24 + dn, dr), t);
      std::vector<double> s(t + 1);
      double m = -1e300;
      for (int u = 0; u <= t; ++u) {
        Eigen::VectorXd kn = wkvb.middleRows(h * 28, dn).cast<double>() * c[u];
        s[u] = (qn.dot(kn) + qr.dot(kr[u])) / std::sqrt(24.0);
        m = std::max(m, s[u]);
      }
      double z = 0;
      for (auto& v : s) z += (v = std::exp(v - m));
      Eigen::VectorXd o = Eigen::VectorXd::Zero(dv);
      for (int u = 0; u <= t; ++u) o += s[u] / z * (wkvb.middleRows(h * 28 + dn, dv).cast<double>() * c[u]);
      out.row(t).segment(h * dv, dv) = o.transpose() / (1 + std::exp(-g[h]));
    }
  }
  Eigen::MatrixXd ref = out * wo.cast<double>().transpose();
  CHECK((y.cast<double>() - ref).norm() / ref.norm() < 1e-5);
}
