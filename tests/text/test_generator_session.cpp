// Generator<runtime::Session> on a tiny checkpoint (tests/data/ling-a-bf16): greedy generation equals the PyTorch
// oracle's greedy ids (expected.safetensors decode_tokens), also when the prompt is fed in two parts (session reuse);
// speculative decoding with the MTP head gives the same ids.
#include <doctest/doctest.h>

#include <span>
#include <string>
#include <vector>

#include "ling/io/chat.hpp"
#include "ling/io/safetensors.hpp"
#include "ling/io/tokenizer.hpp"
#include "ling/runtime/any_session.hpp"
#include "ling/runtime/generator.hpp"
#include "ling/runtime/session.hpp"

using namespace ling;

namespace {
std::vector<std::int32_t> ids_of(io::SafetensorsFile const& f, char const* name) {
  auto const* t = f.find(name);
  REQUIRE(t != nullptr);
  REQUIRE(t->dtype == DType::kI32);
  auto const* p = reinterpret_cast<std::int32_t const*>(t->data);
  return {p, p + t->numel()};
}
// ling-a-bf16's oracle prompt and greedy ids, and a Generator over a CPU session of it. The test tokenizer only
// detokenizes here (its special ids lie past this model's 512-token vocabulary).
struct OracleSet {
  std::string dir = LING_TEST_DATA "/ling-a-bf16";
  io::SafetensorsFile exp = io::SafetensorsFile::open(dir + "/expected.safetensors");
  std::vector<std::int32_t> prompt = ids_of(exp, "tokens"), want = ids_of(exp, "decode_tokens");
  io::Tokenizer tok = io::Tokenizer::load(LING_TEST_DATA "/tokenizer/tokenizer.json");
  runtime::Session session = runtime::Session::open(dir);
  runtime::Generator<runtime::Session> gen{session, tok};  // refers to the members above: the set stays in place
  OracleSet() = default;
  OracleSet(OracleSet const&) = delete;
  OracleSet& operator=(OracleSet const&) = delete;
};
}  // namespace

TEST_CASE("generator over the CPU session: greedy ids equal the oracle's, with and without session reuse") {
  OracleSet set;
  auto& [dir, exp, prompt, want, tok, session, gen] = set;
  REQUIRE(want.size() >= 2);
  runtime::SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = static_cast<std::int64_t>(want.size());
  std::string text;
  auto st = gen.generate(prompt, greedy, [&](std::string_view p) {
    text += p;
    return true;
  });
  CHECK(st.tokens == want);
  CHECK(st.stop_reason == runtime::StopReason::kMaxTokens);
  CHECK(text == tok.decode(want));
  CHECK(session.position() == static_cast<std::int64_t>(prompt.size() + want.size() - 1));

  // first part of the prompt, then the whole prompt: the second call prefills only the rest
  std::vector<std::int32_t> head(prompt.begin(), prompt.begin() + 40);
  auto one = greedy;
  one.max_new_tokens = 1;
  gen.generate(head, one, [](std::string_view) { return true; });
  auto st2 = gen.generate(prompt, greedy, [](std::string_view) { return true; });
  CHECK(st2.prefilled_tokens == static_cast<std::int64_t>(prompt.size() - head.size()));
  CHECK(st2.tokens == want);

  // the same through the type-erased session the command line uses
  runtime::AnySession any(runtime::Session::open(dir), "cpu");
  runtime::Generator<runtime::AnySession> gen_any(any, tok);
  CHECK(gen_any.generate(prompt, greedy, [](std::string_view) { return true; }).tokens == want);
}

namespace {
runtime::SamplingParams greedy_of(std::int64_t n) {
  runtime::SamplingParams p;
  p.temperature = 0;
  p.max_new_tokens = n;
  return p;
}
auto const kSink = [](std::string_view) { return true; };
}  // namespace

TEST_CASE("speculative decoding with the MTP head: greedy ids equal plain decoding's; the caches stay in step") {
  OracleSet set;
  auto& [dir, exp, prompt, want, tok, session, gen] = set;
  gen.set_draft_tokens(1);
  std::string text;
  auto st = gen.generate(prompt, greedy_of(std::int64_t(want.size())), [&](std::string_view p) {
    text += p;
    return true;
  });
  CHECK(st.tokens == want);
  CHECK(text == tok.decode(want));
  CHECK(st.drafts > 0);
  CHECK(st.drafts_accepted <= st.drafts);
  // every token but the last is fed, and the MTP stream has one entry per fed position
  CHECK(session.position() == std::int64_t(prompt.size() + want.size() - 1));
  CHECK(session.mtp_position() == session.position());
  MESSAGE("ling-a-bf16: " << st.drafts_accepted << " of " << st.drafts << " drafts accepted");

  // every length of generation ends in the same state as plain decoding (ending on an accepted draft rewinds it)
  CHECK(gen.generate(prompt, greedy_of(0), kSink).tokens.empty());
  for (std::int64_t n = 1; n <= std::int64_t(want.size()); ++n) {
    CAPTURE(n);
    auto s2 = gen.generate(prompt, greedy_of(n), kSink);  // the same prompt: not an extension, so a fresh start
    CHECK(s2.prefilled_tokens == std::int64_t(prompt.size()));
    CHECK(s2.tokens == std::vector<std::int32_t>(want.begin(), want.begin() + n));
    CHECK(session.position() == std::int64_t(prompt.size()) + n - 1);
    CHECK(session.mtp_position() == session.position());
  }

  // a next turn extends the fed tokens: only the suffix is prefilled, speculation goes on
  std::vector<std::int32_t> head(prompt.begin(), prompt.begin() + 40);
  gen.generate(head, greedy_of(1), kSink);
  auto st2 = gen.generate(prompt, greedy_of(std::int64_t(want.size())), kSink);
  CHECK(st2.prefilled_tokens == std::int64_t(prompt.size() - head.size()));
  CHECK(st2.tokens == want);
  // after a turn without speculation the MTP stream lags: the next speculative turn starts afresh
  gen.set_draft_tokens(0);
  gen.generate(head, greedy_of(1), kSink);
  gen.set_draft_tokens(1);
  auto st3 = gen.generate(prompt, greedy_of(std::int64_t(want.size())), kSink);
  CHECK(st3.prefilled_tokens == std::int64_t(prompt.size()));
  CHECK(st3.tokens == want);

  // through the type-erased session the command line uses
  runtime::AnySession any(runtime::Session::open(dir), "cpu");
  runtime::Generator<runtime::AnySession> gen_any(any, tok);
  gen_any.set_draft_tokens(1);
  CHECK(gen_any.generate(prompt, greedy_of(std::int64_t(want.size())), kSink).tokens == want);

  // sampling: reproducible with a seed, and every id inside the vocabulary
  runtime::SamplingParams hot;
  hot.temperature = 0.9f;
  hot.top_p = 0.95f;
  hot.seed = 3;
  hot.max_new_tokens = 24;
  auto a = gen.generate(prompt, hot, kSink), b = gen.generate(prompt, hot, kSink);
  CHECK(a.tokens == b.tokens);
  CHECK(a.tokens.size() == 24);
  for (auto id : a.tokens) CHECK((id >= 0 && id < 512));
  CHECK(session.mtp_position() == session.position());
}

