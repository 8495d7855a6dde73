// io/model_config.hpp: the spec config, a tiny config, Kimi-Linear as HF transformers writes it, and every
// validation error naming its key.
#include <doctest/doctest.h>

#include <string>

#include "io_test_util.hpp"
#include "ling/io/model_config.hpp"

using namespace ling;
using iotest::check_error;
using nlohmann::json;

TEST_CASE("config: the Ling-3.0-flash spec config (spec §1)") {
  auto c = ModelConfig::load(LING_TEST_DATA "/ling3-flash-config/config.json");
  CHECK(c.family == Family::kLing);
  CHECK(c.model_type == "bailing_hybrid");
  CHECK(c.vocab_size == 157184);
  CHECK(c.hidden_size == 2560);
  CHECK(c.num_hidden_layers == 42);
  CHECK(c.layer_group_size == 6);
  REQUIRE(c.layer_types.size() == 42);
  int mla = 0;
  for (int i = 0; i < 42; ++i) {
    bool want = i % 6 == 5;  // 5, 11, ..., 41
    CHECK(c.is_mla_layer(i) == want);
    mla += want;
  }
  CHECK(mla == 7);
  CHECK(c.first_k_dense_replace == 2);
  CHECK(c.intermediate_size == 6144);
  CHECK(c.num_experts == 512);
  CHECK(c.num_experts_per_tok == 8);
  CHECK(c.moe_intermediate_size == 768);
  CHECK(c.shared_width() == 768);
  CHECK(c.n_group == 8);
  CHECK(c.topk_group == 4);
  CHECK(c.norm_topk_prob);
  CHECK(c.routed_scaling_factor == 2.5);
  CHECK(c.num_attention_heads == 32);
  CHECK(c.mla_num_heads == 32);
  CHECK(c.head_dim == 128);
  CHECK(c.kda_width() == 4096);
  CHECK(c.short_conv_kernel_size == 4);
  CHECK(c.no_kda_lora);
  CHECK(c.kda_safe_gate);
  CHECK(c.kda_lower_bound == -5.0);
  CHECK_FALSE(c.q_lora_rank.has_value());
  CHECK(c.kv_lora_rank == 512);
  CHECK(c.qk_nope_head_dim == 128);
  CHECK(c.qk_rope_head_dim == 64);
  CHECK(c.v_head_dim == 128);
  CHECK(c.qk_head_dim() == 192);
  CHECK(c.mla_use_rope);
  CHECK(c.rope_theta == 6e6);
  CHECK(c.output_gate == OutputGate::kHeadWise);
  CHECK(c.rms_norm_eps == 1e-6);
  CHECK(c.num_nextn_predict_layers == 1);
  CHECK(c.max_position_embeddings == 262144);
  CHECK_FALSE(c.tie_word_embeddings);
  CHECK(c.pad_token_id == 156892);
  CHECK(c.eos_token_id == 156895);
  CHECK_FALSE(c.fp8_scale_ue8m0);
  CHECK(c.expert_limit(34) == 0.0);
  CHECK(c.expert_limit(35) == 4.0);
  CHECK(c.expert_limit(42) == 0.0);  // MTP layer: past the end, no clamp
  CHECK(c.shared_limit(33) == 0.0);
  CHECK(c.shared_limit(34) == 5.0);
  CHECK(c.shared_limit(40) == 7.0);
  CHECK(c.shared_limit(42) == 0.0);
  CHECK(c.source.find("ling3-flash-config/config.json") != std::string::npos);
}

