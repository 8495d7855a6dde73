// io/chat.hpp: the exact Ling chat strings (spec §5), thinking strip, and the streaming think filter.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ling/io/chat.hpp"

using namespace ling::io;

TEST_CASE("chat: single turn prompt, exact bytes") {
  CHECK(chat_prompt("What is 2+2?", {"", true}) ==
        "<role>SYSTEM</role>detailed thinking on<|role_end|><role>HUMAN</role>What is 2+2?<|role_end|>"
        "<role>ASSISTANT</role>");
  CHECK(chat_prompt("Hi", {"You are Ling.", false}) ==
        "<role>SYSTEM</role>You are Ling.\ndetailed thinking off<|role_end|><role>HUMAN</role>Hi<|role_end|>"
        "<role>ASSISTANT</role>");
}

TEST_CASE("chat: multi-turn prompt keeps past replies") {
  Conversation c({"sys", true});
  c.add_user("a");
  c.add_assistant("b");
  c.add_user("c");
  CHECK(c.prompt() ==
        "<role>SYSTEM</role>sys\ndetailed thinking on<|role_end|><role>HUMAN</role>a<|role_end|><role>ASSISTANT</role>b"
        "<|role_end|><role>HUMAN</role>c<|role_end|><role>ASSISTANT</role>");
  c.reset();
  c.options().think = false;
  c.add_user("x");
  CHECK(c.prompt() == "<role>SYSTEM</role>sys\ndetailed thinking off<|role_end|><role>HUMAN</role>x<|role_end|>"
                      "<role>ASSISTANT</role>");
}

TEST_CASE("chat: strip_thinking") {
  CHECK(strip_thinking("\n<think>\nJanet has 3.\n</think>\n\nThe answer is 3.") == "The answer is 3.");
  CHECK(strip_thinking("The answer is 3.") == "The answer is 3.");
  CHECK(strip_thinking("\n<think>\nstill thinking") == "");
  CHECK(strip_thinking("<think></think>x") == "x");
  CHECK(strip_thinking("a <think> b </think> c") == "a <think> b </think> c");  // only a leading block
}

TEST_CASE("chat: ThinkFilter streaming equals strip_thinking at every split") {
  std::vector<std::string> replies = {"\n<think>\nJanet has 3 apples. 3+2=5\n</think>\n\nThe answer is 5. 中文😀",
                                      "No thinking here.\n", "\n\n  plain after whitespace", "\n<think>\nunfinished",
                                      "<thin", "\n<think>\n</think>\n\n", "<think>x</think>y</think>z"};
  int checked = 0;
  for (auto const& r : replies) {
    for (std::size_t p = 0; p <= r.size(); ++p) {
      for (std::size_t q = p; q <= r.size(); q += 3) {
        ThinkFilter f(true);
        std::string out = f.push(r.substr(0, p));
        out += f.push(r.substr(p, q - p));
        out += f.push(r.substr(q));
        out += f.finish();
        CAPTURE(r);
        CAPTURE(p);
        CHECK(out == strip_thinking(r));
        ++checked;
      }
    }
    ThinkFilter show(false);
    CHECK(show.push(r) + show.finish() == r);
  }
  CHECK(checked > 500);
}
