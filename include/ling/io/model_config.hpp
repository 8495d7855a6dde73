#pragma once
// ModelConfig: every key of spec §1 (ling3.md), parsed from config.json. Ling ("bailing_hybrid") and
// Kimi-Linear ("kimi_linear") checkpoints both land here; the differences are fields, not types.
// CONTRACT (shared by io/, model/, cpu/, cuda/): field names below are stable. Parsing/validation: from_json()
// (below, inline). Kimi-Linear: num_attention_heads/head_dim are the KDA heads (linear_attn_config), mla_num_heads
// the MLA heads (its num_attention_heads).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string_view>
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

// ---- parsing (spec §1) -----------------------------------------------------------------------------
namespace detail::config {

inline std::string where(std::string const& source, std::string_view key) {
  return source + ": key '" + std::string(key) + "'";
}

inline nlohmann::json const* find_key(nlohmann::json const& j, std::string_view key) {
  auto it = j.find(std::string(key));
  return it == j.end() ? nullptr : &*it;
}

// First present (non-null) key among aliases; returns its name through `used`.
inline nlohmann::json const* find_any(nlohmann::json const& j, std::initializer_list<std::string_view> keys,
                                      std::string_view& used) {
  for (auto k : keys)
    if (auto const* v = find_key(j, k); v && !v->is_null()) {
      used = k;
      return v;
    }
  used = *keys.begin();
  return nullptr;
}

inline std::int64_t as_int(nlohmann::json const& v, std::string const& source, std::string_view key) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > std::uint64_t(INT64_MAX))
      fail(ErrorCode::kConfig, where(source, key) + " is too large");
    return v.get<std::int64_t>();
  }
  if (v.is_number_float()) {  // 1e6-style integers
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return std::int64_t(d);
  }
  fail(ErrorCode::kConfig, where(source, key) + " must be an integer, got " + v.dump());
}

inline double as_double(nlohmann::json const& v, std::string const& source, std::string_view key) {
  if (!v.is_number()) fail(ErrorCode::kConfig, where(source, key) + " must be a number, got " + v.dump());
  double d = v.get<double>();
  if (!std::isfinite(d)) fail(ErrorCode::kConfig, where(source, key) + " must be finite");
  return d;
}

inline bool as_bool(nlohmann::json const& v, std::string const& source, std::string_view key) {
  if (!v.is_boolean()) fail(ErrorCode::kConfig, where(source, key) + " must be true or false, got " + v.dump());
  return v.get<bool>();
}

inline std::string as_string(nlohmann::json const& v, std::string const& source, std::string_view key) {
  if (!v.is_string()) fail(ErrorCode::kConfig, where(source, key) + " must be a string, got " + v.dump());
  return v.get<std::string>();
}

struct Reader {
  nlohmann::json const& j;
  std::string const& source;

  std::int64_t integer(std::initializer_list<std::string_view> keys, std::optional<std::int64_t> fallback) const {
    std::string_view used;
    if (auto const* v = find_any(j, keys, used)) return as_int(*v, source, used);
    if (!fallback) fail(ErrorCode::kConfig, where(source, used) + " is missing");
    return *fallback;
  }
  std::int64_t integer(std::string_view key, std::optional<std::int64_t> fallback) const {
    return integer({key}, fallback);
  }
  double number(std::initializer_list<std::string_view> keys, std::optional<double> fallback) const {
    std::string_view used;
    if (auto const* v = find_any(j, keys, used)) return as_double(*v, source, used);
    if (!fallback) fail(ErrorCode::kConfig, where(source, used) + " is missing");
    return *fallback;
  }
  double number(std::string_view key, std::optional<double> fallback) const { return number({key}, fallback); }
  bool boolean(std::initializer_list<std::string_view> keys, bool fallback) const {
    std::string_view used;
    if (auto const* v = find_any(j, keys, used)) return as_bool(*v, source, used);
    return fallback;
  }
  bool boolean(std::string_view key, bool fallback) const { return boolean({key}, fallback); }
  // Token ids may be one integer or a list (Kimi's eos_token_id): the first one is kept.
  std::int64_t token_id(std::string_view key) const {
    auto const* v = find_key(j, key);
    if (!v || v->is_null()) return -1;
    if (v->is_array()) {
      if (v->empty()) return -1;
      return as_int(v->front(), source, key);
    }
    return as_int(*v, source, key);
  }
  std::vector<double> doubles(std::string_view key) const {
    std::vector<double> out;
    auto const* v = find_key(j, key);
    if (!v || v->is_null()) return out;
    if (!v->is_array()) fail(ErrorCode::kConfig, where(source, key) + " must be a list of numbers");
    for (auto const& x : *v) out.push_back(as_double(x, source, key));
    return out;
  }
};

}  // namespace detail::config

