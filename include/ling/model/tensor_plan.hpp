#pragma once
// The tensors a model needs (spec §3), derived from its ModelConfig: name as the checkpoint stores it, accepted
// aliases, logical shape ([out, in] for matrices), role and group. Ling ("bailing_hybrid") and Kimi-Linear (names as
// HF transformers writes them: self_attn.*, block_sparse_moe.*, experts.E.w1/w2/w3) are both planned here.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ling/core/error.hpp"
#include "ling/io/model_config.hpp"

namespace ling::model {

enum class TensorRole {
  kMatrix,        // [out, in]
  kRoutedExpert,  // [out, in], one routed expert's gate/up/down
  kVector,        // [n]: norms, router bias
  kConv,          // [P, 1, K]: depthwise short-conv kernel
  kALog,          // [H]; also stored [1, 1, H, 1]
  kDtBias,        // [P]
};

enum class TensorGroup {
  kEmbedding,
  kLmHead,
  kNorm,           // decoder-layer and final RMSNorm weights
  kKda,            // KDA mixer: projections, conv, A_log, dt_bias, o_norm
  kMla,            // MLA mixer incl. its latent norm and output gate
  kRouter,         // mlp.gate.weight and the selection bias
  kRoutedExperts,
  kSharedExperts,
  kDenseMlp,
  kMtp,            // MTP glue: enorm, hnorm, eh_proj, final_layernorm
};

constexpr std::string_view to_string(TensorGroup g) noexcept {
  switch (g) {
    case TensorGroup::kEmbedding: return "embedding";
    case TensorGroup::kLmHead: return "lm_head";
    case TensorGroup::kNorm: return "norms";
    case TensorGroup::kKda: return "kda";
    case TensorGroup::kMla: return "mla";
    case TensorGroup::kRouter: return "router";
    case TensorGroup::kRoutedExperts: return "routed experts";
    case TensorGroup::kSharedExperts: return "shared experts";
    case TensorGroup::kDenseMlp: return "dense mlp";
    case TensorGroup::kMtp: return "mtp";
  }
  return "?";
}
inline constexpr TensorGroup kAllTensorGroups[] = {
    TensorGroup::kEmbedding, TensorGroup::kLmHead,        TensorGroup::kNorm,           TensorGroup::kKda,
    TensorGroup::kMla,       TensorGroup::kRouter,        TensorGroup::kRoutedExperts,  TensorGroup::kSharedExperts,
    TensorGroup::kDenseMlp,  TensorGroup::kMtp};

struct PlannedTensor {
  std::string name;
  std::vector<std::string> aliases;
  std::vector<std::int64_t> shape;  // logical
  TensorRole role = TensorRole::kMatrix;
  TensorGroup group = TensorGroup::kNorm;
  std::int64_t layer = -1;   // -1: not in a layer; >= num_hidden_layers: an MTP layer
  std::int64_t expert = -1;  // routed experts only
  bool optional = false;     // lm_head.weight when tie_word_embeddings

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  bool is_matrix() const { return role == TensorRole::kMatrix || role == TensorRole::kRoutedExpert; }
  // Whether a stored (plain) shape fits: A_log may be [H] or [1,1,H,1]; everything else must match exactly.
  bool accepts_shape(std::span<std::int64_t const> s) const {
    if (std::equal(s.begin(), s.end(), shape.begin(), shape.end())) return true;
    return role == TensorRole::kALog && s.size() == 4 && s[0] == 1 && s[1] == 1 && s[3] == 1 && s[2] == shape[0];
  }
};

class TensorPlan {
 public:
  std::vector<PlannedTensor> const& tensors() const noexcept { return tensors_; }
  std::size_t size() const noexcept { return tensors_.size(); }
  // By name or alias.
  PlannedTensor const* find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }
  void add(PlannedTensor t) {
    std::size_t i = tensors_.size();
    if (!index_.emplace(t.name, i).second) fail(ErrorCode::kInternal, "tensor plan: '" + t.name + "' planned twice");
    for (auto const& a : t.aliases)
      if (!index_.emplace(a, i).second) fail(ErrorCode::kInternal, "tensor plan: alias '" + a + "' planned twice");
    tensors_.push_back(std::move(t));
  }

