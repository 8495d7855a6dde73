#pragma once
// Generator<SessionT>: prompt -> streamed text. Works with any session that computes logits (the CPU
// runtime::Session, the CUDA one, a test fake): see the LogitSession concept below.
//   prefill(prompt) -> sample -> [stop token? eos?] -> detokenize (whole UTF-8 chars only) -> stop strings (held
//   back while they may match) -> callback(piece) -> decode(token) -> sample -> ...
// The session keeps its state between calls: a prompt that extends the tokens already fed (a chat's next turn)
// prefills only the new suffix; any other prompt resets the session first (KDA state cannot be rewound).
#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ling/core/error.hpp"
#include "ling/io/tokenizer.hpp"
#include "ling/runtime/sampling.hpp"
#include "ling/runtime/stop.hpp"

namespace ling::runtime {

template <class S>
concept LogitSession = requires(S& s, S const& cs, std::span<std::int32_t const> tokens, std::int32_t token) {
  { s.prefill(tokens) } -> std::convertible_to<std::span<float const>>;  // logits of the LAST position
  { s.decode(token) } -> std::convertible_to<std::span<float const>>;   // logits after feeding one token
  s.reset();
  { cs.position() } -> std::convertible_to<std::int64_t>;
  { cs.vocab_size() } -> std::convertible_to<std::int64_t>;
};

enum class StopReason { kEos, kStopString, kStopToken, kMaxTokens, kCallback };

constexpr std::string_view to_string(StopReason r) noexcept {
  switch (r) {
    case StopReason::kEos: return "eos";
    case StopReason::kStopString: return "stop string";
    case StopReason::kStopToken: return "stop token";
    case StopReason::kMaxTokens: return "max tokens";
    case StopReason::kCallback: return "callback";
  }
  return "?";
}

struct GenerationStats {
  std::int64_t prompt_tokens = 0;     // tokens of the prompt
  std::int64_t prefilled_tokens = 0;  // of which were actually prefilled (the rest reused from the session)
  double prefill_ms = 0;
  std::int64_t decode_tokens = 0;     // tokens sampled (including a final eos / stop token)
  double decode_ms = 0;               // from the first sample to the end
  double decode_tokens_per_s = 0;
  StopReason stop_reason = StopReason::kMaxTokens;
  std::string stop_string;            // the stop string that matched, if any
  std::int32_t stop_token = -1;       // the eos / stop token that ended it, if any
  std::vector<std::int32_t> tokens;   // generated ids (including a final eos / stop token)
};

// Receives each piece of text (valid UTF-8); returning false stops generation.
using TextCallback = std::function<bool(std::string_view)>;

template <LogitSession SessionT>
class Generator {
 public:
  Generator(SessionT& session, io::Tokenizer const& tokenizer) : session_(&session), tokenizer_(&tokenizer) {
    for (auto const* t : {"<|role_end|>", "<|endoftext|>"})
      if (auto id = tokenizer.token_to_id(t)) eos_ids_.push_back(*id);
  }

  // Tokens that end generation with StopReason::kEos (default: <|role_end|> and <|endoftext|> when present).
  void set_eos_ids(std::vector<std::int32_t> ids) { eos_ids_ = std::move(ids); }
  std::vector<std::int32_t> const& eos_ids() const noexcept { return eos_ids_; }
  // Text of special tokens is emitted unless skip_special is set (the chat filter needs "<think>").
  void set_skip_special(bool skip) noexcept { skip_special_ = skip; }

  GenerationStats generate(std::string_view prompt_text, SamplingParams const& params, TextCallback const& on_text) {
    auto ids = tokenizer_->encode(prompt_text, /*parse_special=*/true);
    return generate(std::span<std::int32_t const>(ids), params, on_text);
  }

