#pragma once
// runtime::Session: one token stream over a checkpoint on the CPU backend. open() reads config.json and picks the
// model type: a static spec when the config matches one exactly (ling3-flash, kimi-linear-48b-a3b), else the
// dynamic one (Kimi-Linear family switches fixed for kimi_linear configs); model_type() says which.
//   prefill(tokens)    -> logits of the last position [V]     (chunked KDA, naive MLA)
//   prefill_all(tokens)-> logits of every position [T·V]
//   decode(token)      -> logits [V]                          (recurrent KDA, absorbed MLA)
//   decode_all(tokens, rewindable) -> logits of every position [T·V] on the decode path; rewind(n) then drops the
//                         last n of those tokens (speculative decoding's verification step)
//   mtp_logits(h, next, position) / mtp_after(next) -> MTP logits (spec §2 MTP)
//   snapshot() / restore(), reset()
//   routing_margin()   -> smallest MoE routing boundary gap of the last prefill/decode (layers::Routing::margin)
// Errors: a token id >= vocab -> kInvalidArgument naming the id; a context past max_position_embeddings (or
// SessionOptions::max_context) -> kOutOfRange. A failed call leaves the caches as they were.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "ling/core/error.hpp"
#include "ling/cpu/hybrid_model.hpp"
#include "ling/io/checkpoint.hpp"
#include "ling/io/model_config.hpp"
#include "ling/io/weights.hpp"
#include "ling/model/dynamic.hpp"
#include "ling/model/kimi_linear.hpp"
#include "ling/model/ling3_flash.hpp"
#include "ling/runtime/cache.hpp"

namespace ling::runtime {

struct SessionOptions {
  std::int64_t max_context = 0;  // 0: max_position_embeddings; larger values are clamped to it
  std::string model_type = "auto";  // "auto", "dynamic" (never a static spec)
};

namespace detail {

class Engine {
 public:
  virtual ~Engine() = default;
  // rewindable: keep what rewind() needs to drop any of the last T - 1 tokens afterwards
  virtual void forward(std::span<std::int32_t const> tokens, cpu::Phase phase, bool all_logits,
                       bool rewindable = false) = 0;
  virtual void rewind(std::int64_t n) = 0;
  virtual void mtp(cpu::ConstMatrixRef h, std::span<std::int32_t const> next, std::int64_t position, cpu::Phase phase) = 0;
  virtual void reset() = 0;
  virtual CacheSnapshot snapshot() const = 0;
  virtual void restore(CacheSnapshot const& s) = 0;
  virtual std::int64_t position() const = 0;
  virtual std::int64_t mtp_position() const = 0;
  virtual bool has_mtp() const = 0;
  virtual ModelConfig const& config() const = 0;
  virtual std::string_view model_type() const = 0;
  virtual float routing_margin() const = 0;

  cpu::Matrix hidden, logits, mtp_logits;
};

template <class Model>
class EngineFor final : public Engine {
 public:
  EngineFor(std::shared_ptr<io::Checkpoint const> ckpt, Model model, std::int64_t max_context)
      : ckpt_(std::move(ckpt)), model_(std::move(model)), state_(model_.make_state()), max_context_(max_context) {}