 private:
  std::vector<PlannedTensor> tensors_;
  std::unordered_map<std::string, std::size_t> index_;
};

// Spec §3. Layers 0..L-1, then num_nextn_predict_layers MTP layers (MLA + MoE) at indices L, L+1, ...
inline TensorPlan plan_tensors(ModelConfig const& c) {
  using R = TensorRole;
  using G = TensorGroup;
  bool const kimi = c.family == Family::kKimiLinear;
  std::int64_t const D = c.hidden_size, V = c.vocab_size, H = c.num_attention_heads, K = c.head_dim, P = c.kda_width();
  TensorPlan plan;
  auto add = [&](std::string name, std::vector<std::int64_t> shape, R role, G group, std::int64_t layer,
                 std::vector<std::string> aliases = {}, std::int64_t expert = -1) {
    PlannedTensor t;
    t.name = std::move(name);
    t.aliases = std::move(aliases);
    t.shape = std::move(shape);
    t.role = role;
    t.group = group;
    t.layer = layer;
    t.expert = expert;
    plan.add(std::move(t));
  };

  add(kimi ? "model.embed_tokens.weight" : "model.word_embeddings.weight", {V, D}, R::kMatrix, G::kEmbedding, -1);

  auto mla = [&](std::string const& a, std::int64_t i) {
    std::int64_t const Hm = c.mla_num_heads, qk = c.qk_head_dim();
    if (c.q_lora_rank) {
      add(a + "q_a_proj.weight", {*c.q_lora_rank, D}, R::kMatrix, G::kMla, i);
      add(a + "q_a_layernorm.weight", {*c.q_lora_rank}, R::kVector, G::kMla, i);
      add(a + "q_b_proj.weight", {Hm * qk, *c.q_lora_rank}, R::kMatrix, G::kMla, i);
    } else {
      add(a + "q_proj.weight", {Hm * qk, D}, R::kMatrix, G::kMla, i);
    }
    add(a + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, D}, R::kMatrix, G::kMla, i);
    add(a + "kv_a_layernorm.weight", {c.kv_lora_rank}, R::kVector, G::kMla, i);
    add(a + "kv_b_proj.weight", {Hm * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, R::kMatrix, G::kMla, i);
    if (c.output_gate == OutputGate::kHeadWise) add(a + "g_proj.weight", {Hm, D}, R::kMatrix, G::kMla, i);
    if (c.output_gate == OutputGate::kElementWise) add(a + "g_proj.weight", {Hm * c.v_head_dim, D}, R::kMatrix, G::kMla, i);
    add(a + (kimi ? "o_proj.weight" : "dense.weight"), {D, Hm * c.v_head_dim}, R::kMatrix, G::kMla, i);
  };
  auto kda = [&](std::string const& a, std::int64_t i) {
    for (char const* n : {"q_proj", "k_proj", "v_proj"}) add(a + n + ".weight", {P, D}, R::kMatrix, G::kKda, i);
    for (char const* n : {"q_conv1d", "k_conv1d", "v_conv1d"})
      add(a + n + ".weight", {P, 1, c.short_conv_kernel_size}, R::kConv, G::kKda, i);
    if (c.no_kda_lora) {
      add(a + "f_proj.weight", {P, D}, R::kMatrix, G::kKda, i);
      add(a + "g_proj.weight", {P, D}, R::kMatrix, G::kKda, i);
    } else {  // low rank, rank = head_dim
      add(a + "f_a_proj.weight", {K, D}, R::kMatrix, G::kKda, i);
      add(a + "f_b_proj.weight", {P, K}, R::kMatrix, G::kKda, i);
      add(a + "g_a_proj.weight", {K, D}, R::kMatrix, G::kKda, i);
      add(a + "g_b_proj.weight", {P, K}, R::kMatrix, G::kKda, i);
    }
    add(a + "b_proj.weight", {H, D}, R::kMatrix, G::kKda, i);
    add(a + "A_log", {H}, R::kALog, G::kKda, i);
    add(a + "dt_bias", {P}, R::kDtBias, G::kKda, i);
    add(a + "o_norm.weight", {K}, R::kVector, G::kKda, i);
    add(a + "o_proj.weight", {D, P}, R::kMatrix, G::kKda, i);
  };
  auto swiglu = [&](std::string const& a, std::int64_t width, G group, std::int64_t i,
                    std::string const& alias_prefix = {}) {
    auto al = [&](char const* n) {
      return alias_prefix.empty() ? std::vector<std::string>{} : std::vector<std::string>{alias_prefix + n};
    };
    add(a + "gate_proj.weight", {width, D}, R::kMatrix, group, i, al("gate_proj.weight"));
    add(a + "up_proj.weight", {width, D}, R::kMatrix, group, i, al("up_proj.weight"));
    add(a + "down_proj.weight", {D, width}, R::kMatrix, group, i, al("down_proj.weight"));
  };
  auto moe = [&](std::string const& m, std::int64_t i) {
    std::int64_t const E = c.num_experts, I = c.moe_intermediate_size;
    add(m + "gate.weight", {E, D}, R::kMatrix, G::kRouter, i);
    if (kimi) add(m + "gate.e_score_correction_bias", {E}, R::kVector, G::kRouter, i);
    else add(m + "gate.expert_bias", {E}, R::kVector, G::kRouter, i, {m + "gate.e_score_correction_bias"});
    for (std::int64_t e = 0; e < E; ++e) {
      std::string x = m + "experts." + std::to_string(e) + ".";
      add(x + (kimi ? "w1.weight" : "gate_proj.weight"), {I, D}, R::kRoutedExpert, G::kRoutedExperts, i, {}, e);
      add(x + (kimi ? "w3.weight" : "up_proj.weight"), {I, D}, R::kRoutedExpert, G::kRoutedExperts, i, {}, e);
      add(x + (kimi ? "w2.weight" : "down_proj.weight"), {D, I}, R::kRoutedExpert, G::kRoutedExperts, i, {}, e);
    }
    if (c.shared_width() > 0) swiglu(m + "shared_experts.", c.shared_width(), G::kSharedExperts, i);
  };

  std::int64_t const L = c.num_hidden_layers;
  for (std::int64_t i = 0; i < L + c.num_nextn_predict_layers; ++i) {
    std::string const p = "model.layers." + std::to_string(i) + ".";
    bool const mtp = i >= L;
    add(p + "input_layernorm.weight", {D}, R::kVector, G::kNorm, i);
    add(p + "post_attention_layernorm.weight", {D}, R::kVector, G::kNorm, i);
    std::string const attn = p + (kimi ? "self_attn." : "attention.");
    if (mtp || c.is_mla_layer(i)) mla(attn, i);
    else kda(attn, i);
    std::string const ffn = p + (kimi ? "block_sparse_moe." : "mlp.");
    if (c.is_moe_layer(i)) moe(ffn, i);
    else swiglu(ffn, c.intermediate_size, G::kDenseMlp, i, kimi ? p + "mlp." : std::string{});
    if (mtp) {
      add(p + "enorm.weight", {D}, R::kVector, G::kMtp, i);
      add(p + "hnorm.weight", {D}, R::kVector, G::kMtp, i);
      add(p + "eh_proj.weight", {D, 2 * D}, R::kMatrix, G::kMtp, i);
      add(p + "final_layernorm.weight", {D}, R::kVector, G::kMtp, i);
    }
  }
  add("model.norm.weight", {D}, R::kVector, G::kNorm, -1);
  PlannedTensor head;  // absent allowed iff the head is tied to the embedding
  head.name = "lm_head.weight";
  head.shape = {V, D};
  head.group = G::kLmHead;
  head.optional = c.tie_word_embeddings;
  plan.add(std::move(head));
  return plan;
}

}  // namespace ling::model
