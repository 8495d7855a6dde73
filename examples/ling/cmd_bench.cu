// `ling bench`: decode speed against the measured memory roofline (DESIGN.md "How speed is established").
//   ling bench --spec ling3-flash --random-weights [--contexts 0,4096,32768,131072] [--reps 5] [--tokens 32]
//              [--lm-head fp8|bf16] [--seed N] [--json]
// Every weight is generated on the GPU in the -fp4 storage layout (no checkpoint, no host copy); context lengths
// are simulated by filling the caches with random contents (KDA states, conv rings, MLA latent rows) and setting the
// position, which costs the same bytes and arithmetic per token as a real history of that length.
// This file also carries the CUDA session's definitions for the CLI (cuda/session.cuh, included once per program).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "ling/cuda/bandwidth.cuh"
#include "ling/cuda/model.cuh"
#include "ling/cuda/session.cuh"
#include "registry.hpp"

namespace {

using ling::ErrorCode;
using ling::fail;

// spec §1 (ling3-flash.config.json): the configuration of Ling-3.0-flash, built in so the bench needs no file.
ling::ModelConfig ling3_flash_config() {
  nlohmann::json j = {
      {"architectures", {"BailingMoeV3ForCausalLM"}}, {"model_type", "bailing_hybrid"}, {"vocab_size", 157184},
      {"hidden_size", 2560}, {"num_hidden_layers", 42}, {"layer_group_size", 6}, {"first_k_dense_replace", 2},
      {"intermediate_size", 6144}, {"moe_intermediate_size", 768}, {"moe_shared_expert_intermediate_size", 768},
      {"num_shared_experts", 1}, {"num_experts", 512}, {"num_experts_per_tok", 8}, {"n_group", 8}, {"topk_group", 4},
      {"norm_topk_prob", true}, {"routed_scaling_factor", 2.5}, {"num_attention_heads", 32}, {"num_key_value_heads", 32},
      {"head_dim", 128}, {"short_conv_kernel_size", 4}, {"no_kda_lora", true}, {"kda_safe_gate", true},
      {"kda_lower_bound", -5.0}, {"q_lora_rank", nullptr}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128},
      {"qk_rope_head_dim", 64}, {"v_head_dim", 128}, {"rope_theta", 6e6}, {"gated_attention_proj_granularity_type", "head_wise"},
      {"rms_norm_eps", 1e-6}, {"tie_word_embeddings", false}, {"num_nextn_predict_layers", 1},
      {"max_position_embeddings", 262144}, {"pad_token_id", 156892}, {"eos_token_id", 156895}};
  std::vector<double> el(42, 0.0), sl(42, 0.0);
  for (int i = 35; i <= 41; ++i) el[std::size_t(i)] = 4.0;
  for (int i = 34; i <= 39; ++i) sl[std::size_t(i)] = 5.0;
  sl[40] = sl[41] = 7.0;
  j["expert_swiglu_limit_list"] = el;
  j["share_expert_swiglu_limit_list"] = sl;
  return ling::ModelConfig::from_json(j, "built-in ling3-flash config (spec §1)");
}

struct BenchArgs {
  std::string spec = "ling3-flash";
  bool random_weights = false;
  std::string contexts = "0,4096,32768,131072";
  int reps = 5, tokens = 32;
  std::string lm_head = "fp8";
  std::uint64_t seed = 1234;
  bool json = false;
};

std::vector<std::int64_t> parse_list(std::string const& s) {
  std::vector<std::int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t used = 0;
      long long x = std::stoll(item, &used);
      if (used != item.size() || x < 0) throw std::invalid_argument("x");
      v.push_back(x);
    } catch (...) {
      fail(ErrorCode::kInvalidArgument, "--contexts: '" + item + "' is not a context length");
    }
  }
  if (v.empty()) fail(ErrorCode::kInvalidArgument, "--contexts: empty");
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct Row {
  std::int64_t context;
  double bytes, ms_median, ms_min, ms_max, tok_s, roofline;
  double ms2_median = 0;  // a pass of two tokens (CudaModel::step_tokens: a speculative verification's cost)
};

