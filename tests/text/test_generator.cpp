// runtime/generator.hpp with a fake session whose logits follow a fixed script (no model needed).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ling/io/chat.hpp"
#include "ling/io/tokenizer.hpp"
#include "ling/runtime/generator.hpp"

using namespace ling;
using namespace ling::runtime;

namespace {

// Deterministic "model": after a prefill, the k-th sampled token is script[k] (logit 10, all others 0).
// The vocabulary is padded past the tokenizer's, as real checkpoints do.
struct FakeSession {
  std::vector<std::int32_t> script;
  std::int64_t vocab = 2048;
  std::int64_t pos = 0, step = 0;
  std::int64_t prefill_calls = 0, last_prefill = 0, decode_calls = 0, resets = 0;
  std::vector<float> logits;

  std::span<float const> out_() {
    logits.assign(static_cast<std::size_t>(vocab), 0.0f);
    logits[2047] = 9.0f;  // a padded id the tokenizer lacks: must never be sampled
    if (step < static_cast<std::int64_t>(script.size())) logits[static_cast<std::size_t>(script[static_cast<std::size_t>(step)])] = 10.0f;
    return logits;
  }
  std::span<float const> prefill(std::span<std::int32_t const> tokens) {
    ++prefill_calls;
    last_prefill = static_cast<std::int64_t>(tokens.size());
    pos += last_prefill;
    step = 0;
    return out_();
  }
  std::span<float const> decode(std::int32_t) {
    ++decode_calls;
    ++pos;
    ++step;
    return out_();
  }
  void reset() {
    ++resets;
    pos = 0;
  }
  std::int64_t position() const { return pos; }
  std::int64_t vocab_size() const { return vocab; }
};
static_assert(LogitSession<FakeSession>);

io::Tokenizer const& tok() {
  static auto t = io::Tokenizer::load(LING_TEST_DATA "/tokenizer/tokenizer.json");
  return t;
}

SamplingParams greedy(std::int64_t max_tokens = 100) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_new_tokens = max_tokens;
  return p;
}

std::string const kReply = "\n<think>\nok\n</think>\n\nThe answer is 中文 😀 STOP tail";

}  // namespace

TEST_CASE("generator: streams the script until eos, pieces are whole UTF-8") {
  FakeSession s;
  s.script = tok().encode(kReply);
  s.script.push_back(*tok().token_to_id("<|role_end|>"));
  Generator<FakeSession> gen(s, tok());
  std::string out;
  int pieces = 0;
  auto st = gen.generate(io::chat_prompt("hi", {}), greedy(), [&](std::string_view p) {
    CHECK(io::utf8::is_valid(p));
    out += p;
    ++pieces;
    return true;
  });
  CHECK(out == kReply);
  CHECK(st.stop_reason == StopReason::kEos);
  CHECK(st.stop_token == *tok().token_to_id("<|role_end|>"));
  CHECK(st.decode_tokens == static_cast<std::int64_t>(s.script.size()));
  CHECK(st.prompt_tokens == static_cast<std::int64_t>(tok().encode(io::chat_prompt("hi", {})).size()));
  CHECK(st.tokens == s.script);
  CHECK(s.decode_calls == st.decode_tokens - 1);  // the final eos is not fed
  CHECK(pieces > 5);
}

TEST_CASE("generator: stop string, stop token, max tokens, callback") {
  FakeSession s;
  s.script = tok().encode(kReply);
  Generator<FakeSession> gen(s, tok());
  std::string out;
  auto collect = [&](std::string_view p) {
    out += p;
    return true;
  };

  auto p = greedy();
  p.stop_strings = {"STOP", "never"};
  auto st = gen.generate("prompt", p, collect);
  CHECK(out == kReply.substr(0, kReply.find("STOP")));
  CHECK(st.stop_reason == StopReason::kStopString);
  CHECK(st.stop_string == "STOP");

  out.clear();
  p = greedy();
  auto think_close = *tok().token_to_id("</think>");
  p.stop_token_ids = {think_close};
  st = gen.generate("prompt", p, collect);
  CHECK(out == "\n<think>\nok\n");
  CHECK(st.stop_reason == StopReason::kStopToken);
  CHECK(st.stop_token == think_close);

  out.clear();
  st = gen.generate("prompt", greedy(4), collect);
  CHECK(st.stop_reason == StopReason::kMaxTokens);
  CHECK(st.decode_tokens == 4);
  CHECK(out == tok().decode(std::span<std::int32_t const>(s.script).first(4)));

  // the script runs out: the fake then prefers the padded id 2047, which must be masked -> id 0 (all zero)
  out.clear();
  st = gen.generate("prompt", greedy(static_cast<std::int64_t>(s.script.size()) + 2), collect);
  CHECK(st.tokens.back() == 0);

  out.clear();
  int calls = 0;
  st = gen.generate("prompt", greedy(), [&](std::string_view piece) {
    out += piece;
    return ++calls < 3;
  });
  CHECK(st.stop_reason == StopReason::kCallback);
  CHECK(calls == 3);
}

