// `ling info --model DIR` / `ling info --config FILE`: what a checkpoint (or a bare config.json) describes:
// config summary, layer pattern, parameter counts, storage format per tensor group, bytes read per decoded token
// (spec §4), and "valid" or the first error (exit 1).
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "ling/core/error.hpp"
#include "ling/io/checkpoint.hpp"
#include "ling/io/model_config.hpp"
#include "ling/io/weights.hpp"
#include "ling/model/footprint.hpp"
#include "ling/model/tensor_plan.hpp"
#include "registry.hpp"

namespace {

std::string layer_pattern(ling::ModelConfig const& c) {
  std::string s;
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    bool mla = c.is_mla_layer(i);
    s += mla ? 'M' : 'K';
    if (mla && i + 1 < c.num_hidden_layers) s += ' ';
  }
  if (c.num_nextn_predict_layers > 0) s += " + MTP x" + std::to_string(c.num_nextn_predict_layers) + " (M)";
  return s;
}

char const* family_name(ling::Family f) { return f == ling::Family::kLing ? "Ling" : "Kimi-Linear"; }
char const* gate_name(ling::OutputGate g) {
  switch (g) {
    case ling::OutputGate::kNone: return "none";
    case ling::OutputGate::kHeadWise: return "head_wise";
    case ling::OutputGate::kElementWise: return "element_wise";
  }
  return "?";
}

void print_config(ling::ModelConfig const& c) {
  std::int64_t mla = 0;
  for (auto t : c.layer_types) mla += t == ling::MixerKind::kMla;
  std::printf("config      %s (%s, model_type %s)\n", c.source.c_str(), family_name(c.family), c.model_type.c_str());
  std::printf("dims        hidden %lld, vocab %lld, layers %lld (%lld KDA, %lld MLA) + %lld MTP, max positions %lld\n",
              (long long)c.hidden_size, (long long)c.vocab_size, (long long)c.num_hidden_layers,
              (long long)(c.num_hidden_layers - mla), (long long)mla, (long long)c.num_nextn_predict_layers,
              (long long)c.max_position_embeddings);
  std::printf("pattern     %s\n", layer_pattern(c).c_str());
  char bound[64] = "";
  if (c.kda_safe_gate) std::snprintf(bound, sizeof bound, " (lower bound %g)", c.kda_lower_bound);
  std::printf("kda         %lld heads x %lld, conv %lld, %s gate%s, %s f/g\n", (long long)c.num_attention_heads,
              (long long)c.head_dim, (long long)c.short_conv_kernel_size, c.kda_safe_gate ? "safe" : "softplus", bound,
              c.no_kda_lora ? "full-rank" : "low-rank");
  char rope[64] = "no rope";
  if (c.mla_use_rope) std::snprintf(rope, sizeof rope, "rope theta %g", c.rope_theta);
  std::printf("mla         %lld heads, q_lora %s, kv_lora %lld, qk %lld+%lld, v %lld, %s, output gate %s\n",
              (long long)c.mla_num_heads, c.q_lora_rank ? std::to_string(*c.q_lora_rank).c_str() : "none",
              (long long)c.kv_lora_rank, (long long)c.qk_nope_head_dim, (long long)c.qk_rope_head_dim,
              (long long)c.v_head_dim, rope,
              gate_name(c.output_gate));
  char dense[96] = "no dense layers";
  if (c.first_k_dense_replace > 0)
    std::snprintf(dense, sizeof dense, "dense 0..%lld width %lld", (long long)c.first_k_dense_replace - 1,
                  (long long)c.intermediate_size);
  std::printf("ffn         %s; MoE %lld experts x %lld, top-%lld (groups %lld keep %lld), shared %lld, scaling %g%s\n",
              dense, (long long)c.num_experts,
              (long long)c.moe_intermediate_size, (long long)c.num_experts_per_tok, (long long)c.n_group,
              (long long)c.topk_group, (long long)c.shared_width(), c.routed_scaling_factor,
              c.expert_swiglu_limit_list.empty() ? "" : ", clamp lists");
}