  GenerationStats generate(std::span<std::int32_t const> prompt, SamplingParams const& params,
                           TextCallback const& on_text) {
    using clock = std::chrono::steady_clock;
    if (prompt.empty()) fail(ErrorCode::kInvalidArgument, "generate: empty prompt");
    params.validate();
    std::int64_t const vocab = session_->vocab_size();
    for (auto id : prompt)
      if (id < 0 || id >= vocab)
        fail(ErrorCode::kInvalidArgument, "generate: prompt token " + std::to_string(id) + " outside the vocabulary (" +
                                              std::to_string(vocab) + ")");
    GenerationStats st;
    st.prompt_tokens = static_cast<std::int64_t>(prompt.size());

    // reuse the session when the prompt extends what it has seen
    bool extends = fed_.size() < prompt.size() && session_->position() == static_cast<std::int64_t>(fed_.size()) &&
                   std::equal(fed_.begin(), fed_.end(), prompt.begin());
    std::span<std::int32_t const> todo = prompt;
    if (extends && !fed_.empty()) {
      todo = prompt.subspan(fed_.size());
    } else {
      session_->reset();
      fed_.clear();
    }
    st.prefilled_tokens = static_cast<std::int64_t>(todo.size());

    auto t0 = clock::now();
    std::span<float const> logits = session_->prefill(todo);
    fed_.insert(fed_.end(), todo.begin(), todo.end());
    auto t1 = clock::now();
    st.prefill_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    check_logits_(logits, vocab);

    std::size_t const usable = static_cast<std::size_t>(std::min<std::int64_t>(vocab, tokenizer_->vocab_size()));
    Sampler sampler(params);
    io::TokenStreamDecoder detok(*tokenizer_, skip_special_);
    StopStringMatcher stops(params.stop_strings);
    std::vector<std::int32_t> history(prompt.begin(), prompt.end());
    auto emit = [&](std::string const& s) { return s.empty() || on_text(s); };
    bool finished = false;
    st.stop_reason = StopReason::kMaxTokens;

    while (!finished && st.decode_tokens < params.max_new_tokens) {
      // a session may pad its vocabulary past the tokenizer's: never sample an id the tokenizer cannot decode
      std::int32_t tok = sampler.sample(logits.first(usable), history);
      ++st.decode_tokens;
      st.tokens.push_back(tok);
      if (std::find(eos_ids_.begin(), eos_ids_.end(), tok) != eos_ids_.end()) {
        st.stop_reason = StopReason::kEos;
        st.stop_token = tok;
        break;
      }
      if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), tok) != params.stop_token_ids.end()) {
        st.stop_reason = StopReason::kStopToken;
        st.stop_token = tok;
        break;
      }
      auto r = stops.push(detok.push(tok));
      if (!emit(r.text)) {
        st.stop_reason = StopReason::kCallback;
        finished = true;
        break;
      }
      if (r.stop) {
        st.stop_reason = StopReason::kStopString;
        st.stop_string = *r.stop;
        finished = true;
        break;
      }
      if (st.decode_tokens >= params.max_new_tokens) break;
      history.push_back(tok);
      logits = session_->decode(tok);
      fed_.push_back(tok);
      check_logits_(logits, vocab);
    }
    if (!finished) {
      // eos, stop token or max tokens: release the held-back text (a dangling partial character becomes U+FFFD)
      auto r = stops.push(detok.finish());
      std::string tail = r.text;
      if (r.stop) {
        st.stop_reason = StopReason::kStopString;
        st.stop_string = *r.stop;
      } else {
        tail += stops.finish();
      }
      if (!emit(tail)) st.stop_reason = StopReason::kCallback;
    }
    auto t2 = clock::now();
    st.decode_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
    st.decode_tokens_per_s = st.decode_ms > 0 ? st.decode_tokens * 1000.0 / st.decode_ms : 0.0;
    return st;
  }

  // Forget the session state (next generate() prefills from scratch).
  void reset() {
    session_->reset();
    fed_.clear();
  }
  // Tokens the session has consumed so far (prompt and fed generated tokens).
  std::vector<std::int32_t> const& fed_tokens() const noexcept { return fed_; }

 private:
  static void check_logits_(std::span<float const> logits, std::int64_t vocab) {
    if (static_cast<std::int64_t>(logits.size()) != vocab)
      fail(ErrorCode::kInternal, "generate: session returned " + std::to_string(logits.size()) +
                                     " logits, vocab_size is " + std::to_string(vocab));
  }

  SessionT* session_;
  io::Tokenizer const* tokenizer_;
  std::vector<std::int32_t> eos_ids_;
  std::vector<std::int32_t> fed_;
  bool skip_special_ = false;
};

}  // namespace ling::runtime
