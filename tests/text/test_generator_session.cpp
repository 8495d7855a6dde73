// Generator<runtime::Session> on a tiny checkpoint (tests/data/ling-a-bf16): greedy generation equals the PyTorch
// oracle's greedy ids (expected.safetensors decode_tokens), also when the prompt is fed in two parts (session reuse).
#include <doctest/doctest.h>

#include <span>
#include <string>
#include <vector>

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
}  // namespace

TEST_CASE("generator over the CPU session: greedy ids equal the oracle's, with and without session reuse") {
  std::string const dir = LING_TEST_DATA "/ling-a-bf16";
  auto exp = io::SafetensorsFile::open(dir + "/expected.safetensors");
  auto prompt = ids_of(exp, "tokens");
  auto want = ids_of(exp, "decode_tokens");
  REQUIRE(want.size() >= 2);
  // the test tokenizer only detokenizes here (its special ids lie past this model's 512-token vocabulary)
  auto tok = io::Tokenizer::load(LING_TEST_DATA "/tokenizer/tokenizer.json");
  auto session = runtime::Session::open(dir);
  runtime::Generator<runtime::Session> gen(session, tok);
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