  void forward(std::span<std::int32_t const> tokens, cpu::Phase phase, bool all_logits, bool rewindable) override {
    cpu::ForwardOptions opt{phase, all_logits, max_context_};
    // Validate before touching the caches, so a bad call changes nothing.
    (void)cpu::embed(model_, tokens);
    std::int64_t const max_ctx = max_context_ > 0 ? max_context_ : model_.config.max_position_embeddings;
    if (max_ctx > 0 && state_.position + std::int64_t(tokens.size()) > max_ctx)
      fail(ErrorCode::kOutOfRange, "context overflow: " + std::to_string(state_.position) + " tokens + " +
                                       std::to_string(tokens.size()) + " new exceed the maximum context of " +
                                       std::to_string(max_ctx));
    be_.min_routing_margin = std::numeric_limits<float>::infinity();
    rewind_tokens_ = 0;
    checkpoints_.clear();
    be_.kda_checkpoints = rewindable ? &checkpoints_ : nullptr;  // set by every forward (the MTP layer has no KDA)
    cpu::forward(be_, model_, state_, tokens, hidden, logits, opt);
    if (rewindable) rewind_tokens_ = std::int64_t(tokens.size());
  }
  // Puts every cache back to where it was n tokens before the end of the last (rewindable) forward: a KDA layer's
  // state from the checkpoint taken after its token T - n (cpu::Backend::kda_checkpoints), an MLA cache by its
  // length (its rows past the length are dead), the position; hidden and logits keep their first T - n rows.
  void rewind(std::int64_t n) override {
    std::int64_t const T = rewind_tokens_;
    if (T == 0)
      fail(ErrorCode::kInvalidArgument, "rewind: the last call was not decode_all(tokens, rewindable = true)");
    if (n < 0 || n >= T)
      fail(ErrorCode::kInvalidArgument, "rewind: " + std::to_string(n) + " tokens asked, but the last decode_all fed " +
                                            std::to_string(T) + " (at most T - 1 can be dropped)");
    if (n > 0) {
      std::int64_t const keep = T - n;
      std::size_t kda = 0;
      for (auto& ls : state_.layers) rewind_layer_(ls, kda, T, keep, n);
      require(kda * std::size_t(T - 1) == checkpoints_.size(), ErrorCode::kInternal,
              "rewind: the KDA checkpoints do not match the layers");
      state_.position -= n;
      cpu::Matrix h = hidden.topRows(keep);
      hidden.swap(h);
      if (logits.rows() == T) {
        cpu::Matrix l = logits.topRows(keep);
        logits.swap(l);
      } else {
        logits.resize(0, logits.cols());  // the last row only: its position was dropped
      }
    }
    rewind_tokens_ = 0;
    checkpoints_.clear();
  }
  void mtp(cpu::ConstMatrixRef h, std::span<std::int32_t const> next, std::int64_t position, cpu::Phase phase) override {
    // routing_margin() describes the last prefill/decode; the MTP layer's own routing must not lower it.
    float const margin = be_.min_routing_margin;
    cpu::mtp_forward(be_, model_, state_, h, next, position, mtp_logits, phase);
    be_.min_routing_margin = margin;
  }
  void reset() override {
    state_ = model_.make_state();
    rewind_tokens_ = 0;
  }
  CacheSnapshot snapshot() const override { return CacheSnapshot(this, state_); }
  void restore(CacheSnapshot const& s) override {
    state_ = s.get<typename Model::State>(this);
    rewind_tokens_ = 0;
  }
  std::int64_t position() const override { return state_.position; }
  std::int64_t mtp_position() const override { return state_.mtp ? state_.mtp->length : 0; }
  bool has_mtp() const override { return model_.has_mtp(); }
  ModelConfig const& config() const override { return model_.config; }
  std::string_view model_type() const override { return Model::spec_type::name; }
  float routing_margin() const override { return be_.min_routing_margin; }
  Model& model() { return model_; }

 private:
  std::shared_ptr<io::Checkpoint const> ckpt_;  // the mapped files the weights view
  Model model_;
  typename Model::State state_;
  // one layer's cache (a variant of the layer kinds, or one kind) put back by n tokens
  template <class S>
  void rewind_layer_(S& s, std::size_t& kda, std::int64_t T, std::int64_t keep, std::int64_t n) {
    if constexpr (requires { s.index(); }) {
      std::visit([&](auto& alt) { rewind_layer_(alt, kda, T, keep, n); }, s);
    } else if constexpr (std::is_same_v<S, cpu::KdaState>) {
      std::size_t const at = kda * std::size_t(T - 1) + std::size_t(keep - 1);
      require(at < checkpoints_.size(), ErrorCode::kInternal, "rewind: a KDA layer has no checkpoint");
      s = checkpoints_[at];
      ++kda;
    } else if constexpr (requires { s.length; }) {
      s.length -= n;
    } else {
      static_assert(std::is_same_v<S, std::monostate>, "rewind: a layer cache of unknown kind");
    }
  }

