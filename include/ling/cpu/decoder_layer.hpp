#pragma once
// CPU forward of the composed layers: DecoderLayer<Mixer, Ffn>, OneOf<...> and the MTP layer.
#include <type_traits>
#include <variant>

#include "ling/cpu/backend.hpp"
#include "ling/cpu/linear.hpp"
#include "ling/cpu/rms_norm.hpp"
#include "ling/layers/decoder_layer.hpp"
#include "ling/layers/mtp.hpp"

namespace ling::cpu {

enum class Phase { kPrefill, kDecode };

// Runs any layer in the given phase, with its state if it has one.
template <class L, class S>
void run_layer(Backend& be, L const& l, S& st, ConstMatrixRef x, Matrix& y, Phase phase) {
  if constexpr (requires { l.layer.index(); }) {  // OneOf
    std::visit(
        [&](auto const& alt) {
          using A = std::decay_t<decltype(alt)>;
          using AS = layers::state_of<A>;
          if constexpr (std::is_same_v<S, std::monostate>) {  // a OneOf of stateless layers
            static_assert(std::is_same_v<AS, std::monostate>, "a stateful layer was given no state");
            run_layer(be, alt, st, x, y, phase);
          } else {
            if (!std::holds_alternative<AS>(st)) fail(ErrorCode::kInternal, "layer state does not match its layer");
            run_layer(be, alt, std::get<AS>(st), x, y, phase);
          }
        },
        l.layer);
  } else if constexpr (std::is_same_v<S, std::monostate>) {
    if (phase == Phase::kPrefill) forward_prefill(be, l, x, y);
    else forward_decode(be, l, x, y);
  } else {
    if (phase == Phase::kPrefill) forward_prefill(be, l, st, x, y);
    else forward_decode(be, l, st, x, y);
  }
}

template <class M, class F, std::int64_t kH>
void decoder_layer_forward(Backend& be, layers::DecoderLayer<M, F, kH> const& l,
                           typename layers::DecoderLayer<M, F, kH>::State& st, ConstMatrixRef x, Matrix& y, Phase phase) {
  Matrix n, m;
  forward_prefill(be, l.input_norm, x, n);
  run_layer(be, l.mixer, st, n, m, phase);
  Matrix h = x + m;
  forward_prefill(be, l.post_norm, h, n);
  std::monostate none;
  run_layer(be, l.ffn, none, n, m, phase);
  y = h + m;
}

template <class M, class F, std::int64_t kH>
void forward_prefill(Backend& be, layers::DecoderLayer<M, F, kH> const& l,
                     typename layers::DecoderLayer<M, F, kH>::State& st, ConstMatrixRef x, Matrix& y) {
  decoder_layer_forward(be, l, st, x, y, Phase::kPrefill);
}
template <class M, class F, std::int64_t kH>
void forward_decode(Backend& be, layers::DecoderLayer<M, F, kH> const& l,
                    typename layers::DecoderLayer<M, F, kH>::State& st, ConstMatrixRef x, Matrix& y) {
  decoder_layer_forward(be, l, st, x, y, Phase::kDecode);
}

// MTP: emb [n, hidden] = embeddings of t_{j+1}, h [n, hidden] = main hidden after model.norm; y = RMSNorm(x; final).
template <class B, class P, std::int64_t kH>
void mtp_forward(Backend& be, layers::MtpLayer<B, P, kH> const& l, typename layers::MtpLayer<B, P, kH>::State& st,
                 ConstMatrixRef emb, ConstMatrixRef h, Matrix& y, Phase phase) {
  Matrix e, hn;
  forward_prefill(be, l.enorm, emb, e);
  forward_prefill(be, l.hnorm, h, hn);
  Matrix cat(emb.rows(), e.cols() + hn.cols());
  cat << e, hn;
  Matrix x = linear(l.eh_proj, cat), out;
  decoder_layer_forward(be, l.block, st, x, out, phase);
  forward_prefill(be, l.final_norm, out, y);
}

template <class B, class P, std::int64_t kH>
void forward_prefill(Backend& be, layers::MtpLayer<B, P, kH> const& l, typename layers::MtpLayer<B, P, kH>::State& st,
                     ConstMatrixRef emb, ConstMatrixRef h, Matrix& y) {
  mtp_forward(be, l, st, emb, h, y, Phase::kPrefill);
}
template <class B, class P, std::int64_t kH>
void forward_decode(Backend& be, layers::MtpLayer<B, P, kH> const& l, typename layers::MtpLayer<B, P, kH>::State& st,
                    ConstMatrixRef emb, ConstMatrixRef h, Matrix& y) {
  mtp_forward(be, l, st, emb, h, y, Phase::kDecode);
}

}  // namespace ling::cpu
