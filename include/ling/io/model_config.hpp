#pragma once
// ModelConfig: every key of spec §1 (ling3.md), parsed from config.json. Ling ("bailing_hybrid") and
// Kimi-Linear ("kimi_linear") checkpoints both land here; the differences are fields, not types.
// CONTRACT (shared by io/, model/, cpu/, cuda/): field names below are stable. Parsing/validation: from_json().
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ling/core/error.hpp"

namespace ling {

enum class Family { kLing, kKimiLinear };
enum class MixerKind { kKda, kMla };
enum class OutputGate { kNone, kHeadWise, kElementWise };  // gated_attention_proj_granularity_type

struct ModelConfig {
  Family family = Family::kLing;
  std::string model_type = "bailing_hybrid";
  std::string source;  // file it was read from, for error messages

  std::int64_t vocab_size = 0, hidden_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t layer_group_size = 0;           // Ling: layer i is MLA iff (i+1) % layer_group_size == 0
  std::vector<MixerKind> layer_types;          // resolved per layer (Kimi: from its config), size num_hidden_layers
  std::int64_t first_k_dense_replace = 0, intermediate_size = 0;

  // MoE
  std::int64_t num_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0;
  std::int64_t num_shared_experts = 0, moe_shared_expert_intermediate_size = 0;  // shared width = product
  std::int64_t n_group = 1, topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  std::vector<double> expert_swiglu_limit_list, share_expert_swiglu_limit_list;  // 0 = no clamp; past end = 0

  // KDA
  std::int64_t num_attention_heads = 0, head_dim = 0;  // KDA heads and K = V = head_dim
  std::int64_t short_conv_kernel_size = 4;
  bool no_kda_lora = true;        // false: low-rank f/g (f_a_proj/f_b_proj, g_a_proj/g_b_proj), rank = head_dim
  bool kda_safe_gate = true;      // true: g = lower_bound * sigmoid(exp(A_log) * (f + dt_bias)); false: softplus gate
  double kda_lower_bound = -5.0;

  // MLA
  std::int64_t mla_num_heads = 0;                 // = num_attention_heads for Ling; Kimi's own count
  std::optional<std::int64_t> q_lora_rank;        // null: one q_proj
  std::int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool mla_use_rope = true;                       // Kimi: NoPE
  double rope_theta = 10000.0;
  OutputGate output_gate = OutputGate::kHeadWise;

  double rms_norm_eps = 1e-6;
  std::int64_t num_nextn_predict_layers = 0;      // MTP layers, stored from index num_hidden_layers
  std::int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  std::int64_t pad_token_id = -1, eos_token_id = -1;

  // quantization_config, when present
  bool fp8_scale_ue8m0 = false;

  // Derived helpers
  bool is_mla_layer(std::int64_t i) const { return layer_types.at(std::size_t(i)) == MixerKind::kMla; }
  bool is_moe_layer(std::int64_t i) const { return i >= first_k_dense_replace; }  // MTP layer (i = L) is MoE
  std::int64_t kda_width() const { return num_attention_heads * head_dim; }        // P
  std::int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  std::int64_t shared_width() const { return num_shared_experts * moe_shared_expert_intermediate_size; }
  double expert_limit(std::int64_t layer) const {
    return std::size_t(layer) < expert_swiglu_limit_list.size() ? expert_swiglu_limit_list[std::size_t(layer)] : 0.0;
  }
  double shared_limit(std::int64_t layer) const {
    return std::size_t(layer) < share_expert_swiglu_limit_list.size() ? share_expert_swiglu_limit_list[std::size_t(layer)] : 0.0;
  }

  // Parses and validates; errors name the key and `source`. Unknown keys are ignored.
  static ModelConfig from_json(nlohmann::json const& j, std::string source = "config.json");
  static ModelConfig load(std::filesystem::path const& config_json);
  void validate() const;  // consistency checks (throws ling::Error naming the key)
};

}  // namespace ling
