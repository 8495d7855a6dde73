#pragma once
// Ling-3.0-flash as a fully static type (spec §1): 42 layers (MLA at 5, 11, ..., 41), hidden 2560, 32 heads of 128,
// 512 experts of 768 (top-8, 8 groups keep 4), one shared expert of 768, dense MLP 6144 on layers 0-1,
// MLA r = 512, dn = 128, dr = 64, dv = 128, head-wise gate, RoPE, one MTP layer. A config.json that differs in any
// of these is refused with an error naming the key.
#include "ling/model/hybrid_model.hpp"
#include "ling/model/spec.hpp"

namespace ling::model {

struct Ling3FlashSpec {
  static constexpr std::string_view name = "ling3-flash";
  static constexpr std::int64_t vocab_size = 157184, hidden_size = 2560, num_hidden_layers = 42, layer_group_size = 6,
                                first_k_dense_replace = 2, intermediate_size = 6144, num_experts = 512,
                                num_experts_per_tok = 8, moe_intermediate_size = 768, shared_width = 768, n_group = 8,
                                topk_group = 4, num_attention_heads = 32, head_dim = 128, short_conv_kernel_size = 4,
                                mla_num_heads = 32, q_lora_rank = 0, kv_lora_rank = 512, qk_nope_head_dim = 128,
                                qk_rope_head_dim = 64, v_head_dim = 128, num_nextn_predict_layers = 1;
  static constexpr Family family = Family::kLing;
  static constexpr OutputGate output_gate = OutputGate::kHeadWise;
  static constexpr bool mla_use_rope = true, kda_safe_gate = true, no_kda_lora = true, tie_word_embeddings = false;
};

template <class Policies = quant::DefaultPolicies>
using Ling3Flash = HybridModel<Ling3FlashSpec, Policies>;

}  // namespace ling::model
