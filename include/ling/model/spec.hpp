#pragma once
// A model Spec: every dimension of a HybridModel, each a compile-time value or ling::dynamic (DESIGN.md
// decision 1). A spec may also fix the family's switches (family, output_gate, mla_use_rope, kda_safe_gate,
// no_kda_lora); those it leaves out are read from config.json. Dims<Spec> binds a spec to a ModelConfig and
// refuses, naming the key, a config that does not match a static value.
#include <cstdint>
#include <string>
#include <string_view>

#include "ling/core/error.hpp"
#include "ling/core/extents.hpp"
#include "ling/io/model_config.hpp"

namespace ling::model {

// All dimensions dynamic: loads any checkpoint of the family.
struct DynamicSpec {
  static constexpr std::string_view name = "dynamic";
  static constexpr std::int64_t vocab_size = dynamic, hidden_size = dynamic, num_hidden_layers = dynamic,
                                layer_group_size = dynamic, first_k_dense_replace = dynamic,
                                intermediate_size = dynamic, num_experts = dynamic, num_experts_per_tok = dynamic,
                                moe_intermediate_size = dynamic, shared_width = dynamic, n_group = dynamic,
                                topk_group = dynamic, num_attention_heads = dynamic, head_dim = dynamic,
                                short_conv_kernel_size = dynamic, mla_num_heads = dynamic,
                                q_lora_rank = dynamic,  // 0 = no q LoRA
                                kv_lora_rank = dynamic, qk_nope_head_dim = dynamic, qk_rope_head_dim = dynamic,
                                v_head_dim = dynamic, num_nextn_predict_layers = dynamic;
};

template <class Spec>
struct Dims {
  Extent<Spec::vocab_size> vocab;
  Extent<Spec::hidden_size> hidden;
  Extent<Spec::num_hidden_layers> layers;
  Extent<Spec::layer_group_size> layer_group;
  Extent<Spec::first_k_dense_replace> dense_layers;
  Extent<Spec::intermediate_size> intermediate;
  Extent<Spec::num_experts> experts;
  Extent<Spec::num_experts_per_tok> top_k;
  Extent<Spec::moe_intermediate_size> expert_width;
  Extent<Spec::shared_width> shared_width;
  Extent<Spec::n_group> n_group;
  Extent<Spec::topk_group> topk_group;
  Extent<Spec::num_attention_heads> kda_heads;
  Extent<Spec::head_dim> head_dim;
  Extent<Spec::short_conv_kernel_size> conv_kernel;
  Extent<Spec::mla_num_heads> mla_heads;
  Extent<Spec::q_lora_rank> q_lora_rank;
  Extent<Spec::kv_lora_rank> kv_rank;
  Extent<Spec::qk_nope_head_dim> nope_dim;
  Extent<Spec::qk_rope_head_dim> rope_dim;
  Extent<Spec::v_head_dim> value_dim;
  Extent<Spec::num_nextn_predict_layers> mtp_layers;

  static Dims bind(ModelConfig const& c) {
    std::string const& s = c.source;
    Dims d;
    d.vocab = {c.vocab_size, "vocab_size", s};
    d.hidden = {c.hidden_size, "hidden_size", s};
    d.layers = {c.num_hidden_layers, "num_hidden_layers", s};
    if constexpr (Spec::layer_group_size != dynamic) d.layer_group = {c.layer_group_size, "layer_group_size", s};
    d.dense_layers = {c.first_k_dense_replace, "first_k_dense_replace", s};
    d.intermediate = {c.intermediate_size, "intermediate_size", s};
    d.experts = {c.num_experts, "num_experts", s};
    d.top_k = {c.num_experts_per_tok, "num_experts_per_tok", s};
    d.expert_width = {c.moe_intermediate_size, "moe_intermediate_size", s};
    d.shared_width = {c.shared_width(), "num_shared_experts·moe_shared_expert_intermediate_size", s};
    d.n_group = {c.n_group, "n_group", s};
    d.topk_group = {c.topk_group, "topk_group", s};
    d.kda_heads = {c.num_attention_heads, "num_attention_heads", s};
    d.head_dim = {c.head_dim, "head_dim", s};
    d.conv_kernel = {c.short_conv_kernel_size, "short_conv_kernel_size", s};
    d.mla_heads = {c.mla_num_heads, "num_attention_heads (MLA)", s};
    d.q_lora_rank = {c.q_lora_rank.value_or(0), "q_lora_rank", s};
    d.kv_rank = {c.kv_lora_rank, "kv_lora_rank", s};
    d.nope_dim = {c.qk_nope_head_dim, "qk_nope_head_dim", s};
    d.rope_dim = {c.qk_rope_head_dim, "qk_rope_head_dim", s};
    d.value_dim = {c.v_head_dim, "v_head_dim", s};
    d.mtp_layers = {c.num_nextn_predict_layers, "num_nextn_predict_layers", s};
    check_switches(c);
    return d;
  }

  // The family switches a spec fixes.
  static void check_switches(ModelConfig const& c) {
    auto bad = [&](char const* key) {
      fail(ErrorCode::kConfig, c.source + ": '" + key + "' does not match model type " + std::string(Spec::name));
    };
    if constexpr (requires { Spec::family; })
      if (c.family != Spec::family) bad("model_type");
    if constexpr (requires { Spec::output_gate; })
      if (c.output_gate != Spec::output_gate) bad("gated_attention_proj_granularity_type");
    if constexpr (requires { Spec::mla_use_rope; })
      if (c.mla_use_rope != Spec::mla_use_rope) bad("mla_use_rope (NoPE)");
    if constexpr (requires { Spec::kda_safe_gate; })
      if (c.kda_safe_gate != Spec::kda_safe_gate) bad("kda_safe_gate");
    if constexpr (requires { Spec::no_kda_lora; })
      if (c.no_kda_lora != Spec::no_kda_lora) bad("no_kda_lora");
    if constexpr (requires { Spec::tie_word_embeddings; })
      if (c.tie_word_embeddings != Spec::tie_word_embeddings) bad("tie_word_embeddings");
  }
};

// Whether a config fits a spec (no throw).
template <class Spec>
bool matches(ModelConfig const& c, std::string* why = nullptr) {
  try {
    (void)Dims<Spec>::bind(c);
    return true;
  } catch (Error const& e) {
    if (why) *why = e.what();
    return false;
  }
}

}  // namespace ling::model