TEST_CASE("speculative decoding: the embedded model's reply equals plain greedy decoding's") {
  std::string const dir = LING_TEST_DATA "/../../models/ling-gsm8k";
  auto tok = io::Tokenizer::load(dir);
  std::string const prompt = io::chat_prompt(
      "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips "
      "did Natalia sell altogether in April and May?",
      {});
  auto plain_session = runtime::Session::open(dir);
  runtime::Generator<runtime::Session> plain(plain_session, tok);
  auto spec_session = runtime::Session::open(dir);
  runtime::Generator<runtime::Session> spec(spec_session, tok);
  spec.set_draft_tokens(1);
  std::string pt, stxt;
  auto p = plain.generate(prompt, greedy_of(120), [&](std::string_view s) {
    pt += s;
    return true;
  });
  auto s = spec.generate(prompt, greedy_of(120), [&](std::string_view x) {
    stxt += x;
    return true;
  });
  CHECK(s.tokens == p.tokens);
  CHECK(stxt == pt);
  CHECK(s.stop_reason == p.stop_reason);
  CHECK(s.drafts_accepted > 0);
  MESSAGE("ling-gsm8k: " << s.tokens.size() << " tokens, " << s.drafts_accepted << " of " << s.drafts
                         << " drafts accepted");

  // each length ends in plain decoding's state, also on an accepted draft (which is rewound: the last token is
  // never fed), and the MTP stream keeps one entry per fed position
  auto const ids = tok.encode(prompt, true);
  std::int64_t const P = std::int64_t(ids.size());
  for (std::int64_t n = 1; n <= 16; ++n) {
    CAPTURE(n);
    auto r = spec.generate(ids, greedy_of(n), kSink);
    CHECK(r.tokens == std::vector<std::int32_t>(p.tokens.begin(), p.tokens.begin() + n));
    CHECK(spec_session.position() == P + n - 1);
    CHECK(spec_session.mtp_position() == spec_session.position());
  }

  // at the end of the context a draft no longer fits: plain steps, the same ids, and the same overflow error
  runtime::SessionOptions tight;
  tight.max_context = P + 4;
  auto a = runtime::Session::open(dir, tight), b = runtime::Session::open(dir, tight);
  runtime::Generator<runtime::Session> ga(a, tok), gb(b, tok);
  gb.set_draft_tokens(1);
  CHECK(gb.generate(ids, greedy_of(5), kSink).tokens == ga.generate(ids, greedy_of(5), kSink).tokens);
  CHECK(b.position() == P + 4);
  auto overflow = [&](runtime::Generator<runtime::Session>& g) {
    try {
      g.generate(ids, greedy_of(6), kSink);
    } catch (Error const& e) {
      return e.code();
    }
    return ErrorCode::kOk;
  };
  CHECK(overflow(ga) == ErrorCode::kOutOfRange);
  CHECK(overflow(gb) == ErrorCode::kOutOfRange);
}

TEST_CASE("speculative decoding refuses sessions that cannot verify drafts, and a draft count past 1") {
  auto tok = io::Tokenizer::load(LING_TEST_DATA "/tokenizer/tokenizer.json");
  auto kimi = runtime::Session::open(LING_TEST_DATA "/kimi-bf16");  // no MTP layer
  REQUIRE_FALSE(kimi.has_mtp());
  runtime::Generator<runtime::Session> gen(kimi, tok);
  CHECK_THROWS_AS(gen.set_draft_tokens(2), Error);
  CHECK_THROWS_AS(gen.set_draft_tokens(-1), Error);
  gen.set_draft_tokens(1);
  std::vector<std::int32_t> const prompt{1, 2, 3};
  try {
    gen.generate(prompt, greedy_of(4), kSink);
    FAIL("no error");
  } catch (Error const& e) {
    CHECK(e.code() == ErrorCode::kUnsupported);
    CHECK(std::string(e.what()).find("MTP") != std::string::npos);
  }
  gen.set_draft_tokens(0);
  CHECK(gen.generate(prompt, greedy_of(4), kSink).tokens.size() == 4);
}
