// The whole use of ling from C++: open a checkpoint, chat-format a prompt, stream the reply to stdout.
// Usage: example_embed [MODEL_DIR] ["question"]   (defaults: the embedded models/ling-gsm8k and a GSM8K-style question)
#include <cstdio>
#include <string>

#include "ling/io/chat.hpp"
#include "ling/io/tokenizer.hpp"
#include "ling/runtime/generator.hpp"
#include "ling/runtime/session.hpp"

int main(int argc, char** argv) try {
  std::string dir = argc > 1 ? argv[1] : LING_SOURCE_DIR "/models/ling-gsm8k";
  auto session = ling::runtime::Session::open(dir);
  auto tokenizer = ling::io::Tokenizer::load(dir);
  ling::runtime::Generator gen(session, tokenizer);
  ling::runtime::SamplingParams params;
  params.temperature = 0;  // greedy
  std::string prompt = ling::io::chat_prompt(argc > 2 ? argv[2] : "Tom has 3 apples and buys 5 more. How many apples?", {});
  auto stats = gen.generate(prompt, params, [](std::string_view piece) { return std::fwrite(piece.data(), 1, piece.size(), stdout) == piece.size(); });
  std::fprintf(stderr, "\n%.1f tokens/s\n", stats.decode_tokens_per_s);
} catch (std::exception const& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
