// Google Benchmark for the CPU backend's ops at Ling-3.0-flash widths: Linear per weight policy (one token and a
// small batch), MLA decode (absorbed) against a context, MoE decode (router + top-8 experts + shared expert).
// bytes_per_second counts the weight bytes each call reads.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "ling/cpu/gated_mla.hpp"
#include "ling/cpu/linear.hpp"
#include "ling/cpu/moe.hpp"
#include "ling/quant/policies.hpp"

using namespace ling;
using Lin = layers::Linear<quant::DefaultPolicies>;
using Dyn = Extent<dynamic>;

namespace {

std::vector<float> random_vec(std::int64_t n, float sd, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

template <class P>
Lin make_linear(std::int64_t rows, std::int64_t cols, unsigned seed = 1) {
  auto w = random_vec(rows * cols, 0.02f, seed);
  if constexpr (std::is_same_v<P, quant::F32>) {
    return Lin::owned<quant::F32>(w, {}, rows, cols);
  } else if constexpr (std::is_same_v<P, quant::Bf16>) {
    std::vector<Bfloat16> d;
    for (float x : w) d.push_back(bf16_from_float(x));
    return Lin::owned<quant::Bf16>(d, {}, rows, cols);
  } else if constexpr (std::is_same_v<P, quant::Fp8Block>) {
    std::vector<E4m3> d(w.size());
    std::vector<float> s(static_cast<std::size_t>(quant::Fp8Block::scale_count(rows, cols)));
    quant::Fp8Block::quantize(w.data(), rows, cols, d.data(), s.data(), true);
    return Lin::owned<quant::Fp8Block>(d, s, rows, cols);
  } else if constexpr (std::is_same_v<P, quant::Fp8Row>) {
    std::vector<E4m3> d(w.size());
    std::vector<float> s(static_cast<std::size_t>(rows));
    quant::Fp8Row::quantize([&](std::int64_t r, std::int64_t c) { return w[std::size_t(r * cols + c)]; }, rows, cols, d.data(), s.data());
    return Lin::owned<quant::Fp8Row>(d, s, rows, cols);
  } else {
    std::vector<std::uint8_t> d(static_cast<std::size_t>(quant::Mxfp4::storage_count(rows, cols)));
    std::vector<Ue8m0> s(static_cast<std::size_t>(quant::Mxfp4::scale_count(rows, cols)));
    quant::Mxfp4::quantize(w.data(), rows, cols, d.data(), s.data());
    return Lin::owned<quant::Mxfp4>(d, s, rows, cols);
  }
}

template <class P>
void BM_Linear(benchmark::State& state) {
  std::int64_t const rows = 2048, cols = 2560, T = state.range(0);
  Lin w = make_linear<P>(rows, cols);
  auto xv = random_vec(T * cols, 1.f, 2);
  cpu::Matrix x = Eigen::Map<cpu::Matrix>(xv.data(), T, cols), y;
  for (auto _ : state) {
    cpu::linear(w, x, y);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * quant::storage_bytes<P>(rows, cols));
  state.SetLabel(std::string(P::name));
}
BENCHMARK_TEMPLATE(BM_Linear, quant::F32)->Arg(1)->Arg(16);
BENCHMARK_TEMPLATE(BM_Linear, quant::Bf16)->Arg(1)->Arg(16);
BENCHMARK_TEMPLATE(BM_Linear, quant::Fp8Block)->Arg(1)->Arg(16);
BENCHMARK_TEMPLATE(BM_Linear, quant::Fp8Row)->Arg(1)->Arg(16);
BENCHMARK_TEMPLATE(BM_Linear, quant::Mxfp4)->Arg(1)->Arg(16);

// One absorbed MLA decode step at spec §1 widths (hidden 2560, 32 heads, r 512, dn 128, dr 64, dv 128) after a
// context of range(0) tokens.
void BM_MlaDecode(benchmark::State& state) {
  using Mla = layers::GatedMla<>;
  Mla l;
  l.config = {Dyn(2560, "h"), Dyn(32, "H"), Dyn(512, "r"), Dyn(128, "dn"), Dyn(64, "dr"), Dyn(128, "dv"), 0, true, 6e6,
              OutputGate::kHeadWise, 1e-6f};
  l.weights.q_proj = make_linear<quant::Bf16>(32 * 192, 2560, 3);
  l.weights.kv_a_proj = make_linear<quant::Bf16>(576, 2560, 4);
  l.weights.kv_a_norm.assign(512, 1.f);
  l.weights.kv_b_proj = make_linear<quant::Bf16>(32 * 256, 512, 5);
  l.weights.g_proj = make_linear<quant::Bf16>(32, 2560, 6);
  l.weights.o_proj = make_linear<quant::Bf16>(2560, 32 * 128, 7);
  cpu::Backend be;
  Mla::State st;
  std::int64_t const ctx = state.range(0);
  auto xv = random_vec(ctx * 2560, 1.f, 8);
  cpu::Matrix ctx_x = Eigen::Map<cpu::Matrix>(xv.data(), ctx, 2560), y;
  cpu::forward_prefill(be, l, st, ctx_x, y);
  cpu::Matrix x = ctx_x.topRows(1);
  for (auto _ : state) {
    st.length = ctx;
    cpu::forward_decode(be, l, st, x, y);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["context"] = double(ctx);
}
BENCHMARK(BM_MlaDecode)->Arg(256)->Arg(2048)->Unit(benchmark::kMillisecond);

// One MoE decode step: hidden 2560, 64 experts of 768 (of flash's 512, to bound memory), top-8, shared 768.
template <class P>
void BM_MoeDecode(benchmark::State& state) {
  using M = layers::Moe<>;
  M m;
  m.config.router = {Dyn(2560, "h"), Dyn(64, "e"), 8, 8, 4, true, 2.5f};
  m.config.expert = {Dyn(2560, "h"), Dyn(768, "w"), 0.f};
  m.config.shared = {Dyn(2560, "h"), Dyn(768, "s"), 0.f};
  m.weights.router.gate = make_linear<quant::F32>(64, 2560, 9);
  m.weights.router.expert_bias.assign(64, 0.f);
  for (unsigned e = 0; e < 64; ++e)
    m.weights.experts.push_back({make_linear<P>(768, 2560, 10 + 3 * e), make_linear<P>(768, 2560, 11 + 3 * e),
                                 make_linear<P>(2560, 768, 12 + 3 * e)});
  m.weights.shared = {make_linear<P>(768, 2560, 1), make_linear<P>(768, 2560, 2), make_linear<P>(2560, 768, 3)};
  cpu::Backend be;
  auto xv = random_vec(2560, 1.f, 13);
  cpu::Matrix x = Eigen::Map<cpu::Matrix>(xv.data(), 1, 2560), y;
  for (auto _ : state) {
    cpu::forward_decode(be, m, x, y);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * 9 * 3 * quant::storage_bytes<P>(768, 2560));
  state.SetLabel(std::string(P::name));
}
BENCHMARK_TEMPLATE(BM_MoeDecode, quant::Bf16)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_MoeDecode, quant::Mxfp4)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