inline ModelConfig ModelConfig::from_json(nlohmann::json const& j, std::string source) {
  using detail::config::as_int;
  using detail::config::as_string;
  using detail::config::where;
  if (!j.is_object()) fail(ErrorCode::kConfig, source + ": not a JSON object");
  detail::config::Reader rd{j, source};
  ModelConfig c;
  c.source = source;

  std::string model_type;
  if (auto const* v = detail::config::find_key(j, "model_type"); v && !v->is_null())
    model_type = as_string(*v, source, "model_type");
  bool ling_arch = false;
  if (auto const* a = detail::config::find_key(j, "architectures"); a && a->is_array())
    for (auto const& x : *a)
      if (x.is_string() && x.get<std::string>().rfind("BailingMoeV3", 0) == 0) ling_arch = true;
  if (model_type == "kimi_linear") c.family = Family::kKimiLinear;
  else if (model_type == "bailing_hybrid" || model_type == "bailing_moe_v3" || (model_type.empty() && ling_arch))
    c.family = Family::kLing;
  else
    fail(ErrorCode::kConfig, where(source, "model_type") + ": unsupported model type '" + model_type +
                                 "' (expected bailing_hybrid or kimi_linear)");
  c.model_type = model_type.empty() ? "bailing_hybrid" : model_type;
  bool const kimi = c.family == Family::kKimiLinear;

  c.vocab_size = rd.integer("vocab_size", kimi ? std::optional<std::int64_t>(163840) : std::nullopt);
  c.hidden_size = rd.integer("hidden_size", kimi ? std::optional<std::int64_t>(2304) : std::nullopt);
  c.num_hidden_layers = rd.integer("num_hidden_layers", kimi ? std::optional<std::int64_t>(27) : std::nullopt);
  c.rms_norm_eps = rd.number("rms_norm_eps", kimi ? 1e-5 : 1e-6);
  c.max_position_embeddings = rd.integer({"max_position_embeddings", "model_max_length"}, 0);
  c.tie_word_embeddings = rd.boolean("tie_word_embeddings", false);
  c.pad_token_id = rd.token_id("pad_token_id");
  c.eos_token_id = rd.token_id("eos_token_id");

  // MoE (Kimi writes its own names; HF's attribute_map aliases them)
  c.num_experts = rd.integer({"num_experts", "num_local_experts"}, kimi ? 256 : 0);
  c.num_experts_per_tok = rd.integer({"num_experts_per_tok", "num_experts_per_token"}, kimi ? 8 : 0);
  c.moe_intermediate_size = rd.integer("moe_intermediate_size", kimi ? 1024 : 0);
  c.num_shared_experts = rd.integer({"num_shared_experts", "n_shared_experts"}, kimi ? 1 : 0);
  c.moe_shared_expert_intermediate_size =
      kimi ? c.moe_intermediate_size : rd.integer("moe_shared_expert_intermediate_size", c.moe_intermediate_size);
  c.n_group = rd.integer({"n_group", "num_expert_group"}, 1);
  c.topk_group = rd.integer("topk_group", 1);
  c.norm_topk_prob = rd.boolean({"norm_topk_prob", "moe_renormalize"}, true);
  c.routed_scaling_factor = rd.number("routed_scaling_factor", kimi ? 2.446 : 1.0);
  c.expert_swiglu_limit_list = rd.doubles("expert_swiglu_limit_list");
  c.share_expert_swiglu_limit_list = rd.doubles("share_expert_swiglu_limit_list");
  c.intermediate_size = rd.integer("intermediate_size", kimi ? 9216 : 0);

  // MLA
  c.q_lora_rank.reset();
  if (auto const* v = detail::config::find_key(j, "q_lora_rank"); v && !v->is_null())
    c.q_lora_rank = as_int(*v, source, "q_lora_rank");
  c.kv_lora_rank = rd.integer("kv_lora_rank", kimi ? std::optional<std::int64_t>(512) : std::nullopt);
  c.qk_nope_head_dim = rd.integer("qk_nope_head_dim", 128);
  c.qk_rope_head_dim = rd.integer("qk_rope_head_dim", 64);
  c.v_head_dim = rd.integer("v_head_dim", 128);
  c.rope_theta = rd.number("rope_theta", 10000.0);

  if (!kimi) {
    c.num_attention_heads = rd.integer("num_attention_heads", std::nullopt);
    std::int64_t default_head_dim =
        c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0 ? c.hidden_size / c.num_attention_heads : 0;
    c.head_dim = rd.integer("head_dim", default_head_dim);
    c.mla_num_heads = c.num_attention_heads;
    if (auto kv = rd.integer("num_key_value_heads", c.num_attention_heads); c.num_attention_heads > 0 && kv != c.num_attention_heads)
      fail(ErrorCode::kConfig, where(source, "num_key_value_heads") + " = " + std::to_string(kv) +
                                   " must equal num_attention_heads = " + std::to_string(c.num_attention_heads));
    c.short_conv_kernel_size = rd.integer("short_conv_kernel_size", 4);
    c.no_kda_lora = rd.boolean("no_kda_lora", true);
    c.kda_safe_gate = rd.boolean("kda_safe_gate", true);
    c.kda_lower_bound = rd.number("kda_lower_bound", -5.0);
    c.mla_use_rope = true;
    c.output_gate = OutputGate::kHeadWise;
    if (auto const* v = detail::config::find_key(j, "gated_attention_proj_granularity_type")) {
      if (v->is_null()) c.output_gate = OutputGate::kNone;
      else {
        std::string g = as_string(*v, source, "gated_attention_proj_granularity_type");
        if (g == "head_wise") c.output_gate = OutputGate::kHeadWise;
        else if (g == "element_wise") c.output_gate = OutputGate::kElementWise;
        else if (g == "none") c.output_gate = OutputGate::kNone;
        else fail(ErrorCode::kConfig, where(source, "gated_attention_proj_granularity_type") + ": unknown value '" + g + "'");
      }
    }
    c.first_k_dense_replace = rd.integer("first_k_dense_replace", 0);
    c.num_nextn_predict_layers = rd.integer("num_nextn_predict_layers", 0);
    c.layer_group_size = rd.integer("layer_group_size", std::nullopt);
    if (c.layer_group_size <= 0)
      fail(ErrorCode::kConfig, where(source, "layer_group_size") + " must be > 0, got " + std::to_string(c.layer_group_size));
    if (c.num_hidden_layers > 0 && c.num_hidden_layers < (std::int64_t(1) << 24))
      for (std::int64_t i = 0; i < c.num_hidden_layers; ++i)
        c.layer_types.push_back((i + 1) % c.layer_group_size == 0 ? MixerKind::kMla : MixerKind::kKda);
  } else {
    // Kimi-Linear as HF transformers 5.24 writes it (configuration_kimi_linear.py): KDA dims in linear_attn_config
    // (or linear_num_heads/linear_head_dim), MLA heads in num_attention_heads, no RoPE, no output gate.
    nlohmann::json empty = nlohmann::json::object();
    nlohmann::json const* lac = detail::config::find_key(j, "linear_attn_config");
    if (lac && !lac->is_null() && !lac->is_object())
      fail(ErrorCode::kConfig, where(source, "linear_attn_config") + " must be an object");
    if (!lac || lac->is_null()) lac = &empty;
    detail::config::Reader lrd{*lac, source};
    c.mla_num_heads = rd.integer("num_attention_heads", 32);
    if (auto kv = rd.integer("num_key_value_heads", c.mla_num_heads); c.mla_num_heads > 0 && kv != c.mla_num_heads)
      fail(ErrorCode::kConfig, where(source, "num_key_value_heads") + " = " + std::to_string(kv) +
                                   " must equal num_attention_heads = " + std::to_string(c.mla_num_heads));
    c.num_attention_heads = lrd.integer("num_heads", rd.integer("linear_num_heads", 32));
    c.head_dim = lrd.integer("head_dim", rd.integer("linear_head_dim", 128));
    c.short_conv_kernel_size = lrd.integer("short_conv_kernel_size", rd.integer("linear_conv_kernel_dim", 4));
    c.no_kda_lora = false;
    c.kda_safe_gate = false;
    c.kda_lower_bound = 0.0;
    c.mla_use_rope = false;
    c.output_gate = OutputGate::kNone;
    c.num_nextn_predict_layers = 0;
    c.layer_group_size = 0;
    std::int64_t const L = c.num_hidden_layers;
    if (L <= 0 || L >= (std::int64_t(1) << 24))
      fail(ErrorCode::kConfig, where(source, "num_hidden_layers") + " must be in 1..2^24, got " + std::to_string(L));
    // Layer types: the layer_types list, else linear_attn_config's 1-based kda_layers/full_attn_layers, else
    // HF's default (full attention on i > 0, i % 4 == 0).
    if (auto const* lt = detail::config::find_key(j, "layer_types"); lt && !lt->is_null()) {
      if (!lt->is_array() || std::int64_t(lt->size()) != L)
        fail(ErrorCode::kConfig, where(source, "layer_types") + " must be a list of num_hidden_layers = " +
                                     std::to_string(L) + " strings");
      for (auto const& t : *lt) {
        std::string s = as_string(t, source, "layer_types");
        if (s == "full_attention") c.layer_types.push_back(MixerKind::kMla);
        else if (s == "linear_attention") c.layer_types.push_back(MixerKind::kKda);
        else fail(ErrorCode::kConfig, where(source, "layer_types") + ": unknown layer type '" + s + "'");
      }
    } else if (lac->contains("kda_layers") && lac->contains("full_attn_layers")) {
      std::vector<int> seen(std::size_t(L), -1);
      auto mark = [&](char const* key, MixerKind kind) {
        auto const& list = (*lac)[key];
        if (!list.is_array()) fail(ErrorCode::kConfig, where(source, std::string("linear_attn_config.") + key) + " must be a list");
        for (auto const& x : list) {
          std::int64_t n = as_int(x, source, std::string("linear_attn_config.") + key);
          if (n < 1 || n > L)
            fail(ErrorCode::kConfig, where(source, std::string("linear_attn_config.") + key) + ": layer " +
                                         std::to_string(n) + " is outside 1.." + std::to_string(L) + " (1-based)");
          if (seen[std::size_t(n - 1)] != -1)
            fail(ErrorCode::kConfig, where(source, std::string("linear_attn_config.") + key) + ": layer " +
                                         std::to_string(n) + " is listed twice");
          seen[std::size_t(n - 1)] = int(kind);
        }
      };
      mark("kda_layers", MixerKind::kKda);
      mark("full_attn_layers", MixerKind::kMla);
      for (std::int64_t i = 0; i < L; ++i) {
        if (seen[std::size_t(i)] < 0)
          fail(ErrorCode::kConfig, where(source, "linear_attn_config") + ": layer " + std::to_string(i + 1) +
                                       " (1-based) is in neither kda_layers nor full_attn_layers");
        c.layer_types.push_back(MixerKind(seen[std::size_t(i)]));
      }
    } else {
      for (std::int64_t i = 0; i < L; ++i) c.layer_types.push_back(i && i % 4 == 0 ? MixerKind::kMla : MixerKind::kKda);
    }
    // Dense/MoE: first_k_dense_replace, else the leading "dense" entries of mlp_layer_types, else 1 (HF default).
    if (auto const* mt = detail::config::find_key(j, "mlp_layer_types"); mt && !mt->is_null()) {
      if (!mt->is_array() || std::int64_t(mt->size()) != L)
        fail(ErrorCode::kConfig, where(source, "mlp_layer_types") + " must be a list of num_hidden_layers strings");
      std::int64_t dense = 0;
      bool sparse_seen = false;
      for (auto const& t : *mt) {
        std::string s = as_string(t, source, "mlp_layer_types");
        if (s == "dense") {
          if (sparse_seen)
            fail(ErrorCode::kUnsupported, where(source, "mlp_layer_types") + ": dense layers must all come first");
          ++dense;
        } else if (s == "sparse") sparse_seen = true;
        else fail(ErrorCode::kConfig, where(source, "mlp_layer_types") + ": unknown type '" + s + "'");
      }
      c.first_k_dense_replace = dense;
      if (auto const* fk = detail::config::find_key(j, "first_k_dense_replace"); fk && !fk->is_null() &&
                                                                                as_int(*fk, source, "first_k_dense_replace") != dense)
        fail(ErrorCode::kConfig, where(source, "first_k_dense_replace") + " disagrees with mlp_layer_types");
    } else {
      c.first_k_dense_replace = rd.integer("first_k_dense_replace", 1);
    }
    if (auto f = rd.integer("moe_layer_freq", 1); f != 1)
      fail(ErrorCode::kUnsupported, where(source, "moe_layer_freq") + " = " + std::to_string(f) + " (only 1 is supported)");
  }

  if (auto const* q = detail::config::find_key(j, "quantization_config"); q && q->is_object()) {
    if (auto const* f = detail::config::find_key(*q, "scale_fmt"); f && !f->is_null())
      c.fp8_scale_ue8m0 = as_string(*f, source, "quantization_config.scale_fmt") == "ue8m0";
  }

  c.validate();
  return c;
}