  std::int64_t max_context_;
  cpu::Backend be_;
  std::vector<cpu::KdaState> checkpoints_;  // of the last rewindable forward
  std::int64_t rewind_tokens_ = 0;          // T of the last rewindable forward; 0: rewind() refuses
};

}  // namespace detail

class Session {
 public:
  // Opens a checkpoint directory (config.json + safetensors) with the model type picked from its config.
  static Session open(std::filesystem::path const& dir, SessionOptions const& options = {}) {
    auto ckpt = std::make_shared<io::Checkpoint const>(io::Checkpoint::open(dir));
    ModelConfig const& c = ckpt->config();
    if (options.model_type != "auto" && options.model_type != "dynamic")
      fail(ErrorCode::kInvalidArgument, "SessionOptions.model_type must be auto or dynamic, got '" + options.model_type + "'");
    if (options.model_type == "auto") {
      if (model::matches<model::Ling3FlashSpec>(c)) return open_loaded<model::Ling3Flash<>>(ckpt, options);
      if (model::matches<model::KimiLinear48BSpec>(c)) return open_loaded<model::KimiLinear48B<>>(ckpt, options);
      if (model::matches<model::KimiLinearSpec>(c)) return open_loaded<model::KimiLinear<>>(ckpt, options);
    }
    return open_loaded<model::DynamicModel<>>(ckpt, options);
  }
  // Opens with a given model type (a static spec, or another policy list); `edit` may change the loaded weights
  // (e.g. quantize them to a policy of the list) before the first token.
  template <class Model>
  static Session open_as(std::filesystem::path const& dir, SessionOptions const& options = {},
                         std::function<void(Model&)> const& edit = {}) {
    auto ckpt = std::make_shared<io::Checkpoint const>(io::Checkpoint::open(dir));
    return open_loaded<Model>(ckpt, options, edit);
  }

  // Logits of the last position [vocab].
  std::span<float const> prefill(std::span<std::int32_t const> tokens) {
    engine_->forward(tokens, cpu::Phase::kPrefill, false);
    return row(engine_->logits, engine_->logits.rows() - 1);
  }
  // Logits of every position [T·vocab], row-major.
  std::span<float const> prefill_all(std::span<std::int32_t const> tokens) {
    engine_->forward(tokens, cpu::Phase::kPrefill, true);
    return {engine_->logits.data(), std::size_t(engine_->logits.size())};
  }
  std::span<float const> prefill(std::span<std::int32_t const> tokens, bool all_rows) {
    return all_rows ? prefill_all(tokens) : prefill(tokens);
  }
  // One token through the decode path: logits [vocab].
  std::span<float const> decode(std::int32_t token) {
    std::int32_t const t[1] = {token};
    engine_->forward(t, cpu::Phase::kDecode, false);
    return row(engine_->logits, 0);
  }
  // Several tokens through the decode path (recurrent KDA, absorbed MLA): logits of every position [T·vocab]. With
  // rewindable set, rewind(n) may then drop the last n < T of them (it keeps a copy of each KDA layer's state after
  // each of the first T - 1 tokens: 2 MB per layer and token at Ling-3.0-flash's widths).
  std::span<float const> decode_all(std::span<std::int32_t const> tokens, bool rewindable = false) {
    engine_->forward(tokens, cpu::Phase::kDecode, true, rewindable);
    return {engine_->logits.data(), std::size_t(engine_->logits.size())};
  }
  // Drops the last n tokens of the last decode_all(tokens, true), as if only the first T - n had been fed: every
  // cache, the position, and last_hidden() (its first T - n rows). The MTP stream is not touched. Once per such
  // call (rewind(0) included); any other call in between (prefill, decode, reset, restore) makes it an error, as
  // does n >= T.
  void rewind(std::int64_t n) { engine_->rewind(n); }
  // The main model's final hidden states (after model.norm) of the last prefill/decode call [n·hidden].
  std::span<float const> last_hidden() const { return {engine_->hidden.data(), std::size_t(engine_->hidden.size())}; }

