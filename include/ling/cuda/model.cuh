#pragma once
// CudaModel: the whole decode step of a Ling-3.0-class model on one GPU (see model.hpp). nvcc only.
//
// Per token the step is: embedding gather; per layer [RMSNorm fused into the projection matvec; KDA: fused step,
// o_proj with the gated RMSNorm as its input prologue and the residual add as its epilogue | MLA: prepare, split-
// context attention, combine, W_UV with the head gate, dense + residual]; [router + grouped top-k (last block);
// MoE gate/up (all routed experts + shared in one launch); down + weighted sum + shared + residual]; final RMSNorm
// fused into the LM head with argmax; the head's last block advances the position. Token, position and cache length
// live in device memory, so the captured graph is replayed unchanged for every token.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ling/core/env.hpp"
#include "ling/cuda/embedding.cuh"
#include "ling/cuda/kda.cuh"
#include "ling/cuda/mla.cuh"
#include "ling/cuda/model.hpp"
#include "ling/cuda/model_ops.cuh"
#include "ling/cuda/norm.cuh"
#include "ling/cuda/random_weights.cuh"
#include "ling/cuda/route_predict.cuh"
#include "ling/io/model_config.hpp"
#include "ling/io/weights.hpp"

namespace ling::cuda {

enum class WeightKind { kEmbedding, kHead, kRouter, kDense, kExpert };

// step_tokens: token k's position, then the position advanced by the pass's tokens (one thread each; templates, so
// that every translation unit may hold them).
template <int = 0>
__global__ void positions_next_kernel(std::int32_t* pos, int n) {
  for (int k = 1; k < n; ++k) pos[k] = pos[0] + k;
}
template <int = 0>
__global__ void positions_advance_kernel(std::int32_t* pos, int n) {
  pos[0] += n;
}

class CudaModel {
 public:
  static constexpr int kMaxTokens = 2;  // tokens per step_tokens pass

  // ---- construction -------------------------------------------------------------------------------
  static std::unique_ptr<CudaModel> from_checkpoint(io::CheckpointWeights const& w, ModelConfig const& c, CudaModelOptions o = {}) {
    std::unique_ptr<CudaModel> m(new CudaModel(c, o));
    m->ckpt_ = &w;
    m->build();
    m->ckpt_ = nullptr;
    return m;
  }
  // All weights generated on the GPU in the -fp4 layout (MXFP4 routed experts, block FP8 matrices, BF16 embedding,
  // router and LM head, fp32 vectors); no host copy.
  static std::unique_ptr<CudaModel> random(ModelConfig const& c, std::uint64_t seed, CudaModelOptions o = {}) {
    std::unique_ptr<CudaModel> m(new CudaModel(c, o));
    m->seed_ = seed;
    m->build();
    return m;
  }
  ~CudaModel() {
    drop_graph();
    if (stream_) cudaStreamDestroy(stream_);
    if (host_token_) cudaFreeHost(host_token_);
  }
  CudaModel(CudaModel const&) = delete;
  CudaModel& operator=(CudaModel const&) = delete;

  ModelConfig const& config() const { return c_; }
  std::int64_t position() const { return pos_; }
  std::int64_t max_context() const { return max_ctx_; }
  std::int64_t vocab_size() const { return c_.vocab_size; }
  cudaStream_t stream() const { return stream_; }
  float const* logits_device() const { return logits_; }
  std::size_t arena_bytes() const { return arena_.bytes(); }
  // Positions below this run the MLA chain in one launch (CudaModelOptions::mla_short after LING_MLA_SHORT; 0: none).
  int mla_short() const { return opt_.mla_short; }

  // ---- the step --------------------------------------------------------------------------------------
  // Zero caches, position 0.
  void reset() {
    check(cudaMemsetAsync(cache_base_, 0, cache_bytes_, stream_), "reset caches");
    std::int32_t zero = 0;
    check(cudaMemcpyAsync(pos_dev_, &zero, 4, cudaMemcpyHostToDevice, stream_), "reset position");
    check(cudaStreamSynchronize(stream_), "reset");
    pos_ = 0;
    mtp_pos_ = 0;  // its device position is in the zeroed region
  }
  // Enqueues one decode step of `token` (asynchronous); logits land in logits_device(), the argmax in the token slot.
  void step(std::int32_t token) {
    check_token(token);
    require(pos_ < max_ctx_, ErrorCode::kOutOfRange,
            "context overflow: position " + std::to_string(pos_) + " reaches the maximum context of " + std::to_string(max_ctx_));
    *host_token_ = token;
    check(cudaMemcpyAsync(token_dev_, host_token_, 4, cudaMemcpyHostToDevice, stream_), "token upload");
    launch_step();
  }
  // Decode steps of several tokens in one pass (up to kMaxTokens; speculative decoding's verification of a draft):
  // tokens[k] at position() + k. Their logits land in logits_device() as [n][vocab] (download_logits(host, n)), the
  // bits n step() calls give; each weight of the matvecs is read once for all of them, the KDA steps, MLA attention
  // and MoE run per token. No argmax (the caller samples), and the opt-in probes LING_PREDICT and LING_AHEAD are not
  // taken. One token is step().
  void step_tokens(std::span<std::int32_t const> tokens) {
    std::int64_t const n = std::int64_t(tokens.size());
    require(n >= 1 && n <= kMaxTokens, ErrorCode::kInvalidArgument,
            "step_tokens: " + std::to_string(n) + " tokens (1 to " + std::to_string(kMaxTokens) + " per pass)");
    if (n == 1) return step(tokens[0]);
    for (std::int32_t t : tokens) check_token(t);
    require(pos_ + n <= max_ctx_, ErrorCode::kOutOfRange,
            "context overflow: positions " + std::to_string(pos_) + " to " + std::to_string(pos_ + n - 1) +
                " pass the maximum context of " + std::to_string(max_ctx_));
    require(takes_tokens(), ErrorCode::kUnsupported,
            "step_tokens: the probes LING_PREDICT and LING_AHEAD run with one token per step");
    for (std::int64_t k = 0; k < n; ++k) host_token_[k] = tokens[std::size_t(k)];
    check(cudaMemcpyAsync(token_dev_, host_token_, std::size_t(4 * n), cudaMemcpyHostToDevice, stream_),
          "token upload");
    bool const s0 = pos_ < opt_.mla_short, s1 = pos_ + n - 1 < opt_.mla_short;
    replay(graph_tokens_[s0 + s1], [&](cudaStream_t st) { enqueue_step(st, s0, int(n), s1); });
    pos_ += n;
    last_tokens_ = int(n);
  }
  // Takes back the last token of the last step_tokens pass of two (a rejected draft): the KDA states go back to the
  // ones kept after the pass's first token (copied from KdaL::state_kept: no recomputation), the position by one. The
  // conv rings and the MLA caches need nothing: the next token at that position writes its slot and row before any
  // read. The last logits are then the first token's. Once per pass, right after it.
  void rewind(int n) {
    require(n == 1 && last_tokens_ == kMaxTokens, ErrorCode::kInvalidArgument,
            "rewind(" + std::to_string(n) + "): only the last token of a step_tokens pass of " +
                std::to_string(kMaxTokens) + " tokens can be taken back, right after the pass");
    std::size_t const bytes =
        std::size_t(c_.num_attention_heads) * std::size_t(c_.head_dim) * std::size_t(c_.head_dim) * sizeof(float);
    for (Layer const& l : layers_)
      if (!l.mla) check(cudaMemcpyAsync(l.k.state, l.k.state_kept, bytes, cudaMemcpyDeviceToDevice, stream_), "rewind");
    positions_advance(stream_, -1);
    --pos_;
    last_tokens_ = 1;
  }
  // ---- the MTP layer (spec §2 "MTP (NEXTN) layer") ----------------------------------------------------------
  // Whether the model has its MTP layer (a checkpoint with model.layers.<num_hidden_layers>.eh_proj.weight, or any
  // random model of a config with num_nextn_predict_layers > 0).
  bool has_mtp() const { return has_mtp_; }
  // Entries of the MTP stream so far (its own MLA cache holds one row per entry; reset() empties it, rewind leaves it).
  std::int64_t mtp_position() const { return mtp_pos_; }
  // MTP entries for the first next.size() positions of the last pass (step: 1, step_tokens: up to its count): entry k
  // runs the MTP layer on the main model's hidden row k of that pass and next[k], the token that follows it, at MTP
  // position p0 + k (p0: the pass's first position, which must be mtp_position()). The last entry's logits land in
  // download_mtp_logits, its argmax (the greedy draft) in mtp_argmax. Each entry is one replay of the MTP graph.
  // hidden, first: other rows instead ([n][hidden] in device memory, residual streams before model.norm, as
  // hidden_device() holds them) and their first position (the caller keeps a longer history, e.g. a prefill's).
  void mtp_after(std::span<std::int32_t const> next, float const* hidden = nullptr, std::int64_t first = -1) {
    require(has_mtp_, ErrorCode::kUnsupported, "mtp_after: the model has no MTP layer (num_nextn_predict_layers)");
    std::int64_t const n = std::int64_t(next.size()), p0 = hidden ? first : pos_ - last_tokens_;
    require(n >= 1 && (hidden ? p0 + n <= pos_ : n <= last_tokens_), ErrorCode::kInvalidArgument,
            "mtp_after: " + std::to_string(n) + " tokens for " +
                (hidden ? "rows past the position" : "a pass of " + std::to_string(last_tokens_)));
    require(mtp_pos_ == p0, ErrorCode::kInvalidArgument,
            "mtp_after: the MTP stream is at position " + std::to_string(mtp_pos_) + ", the rows start at " +
                std::to_string(p0));
    for (std::int32_t t : next) check_token(t);
    std::size_t const D = std::size_t(c_.hidden_size);
    // the tokens in one upload (from pageable memory: staged before the call returns), then one into the graph's slot
    // per entry
    check(cudaMemcpyAsync(mtp_next_dev_, next.data(), std::size_t(n) * 4, cudaMemcpyHostToDevice, stream_),
          "MTP token upload");
    for (std::int64_t k = 0; k < n; ++k) {
      check(cudaMemcpyAsync(mtp_token_dev_, mtp_next_dev_ + k, 4, cudaMemcpyDeviceToDevice, stream_), "MTP token");
      float const* const h = (hidden ? hidden : x_) + std::size_t(k) * D;
      check(cudaMemcpyAsync(mtp_h_, h, D * 4, cudaMemcpyDeviceToDevice, stream_), "MTP hidden");
      bool const short_mla = mtp_pos_ < opt_.mla_short;
      replay(graph_mtp_[short_mla ? 1 : 0], [&](cudaStream_t st) { enqueue_mtp(st, short_mla); });
      ++mtp_pos_;
    }
  }
  // The last pass's hidden rows [tokens][hidden] (residual streams before model.norm), until the next pass.
  float const* hidden_device() const { return x_; }
  int last_tokens() const { return last_tokens_; }
  void download_mtp_logits(float* host) {
    check(cudaMemcpyAsync(host, mtp_logits_, std::size_t(c_.vocab_size) * 4, cudaMemcpyDeviceToHost, stream_),
          "MTP logits download");
    synchronize();
  }
  std::int32_t mtp_argmax() { return read_int(mtp_draft_dev_, "MTP argmax download"); }
  // Whether step_tokens takes more than one token (not with the probes LING_PREDICT and LING_AHEAD).
  bool takes_tokens() const { return !predict_ && !ahead_buf_.data(); }
  // One more step on the token the previous step chose (greedy, no host work): for benchmarks.
  void step_greedy() {
    require(pos_ < max_ctx_, ErrorCode::kOutOfRange, "context overflow");
    launch_step();
  }
  void synchronize() { check(cudaStreamSynchronize(stream_), "decode step"); }
  // The last pass's logits: its first `tokens` rows ([tokens][vocab]; a step_tokens pass has one per token).
  void download_logits(float* host, int tokens = 1) {
    require(tokens >= 1 && tokens <= last_tokens_, ErrorCode::kInvalidArgument,
            "download_logits: " + std::to_string(tokens) + " rows of a pass of " + std::to_string(last_tokens_) +
                " tokens");
    std::size_t const bytes = std::size_t(c_.vocab_size) * 4 * std::size_t(tokens);
    check(cudaMemcpyAsync(host, logits_, bytes, cudaMemcpyDeviceToHost, stream_), "logits download");
    synchronize();
  }
  // The last token's logits of the last pass.
  void download_last_logits(float* host) {
    std::size_t const V = std::size_t(c_.vocab_size);
    check(cudaMemcpyAsync(host, logits_ + std::size_t(last_tokens_ - 1) * V, V * 4, cudaMemcpyDeviceToHost, stream_),
          "logits download");
    synchronize();
  }
  std::int32_t argmax() { return read_int(token_dev_, "argmax download"); }
  // Refuses an id outside the vocabulary (kInvalidArgument, naming it).
  void check_token(std::int32_t t) const {
    require(t >= 0 && t < c_.vocab_size, ErrorCode::kInvalidArgument,
            "token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(c_.vocab_size) + ")");
  }