inline ModelConfig ModelConfig::load(std::filesystem::path const& config_json) {
  std::ifstream in(config_json, std::ios::binary);
  if (!in) fail(ErrorCode::kIo, config_json.string() + ": cannot open");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(ErrorCode::kIo, config_json.string() + ": read failed");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail(ErrorCode::kFormat, config_json.string() + ": not valid JSON");
  return from_json(j, config_json.string());
}

inline void ModelConfig::validate() const {
  using detail::config::where;
  constexpr std::int64_t kMaxDim = std::int64_t(1) << 31;  // keeps products of two dims inside int64
  auto positive = [&](std::int64_t v, std::string_view key) {
    if (v <= 0 || v >= kMaxDim)
      fail(ErrorCode::kConfig, where(source, key) + " must be in 1..2^31, got " + std::to_string(v));
  };
  auto non_negative = [&](std::int64_t v, std::string_view key) {
    if (v < 0 || v >= kMaxDim)
      fail(ErrorCode::kConfig, where(source, key) + " must be in 0..2^31, got " + std::to_string(v));
  };
  bool const kimi = family == Family::kKimiLinear;
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(num_hidden_layers, "num_hidden_layers");
  if (num_hidden_layers >= (std::int64_t(1) << 24)) fail(ErrorCode::kConfig, where(source, "num_hidden_layers") + " is too large");
  positive(num_attention_heads, kimi ? "linear_attn_config.num_heads" : "num_attention_heads");
  positive(head_dim, kimi ? "linear_attn_config.head_dim" : "head_dim");
  if (num_attention_heads * head_dim >= kMaxDim)
    fail(ErrorCode::kConfig, where(source, "num_attention_heads") + " x head_dim is too large");
  positive(short_conv_kernel_size, kimi ? "linear_attn_config.short_conv_kernel_size" : "short_conv_kernel_size");
  positive(mla_num_heads, "num_attention_heads");
  positive(kv_lora_rank, "kv_lora_rank");
  non_negative(qk_nope_head_dim, "qk_nope_head_dim");
  non_negative(qk_rope_head_dim, "qk_rope_head_dim");
  positive(v_head_dim, "v_head_dim");
  if (qk_head_dim() <= 0) fail(ErrorCode::kConfig, where(source, "qk_nope_head_dim") + " + qk_rope_head_dim must be > 0");
  if (mla_use_rope && qk_rope_head_dim % 2 != 0)
    fail(ErrorCode::kConfig, where(source, "qk_rope_head_dim") + " must be even for interleaved RoPE");
  if (mla_num_heads * std::max(qk_head_dim(), qk_nope_head_dim + v_head_dim) >= kMaxDim)
    fail(ErrorCode::kConfig, where(source, "num_attention_heads") + " x qk_head_dim is too large");
  if (q_lora_rank) positive(*q_lora_rank, "q_lora_rank");
  if (!(rms_norm_eps > 0.0)) fail(ErrorCode::kConfig, where(source, "rms_norm_eps") + " must be > 0");
  if (mla_use_rope && !(rope_theta > 0.0)) fail(ErrorCode::kConfig, where(source, "rope_theta") + " must be > 0");
  if (kda_safe_gate && !(kda_lower_bound < 0.0))
    fail(ErrorCode::kConfig, where(source, "kda_lower_bound") + " must be < 0 with kda_safe_gate");
  if (max_position_embeddings < 0) fail(ErrorCode::kConfig, where(source, "max_position_embeddings") + " must be >= 0");
  if (pad_token_id >= vocab_size) fail(ErrorCode::kConfig, where(source, "pad_token_id") + " is not below vocab_size");
  if (eos_token_id >= vocab_size) fail(ErrorCode::kConfig, where(source, "eos_token_id") + " is not below vocab_size");

  // Layer pattern
  if (family == Family::kLing && layer_group_size <= 0)
    fail(ErrorCode::kConfig, where(source, "layer_group_size") + " must be > 0");
  if (std::int64_t(layer_types.size()) != num_hidden_layers)
    fail(ErrorCode::kConfig, where(source, kimi ? "layer_types" : "layer_group_size") + ": " +
                                 std::to_string(layer_types.size()) + " layer types for num_hidden_layers = " +
                                 std::to_string(num_hidden_layers));
  if (num_nextn_predict_layers < 0 || num_nextn_predict_layers > 16)
    fail(ErrorCode::kConfig, where(source, "num_nextn_predict_layers") + " must be in 0..16");
  if (first_k_dense_replace < 0 || first_k_dense_replace > num_hidden_layers)
    fail(ErrorCode::kConfig, where(source, "first_k_dense_replace") + " must be in 0..num_hidden_layers");
  if (first_k_dense_replace > 0) positive(intermediate_size, "intermediate_size");

  // MoE (some layer is MoE unless all are dense and there is no MTP layer)
  bool const has_moe = first_k_dense_replace < num_hidden_layers || num_nextn_predict_layers > 0;
  if (has_moe) {
    positive(num_experts, kimi ? "num_experts" : "num_experts");
    positive(num_experts_per_tok, "num_experts_per_tok");
    positive(moe_intermediate_size, "moe_intermediate_size");
    non_negative(num_shared_experts, "num_shared_experts");
    if (num_shared_experts > 0) positive(moe_shared_expert_intermediate_size, "moe_shared_expert_intermediate_size");
    if (shared_width() >= kMaxDim) fail(ErrorCode::kConfig, where(source, "num_shared_experts") + " x width is too large");
    positive(n_group, "n_group");
    positive(topk_group, "topk_group");
    if (num_experts % n_group != 0)
      fail(ErrorCode::kConfig, where(source, "n_group") + ": num_experts = " + std::to_string(num_experts) +
                                   " is not divisible by n_group = " + std::to_string(n_group));
    if (topk_group > n_group)
      fail(ErrorCode::kConfig, where(source, "topk_group") + " = " + std::to_string(topk_group) +
                                   " exceeds n_group = " + std::to_string(n_group));
    if (n_group > 1 && num_experts / n_group < 2)
      fail(ErrorCode::kConfig, where(source, "n_group") + ": group scores need >= 2 experts per group");
    if (num_experts_per_tok > num_experts)
      fail(ErrorCode::kConfig, where(source, "num_experts_per_tok") + " = " + std::to_string(num_experts_per_tok) +
                                   " exceeds num_experts = " + std::to_string(num_experts));
    if (num_experts_per_tok > topk_group * (num_experts / n_group))
      fail(ErrorCode::kConfig, where(source, "num_experts_per_tok") + " = " + std::to_string(num_experts_per_tok) +
                                   " exceeds the experts in the kept groups (topk_group x num_experts / n_group = " +
                                   std::to_string(topk_group * (num_experts / n_group)) + ")");
    if (!(routed_scaling_factor > 0.0)) fail(ErrorCode::kConfig, where(source, "routed_scaling_factor") + " must be > 0");
  }
  auto check_limits = [&](std::vector<double> const& list, std::string_view key) {
    if (list.empty()) return;
    // One entry per layer; a shorter list means "no clamp" past its end (tests/data/ling-b uses that), a longer one
    // than the layers including MTP is a mistake.
    if (std::int64_t(list.size()) > num_hidden_layers + num_nextn_predict_layers)
      fail(ErrorCode::kConfig, where(source, key) + " has " + std::to_string(list.size()) +
                                   " entries, more than the " + std::to_string(num_hidden_layers + num_nextn_predict_layers) +
                                   " layers (num_hidden_layers + num_nextn_predict_layers)");
    for (double x : list)
      if (!(x >= 0.0)) fail(ErrorCode::kConfig, where(source, key) + " holds a negative limit");
  };
  check_limits(expert_swiglu_limit_list, "expert_swiglu_limit_list");
  check_limits(share_expert_swiglu_limit_list, "share_expert_swiglu_limit_list");
}

}  // namespace ling