TEST_CASE("config: defaults, nulls and quantization_config") {
  json j = iotest::tiny_ling_config();
  for (auto k : {"head_dim", "short_conv_kernel_size", "no_kda_lora", "kda_safe_gate", "kda_lower_bound", "n_group",
                 "topk_group", "rms_norm_eps", "num_nextn_predict_layers", "max_position_embeddings",
                 "moe_shared_expert_intermediate_size", "expert_swiglu_limit_list", "num_key_value_heads",
                 "gated_attention_proj_granularity_type"})
    j.erase(k);
  j["q_lora_rank"] = 24;
  j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}, {"scale_fmt", "ue8m0"}};
  auto c = ModelConfig::from_json(j, "tiny.json");
  CHECK(c.head_dim == 160 / 2);
  CHECK(c.short_conv_kernel_size == 4);
  CHECK(c.no_kda_lora);
  CHECK(c.n_group == 1);
  CHECK(c.topk_group == 1);
  CHECK(c.rms_norm_eps == 1e-6);
  CHECK(c.num_nextn_predict_layers == 0);
  CHECK(c.moe_shared_expert_intermediate_size == 64);
  CHECK(c.expert_swiglu_limit_list.empty());
  j["expert_swiglu_limit_list"] = json::array({0, 3.0});  // shorter than the layers: no clamp past its end
  CHECK(ModelConfig::from_json(j).expert_limit(1) == 3.0);
  CHECK(ModelConfig::from_json(j).expert_limit(2) == 0.0);
  j.erase("expert_swiglu_limit_list");
  CHECK(c.output_gate == OutputGate::kHeadWise);
  CHECK(c.q_lora_rank == std::optional<std::int64_t>(24));
  CHECK(c.fp8_scale_ue8m0);
  j["gated_attention_proj_granularity_type"] = nullptr;
  CHECK(ModelConfig::from_json(j).output_gate == OutputGate::kNone);
  j["gated_attention_proj_granularity_type"] = "element_wise";
  CHECK(ModelConfig::from_json(j).output_gate == OutputGate::kElementWise);
  j["eos_token_id"] = json::array({3, 4});
  CHECK(ModelConfig::from_json(j).eos_token_id == 3);
  j["rope_theta"] = 1e6;  // a float integer is fine where a number is wanted
  j["hidden_size"] = 160.0;
  CHECK(ModelConfig::from_json(j).hidden_size == 160);
}

