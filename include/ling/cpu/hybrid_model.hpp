#pragma once
// CPU forward of a whole HybridModel (spec §2): embedding lookup, the decoder layers, model.norm, lm_head; and the
// MTP layer over the main model's final hidden states. Prefill runs chunked KDA and naive MLA, decode recurrent
// KDA and absorbed MLA (the Phase picks them).
#include <cstdint>
#include <span>
#include <string>

#include "ling/core/error.hpp"
#include "ling/cpu/backend.hpp"
#include "ling/cpu/decoder_layer.hpp"
#include "ling/cpu/gated_mla.hpp"
#include "ling/cpu/kda_mixer.hpp"
#include "ling/cpu/linear.hpp"
#include "ling/cpu/mlp.hpp"
#include "ling/cpu/moe.hpp"
#include "ling/cpu/rms_norm.hpp"
#include "ling/model/hybrid_model.hpp"

namespace ling::cpu {

// Rows of the embedding for `tokens`; an id outside [0, vocab) is an error naming it.
template <class Spec, class P>
Matrix embed(model::HybridModel<Spec, P> const& m, std::span<std::int32_t const> tokens) {
  std::int64_t const V = m.vocab_size();
  Matrix x(std::int64_t(tokens.size()), m.hidden_size());
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= V)
      fail(ErrorCode::kInvalidArgument, "token id " + std::to_string(tokens[t]) + " (at index " + std::to_string(t) +
                                            ") is outside the vocabulary [0, " + std::to_string(V) + ")");
    m.embedding.row(tokens[t], x.row(std::int64_t(t)).data());
  }
  return x;
}

struct ForwardOptions {
  Phase phase = Phase::kPrefill;
  bool all_logits = true;        // false: lm_head on the last row only
  std::int64_t max_context = 0;  // 0: max_position_embeddings
};

// Runs `tokens` at positions state.position..; fills `hidden` [T, hidden] (after model.norm) and `logits`
// ([T, vocab], or [1, vocab] for the last row).
template <class Spec, class P>
void forward(Backend& be, model::HybridModel<Spec, P> const& m, typename model::HybridModel<Spec, P>::State& st,
             std::span<std::int32_t const> tokens, Matrix& hidden, Matrix& logits, ForwardOptions const& opt = {}) {
  std::int64_t const T = std::int64_t(tokens.size());
  std::int64_t const max_ctx = opt.max_context > 0 ? opt.max_context : m.config.max_position_embeddings;
  if (max_ctx > 0 && st.position + T > max_ctx)
    fail(ErrorCode::kOutOfRange, "context overflow: " + std::to_string(st.position) + " tokens + " + std::to_string(T) +
                                     " new exceed the maximum context of " + std::to_string(max_ctx) +
                                     " (max_position_embeddings or the configured limit)");
  require(st.layers.size() == m.layers.size(), ErrorCode::kInternal, "forward: state was made for another model");
  if (T == 0) {
    hidden.resize(0, m.hidden_size());
    logits.resize(0, m.vocab_size());
    return;
  }
  Matrix x = embed(m, tokens), y;
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    decoder_layer_forward(be, m.layers[i], st.layers[i], x, y, opt.phase);
    x.swap(y);
  }
  forward_prefill(be, m.final_norm, x, hidden);
  if (opt.all_logits) linear(m.lm_head, hidden, logits);
  else linear(m.lm_head, hidden.bottomRows(1), logits);
  st.position += T;
}

// MTP logits [n, vocab]: row i from the main model's final hidden h.row(i) (position `position + i`) and the next
// token next_tokens[i]. The MTP stream is contiguous: `position` must equal the tokens its cache already holds.
template <class Spec, class P>
void mtp_forward(Backend& be, model::HybridModel<Spec, P> const& m, typename model::HybridModel<Spec, P>::State& st,
                 ConstMatrixRef h, std::span<std::int32_t const> next_tokens, std::int64_t position, Matrix& logits,
                 Phase phase = Phase::kPrefill) {
  if (!m.mtp || !st.mtp) fail(ErrorCode::kUnsupported, m.config.source + ": the model has no MTP layer (num_nextn_predict_layers = 0)");
  require(h.rows() == std::int64_t(next_tokens.size()), ErrorCode::kInvalidArgument,
          "mtp: " + std::to_string(h.rows()) + " hidden rows but " + std::to_string(next_tokens.size()) + " next tokens");
  require(h.cols() == m.hidden_size(), ErrorCode::kShape, "mtp: hidden rows are not hidden_size wide");
  if (position != st.mtp->length)
    fail(ErrorCode::kInvalidArgument, "mtp: position " + std::to_string(position) + " does not continue the MTP stream, which holds " +
                                          std::to_string(st.mtp->length) + " positions");
  std::int64_t const max_ctx = m.config.max_position_embeddings;
  if (max_ctx > 0 && position + h.rows() > max_ctx)
    fail(ErrorCode::kOutOfRange, "mtp: context overflow past " + std::to_string(max_ctx));
  Matrix emb = embed(m, next_tokens), y;
  mtp_forward(be, *m.mtp, *st.mtp, emb, h, y, phase);
  linear(m.lm_head, y, logits);
}

}  // namespace ling::cpu
