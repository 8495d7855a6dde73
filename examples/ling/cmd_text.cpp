// `ling run`, `ling chat`, `ling tokenize`: text in, text out.
//   ling run [--model DIR] [sampling flags] [--system S] [--think on|off] [--hide-think] [--raw] "prompt" | -
//   ling chat [same flags]          interactive; /reset, /think on|off, /quit; EOF ends
//   ling tokenize [--model DIR] "text"     ids separated by spaces;  --decode 1,2,3 prints text
// The model defaults to $LING_MODEL, else the embedded ${LING_SOURCE_DIR}/models/ling-gsm8k.
// open_session() below is the one place where a backend (--backend auto|cpu|cuda) is chosen.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ling/core/error.hpp"
#include "ling/io/chat.hpp"
#include "ling/io/tokenizer.hpp"
#include "ling/runtime/any_session.hpp"
#include "ling/runtime/generator.hpp"
#include "ling/runtime/sampling.hpp"
#if defined(LING_WITH_CUDA)
#include "ling/cuda/session.hpp"
#endif
#if __has_include("ling/runtime/session.hpp")
#include "ling/runtime/session.hpp"
#define LING_CLI_HAS_CPU_SESSION 1
#endif
#include "registry.hpp"

#ifndef LING_SOURCE_DIR
#define LING_SOURCE_DIR "."
#endif

