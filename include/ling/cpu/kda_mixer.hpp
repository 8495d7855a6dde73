#pragma once
// CPU KDA mixer: projections (spec §2) around the KDA core; prefill runs the chunked core, decode the recurrent one.
#include "ling/cpu/backend.hpp"
#include "ling/cpu/kda.hpp"
#include "ling/cpu/linear.hpp"
#include "ling/layers/kda_mixer.hpp"

namespace ling::cpu {

enum class KdaForm { kChunked, kRecurrent };

template <std::int64_t kH, std::int64_t kN, std::int64_t kK, class P>
void kda_mixer_forward(Backend& be, layers::KdaMixer<kH, kN, kK, P> const& l, KdaState& st, ConstMatrixRef x, Matrix& y,
                       KdaForm form) {
  auto const& c = l.config;
  auto const& w = l.weights;
  std::int64_t const T = x.rows(), width = c.width();
  Matrix q = linear(w.q_proj, x), k = linear(w.k_proj, x), v = linear(w.v_proj, x), b = linear(w.b_proj, x);
  Matrix f, g;
  if (c.low_rank_fg) {
    f = linear(w.f_b_proj, linear(w.f_a_proj, x));
    g = linear(w.g_b_proj, linear(w.g_a_proj, x));
  } else {
    linear(w.f_proj, x, f);
    linear(w.g_proj, x, g);
  }
  require(q.cols() == width && k.cols() == width && v.cols() == width && f.cols() == width && g.cols() == width &&
              b.cols() == c.heads(),
          ErrorCode::kShape, "KdaMixer: projection widths differ from heads·head_dim");
  Matrix o(T, width);
  auto const core = c.core();
  auto const cw = w.core();
  if (form == KdaForm::kChunked)
    kda_forward_chunked(core, cw, st, T, q.data(), k.data(), v.data(), f.data(), b.data(), g.data(), o.data());
  else if (!be.kda_checkpoints || T == 1)
    kda_forward_recurrent(core, cw, st, T, q.data(), k.data(), v.data(), f.data(), b.data(), g.data(), o.data());
  else  // token by token (the same recurrence), keeping the state after each of the first T - 1
    for (std::int64_t t = 0; t < T; ++t) {
      std::int64_t const r = t * width, rb = t * c.heads();
      kda_forward_recurrent(core, cw, st, 1, q.data() + r, k.data() + r, v.data() + r, f.data() + r, b.data() + rb,
                            g.data() + r, o.data() + r);
      if (t + 1 < T) be.kda_checkpoints->push_back(st);
    }
  linear(w.o_proj, o, y);
}

template <std::int64_t kH, std::int64_t kN, std::int64_t kK, class P>
void forward_prefill(Backend& be, layers::KdaMixer<kH, kN, kK, P> const& l, KdaState& st, ConstMatrixRef x, Matrix& y) {
  kda_mixer_forward(be, l, st, x, y, KdaForm::kChunked);
}
template <std::int64_t kH, std::int64_t kN, std::int64_t kK, class P>
void forward_decode(Backend& be, layers::KdaMixer<kH, kN, kK, P> const& l, KdaState& st, ConstMatrixRef x, Matrix& y) {
  kda_mixer_forward(be, l, st, x, y, KdaForm::kRecurrent);
}

}  // namespace ling::cpu
