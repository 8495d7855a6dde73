#pragma once
// Parameter counts and bytes read per decoded token (spec §4: batch 1, context 0), from the tensor plan.
// Shared by `ling info` and `ling bench`.
//   parameters: every planned tensor; "active" = what one token multiplies: routed experts at top-k of num_experts,
//               and not the embedding (a row lookup), as the model card counts (5.10 B for Ling-3.0-flash).
//   bytes/token: each tensor as stored (data + scales); routed experts at top-k / num_experts; the embedding one row;
//               the LM head as stored, and also as BF16 and as the online FP8-row head.
#include <array>
#include <cstdint>
#include <functional>

#include "ling/model/tensor_plan.hpp"
#include "ling/quant/policies.hpp"

namespace ling::model {

struct ParameterCount {
  std::int64_t total = 0, total_with_mtp = 0;    // all stored parameters (tied head counted once)
  std::int64_t active = 0, active_with_mtp = 0;  // per token, embedding excluded
};

inline ParameterCount count_parameters(ModelConfig const& c, TensorPlan const& plan) {
  ParameterCount p;
  for (PlannedTensor const& t : plan.tensors()) {
    if (t.optional) continue;  // a tied lm_head is the embedding
    std::int64_t const n = t.numel();
    bool const mtp = t.layer >= c.num_hidden_layers;
    std::int64_t a = t.role == TensorRole::kRoutedExpert ? n * c.num_experts_per_tok / c.num_experts : n;
    if (t.group == TensorGroup::kEmbedding) a = 0;
    if (t.group == TensorGroup::kLmHead || (t.group == TensorGroup::kEmbedding && c.tie_word_embeddings)) a = n;
    p.total_with_mtp += n;
    p.active_with_mtp += a;
    if (!mtp) {
      p.total += n;
      p.active += a;
    }
  }
  return p;
}

struct TokenBytes {
  std::array<double, std::size(kAllTensorGroups)> by_group{};  // lm_head's entry: as stored
  double lm_head_stored = 0, lm_head_bf16 = 0, lm_head_fp8_row = 0;

  double& operator[](TensorGroup g) { return by_group[std::size_t(g)]; }
  double operator[](TensorGroup g) const { return by_group[std::size_t(g)]; }
  double body() const {  // everything but the head
    double s = 0;
    for (auto g : kAllTensorGroups)
      if (g != TensorGroup::kLmHead) s += (*this)[g];
    return s;
  }
  double total_stored_head() const { return body() + lm_head_stored; }
  double total_bf16_head() const { return body() + lm_head_bf16; }
  double total_fp8_head() const { return body() + lm_head_fp8_row; }
};

// bytes_of(PlannedTensor) -> stored bytes of that tensor (data + scales), or < 0 when the checkpoint lacks it.
// With include_mtp, the MTP layer's reads (one draft step) are added.
inline TokenBytes bytes_per_token(ModelConfig const& c, TensorPlan const& plan,
                                  std::function<double(PlannedTensor const&)> const& bytes_of, bool include_mtp = false) {
  TokenBytes tb;
  double embedding_bytes = 0;
  bool head_present = false;
  for (PlannedTensor const& t : plan.tensors()) {
    if (!include_mtp && t.layer >= c.num_hidden_layers) continue;
    double b = bytes_of(t);
    if (b < 0) continue;
    if (t.group == TensorGroup::kEmbedding) {
      embedding_bytes = b;
      b /= double(c.vocab_size);  // one row
    } else if (t.group == TensorGroup::kLmHead) {
      head_present = true;
      tb.lm_head_stored = b;
      continue;
    } else if (t.role == TensorRole::kRoutedExpert) {
      b = b * double(c.num_experts_per_tok) / double(c.num_experts);
    }
    tb[t.group] += b;
  }
  if (!head_present) tb.lm_head_stored = embedding_bytes;  // tied: the head reads the whole embedding
  tb[TensorGroup::kLmHead] = tb.lm_head_stored;
  tb.lm_head_bf16 = double(quant::storage_bytes<quant::Bf16>(c.vocab_size, c.hidden_size));
  tb.lm_head_fp8_row = double(quant::storage_bytes<quant::Fp8Row>(c.vocab_size, c.hidden_size));
  return tb;
}

// The -fp4 checkpoint layout (spec §3) assumed when only config.json is at hand: routed experts MXFP4, every other
// matrix block FP8, except the embedding, the LM head and the router (BF16, modules_to_not_convert); norms and conv
// kernels BF16; A_log, dt_bias and the router bias F32.
inline double assumed_fp4_bytes(PlannedTensor const& t) {
  switch (t.role) {
    case TensorRole::kRoutedExpert:
      return double(quant::storage_bytes<quant::Mxfp4>(t.shape[0], t.shape[1]));
    case TensorRole::kMatrix:
      if (t.group == TensorGroup::kEmbedding || t.group == TensorGroup::kLmHead || t.group == TensorGroup::kRouter)
        return double(quant::storage_bytes<quant::Bf16>(t.shape[0], t.shape[1]));
      return double(quant::storage_bytes<quant::Fp8Block>(t.shape[0], t.shape[1]));
    case TensorRole::kALog:
    case TensorRole::kDtBias:
      return 4.0 * double(t.numel());
    case TensorRole::kVector:
      return (t.group == TensorGroup::kRouter ? 4.0 : 2.0) * double(t.numel());
    case TensorRole::kConv:
      return 2.0 * double(t.numel());
  }
  return 0;
}

}  // namespace ling::model