void cmd_bench(BenchArgs const& a) {
  if (a.spec != "ling3-flash") fail(ErrorCode::kInvalidArgument, "--spec: only ling3-flash is built in, got '" + a.spec + "'");
  if (!a.random_weights) fail(ErrorCode::kInvalidArgument, "--random-weights is required (the bench generates the model on the GPU)");
  if (a.reps < 1 || a.tokens < 1) fail(ErrorCode::kInvalidArgument, "--reps and --tokens must be >= 1");
  if (a.lm_head != "fp8" && a.lm_head != "bf16") fail(ErrorCode::kInvalidArgument, "--lm-head must be fp8 or bf16");
  if (!ling::cuda::device_available()) fail(ErrorCode::kUnsupported, "ling bench: no CUDA device");
  auto const contexts = parse_list(a.contexts);
  ling::ModelConfig const cfg = ling3_flash_config();

  cudaDeviceProp prop{};
  int dev = 0;
  ling::cuda::check(cudaGetDevice(&dev), "device");
  ling::cuda::check(cudaGetDeviceProperties(&prop, dev), "device properties");
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));

  // 1. the ceiling: streaming read over 4 GiB, best of 10, in this process
  auto bw = ling::cuda::measure_read_bandwidth<16>(std::size_t(4) << 30, 10);
  double const bw_bytes = bw.gb_per_s * 1e9;

  // 2. the model
  std::size_t free0 = 0, total = 0;
  ling::cuda::check(cudaMemGetInfo(&free0, &total), "memory info");
  std::int64_t max_ctx = *std::max_element(contexts.begin(), contexts.end()) + std::int64_t(a.tokens) * 2 + 64;
  auto t0 = std::chrono::steady_clock::now();
  auto model = ling::cuda::CudaModel::random(cfg, a.seed, {max_ctx, a.lm_head == "fp8", true});
  double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::size_t free1 = 0;
  ling::cuda::check(cudaMemGetInfo(&free1, &total), "memory info");
  ling::cuda::StepBytes const sb = model->step_bytes();

  // 3. decode timing per context: graph replays, greedy (the step's argmax is the next token, no host work)
  cudaEvent_t e0, e1;
  ling::cuda::check(cudaEventCreate(&e0), "event");
  ling::cuda::check(cudaEventCreate(&e1), "event");
  std::vector<Row> rows;
  for (std::int64_t ctx : contexts) {
    std::vector<double> ms;
    for (int r = 0; r < a.reps; ++r) {
      model->fill_random_context(ctx, a.seed + std::uint64_t(ctx) * 7 + std::uint64_t(r));
      model->step(1);
      for (int w = 0; w < 3; ++w) model->step_greedy();  // warm-up (first call captures the graph)
      model->synchronize();
      ling::cuda::check(cudaEventRecord(e0, model->stream()), "event");
      for (int t = 0; t < a.tokens; ++t) model->step_greedy();
      ling::cuda::check(cudaEventRecord(e1, model->stream()), "event");
      ling::cuda::check(cudaEventSynchronize(e1), "decode");
      float elapsed = 0;
      ling::cuda::check(cudaEventElapsedTime(&elapsed, e0, e1), "event time");
      ms.push_back(double(elapsed) / a.tokens);
    }
    // the same context through passes of two tokens (step_tokens; the tokens are uploaded before each pass)
    std::vector<double> ms2;
    int const passes = std::max(1, a.tokens / 2);
    std::int32_t const pair[2] = {1, 2};
    for (int r = 0; r < a.reps; ++r) {
      model->fill_random_context(ctx, a.seed + std::uint64_t(ctx) * 7 + std::uint64_t(r));
      model->step(1);
      for (int w = 0; w < 3; ++w) model->step_tokens(pair);  // warm-up (first call captures the graph)
      model->synchronize();
      ling::cuda::check(cudaEventRecord(e0, model->stream()), "event");
      for (int t = 0; t < passes; ++t) model->step_tokens(pair);
      ling::cuda::check(cudaEventRecord(e1, model->stream()), "event");
      ling::cuda::check(cudaEventSynchronize(e1), "decode");
      float elapsed = 0;
      ling::cuda::check(cudaEventElapsedTime(&elapsed, e0, e1), "event time");
      ms2.push_back(double(elapsed) / passes);
    }
    Row row;
    row.context = ctx;
    row.ms2_median = median(ms2);
    row.bytes = sb.at(ctx + 4 + a.tokens / 2);  // mean context over the timed tokens
    row.ms_median = median(ms);
    row.ms_min = *std::min_element(ms.begin(), ms.end());
    row.ms_max = *std::max_element(ms.begin(), ms.end());
    row.tok_s = 1000.0 / row.ms_median;
    row.roofline = row.bytes / (row.ms_median * 1e-3) / bw_bytes;
    rows.push_back(row);
  }

  // 3b. LING_TRACE=path: one step's timeline at the first of the contexts (per layer and region: blocks, first entry,
  // last PDL-wait exit, last midpoint, last end; µs from the step's first traced entry) as CSV
  if (char const* tp = std::getenv("LING_TRACE"); tp && *tp && *tp != '0') {
    model->fill_random_context(contexts.empty() ? 0 : contexts.front(), a.seed);
    model->step(1);
    for (int w = 0; w < 3; ++w) model->step_greedy();
    auto const t = model->trace_step();
    if (!t.empty()) {
      constexpr int kB = ling::cuda::ops::kTraceBlocks, kP = ling::cuda::ops::kTracePhases;
      int const slots = ling::cuda::CudaModel::kTraceSlots;
      std::size_t const layers = t.size() / (std::size_t(slots) * kB * kP);
      unsigned long long t0 = ~0ull;
      for (std::size_t i = 0; i < t.size(); i += kP)
        if (t[i] && t[i] < t0) t0 = t[i];
      // µs from the step's first traced entry; -1 for a record not written
      auto us = [&](unsigned long long v) { return (v == 0 || v == ~0ull) ? -1.0 : double(v - t0) * 1e-3; };
      std::FILE* f = std::fopen(tp, "w");
      if (f) {
        std::fprintf(f, "layer,region,blocks,entry_first,entry_last,wait_first,wait_last,mid_median,mid_last,end_first,end_median,"
                        "end_last\n");
        for (std::size_t l = 0; l < layers; ++l)
          for (int r = 0; r < slots; ++r) {
            unsigned long long const* b = t.data() + ((l * slots + std::size_t(r)) * kB) * kP;
            int n = 0;
            unsigned long long e0 = ~0ull, e1 = 0, w0 = ~0ull, w1 = 0, m1 = 0, d0 = ~0ull, d1 = 0;
            std::vector<unsigned long long> mids, ends;
            for (int k = 0; k < kB; ++k) {
              unsigned long long const* q = b + std::size_t(k) * kP;
              if (!q[0]) continue;
              ++n;
              e0 = std::min(e0, q[0]), e1 = std::max(e1, q[0]);
              if (q[1]) w0 = std::min(w0, q[1]), w1 = std::max(w1, q[1]);
              if (q[2]) m1 = std::max(m1, q[2]), mids.push_back(q[2]);
              if (q[3]) d0 = std::min(d0, q[3]), d1 = std::max(d1, q[3]), ends.push_back(q[3]);
            }
            if (!n) continue;
            auto med = [](std::vector<unsigned long long>& v) {
              if (v.empty()) return 0ull;
              std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
              return v[v.size() / 2];
            };
            std::fprintf(f, "%zu,%d,%d,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f\n", l, r, n, us(e0), us(e1), us(w0), us(w1),
                         us(med(mids)), us(m1), us(d0), us(med(ends)), us(d1));
          }
        std::fclose(f);
      }
      // LING_TRACE_BLOCKS=path: the same step block by block (the SM each ran on, its four times in µs from the same
      // origin, -1 where not written), for tools/perf/trace_blocks.py
      if (char const* bp = std::getenv("LING_TRACE_BLOCKS"); bp && *bp) {
        std::FILE* g = std::fopen(bp, "w");
        if (g) {
          std::fprintf(g, "layer,region,block,sm,entry,wait,mid,end\n");
          for (std::size_t l = 0; l < layers; ++l)
            for (int r = 0; r < slots; ++r)
              for (int k = 0; k < kB; ++k) {
                unsigned long long const* q = t.data() + (((l * slots + std::size_t(r)) * kB) + std::size_t(k)) * kP;
                if (!q[0]) continue;
                std::fprintf(g, "%zu,%d,%d,%lld,%.3f,%.3f,%.3f,%.3f\n", l, r, k, static_cast<long long>(q[4]) - 1,
                             us(q[0]), us(q[1]), us(q[2]), us(q[3]));
              }
          std::fclose(g);
        }
      }
    }
  }

  // 3c. LING_PREDICT: how often the look-ahead's predicted experts were the router's real picks (eager recording
  // steps at the first context after its warm-up; hits / picks over the KDA layers with a MoE)
  ling::cuda::CudaModel::PredictStats pred{};
  int const pred_steps = 32;
  if (model->predicting()) {
    model->fill_random_context(contexts.empty() ? 0 : contexts.front(), a.seed);
    model->step(1);
    for (int w = 0; w < 3; ++w) model->step_greedy();
    for (int s = 0; s < pred_steps; ++s) {
      auto const p = model->predict_step();
      pred.hits += p.hits, pred.picks += p.picks;
    }
  }
  double const pred_rate = pred.picks ? double(pred.hits) / double(pred.picks) : 0.0;

  // 4. LM head FP8 vs BF16 on this model: top-1 agreement and mean KL(bf16 || fp8) over greedy steps
  int const head_steps = 16;
  model->fill_random_context(0, a.seed);
  std::vector<float> lf(std::size_t(cfg.vocab_size)), lb(lf.size());
  int agree = 0;
  double kl_sum = 0;
  std::int32_t tok = 1;
  for (int s = 0; s < head_steps; ++s) {
    model->step(tok);
    std::vector<float>& mine = model->lm_head_fp8() ? lf : lb;
    std::vector<float>& other = model->lm_head_fp8() ? lb : lf;
    model->download_logits(mine.data());
    model->other_head_logits(other.data());
    auto am = [](std::vector<float> const& v) { return int(std::max_element(v.begin(), v.end()) - v.begin()); };
    agree += am(lf) == am(lb);
    double mb = *std::max_element(lb.begin(), lb.end()), mf = *std::max_element(lf.begin(), lf.end()), zb = 0, zf = 0;
    for (std::size_t i = 0; i < lb.size(); ++i) zb += std::exp(lb[i] - mb), zf += std::exp(lf[i] - mf);
    double kl = 0;
    for (std::size_t i = 0; i < lb.size(); ++i) {
      double pb = std::exp(lb[i] - mb) / zb;
      kl += pb * ((lb[i] - mb - std::log(zb)) - (lf[i] - mf - std::log(zf)));
    }
    kl_sum += kl;
    tok = am(mine);
  }

  double const gib = 1024.0 * 1024.0 * 1024.0;
  if (a.json) {
    nlohmann::json j;
    j["date"] = date;
    j["device"] = prop.name;
    j["spec"] = a.spec;
    j["weights"] = "random, generated on the GPU, -fp4 layout (MXFP4 routed experts, block FP8 matrices, BF16 embedding/router/head)";
    j["context"] = "filled with random cache contents";
    j["read_bandwidth_gb_s"] = bw.gb_per_s;
    j["lm_head"] = a.lm_head;
    j["mla_short"] = model->mla_short();
    j["gpu_memory_used_gib"] = double(total - free1) / gib;
    j["model_arena_gib"] = double(model->arena_bytes()) / gib;
    j["build_s"] = build_s;
    j["moe_pace_cycles"] = ling::cuda::moe_pace_used().load();
    j["reps"] = a.reps;
    j["tokens_per_rep"] = a.tokens;
    if (model->predicting())
      j["expert_prediction"] = {{"level", model->predicting()},
                                {"hits", pred.hits},
                                {"picks", pred.picks},
                                {"hit_rate", pred_rate},
                                {"steps", pred_steps}};
    j["lm_head_fp8_vs_bf16"] = {{"top1_agreement", double(agree) / head_steps}, {"mean_kl", kl_sum / head_steps}, {"steps", head_steps}};
    for (auto const& r : rows)
      j["rows"].push_back({{"context", r.context}, {"bytes_per_token", r.bytes}, {"ms_per_token", r.ms_median},
                           {"ms_min", r.ms_min}, {"ms_max", r.ms_max}, {"tokens_per_s", r.tok_s},
                           {"roofline", r.roofline}, {"ms_per_two_token_pass", r.ms2_median}});
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("## ling bench — %s, random weights (-fp4 layout, generated on the GPU, seed %llu)\n\n", a.spec.c_str(),
              (unsigned long long)a.seed);
  std::printf("%s, %s, %d SMs. Contexts are filled with random cache contents (KDA states, conv rings, MLA latent rows).\n\n",
              date, prop.name, prop.multiProcessorCount);
  std::printf("- streaming-read bandwidth (read-only kernel, 4 GiB, best of 10): **%.0f GB/s**\n", bw.gb_per_s);
  std::printf("- GPU memory used: %.1f GiB (model arena %.1f GiB: weights + caches for %lld positions); built in %.1f s\n",
              double(total - free1) / gib, double(model->arena_bytes()) / gib, (long long)max_ctx, build_s);
  std::printf("- LM head: %s; bytes/token = weights %.3f GB + KDA state %.3f GB + MLA cache %.0f B per context token\n",
              a.lm_head == "fp8" ? "online FP8 (row scales)" : "BF16", sb.weights / 1e9, sb.state / 1e9, sb.cache_per_token);
  if (int const n = model->mla_short(); n > 0)
    std::printf(
        "- MLA chain in one launch (mla_short) at positions below %d; a row times positions context + 4 "
        "to context + %d\n",
        n, 3 + a.tokens);
  if (int const pace = ling::cuda::moe_pace_used(); pace >= 0)
    std::printf(
        "- MoE launch A's routed tiles paced %d SM cycles apart per warp (LING_MOE_PACE, or the device's: one tile "
        "at an SM's share of the peak DRAM rate)\n",
        pace);
  if (model->predicting())
    std::printf(
        "- LING_PREDICT=%d: the predicted experts were %lld of the router's %lld picks (%.1f%%) over %d steps at "
        "context %lld (KDA layers; random weights: not Ling's hit rate)\n",
        model->predicting(), (long long)pred.hits, (long long)pred.picks, 100.0 * pred_rate, pred_steps,
        (long long)(contexts.empty() ? 0 : contexts.front()));
  std::printf("- timing: %d reps × %d greedy tokens per context (graph replays, CUDA events); ms/token median [min–max]\n\n",
              a.reps, a.tokens);
  std::printf(
      "| context | bytes/token (GB) | ms/token | tokens/s | roofline %% | 2-token pass (ms) | pass / step |\n"
      "|---:|---:|---:|---:|---:|---:|---:|\n");
  for (auto const& r : rows)
    std::printf("| %lld | %.3f | %.3f [%.3f–%.3f] | %.1f | %.1f | %.3f | %.2f |\n", (long long)r.context, r.bytes / 1e9,
                r.ms_median, r.ms_min, r.ms_max, r.tok_s, 100.0 * r.roofline, r.ms2_median, r.ms2_median / r.ms_median);
  std::printf(
      "\n2-token pass: CudaModel::step_tokens (a speculative verification's cost: the matvecs read each weight once "
      "for both tokens, KDA, MLA attention and MoE run per token), median of %d reps × %d passes, tokens uploaded per "
      "pass\n",
      a.reps, std::max(1, a.tokens / 2));
  std::printf("\nLM head FP8 vs BF16 (this random model, %d greedy steps): top-1 agreement %.3f, mean KL(bf16||fp8) %.3g nats\n",
              head_steps, double(agree) / head_steps, kl_sum / head_steps);
}

ling::cli::Registrar reg{70, [](CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  auto* c = app.add_subcommand("bench", "Decode speed vs the measured memory roofline (CUDA, random weights)");
  c->add_option("--spec", args->spec, "built-in model spec (ling3-flash)");
  c->add_flag("--random-weights", args->random_weights, "generate every tensor on the GPU from --seed");
  c->add_option("--contexts", args->contexts, "comma-separated context lengths");
  c->add_option("--reps", args->reps, "repetitions per context (>= 5 for the spread)");
  c->add_option("--tokens", args->tokens, "timed decode steps per repetition");
  c->add_option("--lm-head", args->lm_head, "fp8 (online FP8-row, default) or bf16")->check(CLI::IsMember({"fp8", "bf16"}));
  c->add_option("--seed", args->seed, "weights seed");
  c->add_flag("--json", args->json, "JSON instead of markdown");
  c->callback([args] { cmd_bench(*args); });
}};

}  // namespace