  // LING_TRACE builds only (measurements): zeroes the timeline, runs one greedy step and returns per layer and region
  // (attention projections, KDA step, o_proj / MLA dense, router, MoE A, MoE B, the MLA chain in one launch) the
  // blocks' records [layers][7][kTraceBlocks][kTracePhases]: four times in ns of %globaltimer, then the SM plus one
  // (0 = not written). Empty without LING_TRACE.
  std::vector<unsigned long long> trace_step() {
    if (!trace_) return {};
    std::size_t const n = layers_.size() * kTraceSlots * std::size_t(ops::kTraceRegion);
    check(cudaMemsetAsync(trace_, 0, n * 8, stream_), "trace reset");
    step_greedy();
    std::vector<unsigned long long> v(n);
    check(cudaMemcpyAsync(v.data(), trace_, n * 8, cudaMemcpyDeviceToHost, stream_), "trace download");
    synchronize();
    return v;
  }
  static constexpr int kTraceSlots = 7;

  // LING_PREDICT (a probe; docs/kernels.md "The layer's experts predicted from its input"): 0 off, 1 the KDA step's
  // look-ahead blocks prefetch the predicted experts' gate and up rows into L2, 2 also their down rows.
  int predicting() const { return predict_; }
  // LING_PREDICT only: one eager greedy step (as step_greedy, outside the graph) that records, per KDA layer with a
  // MoE, the predicted picks and the router's real ones. hits: real picks that were predicted; picks: all real picks.
  struct PredictStats {
    std::int64_t hits = 0, picks = 0;
  };
  PredictStats predict_step() {
    require(predict_ != 0, ErrorCode::kInvalidArgument, "predict_step: LING_PREDICT is off");
    require(pos_ < max_ctx_, ErrorCode::kOutOfRange, "context overflow");
    std::size_t const n = layers_.size() * std::size_t(ops::kMaxTopK);
    check(cudaMemsetAsync(pred_rec_, 0xff, n * 4, stream_), "LING_PREDICT record");
    check(cudaMemsetAsync(act_rec_, 0xff, n * 4, stream_), "LING_PREDICT record");
    recording_ = true;
    try {
      enqueue_step(stream_, pos_ < opt_.mla_short);
    } catch (...) {
      recording_ = false;
      throw;
    }
    recording_ = false;
    ++pos_;
    std::vector<int> pred(n), act(n);
    check(cudaMemcpyAsync(pred.data(), pred_rec_, n * 4, cudaMemcpyDeviceToHost, stream_), "LING_PREDICT record");
    check(cudaMemcpyAsync(act.data(), act_rec_, n * 4, cudaMemcpyDeviceToHost, stream_), "LING_PREDICT record");
    synchronize();
    PredictStats s;
    int const k = int(c_.num_experts_per_tok);
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      if (!layers_[i].f.pred.rows) continue;
      int const* p = pred.data() + i * ops::kMaxTopK;
      int const* r = act.data() + i * ops::kMaxTopK;
      for (int j = 0; j < k; ++j) {
        ++s.picks;
        s.hits += r[j] >= 0 && std::find(p, p + k, r[j]) != p + k;
      }
    }
    return s;
  }

  // Switches the LM head (recaptures the graph on the next step).
  void set_lm_head_fp8(bool fp8) {
    if (fp8 == opt_.lm_head_fp8) return;
    opt_.lm_head_fp8 = fp8;
    drop_graph();
  }
  bool lm_head_fp8() const { return opt_.lm_head_fp8; }
  // Logits of the last step's final hidden state through the other head (outside the graph): FP8 vs BF16 checks.
  void other_head_logits(float* host) {
    ModelMatrix const& h = opt_.lm_head_fp8 ? head_src_ : head_fp8_;
    ops::ArgmaxArgs aa{head_key_, head_counter_, scratch_token_, nullptr};
    ops::head(stream_, x_, norm_pa(final_norm_), h, logits_alt_, aa);
    check(cudaMemcpyAsync(host, logits_alt_, std::size_t(c_.vocab_size) * 4, cudaMemcpyDeviceToHost, stream_), "logits download");
    synchronize();
  }

  // Bench contexts: caches filled with random contents as if `context` tokens had been seen (KDA states N(0, 0.05²),
  // conv rings N(0,1), MLA latent rows N(0,1) in bf16), position set to `context`.
  void fill_random_context(std::int64_t context, std::uint64_t seed) {
    require(context >= 0 && context < max_ctx_, ErrorCode::kOutOfRange, "random context " + std::to_string(context) +
                                                                           " does not fit the maximum context " + std::to_string(max_ctx_));
    reset();
    int li = 0;
    for (auto& l : layers_) {
      std::uint64_t s = dev::mix64(seed + 0x1000 * std::uint64_t(++li));
      if (l.mla) {
        if (context > 0) rnd::fill_bf16_values(l.m.cache, context * mla_dims_.latent(), s, 1.0f, stream_);
      } else {
        std::int64_t const P = c_.kda_width();
        rnd::fill_vector(l.k.state, c_.num_attention_heads * c_.head_dim * c_.head_dim, s, 0.f, 0.05f, false, stream_);
        rnd::fill_vector(l.k.ring, c_.short_conv_kernel_size * 3 * P, s + 1, 0.f, 1.f, false, stream_);
      }
    }
    std::int32_t p = std::int32_t(context);
    check(cudaMemcpyAsync(pos_dev_, &p, 4, cudaMemcpyHostToDevice, stream_), "position");
    synchronize();
    pos_ = context;
  }

  // What one step reads and writes (spec §4), from the device weights as built.
  StepBytes step_bytes() const {
    StepBytes b;
    auto m = [](ModelMatrix const& x) { return double(x.bytes()); };
    std::int64_t const D = c_.hidden_size;
    b.weights += double(D) * (embed_.format == MatFormat::kF32 ? 4 : embed_.format == MatFormat::kBf16 ? 2 : 1);  // one row
    b.weights += m(opt_.lm_head_fp8 ? head_fp8_ : head_src_) + 4.0 * D;
    for (auto const& l : layers_) {
      b.weights += 8.0 * D;  // two norms
      if (l.mla) {
        b.weights += m(l.m.q) + m(l.m.q_a) + m(l.m.q_b) + m(l.m.kv_a) + m(l.m.g) + m(l.m.kv_b) + m(l.m.dense) +
                     4.0 * (c_.kv_lora_rank + (c_.q_lora_rank ? *c_.q_lora_rank : 0));
        b.cache_per_token += 2.0 * mla_dims_.latent();
      } else {
        std::int64_t const P = c_.kda_width(), H = c_.num_attention_heads, K = c_.head_dim, kc = c_.short_conv_kernel_size;
        b.weights += m(l.k.q) + m(l.k.k) + m(l.k.v) + m(l.k.f) + m(l.k.g) + m(l.k.b) + m(l.k.o) +
                     4.0 * (3 * P * kc + H + P + K);
        b.state += 2.0 * 4 * H * K * K + 4.0 * 3 * P * kc;
      }
      auto const& f = l.f;
      b.weights += m(f.sg) + m(f.su) + m(f.sd);
      if (f.moe) b.weights += m(f.router) + 4.0 * c_.num_experts + double(c_.num_experts_per_tok) * f.expert_bytes;
      if (f.pred.rows) b.weights += m(f.pred);  // LING_PREDICT: read by the projections launch
    }
    return b;
  }
  double weight_bytes_resident() const { return double(weight_bytes_); }

