// Kernel benchmarks of the CUDA model (Google Benchmark, manual time from CUDA events): the fused KDA decode step at
// Ling's shape (H = 32, K = V = 128: bytes = fp32 state read + write, conv ring, inputs) and the MLA absorbed decode
// (prepare + split-context attention + combine + W_UV) at contexts 4096 / 32768 / 131072, and at 1 / 33 / 64 tokens
// the chain against its one-launch form (MlaDecodeArgs::kernel 7) (bytes = latent cache rows read + kv_b). Counters: GB/s and the fraction of the streaming-read bandwidth measured in the same process.
// The same weights every launch: kv_b (4 MB) stays in L2, so the MLA rows time the chain's latency and arithmetic
// more than its DRAM reads.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <vector>

#include "ling/cuda/bandwidth.cuh"
#include "ling/cuda/kda.cuh"
#include "ling/cuda/mla.cuh"
#include "ling/cuda/random_weights.cuh"

namespace {
using namespace ling::cuda;

double read_bw() {
  static double bw = measure_read_bandwidth<16>(std::size_t(4) << 30, 5).gb_per_s * 1e9;
  return bw;
}

// `inner` launches captured once as a CUDA graph (PDL edges as in the model's step) and replayed: eager launches
// timed the host instead (session 39: the MLA chain's 20 launches took 438 µs of CPU for 21.5 µs of manual time, the
// one-launch form 342 µs for 16.8, so both rows were the launch rate). launch(stream) enqueues one call.
template <class F>
void time_loop(benchmark::State& st, double bytes, F&& launch) {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "bench stream");
  for (int i = 0; i < 3; ++i) launch(s);
  check(cudaStreamSynchronize(s), "bench warm-up");
  int const inner = 20;
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), "bench capture");
  for (int i = 0; i < inner; ++i) launch(s);
  check(cudaStreamEndCapture(s, &g), "bench capture");
  check(cudaGraphInstantiate(&ge, g, 0), "bench graph");
  check(cudaGraphLaunch(ge, s), "bench graph warm-up");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (auto _ : st) {
    cudaEventRecord(e0, s);
    cudaGraphLaunch(ge, s);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    st.SetIterationTime(double(ms) * 1e-3 / inner);
  }
  check(cudaGetLastError(), "bench");
  st.counters["GB/s"] = benchmark::Counter(bytes * st.iterations(), benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  st.counters["bytes"] = bytes;
  st.counters["read_bw_GB/s"] = read_bw() / 1e9;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

void BM_KdaStep(benchmark::State& st) {
  int const H = 32, K = 128, P = H * K, kc = 4;
  DeviceBuffer in(std::size_t(6) * P * 4), conv(std::size_t(3) * P * kc * 4), alog(H * 4), dt(P * 4), ring(std::size_t(kc) * 3 * P * 4),
      state(std::size_t(H) * K * K * 4), out(P * 4), pos(4);
  rnd::fill_vector(in.data<float>(), 6 * P, 1, 0.f, 1.f);
  rnd::fill_vector(conv.data<float>(), 3 * P * kc, 2, 0.f, 0.4f);
  rnd::fill_vector(alog.data<float>(), H, 3, 0.f, 0.f, true);
  rnd::fill_vector(dt.data<float>(), P, 4, 0.f, 0.5f);
  rnd::fill_vector(ring.data<float>(), kc * 3 * P, 5, 0.f, 1.f);
  rnd::fill_vector(state.data<float>(), H * K * K, 6, 0.f, 0.05f);
  std::int32_t p = 1000;
  pos.upload(&p, 4);
  KdaStepArgs a;
  a.heads = H, a.head_dim = K, a.conv_kernel = kc;
  float* x = in.data<float>();
  a.x_q = x, a.x_k = x + P, a.x_v = x + 2 * P, a.f = x + 3 * P, a.b = x + 5 * P;
  a.conv_w = conv.data<float>(), a.a_log = alog.data<float>(), a.dt_bias = dt.data<float>();
  a.ring = ring.data<float>(), a.state = state.data<float>(), a.o = out.data<float>(), a.position = pos.data<std::int32_t>();
  double bytes = 2.0 * H * K * K * 4 + 4.0 * (5 * P + H) + 4.0 * 3 * P * kc + 4.0 * (3 * 3 * P + 3 * P) + 4.0 * P;
  time_loop(st, bytes, [&](cudaStream_t s) { kda_step(a, s); });
}

void BM_MlaDecode(benchmark::State& st) {
  std::int64_t const ctx = st.range(0);
  MlaDims d{32, 128, 64, 128, 512, true, 6e6, 1e-6f};
  int const L = d.latent(), H = d.heads;
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  std::int64_t kvb_rows = std::int64_t(H) * (d.nope + d.v);
  DeviceBuffer kvb_w(std::size_t(kvb_rows) * d.rank), kvb_s(std::size_t((kvb_rows + 127) / 128) * ((d.rank + 127) / 128) * 4);
  ModelMatrix kvb{MatFormat::kFp8Block, kvb_w.data(), kvb_s.data(), kvb_rows, d.rank};
  rnd::fill_matrix(kvb, 7, 0.05f);
  DeviceBuffer cache(std::size_t(ctx + 1) * L * 2), q(std::size_t(H) * d.qk() * 4), kva(std::size_t(L) * 4), kvn(std::size_t(d.rank) * 4),
      gate(std::size_t(H) * 4), qhat(std::size_t(H) * L * 4), po(std::size_t(sms) * H * d.rank * 4), pml(std::size_t(sms) * H * 8),
      olat(std::size_t(H) * d.rank * 4), out(std::size_t(H) * d.v * 4), pos(4);
  rnd::fill_bf16_values(cache.data<std::uint16_t>(), (ctx + 1) * L, 8, 1.f);
  rnd::fill_vector(q.data<float>(), H * d.qk(), 9, 0.f, 1.f);
  rnd::fill_vector(kva.data<float>(), L, 10, 0.f, 1.f);
  rnd::fill_vector(kvn.data<float>(), d.rank, 11, 1.f, 0.1f);
  rnd::fill_vector(gate.data<float>(), H, 12, 0.f, 1.f);
  std::int32_t p = std::int32_t(ctx);
  pos.upload(&p, 4);
  MlaDecodeArgs a;
  a.d = d, a.q = q.data<float>(), a.kv_a = kva.data<float>(), a.kv_norm = kvn.data<float>(), a.kv_b = kvb;
  a.cache = cache.data<std::uint16_t>(), a.max_ctx = ctx + 1, a.position = pos.data<std::int32_t>();
  a.q_hat = qhat.data<float>(), a.splits = sms, a.part_o = po.data<float>(), a.part_ml = pml.data<float>(), a.o_lat = olat.data<float>();
  a.kernel = int(st.range(1));  // 0 automatic, 1 CUDA cores, 2 tensor cores, 7 the whole chain in one launch (≤ 64 tokens)
  double bytes = double(ctx + 1) * L * 2 + double(kvb.bytes());
  time_loop(st, bytes, [&](cudaStream_t s) { mla_decode(a, gate.data<float>(), 1, out.data<float>(), s); });
  if (a.kernel == kMlaShortClusterKernel) {
    // clusters of 4 blocks resident at once (the launch has 32): fewer means a second wave
    auto const k = mla_short_cluster_kernel<MatFormat::kFp8Block>;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(H * kMlaCluster));
    cfg.blockDim = dim3(unsigned(kMlaClusterThreads));
    cfg.dynamicSmemBytes = mla_short_cluster_smem(d, 16);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kMlaCluster, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int n = 0;
    check(cudaOccupancyMaxActiveClusters(&n, k, &cfg), "max active clusters");
    st.counters["max_clusters"] = n;
  }
}

BENCHMARK(BM_KdaStep)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MlaDecode)
    ->ArgsProduct({{4096, 32768, 131072}, {1, 2}})
    ->ArgNames({"ctx", "kernel"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
// short contexts: the automatic chain (four launches) against the chain in one launch (mla_short_kernel) and its
// cluster form (mla_short_cluster_kernel)
BENCHMARK(BM_MlaDecode)
    ->ArgsProduct({{0, 32, 63}, {0, kMlaShortKernel, kMlaShortClusterKernel}})
    ->ArgNames({"ctx", "kernel"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