namespace {

using ling::ErrorCode;
using ling::fail;
using ling::runtime::AnySession;

std::string default_model_dir() {
  if (char const* env = std::getenv("LING_MODEL"); env && *env) return env;
  return std::string(LING_SOURCE_DIR) + "/models/ling-gsm8k";
}

// ---- backend choice: the single place. auto = cuda when built with CUDA and a device is present, else cpu. ----
AnySession open_session(std::filesystem::path const& dir, std::string const& backend) {
  if (backend != "auto" && backend != "cpu" && backend != "cuda")
    fail(ErrorCode::kInvalidArgument, "--backend must be auto, cpu or cuda, got '" + backend + "'");
#if defined(LING_WITH_CUDA)
  // The GPU when asked for, or when one is present (auto); auto falls back to the CPU for a checkpoint the CUDA
  // model does not implement yet, and says so.
  if (backend == "cuda" || (backend == "auto" && ling::cuda::device_available())) {
    try {
      return ling::cuda::make_cuda_session(dir);
    } catch (ling::Error const& e) {
      if (backend == "cuda" || e.code() != ErrorCode::kUnsupported) throw;
      std::fprintf(stderr, "note: using the CPU (%s)\n", e.what());
    }
  }
#endif
  if (backend == "cuda")
    fail(ErrorCode::kUnsupported, "--backend cuda: this build has no CUDA session (configure with LING_CUDA=ON)");
#if defined(LING_CLI_HAS_CPU_SESSION)
  return AnySession(ling::runtime::Session::open(dir), "cpu");
#else
  (void)dir;
  fail(ErrorCode::kUnsupported, "this build has no CPU session (include/ling/runtime/session.hpp)");
#endif
}

struct TextOptions {
  std::string model;
  std::string backend = "auto";
  float temperature = 0.6f;  // Ling's recommended sampling
  int top_k = 20;
  float top_p = 0.95f;
  float min_p = 0.0f;
  float repeat_penalty = 1.0f;
  float presence_penalty = 0.0f;
  std::uint64_t seed = 0;
  std::int64_t max_tokens = 1024;
  std::vector<std::string> stop;
  std::string system;
  std::string think = "on";
  bool hide_think = false;
  bool raw = false;
  int draft = 0;
  std::string prompt;
};

void add_generation_flags(CLI::App* c, TextOptions& o) {
  c->add_option("--model", o.model, "checkpoint directory (config.json, safetensors, tokenizer.json)");
  c->add_option("--backend", o.backend, "auto | cpu | cuda")->capture_default_str();
  c->add_option("--temp", o.temperature, "temperature (0 = greedy)")->capture_default_str();
  c->add_option("--top-k", o.top_k, "top-k (0 = off)")->capture_default_str();
  c->add_option("--top-p", o.top_p, "top-p (1 = off)")->capture_default_str();
  c->add_option("--min-p", o.min_p, "min-p (0 = off)")->capture_default_str();
  c->add_option("--repeat-penalty", o.repeat_penalty, "CTRL repetition penalty (1 = off)")->capture_default_str();
  c->add_option("--presence-penalty", o.presence_penalty, "presence penalty (0 = off)")->capture_default_str();
  c->add_option("--seed", o.seed, "random seed")->capture_default_str();
  c->add_option("--max-tokens", o.max_tokens, "most new tokens")->capture_default_str();
  c->add_option("--stop", o.stop, "stop string (repeatable); it is not printed");
  c->add_option("--system", o.system, "system prompt");
  c->add_option("--think", o.think, "detailed thinking on | off")->capture_default_str();
  c->add_flag("--hide-think", o.hide_think, "do not print the <think>...</think> part");
  c->add_option("--draft", o.draft,
                "speculative decoding: tokens the MTP head drafts per step, 0 (off) or 1 (a model with an MTP "
                "layer; CPU or CUDA)")
      ->capture_default_str();
}

ling::runtime::SamplingParams sampling_of(TextOptions const& o, ling::io::Tokenizer const&) {
  ling::runtime::SamplingParams p;
  p.temperature = o.temperature;
  p.top_k = o.top_k;
  p.top_p = o.top_p;
  p.min_p = o.min_p;
  p.repetition_penalty = o.repeat_penalty;
  p.presence_penalty = o.presence_penalty;
  p.seed = o.seed;
  p.max_new_tokens = o.max_tokens;
  p.stop_strings = o.stop;
  p.validate();
  return p;
}

bool think_flag(std::string const& s) {
  if (s == "on") return true;
  if (s == "off") return false;
  fail(ErrorCode::kInvalidArgument, "--think must be on or off, got '" + s + "'");
}

void print_stats(ling::runtime::GenerationStats const& st, std::string const& backend) {
  double prefill_tps = st.prefill_ms > 0 ? st.prefilled_tokens * 1000.0 / st.prefill_ms : 0.0;
  std::fprintf(stderr,
               "\n[%s] prompt %lld tok (prefilled %lld) in %.1f ms (%.1f tok/s); generated %lld tok in %.1f ms "
               "(%.2f tok/s); stop: %s%s%s\n",
               backend.c_str(), (long long)st.prompt_tokens, (long long)st.prefilled_tokens, st.prefill_ms, prefill_tps,
               (long long)st.decode_tokens, st.decode_ms, st.decode_tokens_per_s,
               std::string(ling::runtime::to_string(st.stop_reason)).c_str(), st.stop_string.empty() ? "" : " ",
               st.stop_string.c_str());
  if (st.drafts > 0)
    std::fprintf(stderr, "[%s] speculative (MTP): %lld of %lld drafts accepted (%.0f%%)\n", backend.c_str(),
                 (long long)st.drafts_accepted, (long long)st.drafts,
                 100.0 * double(st.drafts_accepted) / double(st.drafts));
}

// One reply, streamed to stdout through the think filter; returns the full reply text.
std::string reply(ling::runtime::Generator<AnySession>& gen, std::string const& prompt,
                  ling::runtime::SamplingParams const& params, bool hide_think, std::string const& backend) {
  ling::io::ThinkFilter filter(hide_think);
  std::string full;
  auto st = gen.generate(prompt, params, [&](std::string_view piece) {
    full += piece;
    auto shown = filter.push(piece);
    std::fwrite(shown.data(), 1, shown.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  auto rest = filter.finish();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  print_stats(st, backend);
  return full;
}

void run_cmd(TextOptions const& o) {
  std::string dir = o.model.empty() ? default_model_dir() : o.model;
  auto tok = ling::io::Tokenizer::load(dir);
  auto params = sampling_of(o, tok);
  bool think = think_flag(o.think);
  AnySession session = open_session(dir, o.backend);
  ling::runtime::Generator<AnySession> gen(session, tok);
  gen.set_draft_tokens(o.draft);
  std::string user = o.prompt;
  if (user == "-") user.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  std::string prompt = o.raw ? user : ling::io::chat_prompt(user, {o.system, think});
  reply(gen, prompt, params, o.hide_think, session.backend());
}

void chat_cmd(TextOptions const& o) {
  std::string dir = o.model.empty() ? default_model_dir() : o.model;
  auto tok = ling::io::Tokenizer::load(dir);
  auto params = sampling_of(o, tok);
  AnySession session = open_session(dir, o.backend);
  ling::runtime::Generator<AnySession> gen(session, tok);
  gen.set_draft_tokens(o.draft);
  ling::io::Conversation conv({o.system, think_flag(o.think)});
  std::fprintf(stderr, "ling chat (%s): /reset, /think on|off, /quit; EOF ends\n", session.backend().c_str());
  for (std::string line;;) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/quit" || line == "/exit") break;
    if (line == "/reset") {
      conv.reset();
      gen.reset();
      std::fputs("(conversation cleared)\n", stderr);
      continue;
    }
    if (line.rfind("/think", 0) == 0) {
      std::string arg = line.size() > 7 ? line.substr(7) : "";
      try {
        conv.options().think = think_flag(arg);
        std::fprintf(stderr, "(thinking %s)\n", conv.options().think ? "on" : "off");
      } catch (ling::Error const& e) {
        std::fprintf(stderr, "%s\n", e.what());
      }
      continue;
    }
    conv.add_user(line);
    auto full = reply(gen, conv.prompt(), params, o.hide_think, session.backend());
    // later prompts carry the answer without its thinking
    conv.add_assistant(ling::io::strip_thinking(full));
  }
}

struct TokenizeOptions {
  std::string model;
  std::string decode;
  bool no_special = false;
  bool skip_special = false;
  std::string text;
};

void tokenize_cmd(TokenizeOptions const& o) {
  std::string dir = o.model.empty() ? default_model_dir() : o.model;
  auto tok = ling::io::Tokenizer::load(dir);
  if (!o.decode.empty()) {
    std::vector<std::int32_t> ids;
    std::stringstream ss(o.decode);
    for (std::string item; std::getline(ss, item, ',');) {
      std::size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(item, &used);
      } catch (std::exception const&) {
        used = 0;
      }
      if (used == 0 || item.find_first_not_of(" \t", used) != std::string::npos)
        fail(ErrorCode::kInvalidArgument, "--decode: '" + item + "' is not a token id");
      ids.push_back(static_cast<std::int32_t>(v));
    }
    std::string text = tok.decode(ids, o.skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    return;
  }
  auto ids = tok.encode(o.text, !o.no_special);
  for (std::size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? " " : "", ids[i]);
  std::printf("\n");
}

ling::cli::Registrar reg{20, [](CLI::App& app) {
  auto ro = std::make_shared<TextOptions>();
  auto* run = app.add_subcommand("run", "generate a reply to one prompt, streamed; stats on stderr");
  add_generation_flags(run, *ro);
  run->add_flag("--raw", ro->raw, "send the prompt as is (no chat template)");
  run->add_option("prompt", ro->prompt, "the prompt (- reads it from stdin)")->required();
  run->callback([ro] { run_cmd(*ro); });

  auto co = std::make_shared<TextOptions>();
  auto* chat = app.add_subcommand("chat", "interactive chat (/reset, /think on|off, /quit)");
  add_generation_flags(chat, *co);
  chat->callback([co] { chat_cmd(*co); });

  auto to = std::make_shared<TokenizeOptions>();
  auto* tk = app.add_subcommand("tokenize", "text -> token ids, or --decode ids -> text");
  tk->add_option("--model", to->model, "directory with tokenizer.json (or the file)");
  tk->add_option("--decode", to->decode, "comma-separated ids to turn into text");
  tk->add_flag("--no-special", to->no_special, "treat special-token text as plain text");
  tk->add_flag("--skip-special", to->skip_special, "--decode: leave special tokens out");
  tk->add_option("text", to->text, "text to encode");
  tk->callback([to] { tokenize_cmd(*to); });
}};

}  // namespace
