#pragma once
// Generator<SessionT>: prompt -> streamed text. Works with any session that computes logits (the CPU
// runtime::Session, the CUDA one, a test fake): see the LogitSession concept below.
//   prefill(prompt) -> sample -> [stop token? eos?] -> detokenize (whole UTF-8 chars only) -> stop strings (held
//   back while they may match) -> callback(piece) -> decode(token) -> sample -> ...
// The session keeps its state between calls: a prompt that extends the tokens already fed (a chat's next turn)
// prefills only the new suffix; any other prompt resets the session first (KDA state cannot be rewound).
// Speculative decoding (set_draft_tokens(1), sessions with an MTP layer: SpeculativeSession): the MTP head drafts the
// token after the one just sampled; one decode_all call over both verifies the draft (Sampler::verify) and yields one
// or two tokens; a rejected draft is rewound. The tokens have the distribution of plain decoding (greedy: the same
// ids, up to the rounding of a two-row product against a one-row one).
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

// A session that can verify drafts: several tokens through the decode path, the last ones dropped again, and the MTP
// head (runtime::Session; not yet the CUDA one).
template <class S>
concept SpeculativeSession =
    LogitSession<S> && requires(S& s, S const& cs, std::span<std::int32_t const> tokens) {
      { s.decode_all(tokens, true) } -> std::convertible_to<std::span<float const>>;
      s.rewind(std::int64_t{1});
      { s.mtp_after(tokens) } -> std::convertible_to<std::span<float const>>;
      { cs.has_mtp() } -> std::convertible_to<bool>;
      { cs.mtp_position() } -> std::convertible_to<std::int64_t>;
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
  std::int64_t drafts = 0;            // speculative decoding: drafts verified, and of those accepted
  std::int64_t drafts_accepted = 0;
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
  // Speculative decoding with the model's MTP head: 0 (off) or 1 draft token per step. generate() fails with
  // kUnsupported when it is on and the session cannot verify drafts or has no MTP layer.
  void set_draft_tokens(int n) {
    if (n < 0 || n > 1)
      fail(ErrorCode::kInvalidArgument, "draft tokens: " + std::to_string(n) +
                                            " asked; the MTP head drafts 0 (off) or 1 token ahead");
    draft_tokens_ = n;
  }
  int draft_tokens() const noexcept { return draft_tokens_; }

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
    bool const speculate = draft_tokens_ > 0;
    if (speculate) {
      if constexpr (!SpeculativeSession<SessionT>) {
        fail(ErrorCode::kUnsupported, "speculative decoding: this session cannot verify drafts (it needs decode_all, "
                                      "rewind and the MTP head: the CPU session)");
      } else if (!session_->has_mtp()) {
        fail(ErrorCode::kUnsupported, "speculative decoding: the session runs no MTP layer (the checkpoint has none, "
                                      "or the backend does not run it yet)");
      }
    }

    // reuse the session when the prompt extends what it has seen (speculating, also its MTP stream: one entry per
    // position, which a call without speculation does not add)
    bool extends = fed_.size() < prompt.size() && session_->position() == static_cast<std::int64_t>(fed_.size()) &&
                   std::equal(fed_.begin(), fed_.end(), prompt.begin());
    if constexpr (SpeculativeSession<SessionT>)
      if (speculate && session_->mtp_position() != session_->position()) extends = false;
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
    // One sampled token: count it, end on eos / stop token / stop string / callback. False: generation ends (the
    // token is not fed).
    auto take = [&](std::int32_t tok) {
      ++st.decode_tokens;
      st.tokens.push_back(tok);
      if (std::find(eos_ids_.begin(), eos_ids_.end(), tok) != eos_ids_.end()) {
        st.stop_reason = StopReason::kEos;
        st.stop_token = tok;
        return false;
      }
      if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), tok) != params.stop_token_ids.end()) {
        st.stop_reason = StopReason::kStopToken;
        st.stop_token = tok;
        return false;
      }
      auto r = stops.push(detok.push(tok));
      if (!emit(r.text)) {
        st.stop_reason = StopReason::kCallback;
        finished = true;
        return false;
      }
      if (r.stop) {
        st.stop_reason = StopReason::kStopString;
        st.stop_string = *r.stop;
        finished = true;
        return false;
      }
      return st.decode_tokens < params.max_new_tokens;
    };

    bool plain = true;
    if constexpr (SpeculativeSession<SessionT>) {
      if (speculate) {
        if (params.max_new_tokens > 0) speculate_(todo, logits, usable, vocab, sampler, history, take, st);
        plain = false;
      }
    }
    while (plain && st.decode_tokens < params.max_new_tokens) {
      // a session may pad its vocabulary past the tokenizer's: never sample an id the tokenizer cannot decode
      std::int32_t tok = sampler.sample(logits.first(usable), history);
      if (!take(tok)) break;
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
  // The speculative loop (after the prefill of `todo`, whose last logits are `logits`). Invariant at each draft: the
  // main stream has fed every token but the pending one (sampled, taken), and the MTP stream holds one entry per fed
  // position, the last made from the pending token; so when generation ends, the MTP stream is as long as the main
  // one, and a next turn can go on speculating without a new prefill.
  template <class Take>
  void speculate_(std::span<std::int32_t const> todo, std::span<float const> logits, std::size_t usable,
                  std::int64_t vocab, Sampler& sampler, std::vector<std::int32_t>& history, Take& take,
                  GenerationStats& st) {
    // The MTP entries of the last call's first positions, each with the token after it (Session::mtp_after); the
    // last entry's logits give the next draft.
    auto draft_after = [&](std::span<std::int32_t const> next) {
      auto l = session_->mtp_after(next).last(std::size_t(vocab));
      return static_cast<std::int32_t>(std::max_element(l.begin(), l.begin() + std::ptrdiff_t(usable)) - l.begin());
    };
    auto draft_after_one = [&](std::int32_t next) { return draft_after(std::span<std::int32_t const>(&next, 1)); };

    std::int32_t tok = sampler.sample(logits.first(usable), history);
    // every prefilled position with the token after it, the last with the sampled one
    std::vector<std::int32_t> next(todo.begin() + 1, todo.end());
    next.push_back(tok);
    std::int32_t draft = draft_after(next);
    if (!take(tok)) return;
    for (;;) {
      history.push_back(tok);
      std::int32_t const pair[2] = {tok, draft};
      std::span<float const> rows;
      try {
        rows = session_->decode_all(pair, true);
      } catch (Error const& e) {
        if (e.code() != ErrorCode::kOutOfRange) throw;
        // no room for the draft at the end of the context: one plain step (which fails itself if even that overflows)
        logits = session_->decode(tok);
        fed_.push_back(tok);
        check_logits_(logits, vocab);
        tok = sampler.sample(logits.first(usable), history);
        draft = draft_after_one(tok);
        if (!take(tok)) return;
        continue;
      }
      if (std::int64_t(rows.size()) != 2 * vocab)
        fail(ErrorCode::kInternal, "generate: decode_all returned " + std::to_string(rows.size()) +
                                       " logits for 2 tokens, vocab_size is " + std::to_string(vocab));
      fed_.push_back(tok);
      fed_.push_back(draft);
      ++st.drafts;
      auto const v = sampler.verify(rows.first(std::size_t(vocab)).first(usable), history, draft);
      if (!v.accepted) {
        session_->rewind(1);
        fed_.pop_back();
        tok = v.token;
        draft = draft_after_one(tok);
        if (!take(tok)) return;
        continue;
      }
      ++st.drafts_accepted;
      if (!take(draft)) {
        // generation ends at the draft: its MTP entry, then un-feed it, as plain decoding never feeds its last token
        (void)draft_after_one(draft);
        session_->rewind(1);
        fed_.pop_back();
        return;
      }
      history.push_back(draft);
      tok = sampler.sample(rows.subspan(std::size_t(vocab), std::size_t(vocab)).first(usable), history);
      // the MTP entries of both fed positions in one call; the second one drafts the next token
      std::int32_t const after[2] = {draft, tok};
      draft = draft_after(after);
      if (!take(tok)) return;
    }
  }

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
  int draft_tokens_ = 0;
};

}  // namespace ling::runtime
