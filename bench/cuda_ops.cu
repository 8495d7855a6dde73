// GPU op benchmarks at Ling-3.0-flash shapes (spec §4): bytes moved per op, GB/s, and % of the device's measured
// streaming-read bandwidth (measured once per process, ≥ 4 GiB, 16-byte loads). Each timing replays a CUDA graph of
// many consecutive launches over several weight copies (rotated so the 60 MB L2 cannot serve them), timed with CUDA
// events (UseManualTime); the MoE step graph runs consecutive steps on different layers' experts with different ids,
// both launches per step, as decode does.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ling/cuda/bandwidth.cuh"
#include "ling/cuda/linear.cuh"
#include "ling/cuda/lm_head.cuh"
#include "ling/cuda/moe.cuh"
#include "ling/cuda/router.cuh"

using namespace ling;
using namespace ling::cuda;

namespace {

double g_read_gbs = 0;  // measured read bandwidth, GB/s
std::string g_name;     // the running benchmark (benchmark 1.7 has no State::name)

// Random device bytes: any byte is a valid E2M1 pair / E4M3 / bf16 pattern for timing; scales are set to sane values.
__global__ void fill_bytes(std::uint8_t* p, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint64_t x = (i + seed) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    p[i] = std::uint8_t(x >> 40);
  }
}
__global__ void fill_floats(float* p, std::size_t n, float v) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = v * (1.0f + 0.001f * float(i % 7));
}
__global__ void fill_ue8m0(std::uint8_t* p, std::size_t n) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = std::uint8_t(120 + i % 8);
}

template <class P>
DeviceMatrix<P> random_device_matrix(std::int64_t rows, std::int64_t cols, int count = 1) {
  auto m = DeviceMatrix<P>::allocate(rows, cols, count);
  MatrixArgs a = m.args();
  std::size_t const nd = std::size_t(a.data_stride) * std::size_t(count);
  static std::uint64_t seed = 1;
  fill_bytes<<<1024, 256>>>(static_cast<std::uint8_t*>(const_cast<void*>(a.data)), nd, seed++ * 0x1234567ull);
  if constexpr (std::is_same_v<typename P::scale_type, float>) {
    fill_floats<<<256, 256>>>(static_cast<float*>(const_cast<void*>(a.scales)), std::size_t(a.scale_stride) * count / 4, 1e-3f);
  } else if constexpr (std::is_same_v<typename P::scale_type, Ue8m0>) {
    fill_ue8m0<<<256, 256>>>(static_cast<std::uint8_t*>(const_cast<void*>(a.scales)), std::size_t(a.scale_stride) * count);
  }
  check(cudaGetLastError(), "fill");
  return m;
}