 private:
  std::int32_t read_int(std::int32_t const* dev, char const* what) {
    std::int32_t v = 0;
    check(cudaMemcpyAsync(&v, dev, 4, cudaMemcpyDeviceToHost, stream_), what);
    synchronize();
    return v;
  }
  struct KdaL {
    ModelMatrix q, k, v, f, g, b, o;
    float *conv_w = nullptr, *a_log = nullptr, *dt_bias = nullptr, *o_norm = nullptr, *state = nullptr, *ring = nullptr;
    float* state_kept = nullptr;  // step_tokens: the state after the pass's first token (rewind)
  };
  struct MlaL {
    ModelMatrix q, q_a, q_b, kv_a, g, kv_b, dense;
    float *q_a_norm = nullptr, *kv_norm = nullptr;
    std::uint16_t* cache = nullptr;
  };
  struct FfnL {
    bool moe = false;
    ModelMatrix router;
    float* bias = nullptr;
    MatFormat routed = MatFormat::kMxfp4;
    void *g_w = nullptr, *g_s = nullptr, *u_w = nullptr, *u_s = nullptr, *d_w = nullptr, *d_s = nullptr;
    std::int64_t gu_sw = 0, gu_ss = 0, d_sw = 0, d_ss = 0;
    double expert_bytes = 0;  // gate + up + down of one expert
    ModelMatrix sg, su, sd;   // shared expert or dense MLP
    float limit = 0, shared_limit = 0;
    ModelMatrix pred;  // LING_PREDICT: the router folded onto the attention input (route_predict.cuh), or empty
  };
  struct Layer {
    bool mla = false;
    float *in_norm = nullptr, *post_norm = nullptr;
    KdaL k;
    MlaL m;
    FfnL f;
  };

  // Two passes over the same build code: the first sizes the arena, the second fills it.
  struct Arena {
    bool dry = true;
    std::size_t used = 0;
    DeviceBuffer buf;
    void* take(std::size_t bytes) {
      std::size_t off = (used + 255) / 256 * 256;
      used = off + bytes;
      return dry ? nullptr : static_cast<char*>(buf.data()) + off;
    }
    std::size_t bytes() const { return buf.bytes(); }
  };