void print_bytes(ling::model::TokenBytes const& tb, char const* title) {
  using ling::model::TensorGroup;
  std::printf("%s\n", title);
  for (auto g : ling::model::kAllTensorGroups) {
    if (g == TensorGroup::kLmHead || tb[g] == 0) continue;
    std::printf("  %-16s %12.6f GB\n", std::string(to_string(g)).c_str(), tb[g] / 1e9);
  }
  std::printf("  %-16s %12.6f GB as stored, %.6f GB BF16, %.6f GB FP8-row\n", "lm_head", tb.lm_head_stored / 1e9,
              tb.lm_head_bf16 / 1e9, tb.lm_head_fp8_row / 1e9);
  std::printf("  %-16s %12.6f GB/token with FP8 head, %.6f GB/token with BF16 head, %.6f GB/token as stored\n", "total",
              tb.total_fp8_head() / 1e9, tb.total_bf16_head() / 1e9, tb.total_stored_head() / 1e9);
}

void run_info(std::string const& model_dir, std::string const& config_file) {
  namespace fs = std::filesystem;
  if (model_dir.empty() == config_file.empty())
    ling::fail(ling::ErrorCode::kInvalidArgument, "ling info: give exactly one of --model DIR or --config FILE");
  fs::path config_path = config_file.empty() ? fs::path(model_dir) / "config.json" : fs::path(config_file);
  ling::ModelConfig cfg = ling::ModelConfig::load(config_path);
  print_config(cfg);
  ling::model::TensorPlan plan = ling::model::plan_tensors(cfg);
  auto params = ling::model::count_parameters(cfg, plan);
  // Billions at full size (the spec's 124.41 B); millions for the small test models.
  bool const big = params.total >= 1e9;
  double const unit = big ? 1e9 : 1e6;
  char const* u = big ? "B" : "M";
  std::printf("parameters  %.2f %s total (%.2f %s with MTP), %.2f %s active per token (%.2f %s with MTP), %zu tensors\n",
              params.total / unit, u, params.total_with_mtp / unit, u, params.active / unit, u,
              params.active_with_mtp / unit, u, plan.size());

  std::error_code ec;
  bool has_weights = !model_dir.empty() && (fs::exists(fs::path(model_dir) / "model.safetensors", ec) ||
                                            fs::exists(fs::path(model_dir) / "model.safetensors.index.json", ec));
  if (!has_weights) {
    std::printf("storage     assumed -fp4 layout (no weights at hand): routed experts mxfp4, other matrices fp8-block, "
                "embedding/lm_head/router bf16\n");
    print_bytes(ling::model::bytes_per_token(cfg, plan, ling::model::assumed_fp4_bytes),
                "bytes/token (batch 1, context 0, spec §4):");
    print_bytes(ling::model::bytes_per_token(cfg, plan, ling::model::assumed_fp4_bytes, true),
                "bytes/token with the MTP layer's reads added (LM head counted once):");
    std::printf("status      valid (config only)\n");
    return;
  }
  try {
    auto ckpt = ling::io::Checkpoint::open(model_dir);
    auto weights = ling::io::CheckpointWeights::load(ckpt);
    std::printf("storage     %zu tensors in %zu file(s)\n", ckpt.size(), ckpt.files().size());
    std::map<ling::model::TensorGroup, std::map<std::string, int>> formats;
    for (auto const& w : weights.weights()) ++formats[w.group][std::string(ling::io::to_string(w.format))];
    for (auto const& [g, fm] : formats) {
      std::string line;
      for (auto const& [f, n] : fm) line += (line.empty() ? "" : ", ") + f + " x" + std::to_string(n);
      std::printf("  %-16s %s\n", std::string(to_string(g)).c_str(), line.c_str());
    }
    auto stored = [&](ling::model::PlannedTensor const& t) -> double {
      auto const* w = weights.find(t.name);
      return w ? double(w->bytes) : -1.0;
    };
    print_bytes(ling::model::bytes_per_token(cfg, plan, stored), "bytes/token (batch 1, context 0, spec §4):");
    std::printf("status      valid\n");
  } catch (ling::Error const& e) {
    std::printf("status      invalid: %s\n", e.what());
    throw;
  }
}

ling::cli::Registrar reg{90, [](CLI::App& app) {
                           auto* c = app.add_subcommand("info", "Describe a checkpoint or config: layers, parameters, "
                                                                "storage formats, bytes per token; check it");
                           auto model = std::make_shared<std::string>();
                           auto config = std::make_shared<std::string>();
                           c->add_option("--model", *model, "checkpoint directory (config.json [+ safetensors])");
                           c->add_option("--config", *config, "a config.json file");
                           c->callback([model, config] { run_info(*model, *config); });
                         }};

}  // namespace