TEST_CASE("config: Kimi-Linear as transformers 5.24 writes it") {
  // From KimiLinearConfig(num_hidden_layers=4, linear_attn_config={...}, ...).to_json_string() (keys verbatim).
  json j = json::parse(R"({
    "attention_bias": false, "bos_token_id": 163584, "eos_token_id": 163586, "first_k_dense_replace": 1,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2304, "intermediate_size": 9216, "kv_lora_rank": 512,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_attn_config": {"full_attn_layers": [4], "head_dim": 128, "kda_layers": [1, 2, 3], "num_heads": 32,
                           "short_conv_kernel_size": 4},
    "linear_conv_kernel_dim": 4, "linear_head_dim": 128, "linear_num_heads": 32, "mla_use_nope": true,
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "model_max_length": 1048576,
    "model_type": "kimi_linear", "moe_intermediate_size": 1024, "moe_renormalize": true, "num_attention_heads": 32,
    "num_expert_group": 1, "num_experts": 256, "num_experts_per_token": 8, "num_hidden_layers": 4,
    "num_key_value_heads": 32, "num_shared_experts": 1, "pad_token_id": 163839, "q_lora_rank": null,
    "qk_head_dim": 192, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05,
    "routed_scaling_factor": 2.446, "tie_word_embeddings": false, "topk_group": 1, "transformers_version": "5.24.0",
    "v_head_dim": 128, "vocab_size": 163840
  })");
  auto c = ModelConfig::from_json(j, "kimi.json");
  CHECK(c.family == Family::kKimiLinear);
  CHECK(c.num_attention_heads == 32);  // KDA heads
  CHECK(c.head_dim == 128);            // from linear_attn_config, not the top-level head_dim (= qk_rope_head_dim)
  CHECK(c.mla_num_heads == 32);
  CHECK(c.short_conv_kernel_size == 4);
  CHECK_FALSE(c.kda_safe_gate);
  CHECK_FALSE(c.no_kda_lora);
  CHECK_FALSE(c.mla_use_rope);
  CHECK(c.output_gate == OutputGate::kNone);
  CHECK(c.num_experts == 256);
  CHECK(c.num_experts_per_tok == 8);
  CHECK(c.n_group == 1);
  CHECK(c.shared_width() == 1024);
  CHECK(c.routed_scaling_factor == 2.446);
  CHECK(c.first_k_dense_replace == 1);
  CHECK(c.max_position_embeddings == 1048576);
  CHECK(c.rms_norm_eps == 1e-5);
  CHECK(c.num_nextn_predict_layers == 0);
  REQUIRE(c.layer_types.size() == 4);
  CHECK(c.layer_types[3] == MixerKind::kMla);
  CHECK(c.layer_types[0] == MixerKind::kKda);

  SUBCASE("only linear_attn_config (the original checkpoint's form): 1-based layer lists") {
    j.erase("layer_types");
    j.erase("mlp_layer_types");
    j["linear_attn_config"]["full_attn_layers"] = {2, 4};
    j["linear_attn_config"]["kda_layers"] = {1, 3};
    auto k = ModelConfig::from_json(j);
    CHECK(k.layer_types == std::vector<MixerKind>{MixerKind::kKda, MixerKind::kMla, MixerKind::kKda, MixerKind::kMla});
    j["linear_attn_config"]["kda_layers"] = {1};
    check_error([&] { ModelConfig::from_json(j, "k.json"); }, ErrorCode::kConfig, {"k.json", "linear_attn_config", "layer 3"});
    j["linear_attn_config"]["kda_layers"] = {1, 3, 5};
    check_error([&] { ModelConfig::from_json(j, "k.json"); }, ErrorCode::kConfig, {"kda_layers", "layer 5"});
  }
  SUBCASE("no layer lists at all: HF's default (full attention at i > 0, i % 4 == 0)") {
    j.erase("layer_types");
    j.erase("linear_attn_config");
    j["num_hidden_layers"] = 9;
    j.erase("mlp_layer_types");
    auto k = ModelConfig::from_json(j);
    for (int i = 0; i < 9; ++i) CHECK(k.is_mla_layer(i) == (i == 4 || i == 8));
    CHECK(k.num_attention_heads == 32);  // linear_num_heads
    CHECK(k.head_dim == 128);
  }
  SUBCASE("HF aliases: n_group, num_experts_per_tok, num_local_experts") {
    j.erase("num_expert_group");
    j.erase("num_experts_per_token");
    j.erase("num_experts");
    j["n_group"] = 4;
    j["topk_group"] = 2;
    j["num_experts_per_tok"] = 6;
    j["num_local_experts"] = 64;
    auto k = ModelConfig::from_json(j);
    CHECK(k.n_group == 4);
    CHECK(k.num_experts_per_tok == 6);
    CHECK(k.num_experts == 64);
  }
  SUBCASE("mlp_layer_types that interleave dense and sparse are refused") {
    j["mlp_layer_types"] = {"dense", "sparse", "dense", "sparse"};
    j.erase("first_k_dense_replace");
    check_error([&] { ModelConfig::from_json(j); }, ErrorCode::kUnsupported, {"mlp_layer_types"});
  }
}