TEST_CASE("generator: a prompt extending the fed tokens prefills only the suffix") {
  FakeSession s;
  s.script = tok().encode("abc def");
  s.script.push_back(*tok().token_to_id("<|role_end|>"));
  Generator<FakeSession> gen(s, tok());
  auto prompt = tok().encode(io::chat_prompt("first", {}));
  auto st = gen.generate(prompt, greedy(), [](std::string_view) { return true; });
  CHECK(st.prefilled_tokens == static_cast<std::int64_t>(prompt.size()));
  auto fed = gen.fed_tokens();
  CHECK(fed.size() == prompt.size() + s.script.size() - 1);
  CHECK(s.position() == static_cast<std::int64_t>(fed.size()));
  std::vector<std::int32_t> next = fed;
  for (auto id : tok().encode("<|role_end|><role>HUMAN</role>second<|role_end|><role>ASSISTANT</role>")) next.push_back(id);
  auto resets = s.resets;
  st = gen.generate(next, greedy(), [](std::string_view) { return true; });
  CHECK(s.resets == resets);
  CHECK(st.prefilled_tokens == static_cast<std::int64_t>(next.size() - fed.size()));
  CHECK(s.last_prefill == st.prefilled_tokens);
  // an unrelated prompt resets
  st = gen.generate("other", greedy(), [](std::string_view) { return true; });
  CHECK(s.resets == resets + 1);
  CHECK(st.prefilled_tokens == st.prompt_tokens);
}

TEST_CASE("generator: sampling with a seed is reproducible; bad prompts are errors") {
  FakeSession s;
  s.script = tok().encode("one two three four five six seven eight");
  Generator<FakeSession> gen(s, tok());
  SamplingParams p;
  p.temperature = 1.5f;
  p.seed = 11;
  p.max_new_tokens = 8;
  auto a = gen.generate("x", p, [](std::string_view) { return true; });
  auto b = gen.generate("x", p, [](std::string_view) { return true; });
  CHECK(a.tokens == b.tokens);
  CHECK(a.tokens.size() == 8);
  CHECK_THROWS_AS(gen.generate(std::vector<std::int32_t>{}, p, [](std::string_view) { return true; }), ling::Error);
  CHECK_THROWS_AS(gen.generate(std::vector<std::int32_t>{5000}, p, [](std::string_view) { return true; }), ling::Error);
}

#include "ling/runtime/any_session.hpp"

TEST_CASE("generator: AnySession forwards to the wrapped session") {
  FakeSession fake;
  fake.script = tok().encode("type erased");
  fake.script.push_back(*tok().token_to_id("<|role_end|>"));
  AnySession any(std::move(fake), "fake");
  CHECK(any.backend() == "fake");
  CHECK(any.vocab_size() == 2048);
  Generator<AnySession> gen(any, tok());
  std::string out;
  auto st = gen.generate("x", greedy(), [&](std::string_view p) {
    out += p;
    return true;
  });
  CHECK(out == "type erased");
  CHECK(st.stop_reason == StopReason::kEos);
  REQUIRE(any.get<FakeSession>() != nullptr);
  CHECK(any.get<FakeSession>()->prefill_calls == 1);
  CHECK(any.position() == any.get<FakeSession>()->pos);
  CHECK(any.get<int>() == nullptr);
}