  CudaModel(ModelConfig const& c, CudaModelOptions o) : c_(c), opt_(o) {
    require(c.family == Family::kLing, ErrorCode::kUnsupported,
            c.source + ": the CUDA model runs Ling (bailing_hybrid) checkpoints; Kimi-Linear names are not mapped yet");
    require(c.no_kda_lora, ErrorCode::kUnsupported, c.source + ": the CUDA model needs full-rank KDA f/g projections (no_kda_lora)");
    opt_.mla_short = env_int("LING_MLA_SHORT", opt_.mla_short);
    opt_.mla_short_cluster = env_int("LING_MLA_SHORT_CLUSTER", opt_.mla_short_cluster ? 1 : 0) != 0;
    require(opt_.mla_short >= 0 && opt_.mla_short <= kMlaShortMaxLen, ErrorCode::kInvalidArgument,
            "CudaModelOptions::mla_short (or LING_MLA_SHORT) is " + std::to_string(opt_.mla_short) +
                ": the short-context MLA kernel takes positions below at most " + std::to_string(kMlaShortMaxLen));
    predict_ = predict_env();
    require(!predict_ || kda_fast_fits(int(c.head_dim), int(c.short_conv_kernel_size)), ErrorCode::kUnsupported,
            "LING_PREDICT: the prediction runs in the KDA step's fast kernel (head_dim a multiple of 4 up to " +
                std::to_string(kKdaFastMaxK) + ", conv kernel up to 4); " + c.source + " has head_dim " +
                std::to_string(c.head_dim) + ", conv kernel " + std::to_string(c.short_conv_kernel_size));
    max_ctx_ = o.max_context > 0 ? o.max_context : 4096;
    if (c.max_position_embeddings > 0) max_ctx_ = std::min(max_ctx_, c.max_position_embeddings);
    mla_dims_ = MlaDims{int(c.mla_num_heads), int(c.qk_nope_head_dim), int(c.qk_rope_head_dim), int(c.v_head_dim), int(c.kv_lora_rank),
                        c.mla_use_rope, c.rope_theta, float(c.rms_norm_eps)};
    mla_can_implement(mla_dims_).throw_if_error();
    require(c.num_experts_per_tok <= ops::kMaxTopK, ErrorCode::kUnsupported,
            c.source + ": num_experts_per_tok " + std::to_string(c.num_experts_per_tok) + " > " + std::to_string(ops::kMaxTopK));
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
    check(cudaMallocHost(&host_token_, 4 * kMaxTokens), "pinned token");
    int dev = 0;
    check(cudaGetDevice(&dev), "device");
    check(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev), "SM count");
  }

  // ---- weights --------------------------------------------------------------------------------------
  static MatFormat to_mat(io::StorageFormat f, std::string const& name) {
    switch (f) {
      case io::StorageFormat::kBf16: return MatFormat::kBf16;
      case io::StorageFormat::kF32: return MatFormat::kF32;
      case io::StorageFormat::kFp8Block: return MatFormat::kFp8Block;
      case io::StorageFormat::kMxfp4: return MatFormat::kMxfp4;
      case io::StorageFormat::kF16: break;
    }
    fail(ErrorCode::kUnsupported, name + ": F16 matrices are not supported by the CUDA model");
  }
  static MatFormat random_format(WeightKind k) {
    switch (k) {
      case WeightKind::kEmbedding:
      case WeightKind::kHead:
      case WeightKind::kRouter: return MatFormat::kBf16;
      case WeightKind::kDense: return MatFormat::kFp8Block;
      case WeightKind::kExpert: return MatFormat::kMxfp4;
    }
    return MatFormat::kBf16;
  }
  io::WeightRef const& ref(std::string const& name, std::int64_t rows, std::int64_t cols) const {
    io::WeightRef const& r = ckpt_->get(name);
    require(r.rows == rows && r.cols == cols, ErrorCode::kShape,
            name + ": is [" + std::to_string(r.rows) + ", " + std::to_string(r.cols) + "], the CUDA model expects [" +
                std::to_string(rows) + ", " + std::to_string(cols) + "]");
    return r;
  }

  ModelMatrix mat(std::string const& name, std::int64_t rows, std::int64_t cols, WeightKind kind) {
    MatFormat f = ckpt_ ? to_mat(ref(name, rows, cols).format, name) : random_format(kind);
    ModelMatrix m{f, nullptr, nullptr, rows, cols};
    std::size_t sb = std::size_t(matrix_storage_bytes(f, rows, cols)), cb = std::size_t(matrix_scale_bytes(f, rows, cols));
    m.data = arena_.take(sb);
    if (cb) m.scales = arena_.take(cb);
    weight_bytes_ += (arena_.dry ? 0 : sb + cb);
    if (arena_.dry) return m;
    if (ckpt_) {
      io::WeightRef const& r = ref(name, rows, cols);
      check(cudaMemcpy(const_cast<void*>(m.data), r.data, sb, cudaMemcpyHostToDevice), "upload " + name);
      if (cb) check(cudaMemcpy(const_cast<void*>(m.scales), r.scales, cb, cudaMemcpyHostToDevice), "upload " + name);
    } else {
      float sigma = kind == WeightKind::kEmbedding ? 0.02f : 1.0f / std::sqrt(float(cols));
      rnd::fill_matrix(m, rnd::name_seed(seed_, name), sigma);
    }
    return m;
  }
  // E experts' matrices stacked: one allocation for the data, one for the scales.
  void stack(std::vector<std::string> const& names, std::int64_t rows, std::int64_t cols, MatFormat& fmt, void*& w, void*& s,
             std::int64_t& sw, std::int64_t& ss) {
    fmt = ckpt_ ? to_mat(ref(names[0], rows, cols).format, names[0]) : random_format(WeightKind::kExpert);
    sw = matrix_storage_bytes(fmt, rows, cols);
    ss = matrix_scale_bytes(fmt, rows, cols);
    std::size_t const E = names.size();
    w = arena_.take(std::size_t(sw) * E);
    s = ss ? arena_.take(std::size_t(ss) * E) : nullptr;
    if (arena_.dry) return;
    weight_bytes_ += std::size_t(sw + ss) * E;
    for (std::size_t e = 0; e < E; ++e) {
      char* wd = static_cast<char*>(w) + e * sw;
      char* sd = s ? static_cast<char*>(s) + e * ss : nullptr;
      if (ckpt_) {
        io::WeightRef const& r = ref(names[e], rows, cols);
        require(to_mat(r.format, names[e]) == fmt, ErrorCode::kShape, names[e] + ": experts of a layer must share one format");
        check(cudaMemcpy(wd, r.data, std::size_t(sw), cudaMemcpyHostToDevice), "upload " + names[e]);
        if (ss) check(cudaMemcpy(sd, r.scales, std::size_t(ss), cudaMemcpyHostToDevice), "upload " + names[e]);
      } else {
        rnd::fill_matrix(ModelMatrix{fmt, wd, sd, rows, cols}, rnd::name_seed(seed_, names[e]), 1.0f / std::sqrt(float(cols)));
      }
    }
  }
  enum class VecInit { kNorm, kConv, kALog, kDtBias, kBias };
  float* vec(std::string const& name, std::int64_t n, VecInit init) {
    float* p = static_cast<float*>(arena_.take(std::size_t(n) * 4));
    if (arena_.dry) return p;
    weight_bytes_ += std::size_t(n) * 4;
    if (ckpt_) {
      io::WeightRef const& r = ckpt_->get(name);
      std::int64_t numel = 1;
      for (auto d : r.shape) numel *= d;
      require(numel == n, ErrorCode::kShape, name + ": has " + std::to_string(numel) + " values, expected " + std::to_string(n));
      std::vector<float> h(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) {
        switch (r.format) {
          case io::StorageFormat::kBf16: h[std::size_t(i)] = to_float(static_cast<Bfloat16 const*>(r.data)[i]); break;
          case io::StorageFormat::kF16: h[std::size_t(i)] = to_float(static_cast<Half const*>(r.data)[i]); break;
          case io::StorageFormat::kF32: h[std::size_t(i)] = static_cast<float const*>(r.data)[i]; break;
          default: fail(ErrorCode::kShape, name + ": a vector must be stored plain (bf16/f16/f32)");
        }
      }
      check(cudaMemcpy(p, h.data(), std::size_t(n) * 4, cudaMemcpyHostToDevice), "upload " + name);
    } else {
      std::uint64_t s = rnd::name_seed(seed_, name);
      switch (init) {
        case VecInit::kNorm: rnd::fill_vector(p, n, s, 1.0f, 0.1f); break;
        case VecInit::kConv: rnd::fill_vector(p, n, s, 0.0f, 0.4f); break;
        case VecInit::kALog: rnd::fill_vector(p, n, s, 0.f, 0.f, true); break;
        case VecInit::kDtBias: rnd::fill_vector(p, n, s, 0.0f, 0.5f); break;
        case VecInit::kBias: rnd::fill_vector(p, n, s, 0.0f, 0.01f); break;
      }
    }
    return p;
  }
  // q/k/v conv weights [P,1,kc] each -> one fp32 [3P, kc]
  float* conv3(std::string const& a, std::int64_t P, std::int64_t kc) {
    float* p = static_cast<float*>(arena_.take(std::size_t(3 * P * kc) * 4));
    if (arena_.dry) return p;
    if (!ckpt_) {
      rnd::fill_vector(p, 3 * P * kc, rnd::name_seed(seed_, a + "conv"), 0.f, 0.4f);
      weight_bytes_ += std::size_t(3 * P * kc) * 4;
      return p;
    }
    char const* names[3] = {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"};
    for (int n = 0; n < 3; ++n) {
      io::WeightRef const& r = ckpt_->get(a + names[n]);
      require(r.rows == P && r.cols == kc, ErrorCode::kShape, a + names[n] + ": unexpected shape");
      std::vector<float> h(static_cast<std::size_t>(P * kc));
      for (std::int64_t i = 0; i < P * kc; ++i) {
        switch (r.format) {
          case io::StorageFormat::kBf16: h[std::size_t(i)] = to_float(static_cast<Bfloat16 const*>(r.data)[i]); break;
          case io::StorageFormat::kF16: h[std::size_t(i)] = to_float(static_cast<Half const*>(r.data)[i]); break;
          case io::StorageFormat::kF32: h[std::size_t(i)] = static_cast<float const*>(r.data)[i]; break;
          default: fail(ErrorCode::kShape, a + names[n] + ": conv weights must be stored plain");
        }
      }
      check(cudaMemcpy(p + n * P * kc, h.data(), h.size() * 4, cudaMemcpyHostToDevice), "upload conv");
    }
    weight_bytes_ += std::size_t(3 * P * kc) * 4;
    return p;
  }

  template <class T>
  T* scratch(std::int64_t n) { return static_cast<T*>(arena_.take(std::size_t(std::max<std::int64_t>(n, 1)) * sizeof(T))); }

  // Layer i's weights (model.layers.i.*): its attention (MLA or KDA) and its MLP or MoE; act_max grows to its MoE
  // activations' width.
  void build_layer(Layer& l, std::int64_t i, bool mla, std::int64_t& act_max) {
    ModelConfig const& c = c_;
    std::int64_t const D = c.hidden_size, H = c.num_attention_heads, K = c.head_dim, P = c.kda_width();
    std::int64_t const kc = c.short_conv_kernel_size, Hm = c.mla_num_heads, L = mla_dims_.latent();
    std::string const p = "model.layers." + std::to_string(i) + ".";
    std::string const a = p + "attention.";
    l.in_norm = vec(p + "input_layernorm.weight", D, VecInit::kNorm);
    l.post_norm = vec(p + "post_attention_layernorm.weight", D, VecInit::kNorm);
    l.mla = mla;
    if (l.mla) {
      if (c.q_lora_rank) {
        l.m.q_a = mat(a + "q_a_proj.weight", *c.q_lora_rank, D, WeightKind::kDense);
        l.m.q_a_norm = vec(a + "q_a_layernorm.weight", *c.q_lora_rank, VecInit::kNorm);
        l.m.q_b = mat(a + "q_b_proj.weight", Hm * c.qk_head_dim(), *c.q_lora_rank, WeightKind::kDense);
      } else {
        l.m.q = mat(a + "q_proj.weight", Hm * c.qk_head_dim(), D, WeightKind::kDense);
      }
      l.m.kv_a = mat(a + "kv_a_proj_with_mqa.weight", L, D, WeightKind::kDense);
      l.m.kv_norm = vec(a + "kv_a_layernorm.weight", c.kv_lora_rank, VecInit::kNorm);
      l.m.kv_b = mat(a + "kv_b_proj.weight", Hm * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank, WeightKind::kDense);
      if (c.output_gate == OutputGate::kHeadWise) l.m.g = mat(a + "g_proj.weight", Hm, D, WeightKind::kDense);
      if (c.output_gate == OutputGate::kElementWise) l.m.g = mat(a + "g_proj.weight", Hm * c.v_head_dim, D, WeightKind::kDense);
      l.m.dense = mat(a + "dense.weight", D, Hm * c.v_head_dim, WeightKind::kDense);
    } else {
      l.k.q = mat(a + "q_proj.weight", P, D, WeightKind::kDense);
      l.k.k = mat(a + "k_proj.weight", P, D, WeightKind::kDense);
      l.k.v = mat(a + "v_proj.weight", P, D, WeightKind::kDense);
      l.k.f = mat(a + "f_proj.weight", P, D, WeightKind::kDense);
      l.k.g = mat(a + "g_proj.weight", P, D, WeightKind::kDense);
      l.k.b = mat(a + "b_proj.weight", H, D, WeightKind::kDense);
      l.k.conv_w = conv3(a, P, kc);
      l.k.a_log = vec(a + "A_log", H, VecInit::kALog);
      l.k.dt_bias = vec(a + "dt_bias", P, VecInit::kDtBias);
      l.k.o_norm = vec(a + "o_norm.weight", K, VecInit::kNorm);
      l.k.o = mat(a + "o_proj.weight", D, P, WeightKind::kDense);
    }
    std::string const m = p + "mlp.";
    FfnL& f = l.f;
    f.moe = c.is_moe_layer(i);
    f.limit = float(c.expert_limit(i));
    f.shared_limit = float(c.shared_limit(i));
    if (f.moe) {
      std::int64_t const E = c.num_experts, I = c.moe_intermediate_size;
      f.router = mat(m + "gate.weight", E, D, WeightKind::kRouter);
      f.bias = vec(m + "gate.expert_bias", E, VecInit::kBias);
      std::vector<std::string> gn, un, dn;
      for (std::int64_t e = 0; e < E; ++e) {
        std::string x = m + "experts." + std::to_string(e) + ".";
        gn.push_back(x + "gate_proj.weight");
        un.push_back(x + "up_proj.weight");
        dn.push_back(x + "down_proj.weight");
      }
      MatFormat fu, fd;
      stack(gn, I, D, f.routed, f.g_w, f.g_s, f.gu_sw, f.gu_ss);
      stack(un, I, D, fu, f.u_w, f.u_s, f.gu_sw, f.gu_ss);
      stack(dn, D, I, fd, f.d_w, f.d_s, f.d_sw, f.d_ss);
      require(fu == f.routed && fd == f.routed, ErrorCode::kShape, m + "experts: gate/up/down must share one format");
      f.expert_bytes = double(2 * (f.gu_sw + f.gu_ss) + f.d_sw + f.d_ss);
      if (c.shared_width() > 0) {
        std::int64_t const Is = c.shared_width();
        f.sg = mat(m + "shared_experts.gate_proj.weight", Is, D, WeightKind::kDense);
        f.su = mat(m + "shared_experts.up_proj.weight", Is, D, WeightKind::kDense);
        f.sd = mat(m + "shared_experts.down_proj.weight", D, Is, WeightKind::kDense);
        require(f.sg.format == f.su.format && f.sg.format == f.sd.format, ErrorCode::kShape, m + "shared_experts: formats differ");
      }
      act_max = std::max(act_max, c.num_experts_per_tok * I + c.shared_width());
      if (predict_ && !l.mla) {  // LING_PREDICT: the predictor rows, in the projections' format
        MatFormat const pf = l.k.q.format;
        require(route_predictor_format(pf), ErrorCode::kUnsupported,
                "LING_PREDICT: " + a + "q_proj.weight is stored as " + std::string(to_string(pf)) +
                    "; the predictor rows join the projections' launch only as block FP8, BF16 or F32");
        std::size_t const sb = std::size_t(matrix_storage_bytes(pf, E, D)),
                          cb = std::size_t(matrix_scale_bytes(pf, E, D));
        f.pred = ModelMatrix{pf, arena_.take(sb), cb ? arena_.take(cb) : nullptr, E, D};
        weight_bytes_ += arena_.dry ? 0 : sb + cb;
      }
    } else {
      std::int64_t const I = c.intermediate_size;
      f.sg = mat(m + "gate_proj.weight", I, D, WeightKind::kDense);
      f.su = mat(m + "up_proj.weight", I, D, WeightKind::kDense);
      f.sd = mat(m + "down_proj.weight", D, I, WeightKind::kDense);
      require(f.sg.format == f.su.format && f.sg.format == f.sd.format, ErrorCode::kShape, m + ": formats differ");
      act_max = std::max(act_max, I);
    }
  }

  void build_pass() {
    weight_bytes_ = 0;
    ModelConfig const& c = c_;
    std::int64_t const D = c.hidden_size, V = c.vocab_size, H = c.num_attention_heads, K = c.head_dim, P = c.kda_width();
    std::int64_t const kc = c.short_conv_kernel_size, Hm = c.mla_num_heads, L = mla_dims_.latent();
    embed_ = mat("model.word_embeddings.weight", V, D, WeightKind::kEmbedding);
    final_norm_ = vec("model.norm.weight", D, VecInit::kNorm);
    bool const tied = ckpt_ && c.tie_word_embeddings && !ckpt_->find("lm_head.weight");
    head_src_ = tied ? embed_ : mat("lm_head.weight", V, D, WeightKind::kHead);
    head_fp8_ = ModelMatrix{MatFormat::kFp8Row, arena_.take(std::size_t(V * D)), arena_.take(std::size_t(V) * 4), V, D};
    layers_.assign(std::size_t(c.num_hidden_layers), Layer{});
    std::int64_t act_max = 1;
    for (std::int64_t i = 0; i < c.num_hidden_layers; ++i)
      build_layer(layers_[std::size_t(i)], i, c.is_mla_layer(i), act_max);
    // the MTP layer: model.layers.<num_hidden_layers>.* (spec §2, §3), an MLA layer with a MoE
    std::string const mp = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
    has_mtp_ = c.num_nextn_predict_layers > 0 && (!ckpt_ || ckpt_->find(mp + "eh_proj.weight"));
    if (has_mtp_) {
      mtp_ = Layer{};
      build_layer(mtp_, c.num_hidden_layers, true, act_max);
      mtp_enorm_ = vec(mp + "enorm.weight", D, VecInit::kNorm);
      mtp_hnorm_ = vec(mp + "hnorm.weight", D, VecInit::kNorm);
      mtp_final_ = vec(mp + "final_layernorm.weight", D, VecInit::kNorm);
      mtp_eh_ = mat(mp + "eh_proj.weight", D, 2 * D, WeightKind::kDense);
    }
    // activations and scratch: up to kMaxTokens tokens (step_tokens), token k's at k times the one-token size
    constexpr std::int64_t T = kMaxTokens;
    x_ = scratch<float>(T * D);
    xq_ = scratch<float>(T * P), xk_ = scratch<float>(T * P), xv_ = scratch<float>(T * P), xf_ = scratch<float>(T * P);
    xg_ = scratch<float>(T * P), xb_ = scratch<float>(T * H), o_ = scratch<float>(T * P);
    o_ss_ = scratch<float>(T * H * kda_ss_parts(int(c.head_dim)));
    mq_ = scratch<float>(T * Hm * c.qk_head_dim());
    mqa_ = scratch<float>(T * (c.q_lora_rank ? *c.q_lora_rank : 1));
    mkv_ = scratch<float>(T * L);
    mgate_ = scratch<float>(T * Hm * c.v_head_dim);
    splits_ = std::max(1, sms_);
    q_hat_ = scratch<float>(Hm * L);
    part_o_ = scratch<float>(std::int64_t(splits_) * Hm * c.kv_lora_rank);
    part_ml_ = scratch<float>(std::int64_t(splits_) * Hm * 2);
    o_lat_ = scratch<float>(Hm * c.kv_lora_rank);
    if (Hm > 0 && mla_dims_.use_rope) mla_rope_cs_ = scratch<float>(std::int64_t(kMlaShortMaxLen) * mla_dims_.rope);
    mo_ = scratch<float>(T * Hm * c.v_head_dim);
    router_logits_ = scratch<float>(std::max<std::int64_t>(c.num_experts, 1));
    if (predict_) {
      pred_logits_ = scratch<float>(std::max<std::int64_t>(c.num_experts, 1));
      pred_rec_ = scratch<int>(std::int64_t(layers_.size()) * ops::kMaxTopK);
      act_rec_ = scratch<int>(std::int64_t(layers_.size()) * ops::kMaxTopK);
    }
    sel_idx_ = scratch<int>(ops::kMaxTopK);
    sel_w_ = scratch<float>(ops::kMaxTopK);
    act_ = scratch<float>(act_max);
    logits_ = scratch<float>(T * V);
    logits_alt_ = scratch<float>(V);
    if (has_mtp_) {
      mtp_h_ = scratch<float>(D), mtp_hn_ = scratch<float>(D), mtp_e_ = scratch<float>(D), mtp_x_ = scratch<float>(D);
      mtp_in_ = scratch<float>(2 * D);
      mtp_logits_ = scratch<float>(V);
      mtp_token_dev_ = scratch<std::int32_t>(1), mtp_draft_dev_ = scratch<std::int32_t>(1);
      mtp_next_dev_ = scratch<std::int32_t>(max_ctx_);
    }
    // caches and counters: one contiguous region, zeroed by reset()
    std::size_t cache_start = (arena_.used + 255) / 256 * 256;
    cache_base_ = arena_.take(0);
    if (has_mtp_) {
      mtp_.m.cache = scratch<std::uint16_t>(max_ctx_ * L);
      mtp_pos_dev_ = scratch<std::int32_t>(1);
    }
    for (auto& l : layers_) {
      if (l.mla) l.m.cache = scratch<std::uint16_t>(max_ctx_ * L);
      else {
        l.k.state = scratch<float>(H * K * K);
        l.k.ring = scratch<float>(kc * 3 * P);
        l.k.state_kept = scratch<float>(H * K * K);
      }
    }
    head_key_ = scratch<unsigned long long>(1);
    router_counter_ = scratch<unsigned>(1);
    grid_bar_ = scratch<unsigned long long>(1);
    head_counter_ = scratch<unsigned>(1);
    tail_counter_ = scratch<unsigned>(1);
    if (trace_enabled()) trace_ = scratch<unsigned long long>(std::int64_t(layers_.size()) * kTraceSlots * ops::kTraceRegion);
    token_dev_ = scratch<std::int32_t>(kMaxTokens);
    scratch_token_ = scratch<std::int32_t>(1);
    pos_dev_ = scratch<std::int32_t>(kMaxTokens);  // [0]: the step's position; [k]: token k's (step_tokens)
    cache_bytes_ = arena_.used - cache_start;
  }

  void build() {
    arena_.dry = true;
    arena_.used = 0;
    build_pass();
    arena_.buf = DeviceBuffer(arena_.used + 256, "CUDA model weights and caches");
    arena_.dry = false;
    arena_.used = 0;
    build_pass();
    rnd::quantize_fp8_rows(head_src_, static_cast<E4m3*>(const_cast<void*>(head_fp8_.data)),
                           static_cast<float*>(const_cast<void*>(head_fp8_.scales)));
    weight_bytes_ += std::size_t(head_fp8_.bytes());
    for (Layer const& l : layers_)
      if (l.f.pred.rows) build_route_predictor(l.f.router, l.post_norm, l.in_norm, l.f.pred);
    setup_ahead();
    if (mla_rope_cs_) mla_rope_table(mla_rope_cs_, mla_dims_, stream_);
    // the projections' dynamic tail (ops::MatvecTail; session 48: 20% measured 0.011-0.022 ms/token faster on H100s)
    tail_ = {tail_counter_, env_int_in("LING_MATVEC_TAIL", 20, 0, 90)};
    check(cudaDeviceSynchronize(), "building the CUDA model");
    // One eager step from a zero state: sets the kernels' shared-memory attributes outside any capture and surfaces
    // launch errors early; then back to a fresh stream.
    reset();
    enqueue_step(stream_, false);
    synchronize();
    if (opt_.mla_short > 0) {  // the short-context step's own kernels too (CudaModelOptions::mla_short)
      reset();
      enqueue_step(stream_, true);
      synchronize();
    }
    if (!predict_ && !ahead_buf_.data()) {  // and step_tokens' (the matvecs' two-token instances)
      reset();
      enqueue_step(stream_, opt_.mla_short > 1, kMaxTokens, opt_.mla_short > 1);
      synchronize();
    }
    if (has_mtp_) {  // and the MTP layer's (eh_proj's matvec, the norms), on token 0 and a zero hidden row
      reset();
      check(cudaMemsetAsync(mtp_token_dev_, 0, 4, stream_), "MTP warm-up");
      check(cudaMemsetAsync(mtp_h_, 0, std::size_t(c_.hidden_size) * 4, stream_), "MTP warm-up");
      enqueue_mtp(stream_, opt_.mla_short > 0);
      synchronize();
    }
    reset();
  }

  // LING_PREDICT: unset or 0 off, 1 or 2 (CudaModel::predicting); anything else is refused, naming the variable.
  static int predict_env() {
    char const* e = std::getenv("LING_PREDICT");
    if (!e || !*e || std::strcmp(e, "0") == 0) return 0;
    require(std::strcmp(e, "1") == 0 || std::strcmp(e, "2") == 0, ErrorCode::kInvalidArgument,
            std::string("LING_PREDICT is '") + e +
                "': 0 (off), 1 (the predicted experts' gate and up rows) or 2 (also down)");
    return *e - '0';
  }

  // ---- the L2 look-ahead probe (measurements only) -----------------------------------------------------
  // LING_FORCE_EXPERTS=1 (random weights only): every MoE layer's selection bias (expert_bias) is +1000 on top_k fixed
  // experts, half in group i mod n_group and half in the group n_group / 2 further, so the selection picks exactly
  // those at every step (the weights still come from the unbiased scores). It makes the routing known ahead, for
  // LING_AHEAD's `experts` and `edown` below; it changes the model's outputs.
  // LING_AHEAD=part,... (or part+part: scripts/device-ab.sh splits its variants' settings at commas): the KDA step's
  // look-ahead blocks (KdaStepArgs::ahead) request the same layer's MoE weights into L2 while the DRAM is idle behind
  // the step's latency chain: `router` (the router rows), `shared` (the shared expert's gate and up), `sdown` (its
  // down), `experts` (the forced experts' gate and up; needs LING_FORCE_EXPERTS), `edown` (their down).
  // LING_AHEAD_EARLY=1: the blocks request them without waiting for the projections. Outputs are unchanged by
  // LING_AHEAD (a prefetch changes no value). The question it answers: how much would launch A and B gain if the
  // routing were known a launch ahead (docs/perf-log.md, session 41's item 5).
  void setup_ahead() {
    auto const parts = [](char const* e) {
      std::vector<std::string> v;
      std::string s = e ? e : "";
      for (std::size_t b = 0; b < s.size();) {
        std::size_t const c = s.find_first_of(",+", b);
        std::string const t = s.substr(b, c == std::string::npos ? std::string::npos : c - b);
        if (!t.empty() && t != "0") v.push_back(t);
        b = c == std::string::npos ? s.size() : c + 1;
      }
      return v;
    };
    std::vector<std::string> const want = parts(std::getenv("LING_AHEAD"));
    bool const force = env_on("LING_FORCE_EXPERTS");
    ahead_early_ = env_on("LING_AHEAD_EARLY");
    ahead_lines_ = env_on("LING_AHEAD_LINES");                       // KdaStepArgs::ahead_lines
    ahead_cols_ = std::clamp(env_int("LING_AHEAD_COLS", 1), 1, 64);  // KdaStepArgs::ahead_cols
    ModelConfig const& c = c_;
    int const top_k = int(c.num_experts_per_tok), groups = int(c.n_group) > 0 ? int(c.n_group) : 1;
    int const gsize = int(c.num_experts / groups), half = (top_k + 1) / 2;
    std::vector<std::vector<int>> forced(layers_.size());  // each MoE layer's forced experts
    if (force) {
      require(ckpt_ == nullptr, ErrorCode::kInvalidArgument,
              "LING_FORCE_EXPERTS: for random weights only (it rewrites expert_bias)");
      require(groups >= 2 && c.topk_group >= 2 && half <= gsize && top_k <= 2 * gsize, ErrorCode::kInvalidArgument,
              "LING_FORCE_EXPERTS: needs n_group >= 2, topk_group >= 2 and num_experts_per_tok <= 2 x the group size");
      float const big = 1000.f;
      for (std::size_t i = 0; i < layers_.size(); ++i) {
        if (!layers_[i].f.moe) continue;
        int const g1 = int(i) % groups, g2 = (g1 + groups / 2) % groups;
        for (int k = 0; k < top_k; ++k) {
          int const g = k < half ? g1 : g2, j = k < half ? k : k - half;
          int const e = g * gsize + (int(i) * 5 + j) % gsize;
          forced[i].push_back(e);
          check(cudaMemcpy(layers_[i].f.bias + e, &big, 4, cudaMemcpyHostToDevice), "LING_FORCE_EXPERTS");
        }
      }
    }
    ahead_off_.assign(layers_.size(), 0);
    ahead_n_.assign(layers_.size(), 0);
    if (want.empty()) return;
    for (auto const& w : want)
      require(w == "router" || w == "shared" || w == "sdown" || w == "experts" || w == "edown",
              ErrorCode::kInvalidArgument,
              "LING_AHEAD: unknown part '" + w + "' (router, shared, sdown, experts, edown)");
    auto has = [&](char const* n) { return std::find(want.begin(), want.end(), std::string(n)) != want.end(); };
    require(!(has("experts") || has("edown")) || force, ErrorCode::kInvalidArgument,
            "LING_AHEAD: experts and edown prefetch the forced experts: they need LING_FORCE_EXPERTS=1");
    std::vector<AheadRange> all;
    auto add = [&](void const* p, std::int64_t bytes) {
      if (p && bytes >= 16) all.push_back(AheadRange{p, std::uint64_t(bytes) / 16 * 16});
    };
    auto add_matrix = [&](ModelMatrix const& m) {
      add(m.data, matrix_storage_bytes(m.format, m.rows, m.cols));
      add(m.scales, matrix_scale_bytes(m.format, m.rows, m.cols));
    };
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      FfnL const& f = layers_[i].f;
      if (layers_[i].mla || !f.moe) continue;  // the look-ahead rides on the KDA step
      ahead_off_[i] = int(all.size());
      if (has("router")) add_matrix(f.router);
      if (has("shared") && f.sg.rows) add_matrix(f.sg), add_matrix(f.su);
      if (has("sdown") && f.sd.rows) add_matrix(f.sd);
      for (int e : forced[i]) {
        if (has("experts")) {
          add(static_cast<char const*>(f.g_w) + std::int64_t(e) * f.gu_sw, f.gu_sw);
          if (f.g_s) add(static_cast<char const*>(f.g_s) + std::int64_t(e) * f.gu_ss, f.gu_ss);
          add(static_cast<char const*>(f.u_w) + std::int64_t(e) * f.gu_sw, f.gu_sw);
          if (f.u_s) add(static_cast<char const*>(f.u_s) + std::int64_t(e) * f.gu_ss, f.gu_ss);
        }
        if (has("edown")) {
          add(static_cast<char const*>(f.d_w) + std::int64_t(e) * f.d_sw, f.d_sw);
          if (f.d_s) add(static_cast<char const*>(f.d_s) + std::int64_t(e) * f.d_ss, f.d_ss);
        }
      }
      ahead_n_[i] = int(all.size()) - ahead_off_[i];
    }
    if (all.empty()) return;
    ahead_buf_ = DeviceBuffer(all.size() * sizeof(AheadRange), "LING_AHEAD ranges");
    ahead_buf_.upload(all.data(), all.size() * sizeof(AheadRange));
  }

  // ---- launches --------------------------------------------------------------------------------------
  ops::PrologueArgs norm_pa(float const* w) const {
    ops::PrologueArgs p{ops::Prologue::kRmsNorm, w, nullptr, 0, float(c_.rms_norm_eps)};
    p.flags = prologue_flags();
    return p;
  }
  static int prologue_flags() {
    static int const f = [] {
      char const* e = std::getenv("LING_PROLOGUE");
      return e && *e ? std::atoi(e) : ops::PrologueArgs::kFusedWeights | ops::PrologueArgs::kPrefetchWeights;
    }();
    return f;
  }

  // LING_KDA_SS=0: o_proj's gated head norm reduces each head itself instead of reading the KDA step's partial sums
  // (the A/B switch of KdaStepArgs::o_ss).
  static bool kda_ss_on() {
    static bool const on = !env_off("LING_KDA_SS");
    return on;
  }

  // LING_KDA_GATE=0: o_proj's prologue applies the gated head norm's element-wise factors itself (kGatedHeadNorm)
  // instead of the KDA step (KdaStepArgs::out_gate, then kHeadScale; needs the partial sums, LING_KDA_SS). A/B switch.
  static bool kda_gate_on() {
    static bool const on = !env_off("LING_KDA_GATE");
    return on;
  }

  // Whether the step being enqueued is the replayed graph, where a launch may read before its PDL wait what the
  // previous step wrote: that step is complete before the graph starts, while an eager step's launches may overlap the
  // previous step's (PDL).
  bool replayed_graph() const { return opt_.use_graph && !recording_; }

  // LING_MLA_EARLY=0: the MLA cluster chain reads the position and the cached rows after its PDL wait even in the
  // replayed graph (A/B; MlaDecodeArgs::early).
  static bool mla_early_env() { return !env_off("LING_MLA_EARLY"); }

  // LING_KDA_EARLY=0: the KDA step loads its state after its PDL wait even in the replayed graph (A/B).
  static bool kda_state_early_env() {
    static bool const on = !env_off("LING_KDA_EARLY");
    return on;
  }

  // LING_SKIP=a,b,...: leave those launches out of the step (in-place cost of each part of the step, for
  // measurements only; the outputs are then meaningless): kproj, kstep, oproj, mla (a gated-MLA layer's attention
  // launches), router, moea (MoE launch A), moeb (launch B), head.
  static bool skipped(char const* what) {
    static std::string const list = [] {
      char const* e = std::getenv("LING_SKIP");
      return "," + std::string(e ? e : "") + ",";
    }();
    return list.find("," + std::string(what) + ",") != std::string::npos;
  }

  // LING_TRACE set (not "0"; `ling bench` writes its table to that path): every layer's launches record a per-block
  // timeline (cuda/linear.cuh "step timeline") into trace_, 7 regions per layer: attention projections (the first
  // launch), KDA step, o_proj / MLA dense, router, MoE A, MoE B, and the MLA attention when it is the one launch
  // (either form of it; the usual chain's launches are not traced).
  static bool trace_enabled() {
    static bool const on = [] {
      char const* e = std::getenv("LING_TRACE");
      return e && *e && *e != '0';
    }();
    return on;
  }
  void trace_at(std::size_t layer, int slot) {
    bool const traced = trace_ && layer < layers_.size();  // the MTP layer is not traced
    ops::trace_next() = traced ? trace_ + (std::int64_t(layer) * kTraceSlots + slot) * ops::kTraceRegion : nullptr;
  }

  // short_mla: the MLA layers' attention chain in one launch (CudaModelOptions::mla_short; only for positions below
  // it: mla_short_kernel's contract), where mla_short_fits (a cluster per head with mla_short_cluster, where that
  // fits too); else the usual launches.
  // tokens (1 or kMaxTokens, step_tokens): token k at position pos_dev_[k]; its activations at k times the one-token
  // size. The matvecs read their weights once for all tokens (MultiArgs::tokens); the KDA steps, the MLA attention and
  // the MoE run once per token, in token order. short_mla: the first token's MLA chain in one launch; short_next: the
  // later tokens'. Two tokens end with their logits [2][vocab] and no argmax; one token as the decode step always did.
  void positions_next(cudaStream_t st, int tokens) {
    positions_next_kernel<0><<<1, 1, 0, st>>>(pos_dev_, tokens);
    check(cudaGetLastError(), "positions");
  }
  void positions_advance(cudaStream_t st, int tokens) {
    positions_advance_kernel<0><<<1, 1, 0, st>>>(pos_dev_, tokens);
    check(cudaGetLastError(), "positions");
  }
  // Layer i of the step (i = layers_.size(): the MTP layer, not traced) on the hidden rows x [tokens][hidden] (its
  // residual stream, updated in place), token k at position pos[k].
  void enqueue_layer(cudaStream_t st, Layer& l, std::size_t i, float* x, std::int32_t* pos, int tokens, bool short_mla,
                     bool short_next) {
    ModelConfig const& c = c_;
    std::int64_t const D = c.hidden_size, P = c.kda_width(), Hk = c.num_attention_heads;
    std::int64_t const ssn = Hk * kda_ss_parts(int(c.head_dim));
    bool const traced = trace_ && i < layers_.size();
    trace_at(i, 0);
    if (!l.mla) {
      // LING_PREDICT: the predictor rows join the projections (ops::matvec leaves out a matrix of 0 rows)
      bool const predict = l.f.pred.rows > 0;
      if (!skipped("kproj")) {
        ops::matvec(st, x, norm_pa(l.in_norm),
                    {{&l.k.q, xq_},
                     {&l.k.k, xk_},
                     {&l.k.v, xv_},
                     {&l.k.f, xf_},
                     {&l.k.g, xg_},
                     {&l.k.b, xb_},
                     {&l.f.pred, pred_logits_}},
                    tail_, tokens);
      }
      for (int t = 0; t < tokens; ++t) {
        std::int64_t const tp = t * P;
        KdaStepArgs ka;
        ka.heads = int(c.num_attention_heads);
        ka.head_dim = int(c.head_dim);
        ka.conv_kernel = int(c.short_conv_kernel_size);
        ka.safe_gate = c.kda_safe_gate;
        ka.lower_bound = float(c.kda_lower_bound);
        ka.x_q = xq_ + tp, ka.x_k = xk_ + tp, ka.x_v = xv_ + tp, ka.f = xf_ + tp, ka.b = xb_ + t * Hk;
        ka.conv_w = l.k.conv_w, ka.a_log = l.k.a_log, ka.dt_bias = l.k.dt_bias;
        ka.ring = l.k.ring, ka.state = l.k.state, ka.o = o_ + tp, ka.position = pos + t;
        if (tokens > 1 && t == 0) ka.state_copy = l.k.state_kept;  // for rewind(1)
        ka.o_ss = kda_ss_on() ? o_ss_ + t * ssn : nullptr;
        bool const gated = ka.o_ss && kda_gate_on();
        if (gated) ka.out_gate = xg_ + tp, ka.out_norm_w = l.k.o_norm;
        // a later token's state and ring are the earlier token's step's outputs: after the wait
        ka.state_before_wait = t == 0 && replayed_graph() && kda_state_early_env();
        ka.trace = traced && t == 0 ? trace_ + (std::int64_t(i) * kTraceSlots + 1) * ops::kTraceRegion : nullptr;
        // the look-ahead column's settings (read only when it runs: LING_AHEAD ranges or LING_PREDICT)
        ka.ahead_before_wait = ahead_early_, ka.ahead_lines = ahead_lines_, ka.ahead_cols = ahead_cols_;
        if (ahead_buf_.data() && ahead_n_[i] > 0) {  // LING_AHEAD (setup_ahead)
          ka.ahead = ahead_buf_.data<AheadRange>() + ahead_off_[i];
          ka.n_ahead = ahead_n_[i];
        }
        if (predict) {
          FfnL const& f = l.f;
          KdaPredict& pr = ka.predict;
          pr.logits = pred_logits_, pr.bias = f.bias;
          pr.experts = int(c.num_experts), pr.top_k = int(c.num_experts_per_tok);
          pr.n_group = int(c.n_group) > 0 ? int(c.n_group) : 1;
          pr.topk_group = int(c.topk_group) > 0 ? int(c.topk_group) : 1;
          pr.g_w = f.g_w, pr.g_s = f.g_s, pr.u_w = f.u_w, pr.u_s = f.u_s, pr.d_w = f.d_w, pr.d_s = f.d_s;
          pr.gu_sw = f.gu_sw, pr.gu_ss = f.gu_ss, pr.d_sw = f.d_sw, pr.d_ss = f.d_ss;
          pr.down = predict_ >= 2;
          pr.record = recording_ ? pred_rec_ + std::int64_t(i) * ops::kMaxTopK : nullptr;
        }
        if (!skipped("kstep")) kda_step(ka, st);
      }
      trace_at(i, 2);
      int const hd = int(c.head_dim);
      float const eps = float(c.rms_norm_eps);
      bool const ss = kda_ss_on(), gated = ss && kda_gate_on();
      ops::PrologueArgs po = gated ? ops::PrologueArgs{ops::Prologue::kHeadScale, nullptr, nullptr, hd, eps}
                                   : ops::PrologueArgs{ops::Prologue::kGatedHeadNorm, l.k.o_norm, xg_, hd, eps};
      po.flags = prologue_flags();
      if (ss) po.head_ss = o_ss_, po.ss_parts = kda_ss_parts(hd);
      if (!skipped("oproj")) ops::matvec(st, o_, po, {{&l.k.o, x, x}}, {}, tokens);
    } else if (!skipped("mla")) {
      if (c.q_lora_rank) {
        ops::matvec(st, x, norm_pa(l.in_norm), {{&l.m.q_a, mqa_}, {&l.m.kv_a, mkv_}, {&l.m.g, mgate_}}, tail_,
                    tokens);
        ops::trace_next() = nullptr;  // region 0 holds the first projection launch only
        ops::matvec(st, mqa_, norm_pa(l.m.q_a_norm), {{&l.m.q_b, mq_}}, tail_, tokens);
      } else {
        ops::matvec(st, x, norm_pa(l.in_norm), {{&l.m.q, mq_}, {&l.m.kv_a, mkv_}, {&l.m.g, mgate_}}, tail_,
                    tokens);
      }
      std::int64_t const qn = c.mla_num_heads * c.qk_head_dim(), vn = c.mla_num_heads * c.v_head_dim;
      for (int t = 0; t < tokens; ++t) {
        MlaDecodeArgs ma;
        ma.d = mla_dims_;
        ma.q = mq_ + t * qn, ma.kv_a = mkv_ + t * mla_dims_.latent(), ma.kv_norm = l.m.kv_norm, ma.kv_b = l.m.kv_b;
        ma.cache = l.m.cache, ma.max_ctx = max_ctx_, ma.position = pos + t;
        ma.q_hat = q_hat_, ma.splits = splits_, ma.part_o = part_o_, ma.part_ml = part_ml_, ma.o_lat = o_lat_;
        ma.kernel = mla_env().kernel, ma.min_chunk = mla_env().min_chunk, ma.diag = mla_env().diag;
        ma.combine = mla_env().combine;
        if ((t == 0 ? short_mla : short_next) && mla_short_fits(ma)) {
          ma.kernel = opt_.mla_short_cluster ? kMlaShortClusterKernel : kMlaShortKernel;
          ma.trace = traced && t == 0 ? trace_ + (std::int64_t(i) * kTraceSlots + 6) * ops::kTraceRegion : nullptr;
          ma.trace_mid = mla_env().trace_mid;
          // a later token attends to the earlier token's cache row: read after the wait
          ma.early = t == 0 && replayed_graph() && mla_early_env();
          ma.rope_cs = mla_rope_cs_;
        }
        int const gate_mode =
            c.output_gate == OutputGate::kHeadWise ? 1 : c.output_gate == OutputGate::kElementWise ? 2 : 0;
        ops::trace_next() = nullptr;
        mla_decode(ma, mgate_ + t * l.m.g.rows, gate_mode, mo_ + t * vn, st);
      }
      trace_at(i, 2);
      ops::matvec(st, mo_, {ops::Prologue::kPlain, nullptr, nullptr, 0, 0.f}, {{&l.m.dense, x, x}}, {}, tokens);
    }
    FfnL& f = l.f;
    ops::MoeArgs a;
    a.hidden = int(c.hidden_size);
    a.act = act_;
    a.sg_w = f.sg.data, a.sg_s = f.sg.scales, a.su_w = f.su.data, a.su_s = f.su.scales, a.sdn_w = f.sd.data, a.sdn_s = f.sd.scales;
    a.shared_inter = int(f.sg.rows);
    a.shared_limit = f.shared_limit;
    ops::RouterArgs ra{};  // outlives ops::moe below, which may read it (fused routing)
    bool router_launch = false, fused = false;  // a router launch before each token's MoE (not inside launch A)
    if (f.moe) {
      ra = ops::RouterArgs{router_logits_, f.bias, int(c.num_experts), int(c.n_group), int(c.topk_group), int(c.num_experts_per_tok),
                           c.norm_topk_prob, float(c.routed_scaling_factor), sel_idx_, sel_w_, router_counter_};
      fused = ops::fused_router_enabled();
      // the router's rows inside launch A (no router launch): BF16 rows of whole chunks
      bool const in_a = fused && opt_.router_in_moe && ops::router_in_a_env() &&
                        f.router.format == MatFormat::kBf16 && ops::fast_rows(f.router);
      if (in_a) {
        a.router = &f.router;
        a.grid_bar = grid_bar_;
      } else {
        router_launch = !skipped("router");
      }
      a.g_w = f.g_w, a.g_s = f.g_s, a.u_w = f.u_w, a.u_s = f.u_s, a.dn_w = f.d_w, a.dn_s = f.d_s;
      a.gu_stride_w = f.gu_sw, a.gu_stride_s = f.gu_ss, a.dn_stride_w = f.d_sw, a.dn_stride_s = f.d_ss;
      a.top_k = int(c.num_experts_per_tok);
      a.experts = int(c.num_experts);
      a.inter = int(c.moe_intermediate_size);
      a.sel_idx = sel_idx_, a.sel_w = sel_w_;
      if (fused) a.route = &ra;
      a.limit = f.limit;
    } else {
      a.shared_limit = 0.f;  // the dense MLP has no clamp
    }
    a.skip_a = skipped("moea"), a.skip_b = skipped("moeb");
    for (int t = 0; t < tokens; ++t) {  // the routing and the MoE of each token in turn (they share sel_idx_, act_)
      float* const xt = x + t * D;
      if (f.moe) {
        if (t == 0) trace_at(i, 3);
        else ops::trace_next() = nullptr;
        // fused routing needs only the logits: with LING_MATVEC_PRELOAD=1 the preloaded matvec computes them
        if (router_launch && fused && ops::matvec_preload_enabled())
          ops::matvec(st, xt, norm_pa(l.post_norm), {{&f.router, router_logits_}});
        else if (router_launch)
          ops::router(st, xt, norm_pa(l.post_norm), f.router, ra, fused);
      }
      if (t == 0) trace_at(i, 4);  // B: region 5
      else ops::trace_next() = nullptr;
      ops::moe(st, xt, norm_pa(l.post_norm), a, f.routed, f.sg.format, xt, xt);
    }
    if (recording_ && f.pred.rows)  // predict_step: the real picks beside the predicted ones
      check(cudaMemcpyAsync(act_rec_ + std::int64_t(i) * ops::kMaxTopK, sel_idx_,
                            std::size_t(c.num_experts_per_tok) * 4, cudaMemcpyDeviceToDevice, st),
            "LING_PREDICT record");
  }

  // One MTP entry (spec §2): x = eh_proj [RMSNorm(emb(next); enorm) ; RMSNorm(model.norm(h); hnorm)], the MTP layer
  // at the MTP position, then the LM head on RMSNorm(x; final_layernorm), whose argmax epilogue writes the draft and
  // advances the MTP position.
  void enqueue_mtp(cudaStream_t st, bool short_mla) {
    std::int64_t const D = c_.hidden_size;
    float const eps = float(c_.rms_norm_eps);
    embedding({embed_, mtp_token_dev_, mtp_e_, 1}, st);
    rms_norm({mtp_e_, mtp_enorm_, mtp_in_, 1, D, eps}, st);
    rms_norm({mtp_h_, final_norm_, mtp_hn_, 1, D, eps}, st);
    rms_norm({mtp_hn_, mtp_hnorm_, mtp_in_ + D, 1, D, eps}, st);
    ops::matvec(st, mtp_in_, {ops::Prologue::kPlain, nullptr, nullptr, 0, 0.f}, {{&mtp_eh_, mtp_x_}});
    enqueue_layer(st, mtp_, layers_.size(), mtp_x_, mtp_pos_dev_, 1, short_mla, false);
    ops::ArgmaxArgs aa{head_key_, head_counter_, mtp_draft_dev_, mtp_pos_dev_};
    ops::trace_next() = nullptr;
    ops::head(st, mtp_x_, norm_pa(mtp_final_), opt_.lm_head_fp8 ? head_fp8_ : head_src_, mtp_logits_, aa);
  }
  void enqueue_step(cudaStream_t st, bool short_mla, int tokens = 1, bool short_next = false) {
    if (tokens > 1) positions_next(st, tokens);
    embedding({embed_, token_dev_, x_, tokens}, st);
    for (std::size_t i = 0; i < layers_.size(); ++i)
      enqueue_layer(st, layers_[i], i, x_, pos_dev_, tokens, short_mla, short_next);
    ops::ArgmaxArgs aa{head_key_, head_counter_, token_dev_, pos_dev_};
    ops::trace_next() = nullptr;
    ModelMatrix const& head = opt_.lm_head_fp8 ? head_fp8_ : head_src_;
    if (tokens == 1) {
      if (!skipped("head")) ops::head(st, x_, norm_pa(final_norm_), head, logits_, aa);
    } else {
      if (!skipped("head")) ops::matvec(st, x_, norm_pa(final_norm_), {{&head, logits_}}, {}, tokens);
      positions_advance(st, tokens);
    }
  }

  // The MLA attention's switches, read once (unset: 0, the automatic choice):
  //  LING_MLA_KERNEL=1 forces the CUDA-core attention, =2 the tensor-core one with padded cache tiles, =3 the
  //  tensor-core one with swizzled cache tiles; =4 that with two tiles per pass, =5 with Q̂'s loads before the tile
  //  copies (the automatic choice at Ling's shape), =6 with both (MlaDecodeArgs::kernel);
  //  LING_MLA_MIN_CHUNK=n: tokens per attention split at least (A/B of the split size);
  //  LING_MLA_DIAG=1|2: measurements only, wrong outputs (MlaDecodeArgs::diag: the attention's copies only, its math
  //  only); LING_MLA_COMBINE=1: the splits' combine with a thread per column (mla_combine_kernel) instead of the
  //  partial outputs in one round trip (A/B measurements); LING_TRACE_MLA_MID=0..3: with LING_TRACE, where the
  //  one-launch chain's midpoint mark is taken (MlaDecodeArgs::trace_mid);
  struct MlaEnv {
    int kernel = 0, min_chunk = 0, diag = 0, combine = 0, trace_mid = 0;
  };
  static MlaEnv const& mla_env() {
    static MlaEnv const e = [] {
      auto read = [](char const* name) {
        char const* v = std::getenv(name);
        return v ? std::atoi(v) : 0;
      };
      return MlaEnv{read("LING_MLA_KERNEL"), read("LING_MLA_MIN_CHUNK"), read("LING_MLA_DIAG"),
                    read("LING_MLA_COMBINE"), read("LING_TRACE_MLA_MID")};
    }();
    return e;
  }

  void drop_graph() {
    for (cudaGraphExec_t* g : {&graph_exec_, &graph_short_, &graph_tokens_[0], &graph_tokens_[1], &graph_tokens_[2],
                               &graph_mtp_[0], &graph_mtp_[1]}) {
      if (*g) cudaGraphExecDestroy(*g);
      *g = nullptr;
    }
  }

  // Positions below CudaModelOptions::mla_short run the short-context step (its own graph), the others the usual one.
  void launch_step() {
    bool const short_mla = pos_ < opt_.mla_short;
    replay(short_mla ? graph_short_ : graph_exec_, [&](cudaStream_t st) { enqueue_step(st, short_mla); });
    ++pos_;
    last_tokens_ = 1;
  }
  // Runs enqueue(stream_): eagerly without CudaModelOptions::use_graph, else as graph_exec (captured at first use).
  template <class Enqueue>
  void replay(cudaGraphExec_t& graph_exec, Enqueue&& enqueue) {
    if (!opt_.use_graph) {
      enqueue(stream_);
    } else {
      if (!graph_exec) {
        // Kernel attributes (dynamic shared memory limits) are set on the host during the first enqueue: do it once
        // outside the capture on a throwaway stream state, then capture. The eager pass must not change the caches,
        // so it runs before any token of this stream: snapshot-free because capture happens at the first step.
        cudaGraph_t g = nullptr;
        check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
        try {
          enqueue(stream_);
        } catch (...) {
          cudaStreamEndCapture(stream_, &g);
          if (g) cudaGraphDestroy(g);
          throw;
        }
        check(cudaStreamEndCapture(stream_, &g), "end capture");
        check(cudaGraphInstantiate(&graph_exec, g, 0), "graph instantiate");
        cudaGraphDestroy(g);
      }
      check(cudaGraphLaunch(graph_exec, stream_), "graph launch");
    }
  }

  ModelConfig c_;
  CudaModelOptions opt_;
  io::CheckpointWeights const* ckpt_ = nullptr;
  std::uint64_t seed_ = 0;
  std::int64_t max_ctx_ = 0, pos_ = 0;
  int last_tokens_ = 1;  // tokens of the last pass (step: 1; step_tokens: its count)
  int sms_ = 132, splits_ = 1;
  MlaDims mla_dims_;
  Arena arena_;
  std::size_t weight_bytes_ = 0, cache_bytes_ = 0;
  void* cache_base_ = nullptr;
  ModelMatrix embed_, head_src_, head_fp8_;
  float* final_norm_ = nullptr;
  std::vector<Layer> layers_;
  float *x_ = nullptr, *xq_ = nullptr, *xk_ = nullptr, *xv_ = nullptr, *xf_ = nullptr, *xg_ = nullptr, *xb_ = nullptr, *o_ = nullptr;
  float* o_ss_ = nullptr;  // the KDA step's partial Σ o² per head (KdaStepArgs::o_ss) for o_proj's gated head norm
  float *mq_ = nullptr, *mqa_ = nullptr, *mkv_ = nullptr, *mgate_ = nullptr, *q_hat_ = nullptr, *part_o_ = nullptr, *part_ml_ = nullptr;
  float* mla_rope_cs_ = nullptr;  // MlaDecodeArgs::rope_cs (filled once in build())
  float *o_lat_ = nullptr, *mo_ = nullptr, *router_logits_ = nullptr, *sel_w_ = nullptr, *act_ = nullptr, *logits_ = nullptr;
  float* logits_alt_ = nullptr;
  int* sel_idx_ = nullptr;
  unsigned long long* head_key_ = nullptr;
  unsigned *router_counter_ = nullptr, *head_counter_ = nullptr;
  unsigned* tail_counter_ = nullptr;        // ops::matvec's dynamic tail (LING_MATVEC_TAIL); 0 between launches
  ops::MatvecTail tail_;                    // that counter and the settings, read once at build
  unsigned long long* grid_bar_ = nullptr;  // MoE launch A's grid barrier (router rows in launch A)
  // the L2 look-ahead probe (setup_ahead): the ranges of all layers, each KDA layer's first and count
  DeviceBuffer ahead_buf_;
  std::vector<int> ahead_off_, ahead_n_;
  bool ahead_early_ = false, ahead_lines_ = false;
  int ahead_cols_ = 1;
  // LING_PREDICT (predict_env): 0 off, 1 the predicted experts' gate and up rows, 2 also their down rows. pred_logits_:
  // the projections launch's predicted logits; pred_rec_ / act_rec_: per layer, the predicted and the real picks
  // (predict_step only, recording_).
  int predict_ = 0;
  bool recording_ = false;
  float* pred_logits_ = nullptr;
  int *pred_rec_ = nullptr, *act_rec_ = nullptr;
  std::int32_t *token_dev_ = nullptr, *scratch_token_ = nullptr, *pos_dev_ = nullptr;
  std::int32_t* host_token_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaGraphExec_t graph_exec_ = nullptr;
  // the short-context step (CudaModelOptions::mla_short), captured at first use
  cudaGraphExec_t graph_short_ = nullptr;
  // step_tokens' passes, by how many of their tokens run the short-context MLA chain (0: none, 1: the first, 2: both)
  cudaGraphExec_t graph_tokens_[3] = {};
  // the MTP layer (has_mtp_): its weights as a layer (an MLA layer with a MoE) and its own vectors and eh_proj; the
  // entry's hidden row (mtp_h_), the normalized [emb ; h] input, its residual stream, logits, greedy draft, token and
  // position; one MTP graph per MLA chain form (long, short)
  bool has_mtp_ = false;
  Layer mtp_;
  ModelMatrix mtp_eh_;
  float *mtp_enorm_ = nullptr, *mtp_hnorm_ = nullptr, *mtp_final_ = nullptr;
  float *mtp_h_ = nullptr, *mtp_hn_ = nullptr, *mtp_e_ = nullptr, *mtp_in_ = nullptr, *mtp_x_ = nullptr;
  float* mtp_logits_ = nullptr;
  std::int32_t *mtp_token_dev_ = nullptr, *mtp_draft_dev_ = nullptr, *mtp_pos_dev_ = nullptr, *mtp_next_dev_ = nullptr;
  std::int64_t mtp_pos_ = 0;
  cudaGraphExec_t graph_mtp_[2] = {};
  unsigned long long* trace_ = nullptr;  // LING_TRACE: layers × 6 regions (arena)
};

}  // namespace ling::cuda
