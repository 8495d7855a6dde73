#pragma once
// Kimi-Linear (HF transformers `kimi_linear`) from the same templates: KDA:MLA by `layer_types`, low-rank f/g
// (f_a/f_b, g_a/g_b), the softplus gate, NoPE and ungated MLA, Kimi tensor names (model.embed_tokens,
// self_attn.*, block_sparse_moe.*, experts.E.w1/w2/w3). The loader picks the names from the config's family.
//  - KimiLinearSpec: the family's switches fixed, every dimension dynamic (any Kimi-Linear checkpoint);
//  - KimiLinear48BSpec: Kimi-Linear-48B-A3B's main dimensions static (hidden 2304, 256 experts, 32 heads of 128,
//    MLA r = 512, dn = 128, dr = 64, dv = 128); the rest dynamic.
#include "ling/model/hybrid_model.hpp"
#include "ling/model/spec.hpp"

namespace ling::model {

struct KimiLinearSpec : DynamicSpec {
  static constexpr std::string_view name = "kimi-linear";
  static constexpr Family family = Family::kKimiLinear;
  static constexpr OutputGate output_gate = OutputGate::kNone;
  static constexpr bool mla_use_rope = false, kda_safe_gate = false, no_kda_lora = false;
};

struct KimiLinear48BSpec : KimiLinearSpec {
  static constexpr std::string_view name = "kimi-linear-48b-a3b";
  static constexpr std::int64_t hidden_size = 2304, num_experts = 256, num_attention_heads = 32, head_dim = 128,
                                mla_num_heads = 32, q_lora_rank = 0, kv_lora_rank = 512, qk_nope_head_dim = 128,
                                qk_rope_head_dim = 64, v_head_dim = 128;
};

template <class Policies = quant::DefaultPolicies>
using KimiLinear = HybridModel<KimiLinearSpec, Policies>;
template <class Policies = quant::DefaultPolicies>
using KimiLinear48B = HybridModel<KimiLinear48BSpec, Policies>;

}  // namespace ling::model