std::vector<float> host_randn(std::size_t n) {
  std::mt19937 g(42);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
struct DVec {
  DeviceBuffer b;
  explicit DVec(std::size_t n) : b(n * sizeof(float) + 16) {
    auto h = host_randn(n);
    b.upload(h.data(), n * sizeof(float));
  }
  float* p() const { return b.data<float>(); }
};

// Captures `body(i)` for i < n into a graph; replays it per benchmark iteration, timed with events.
template <class Body>
void run_graph(benchmark::State& state, int n, double bytes_per_op, Body body) {
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  for (int i = 0; i < n; ++i) check(body(i, s), "warm-up launch");  // also sets kernel attributes before capture
  check(cudaStreamSynchronize(s), "warm-up");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), "begin capture");
  for (int i = 0; i < n; ++i) check(body(i, s), "captured launch");
  check(cudaStreamEndCapture(s, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  check(cudaGraphLaunch(exec, s), "graph warm-up");
  check(cudaStreamSynchronize(s), "graph warm-up");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  double total_ms = 0;
  std::int64_t ops = 0;
  std::vector<double> per_op_us;
  for (auto _ : state) {
    check(cudaEventRecord(e0, s), "record");
    check(cudaGraphLaunch(exec, s), "graph launch");
    check(cudaEventRecord(e1, s), "record");
    check(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    state.SetIterationTime(ms * 1e-3);
    total_ms += ms;
    ops += n;
    per_op_us.push_back(ms * 1e3 / n);
  }
  std::sort(per_op_us.begin(), per_op_us.end());
  double const med_us = per_op_us.empty() ? 0 : per_op_us[per_op_us.size() / 2];
  double const gbs = bytes_per_op / (med_us * 1e-6) / 1e9;
  state.counters["MB"] = bytes_per_op / 1e6;
  state.counters["us_per_op"] = med_us;
  state.counters["GB/s"] = gbs;
  state.counters["pct_read_bw"] = g_read_gbs > 0 ? 100.0 * gbs / g_read_gbs : 0;
  std::printf("TABLE | %-38s | %9.2f MB | %8.2f us | %7.0f GB/s | %5.1f %% |\n", g_name.c_str(), bytes_per_op / 1e6,
              med_us, gbs, g_read_gbs > 0 ? 100.0 * gbs / g_read_gbs : 0.0);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

int copies_for(double bytes) {  // enough copies to stream at least 480 MB (8x the L2) per graph pass
  int c = int(480e6 / bytes) + 1;
  return c < 2 ? 2 : (c > 64 ? 64 : c);
}

// ---- dense projections ------------------------------------------------------------------------------------
template <class P>
void BM_Matvec(benchmark::State& state, std::int64_t rows, std::int64_t cols) {
  auto probe = DeviceMatrix<P>::allocate(rows, cols);
  double const bytes = double(probe.bytes_per_matrix());
  int const copies = copies_for(bytes);
  std::vector<DeviceMatrix<P>> w;
  for (int i = 0; i < copies; ++i) w.push_back(random_device_matrix<P>(rows, cols));
  DVec x{std::size_t(cols)}, y{std::size_t(rows)};
  run_graph(state, copies, bytes, [&](int i, cudaStream_t s) { return launch_matvec(w[std::size_t(i)], x.p(), y.p(), s); });
}

// Bytes one launch over matrices of `rows` x cols reads (device layout), and their total rows.
template <class P>
double multi_bytes(std::vector<std::int64_t> const& rows, std::int64_t cols, std::int64_t& total_rows) {
  double bytes = 0;
  total_rows = 0;
  for (auto r : rows) {
    bytes += double(DeviceMatrix<P>::allocate(r, cols).bytes_per_matrix());
    total_rows += r;
  }
  return bytes;
}

// `copies` sets of random matrices of `rows` x cols (rotated through so that the L2 cannot serve them), and each set's
// pointers for the multi-matvec launchers.
template <class P>
struct MultiCopies {
  std::vector<std::vector<DeviceMatrix<P>>> w;
  std::vector<std::vector<DeviceMatrix<P> const*>> ptrs;
  MultiCopies(std::vector<std::int64_t> const& rows, std::int64_t cols, int copies)
      : w(static_cast<std::size_t>(copies)), ptrs(static_cast<std::size_t>(copies)) {
    for (std::size_t i = 0; i < w.size(); ++i) {
      for (auto r : rows) w[i].push_back(random_device_matrix<P>(r, cols));
      for (auto& m : w[i]) ptrs[i].push_back(&m);
    }
  }
  std::span<DeviceMatrix<P> const* const> operator[](int i) const { return ptrs[std::size_t(i)]; }
};

// preload: the kernel that copies its rows into shared memory before the PDL wait; false: the default CUDA-core one.
template <class P>
void BM_MatvecMulti(benchmark::State& state, std::vector<std::int64_t> rows, std::int64_t cols, bool preload = false) {
  std::int64_t out = 0;
  double const bytes = multi_bytes<P>(rows, cols, out);
  int const copies = copies_for(bytes);
  MultiCopies<P> const set(rows, cols, copies);
  DVec x{std::size_t(cols)}, y{std::size_t(out)};
  run_graph(state, copies, bytes, [&](int i, cudaStream_t s) {
    return preload ? launch_matvec_multi_preload(set[i], x.p(), y.p(), s)
                   : launch_matvec_multi(set[i], x.p(), y.p(), s);
  });
}

// `tokens` input rows per launch (launch_matvec_multi_tokens: a speculative verification step), with the RMSNorm
// prologue when `rms` (the projections' own) or none; the bytes are the weights' (read once for all tokens).
template <class P>
void BM_MatvecTokens(benchmark::State& state, std::vector<std::int64_t> rows, std::int64_t cols, int tokens, bool rms) {
  std::int64_t out = 0;
  double const bytes = multi_bytes<P>(rows, cols, out);
  int const copies = copies_for(bytes);
  MultiCopies<P> const set(rows, cols, copies);
  DVec x{std::size_t(cols) * std::size_t(tokens)}, y{std::size_t(out) * std::size_t(tokens)}, nw{std::size_t(cols)};
  InputPrologue pro{};
  if (rms) {
    pro.kind = PrologueKind::kRmsNorm;
    pro.norm_w = nw.p();
  }
  run_graph(state, copies, bytes, [&](int i, cudaStream_t s) {
    return launch_matvec_multi_tokens(set[i], x.p(), tokens, y.p(), s, pro);
  });
}

// ---- MoE step: router-chosen ids (random, distinct) on `layers` different layers' expert sets ----------------
template <class PE, class PS>
struct MoeBench {
  static constexpr std::int64_t kHidden = 2560, kInter = 768;
  static constexpr int kTopK = 8;
  int const kExperts;  // 512 in Ling; fewer: the same bytes per step from a smaller address range
  std::vector<MoeWeights<PE, PS>> w;
  DeviceBuffer ids;
  DVec wts, u, h, hid;
  MoeBench(int layers, int steps, int experts = 512)
      : kExperts(experts),
        w(static_cast<std::size_t>(layers)),
        wts{static_cast<std::size_t>(steps) * kTopK},
        u{kHidden},
        h{static_cast<std::size_t>(kTopK * kInter + kInter)},  // top_k slots + the shared expert (kInter wide here)
        hid{kHidden} {
    for (auto& l : w) {
      l.gate = random_device_matrix<PE>(kInter, kHidden, kExperts);
      l.up = random_device_matrix<PE>(kInter, kHidden, kExperts);
      l.down = random_device_matrix<PE>(kHidden, kInter, kExperts);
      l.shared_gate = random_device_matrix<PS>(kInter, kHidden);
      l.shared_up = random_device_matrix<PS>(kInter, kHidden);
      l.shared_down = random_device_matrix<PS>(kHidden, kInter);
    }
    std::mt19937 g(7);
    std::vector<int> v;
    for (int s = 0; s < steps; ++s) {
      std::vector<int> all(kExperts);
      for (int e = 0; e < kExperts; ++e) all[std::size_t(e)] = e;
      std::shuffle(all.begin(), all.end(), g);
      v.insert(v.end(), all.begin(), all.begin() + kTopK);
    }
    ids = DeviceBuffer(v.size() * sizeof(int));
    ids.upload(v.data(), v.size() * sizeof(int));
  }
  MoeStep step(int i) { return MoeStep{ids.data<int>() + i * kTopK, wts.p() + i * kTopK, kTopK, 4.0f, 5.0f}; }
  MoeWeights<PE, PS> const& layer(int i) const { return w[std::size_t(i) % w.size()]; }
};

template <class PE, class PS>
void BM_MoeStep(benchmark::State& state, int layers, int steps, bool gate_up_only, bool down_only, int experts = 512) {
  MoeBench<PE, PS> b(layers, steps, experts);
  auto const& w0 = b.w[0];
  constexpr int kTopK = MoeBench<PE, PS>::kTopK;
  double bytes = double(w0.bytes_per_token(kTopK));
  if (gate_up_only)
    bytes = double(kTopK) * double(w0.gate.bytes_per_matrix() + w0.up.bytes_per_matrix()) +
            double(w0.shared_gate.bytes_per_matrix() + w0.shared_up.bytes_per_matrix());
  if (down_only) bytes = double(kTopK) * double(w0.down.bytes_per_matrix()) + double(w0.shared_down.bytes_per_matrix());
  run_graph(state, steps, bytes, [&](int i, cudaStream_t s) {
    MoeStep const st = b.step(i);
    auto const& l = b.layer(i);
    if (gate_up_only) return launch_moe_gate_up(l, st, b.u.p(), b.h.p(), s);
    if (down_only) return launch_moe_down(l, st, b.h.p(), b.hid.p(), b.hid.p(), s);
    return launch_moe(l, st, b.u.p(), b.h.p(), b.hid.p(), b.hid.p(), s);
  });
}

// Tuning variants of the fused projections: kNR rows per warp task, kMinB resident blocks per SM.
template <class P, int kNR, int kMinB>
void BM_MatvecMultiTuned(benchmark::State& state, std::vector<std::int64_t> rows, std::int64_t cols) {
  std::int64_t out = 0;
  double const bytes = multi_bytes<P>(rows, cols, out);
  int const copies = copies_for(bytes);
  std::vector<std::vector<DeviceMatrix<P>>> w(static_cast<std::size_t>(copies));
  std::vector<kernels::MultiArgs> args(static_cast<std::size_t>(copies));
  DVec x{std::size_t(cols)}, y{std::size_t(out)};
  for (int i = 0; i < copies; ++i) {
    auto& a = args[std::size_t(i)];
    for (auto r : rows) w[std::size_t(i)].push_back(random_device_matrix<P>(r, cols));
    a.count = int(rows.size());
    for (int k = 0; k < a.count; ++k) a.m[k] = w[std::size_t(i)][std::size_t(k)].args();
    kernels::finish_multi_args<P, kNR>(a, y.p(), nullptr);
  }
  run_graph(state, copies, bytes, [&](int i, cudaStream_t s) {
    return kernels::launch_matvec_keyed<kNR, kMinB>(kernels::make_key<P>(), args[std::size_t(i)], x.p(), InputPrologue{}, {}, s);
  });
}

void BM_Router(benchmark::State& state) {
  constexpr std::int64_t kE = 512, kHidden = 2560;
  double const bytes = double(DeviceMatrix<quant::Bf16>::allocate(kE, kHidden).bytes_per_matrix());
  int const copies = copies_for(bytes);
  std::vector<DeviceMatrix<quant::Bf16>> w;
  for (int i = 0; i < copies; ++i) w.push_back(random_device_matrix<quant::Bf16>(kE, kHidden));
  DVec u(kHidden), bias(kE), wts(8);
  DeviceBuffer idx(8 * sizeof(int));
  RouterWorkspace ws(kE);
  RouterParams p{8, 8, 4, 2.5f, true};
  run_graph(state, copies, bytes, [&](int i, cudaStream_t s) {
    return launch_router(w[std::size_t(i)], bias.p(), u.p(), p, ws, idx.data<int>(), wts.p(), s);
  });
}

template <class P>
void BM_LmHead(benchmark::State& state) {
  constexpr std::int64_t kV = 157184, kHidden = 2560;
  std::vector<DeviceMatrix<P>> w;
  for (int i = 0; i < 2; ++i) {
    if constexpr (std::is_same_v<P, quant::Fp8Row>) {
      auto bf = random_device_matrix<quant::Bf16>(kV, kHidden);
      w.push_back(quantize_fp8_rows(bf, nullptr));  // the online quantization, as at load
    } else {
      w.push_back(random_device_matrix<P>(kV, kHidden));
    }
  }
  double const bytes = double(w[0].bytes_per_matrix());
  DVec x(kHidden), logits(kV);
  DeviceBuffer am(sizeof(int));
  ArgmaxWorkspace ws;
  run_graph(state, 4, bytes, [&](int i, cudaStream_t s) {
    return launch_lm_head(w[std::size_t(i % 2)], x.p(), logits.p(), am.data<int>(), &ws, s);
  });
}

void BM_ReadBandwidth(benchmark::State& state) {
  for (auto _ : state) {
    auto r = measure_read_bandwidth<16>(std::size_t(4) << 30, 5);
    state.SetIterationTime(r.best_ms * 1e-3);
    state.counters["GB/s"] = r.gb_per_s;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!device_available()) {
    std::printf("no GPU: cuda_ops benchmarks skipped\n");
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  auto bw = measure_read_bandwidth<16>(std::size_t(4) << 30, 10);
  g_read_gbs = bw.gb_per_s;
  std::printf("device: %s, %d SMs, L2 %d MB; measured streaming read: %.0f GB/s (4 GiB, best of 10)\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, g_read_gbs);

  using quant::Bf16;
  using quant::Fp8Block;
  using quant::Fp8Row;
  using quant::Mxfp4;
  auto reg = [](char const* name, auto fn) {
    benchmark::RegisterBenchmark(name, [name, fn](benchmark::State& s) {
      g_name = name;
      fn(s);
    })->UseManualTime()->Unit(benchmark::kMicrosecond);
  };
  reg("kda_qkvfgb_6x[4096|32,2560]_fp8", [](benchmark::State& s) { BM_MatvecMulti<Fp8Block>(s, {4096, 4096, 4096, 4096, 4096, 32}, 2560); });
  reg("kda_qkvfgb_6x[4096|32,2560]_fp8_nopipe", [](benchmark::State& s) {
    setenv("LING_MATVEC_PIPE", "0", 1);  // the one-round-trip-per-task kernel (before software pipelining)
    BM_MatvecMulti<Fp8Block>(s, {4096, 4096, 4096, 4096, 4096, 32}, 2560);
    unsetenv("LING_MATVEC_PIPE");
  });
  reg("kda_o_proj_[2560,4096]_fp8_nopipe", [](benchmark::State& s) {
    setenv("LING_MATVEC_PIPE", "0", 1);
    BM_MatvecMulti<Fp8Block>(s, {2560}, 4096);
    unsetenv("LING_MATVEC_PIPE");
  });
  reg("kda_qkvfgb_fp8_nr2_min2(old)", [](benchmark::State& s) {
    BM_MatvecMultiTuned<Fp8Block, 2, 2>(s, {4096, 4096, 4096, 4096, 4096, 32}, 2560);
  });
  reg("kda_o_proj_[2560,4096]_fp8", [](benchmark::State& s) { BM_Matvec<Fp8Block>(s, 2560, 4096); });
  // one token and two (a verification step) through launch_matvec_multi_tokens, with the projections' RMSNorm
  reg("kda_qkvfgb_fp8_rms_1tok", [](benchmark::State& s) {
    BM_MatvecTokens<Fp8Block>(s, {4096, 4096, 4096, 4096, 4096, 32}, 2560, 1, true);
  });
  reg("kda_qkvfgb_fp8_rms_2tok", [](benchmark::State& s) {
    BM_MatvecTokens<Fp8Block>(s, {4096, 4096, 4096, 4096, 4096, 32}, 2560, 2, true);
  });
  reg("kda_o_proj_fp8_1tok", [](benchmark::State& s) { BM_MatvecTokens<Fp8Block>(s, {2560}, 4096, 1, false); });
  reg("kda_o_proj_fp8_2tok", [](benchmark::State& s) { BM_MatvecTokens<Fp8Block>(s, {2560}, 4096, 2, false); });
  reg("dense_mlp_gate_up_fp8_rms_2tok",
      [](benchmark::State& s) { BM_MatvecTokens<Fp8Block>(s, {6144, 6144}, 2560, 2, true); });
  reg("lm_head_fp8row_1tok", [](benchmark::State& s) { BM_MatvecTokens<Fp8Row>(s, {157184}, 2560, 1, false); });
  reg("lm_head_fp8row_2tok", [](benchmark::State& s) { BM_MatvecTokens<Fp8Row>(s, {157184}, 2560, 2, false); });
  reg("mla_q_kva_g_[6144|576|32,2560]_fp8", [](benchmark::State& s) { BM_MatvecMulti<Fp8Block>(s, {6144, 576, 32}, 2560); });
  reg("mla_kv_b_[8192,512]_fp8", [](benchmark::State& s) { BM_Matvec<Fp8Block>(s, 8192, 512); });
  reg("mla_dense_[2560,4096]_fp8", [](benchmark::State& s) { BM_Matvec<Fp8Block>(s, 2560, 4096); });
  reg("dense_mlp_gate_up_2x[6144,2560]_fp8", [](benchmark::State& s) { BM_MatvecMulti<Fp8Block>(s, {6144, 6144}, 2560); });
  reg("dense_mlp_down_[2560,6144]_fp8", [](benchmark::State& s) { BM_Matvec<Fp8Block>(s, 2560, 6144); });
  reg("kda_o_proj_[2560,4096]_fp8_preload",
      [](benchmark::State& s) { BM_MatvecMulti<Fp8Block>(s, {2560}, 4096, true); });
  reg("mla_kv_b_[8192,512]_fp8_preload", [](benchmark::State& s) { BM_MatvecMulti<Fp8Block>(s, {8192}, 512, true); });
  reg("kda_qkvfgb_6x[4096|32,2560]_bf16", [](benchmark::State& s) { BM_MatvecMulti<Bf16>(s, {4096, 4096, 4096, 4096, 4096, 32}, 2560); });
  reg("router_[512,2560]_bf16_topk", [](benchmark::State& s) { BM_Router(s); });
  reg("moe_step_8of512_mxfp4+shared_fp8", [](benchmark::State& s) { BM_MoeStep<Mxfp4, Fp8Block>(s, 4, 40, false, false); });
  reg("moe_gate_up_8of512_mxfp4+shared", [](benchmark::State& s) { BM_MoeStep<Mxfp4, Fp8Block>(s, 4, 40, true, false); });
  reg("moe_down_8of512_mxfp4+shared", [](benchmark::State& s) { BM_MoeStep<Mxfp4, Fp8Block>(s, 4, 40, false, true); });
  // the same launches over 32 experts per layer (96 MB of expert arrays instead of 1.6 GB): address-range effects
  reg("moe_gate_up_8of32_mxfp4+shared", [](benchmark::State& s) { BM_MoeStep<Mxfp4, Fp8Block>(s, 4, 40, true, false, 32); });
  reg("moe_down_8of32_mxfp4+shared", [](benchmark::State& s) { BM_MoeStep<Mxfp4, Fp8Block>(s, 4, 40, false, true, 32); });
  // A/B variants of the same three (moe.cuh reads these at each launch): launch B on the register kernel instead of the
  // lane kernel, launch A on q8_chunk instead of the biased int8 lookup, launch B's lane kernel with 2 rows per warp,
  // launch A on the register-streaming kernel, launch A streamed on two blocks of 8 or one of 20 warps per SM instead
  // of one of 16, launch B's register kernel on int8, the fp32 decoder (register kernels)
  struct MoeVariant {
    char const* suffix;
    char const* env[2][2];
  };
  static MoeVariant const variants[] = {{"_downreg", {{"LING_MOE_DOWN_LANE", "0"}, {nullptr, nullptr}}},
                                        {"_q8u0", {{"LING_MOE_Q8U", "0"}, {nullptr, nullptr}}},
                                        {"_rows2", {{"LING_MOE_LANE_ROWS", "2"}, {nullptr, nullptr}}},
                                        {"_register", {{"LING_MOE_STREAM", "0"}, {nullptr, nullptr}}},
                                        {"_streamA8", {{"LING_MOE_STREAM_WARPS_A", "8"}, {nullptr, nullptr}}},
                                        {"_streamA20", {{"LING_MOE_STREAM_WARPS_A", "20"}, {nullptr, nullptr}}},
                                        {"_q8downreg", {{"LING_MOE_Q8", "2"}, {"LING_MOE_DOWN_LANE", "0"}}},
                                        {"_fp32dec", {{"LING_MOE_Q8", "0"}, {"LING_MOE_STREAM", "0"}}}};
  for (MoeVariant const& v : variants) {
    for (int part = 0; part < 3; ++part) {
      static char const* const names[] = {"moe_step_8of512_mxfp4+shared_fp8", "moe_gate_up_8of512_mxfp4+shared",
                                          "moe_down_8of512_mxfp4+shared"};
      static std::deque<std::string> kept;  // reg keeps the name's pointer
      kept.push_back(std::string(names[part]) + v.suffix);
      reg(kept.back().c_str(), [part, &v](benchmark::State& s) {
        for (auto const& kv : v.env)
          if (kv[0]) setenv(kv[0], kv[1], 1);
        BM_MoeStep<Mxfp4, Fp8Block>(s, 4, 40, part == 1, part == 2);
        for (auto const& kv : v.env)
          if (kv[0]) unsetenv(kv[0]);
      });
    }
  }
  reg("moe_step_8of512_fp8+shared_fp8", [](benchmark::State& s) { BM_MoeStep<Fp8Block, Fp8Block>(s, 2, 40, false, false); });
  reg("lm_head_[157184,2560]_fp8row_argmax", [](benchmark::State& s) { BM_LmHead<Fp8Row>(s); });
  reg("lm_head_[157184,2560]_bf16_argmax", [](benchmark::State& s) { BM_LmHead<Bf16>(s); });
  reg("read_bandwidth_4GiB", [](benchmark::State& s) { BM_ReadBandwidth(s); });

  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