  // MTP logits [n·vocab]: row i from hidden h[i] (after model.norm, at position `position + i`) and the token that
  // follows it, next[i]. Positions must continue the MTP stream (mtp_position()).
  std::span<float const> mtp_logits(std::span<float const> h, std::span<std::int32_t const> next, std::int64_t position) {
    std::int64_t const H = engine_->config().hidden_size;
    require(std::int64_t(h.size()) == std::int64_t(next.size()) * H, ErrorCode::kInvalidArgument,
            "mtp_logits: hidden holds " + std::to_string(h.size()) + " floats, expected next.size()·hidden_size");
    Eigen::Map<cpu::Matrix const> hm(h.data(), std::int64_t(next.size()), H);
    engine_->mtp(hm, next, position, next.size() == 1 ? cpu::Phase::kDecode : cpu::Phase::kPrefill);
    return {engine_->mtp_logits.data(), std::size_t(engine_->mtp_logits.size())};
  }
  // MTP logits from the first next.size() hidden rows of the last prefill/decode call, at their positions.
  std::span<float const> mtp_after(std::span<std::int32_t const> next) {
    std::int64_t const n = engine_->hidden.rows();
    require(std::int64_t(next.size()) <= n, ErrorCode::kInvalidArgument,
            "mtp_after: " + std::to_string(next.size()) + " tokens but the last call produced " + std::to_string(n) + " positions");
    cpu::Matrix h = engine_->hidden.topRows(std::int64_t(next.size()));
    return mtp_logits({h.data(), std::size_t(h.size())}, next, engine_->position() - n);
  }

  void reset() { engine_->reset(); }
  CacheSnapshot snapshot() const { return engine_->snapshot(); }
  void restore(CacheSnapshot const& s) { engine_->restore(s); }

  std::int64_t position() const { return engine_->position(); }
  std::int64_t mtp_position() const { return engine_->mtp_position(); }
  std::int64_t vocab_size() const { return engine_->config().vocab_size; }
  bool has_mtp() const { return engine_->has_mtp(); }
  ModelConfig const& config() const { return engine_->config(); }
  std::string_view model_type() const { return engine_->model_type(); }
  // Smallest top-k/group boundary gap (biased score) over the MoE layers and tokens of the last prefill/decode; +inf
  // when the model has no MoE. Another engine (the CUDA model) whose router scores differ from these by more than
  // this may legitimately pick other experts, so comparisons use it to tell such a step from a bug.
  float routing_margin() const { return engine_->routing_margin(); }

 private:
  explicit Session(std::unique_ptr<detail::Engine> e) : engine_(std::move(e)) {}

  template <class Model>
  static Session open_loaded(std::shared_ptr<io::Checkpoint const> ckpt, SessionOptions const& options,
                             std::function<void(Model&)> const& edit = {}) {
    ModelConfig const& c = ckpt->config();
    auto weights = io::CheckpointWeights::load(*ckpt);
    Model m = Model::load(weights, c);
    if (edit) edit(m);
    std::int64_t max_ctx = c.max_position_embeddings;
    if (options.max_context > 0 && (max_ctx <= 0 || options.max_context < max_ctx)) max_ctx = options.max_context;
    return Session(std::make_unique<detail::EngineFor<Model>>(std::move(ckpt), std::move(m), max_ctx));
  }
  static std::span<float const> row(cpu::Matrix const& m, std::int64_t r) {
    return {m.data() + r * m.cols(), std::size_t(m.cols())};
  }

  std::unique_ptr<detail::Engine> engine_;
};

}  // namespace ling::runtime
