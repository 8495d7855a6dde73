// `ling logits --model DIR --tokens 5,17,42 --out L.npy [--decode N] [--mtp-out M.npy] [--backend cpu|cuda]`
// L.npy float32 [T+N, vocab]: rows 0..T-1 are the prefill logits; then N greedy steps through the single-token
// decode path (g0 = argmax(row T-1); feeding g_i yields row T+i). Prints `greedy: g0 g1 ... g(N-1)`.
// M.npy float32 [T-1, vocab]: row j = MTP logits from h_j (after model.norm) and token t_{j+1}, at position j.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "ling/core/error.hpp"
#include "ling/io/npy.hpp"
#include "ling/runtime/session.hpp"
#if defined(LING_WITH_CUDA)
#include "ling/cuda/session.hpp"
#endif
#include "registry.hpp"

namespace {

struct LogitsArgs {
  std::string model, tokens, out, mtp_out, backend = "cpu";
  std::int64_t decode = 0;
};

std::vector<std::int32_t> parse_tokens(std::string const& s) {
  std::vector<std::int32_t> out;
  std::size_t i = 0;
  while (i <= s.size()) {
    std::size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string item = s.substr(i, j - i);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) ling::fail(ling::ErrorCode::kInvalidArgument, "--tokens: empty item in '" + s + "'");
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used != item.size() || v < 0 || v > INT32_MAX)
      ling::fail(ling::ErrorCode::kInvalidArgument, "--tokens: '" + item + "' is not a token id");
    out.push_back(std::int32_t(v));
    i = j + 1;
  }
  if (out.empty()) ling::fail(ling::ErrorCode::kInvalidArgument, "--tokens: no token ids");
  return out;
}

std::int32_t argmax(std::span<float const> row) {
  return std::int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

// Runs the whole request on any session type with prefill_all / decode / mtp_after (the CPU Session; the CUDA
// backend provides the same vocabulary).
template <class SessionT>
void run_logits(SessionT& s, LogitsArgs const& a, std::vector<std::int32_t> const& tokens) {
  std::int64_t const V = s.vocab_size(), T = std::int64_t(tokens.size()), N = a.decode;
  if (!a.mtp_out.empty() && !s.has_mtp())
    ling::fail(ling::ErrorCode::kUnsupported, a.model + ": --mtp-out given but the model has no MTP layer");
  std::vector<float> logits;
  logits.reserve(std::size_t((T + N) * V));
  auto pre = s.prefill_all(tokens);
  logits.insert(logits.end(), pre.begin(), pre.end());
  std::vector<float> mtp;
  if (!a.mtp_out.empty() && T > 1) {
    auto m = s.mtp_after(std::span<std::int32_t const>(tokens).subspan(1));
    mtp.assign(m.begin(), m.end());
  }
  std::vector<std::int32_t> greedy;
  std::int32_t next = argmax(std::span<float const>(logits).subspan(std::size_t((T - 1) * V), std::size_t(V)));
  for (std::int64_t i = 0; i < N; ++i) {
    greedy.push_back(next);
    auto row = s.decode(next);
    logits.insert(logits.end(), row.begin(), row.end());
    next = argmax(row);
  }
  ling::io::write_npy(a.out, logits, {T + N, V});
  if (!a.mtp_out.empty()) ling::io::write_npy(a.mtp_out, mtp, {T - 1, V});
  std::string line = "greedy:";
  for (auto g : greedy) line += " " + std::to_string(g);
  std::printf("%s\n", line.c_str());
}

void cmd_logits(LogitsArgs const& a) {
  std::vector<std::int32_t> const tokens = parse_tokens(a.tokens);
  if (a.decode < 0) ling::fail(ling::ErrorCode::kInvalidArgument, "--decode must be >= 0");
  if (a.backend == "cuda") {
#if defined(LING_WITH_CUDA)
    // The head as stored (BF16): `ling logits` compares against the reference, so no online FP8 here.
    ling::cuda::CudaModelOptions options;
    options.lm_head_fp8 = false;
    auto s = ling::cuda::CudaSession::open(a.model, options);
    run_logits(s, a, tokens);
    return;
#else
    ling::fail(ling::ErrorCode::kUnsupported,
               "--backend cuda: this build has no CUDA backend (configure with -DLING_CUDA=ON on a machine with nvcc)");
#endif
  }
  if (a.backend != "cpu") ling::fail(ling::ErrorCode::kInvalidArgument, "--backend must be cpu or cuda, got '" + a.backend + "'");
  auto s = ling::runtime::Session::open(a.model);
  std::fprintf(stderr, "model type: %s\n", std::string(s.model_type()).c_str());
  run_logits(s, a, tokens);
}

ling::cli::Registrar reg{40, [](CLI::App& app) {
  auto args = std::make_shared<LogitsArgs>();
  auto* c = app.add_subcommand("logits", "Prefill + greedy decode logits (and MTP logits) to .npy files");
  c->add_option("--model", args->model, "checkpoint directory (config.json + safetensors)")->required();
  c->add_option("--tokens", args->tokens, "comma-separated token ids, e.g. 5,17,42")->required();
  c->add_option("--out", args->out, "output .npy, float32 [T+N, vocab]")->required();
  c->add_option("--decode", args->decode, "greedy steps through the decode path (N)");
  c->add_option("--mtp-out", args->mtp_out, "output .npy of MTP logits, float32 [T-1, vocab]");
  c->add_option("--backend", args->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  c->callback([args] { cmd_logits(*args); });
}};

}  // namespace
