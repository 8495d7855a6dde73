// CPU KDA core (spec §2 "KDA mixer"): one decode step (recurrent form) and prefill (chunked WY/UT form, and the
// recurrent form for comparison), at Ling-3.0's shape (H=32, K=128) and a small one (H=4, K=64).
// Counters: tokens/s, and for decode the state traffic (S read + written once) in GB/s.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "ling/cpu/kda.hpp"

namespace {

struct Setup {
  ling::cpu::KdaCoreConfig cfg;
  std::vector<float> q_conv, k_conv, v_conv, a_log, dt_bias, o_norm;
  std::vector<float> xq, xk, xv, f, b, g, out;
  ling::cpu::KdaState state;

  Setup(std::int64_t heads, std::int64_t dim, std::int64_t tokens) {
    cfg.heads = heads, cfg.head_dim = dim;
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto fill = [&](std::vector<float>& v, std::int64_t n, float scale, float shift) {
      v.resize(static_cast<std::size_t>(n));
      for (auto& x : v) x = shift + scale * nd(rng);
    };
    std::int64_t const p = heads * dim;
    fill(q_conv, p * cfg.conv_kernel, 0.3f, 0.0f), fill(k_conv, p * cfg.conv_kernel, 0.3f, 0.0f);
    fill(v_conv, p * cfg.conv_kernel, 0.3f, 0.0f), fill(a_log, heads, 0.3f, 1.0f);
    fill(dt_bias, p, 0.5f, -1.0f), fill(o_norm, dim, 0.1f, 1.0f);
    fill(xq, tokens * p, 1.0f, 0.0f), fill(xk, tokens * p, 1.0f, 0.0f), fill(xv, tokens * p, 1.0f, 0.0f);
    fill(f, tokens * p, 1.0f, 0.0f), fill(b, tokens * heads, 1.0f, 0.0f), fill(g, tokens * p, 1.0f, 0.0f);
    out.assign(static_cast<std::size_t>(tokens * p), 0.0f);
    state = ling::cpu::KdaState::zeros(cfg);
  }
  ling::cpu::KdaCoreWeights weights() const {
    return {q_conv.data(), k_conv.data(), v_conv.data(), a_log.data(), dt_bias.data(), o_norm.data()};
  }
};

void BM_KdaDecodeStep(benchmark::State& bs) {
  Setup s(bs.range(0), bs.range(1), 1);
  auto const w = s.weights();
  for (auto _ : bs) {
    ling::cpu::kda_forward_recurrent(s.cfg, w, s.state, 1, s.xq.data(), s.xk.data(), s.xv.data(), s.f.data(),
                                     s.b.data(), s.g.data(), s.out.data());
    benchmark::DoNotOptimize(s.out.data());
  }
  double const state_rw = 2.0 * static_cast<double>(s.state.s.size() * sizeof(float));
  bs.counters["tokens/s"] = benchmark::Counter(static_cast<double>(bs.iterations()), benchmark::Counter::kIsRate);
  bs.counters["state_GB/s"] =
      benchmark::Counter(state_rw * static_cast<double>(bs.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

template <bool kChunked>
void BM_KdaPrefill(benchmark::State& bs) {
  std::int64_t const tokens = bs.range(2);
  Setup s(bs.range(0), bs.range(1), tokens);
  auto const w = s.weights();
  for (auto _ : bs) {
    s.state.reset();  // each iteration is a fresh prefill (the reset is a small part of the time)
    if constexpr (kChunked)
      ling::cpu::kda_forward_chunked(s.cfg, w, s.state, tokens, s.xq.data(), s.xk.data(), s.xv.data(), s.f.data(),
                                     s.b.data(), s.g.data(), s.out.data());
    else
      ling::cpu::kda_forward_recurrent(s.cfg, w, s.state, tokens, s.xq.data(), s.xk.data(), s.xv.data(),
                                       s.f.data(), s.b.data(), s.g.data(), s.out.data());
    benchmark::DoNotOptimize(s.out.data());
  }
  bs.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(bs.iterations() * tokens), benchmark::Counter::kIsRate);
}

}  // namespace

// Args: heads, head_dim [, tokens].
BENCHMARK(BM_KdaDecodeStep)->ArgNames({"H", "K"})->Args({32, 128})->Args({4, 64})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_KdaPrefill<true>)
    ->Name("BM_KdaPrefillChunked")
    ->ArgNames({"H", "K", "T"})
    ->Args({32, 128, 256})
    ->Args({32, 128, 1024})
    ->Args({4, 64, 256})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_KdaPrefill<false>)
    ->Name("BM_KdaPrefillRecurrent")
    ->ArgNames({"H", "K", "T"})
    ->Args({32, 128, 256})
    ->Args({4, 64, 256})
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