TEST_CASE("config: validation errors name the key") {
  struct Case {
    char const* key;
    json value;  // null: erase the key
    ErrorCode code;
    std::string needle;
  };
  std::vector<Case> cases = {
      {"hidden_size", 0, ErrorCode::kConfig, "'hidden_size'"},
      {"hidden_size", nullptr, ErrorCode::kConfig, "'hidden_size' is missing"},
      {"vocab_size", -3, ErrorCode::kConfig, "'vocab_size'"},
      {"vocab_size", "many", ErrorCode::kConfig, "'vocab_size' must be an integer"},
      {"num_hidden_layers", 0, ErrorCode::kConfig, "'num_hidden_layers'"},
      {"layer_group_size", 0, ErrorCode::kConfig, "'layer_group_size'"},
      {"layer_group_size", nullptr, ErrorCode::kConfig, "'layer_group_size' is missing"},
      {"num_attention_heads", 0, ErrorCode::kConfig, "'num_attention_heads'"},
      {"num_key_value_heads", 1, ErrorCode::kConfig, "'num_key_value_heads'"},
      {"head_dim", -1, ErrorCode::kConfig, "'head_dim'"},
      {"kv_lora_rank", 0, ErrorCode::kConfig, "'kv_lora_rank'"},
      {"q_lora_rank", 0, ErrorCode::kConfig, "'q_lora_rank'"},
      {"qk_rope_head_dim", 7, ErrorCode::kConfig, "'qk_rope_head_dim'"},
      {"v_head_dim", 0, ErrorCode::kConfig, "'v_head_dim'"},
      {"n_group", 3, ErrorCode::kConfig, "'n_group'"},  // 4 experts not divisible by 3
      {"topk_group", 3, ErrorCode::kConfig, "'topk_group'"},
      {"num_experts_per_tok", 5, ErrorCode::kConfig, "'num_experts_per_tok'"},
      {"num_experts_per_tok", 3, ErrorCode::kConfig, "kept groups"},  // topk_group 1 of 2 groups keeps 2 experts
      {"num_experts", 0, ErrorCode::kConfig, "'num_experts'"},
      {"moe_intermediate_size", 0, ErrorCode::kConfig, "'moe_intermediate_size'"},
      {"intermediate_size", 0, ErrorCode::kConfig, "'intermediate_size'"},
      {"first_k_dense_replace", 4, ErrorCode::kConfig, "'first_k_dense_replace'"},
      {"expert_swiglu_limit_list", json::array({0, 0, 0, 4.0, 4.0}), ErrorCode::kConfig, "'expert_swiglu_limit_list' has 5 entries"},
      {"share_expert_swiglu_limit_list", json::array({0, 0, 1, 2, 3, 4}), ErrorCode::kConfig, "'share_expert_swiglu_limit_list'"},
      {"expert_swiglu_limit_list", json::array({0, -1, 0}), ErrorCode::kConfig, "negative"},
      {"rms_norm_eps", 0, ErrorCode::kConfig, "'rms_norm_eps'"},
      {"routed_scaling_factor", 0, ErrorCode::kConfig, "'routed_scaling_factor'"},
      {"norm_topk_prob", 1, ErrorCode::kConfig, "'norm_topk_prob' must be true or false"},
      {"gated_attention_proj_granularity_type", "channel", ErrorCode::kConfig, "'gated_attention_proj_granularity_type'"},
      {"model_type", "llama", ErrorCode::kConfig, "unsupported model type 'llama'"},
      {"kda_lower_bound", 1.0, ErrorCode::kConfig, "'kda_lower_bound'"},
      {"pad_token_id", 50, ErrorCode::kConfig, "'pad_token_id'"},
      {"num_nextn_predict_layers", -1, ErrorCode::kConfig, "'num_nextn_predict_layers'"},
  };
  for (auto const& c : cases) {
    std::string const key = c.key;
    CAPTURE(key);
    json j = iotest::tiny_ling_config();
    if (c.value.is_null()) j.erase(c.key);
    else j[c.key] = c.value;
    check_error([&] { ModelConfig::from_json(j, "bad-config.json"); }, c.code, {"bad-config.json", c.needle});
  }
  check_error([] { ModelConfig::from_json(json::array(), "arr.json"); }, ErrorCode::kConfig, {"arr.json", "not a JSON object"});
  check_error([] { ModelConfig::load("/nonexistent/config.json"); }, ErrorCode::kIo, {"/nonexistent/config.json"});
}
