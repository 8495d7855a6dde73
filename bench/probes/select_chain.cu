// Probe: how long does MoE launch A's expert selection take by itself, warm, and how long are the steps it is made of?
// (docs/perf-log.md, session 28: launch A's selection took ~2.6 µs after its grid barrier, and a second pass over
// the same code, warm, took ~2.4 µs, so its time is its chain, not instruction fetch.)
//
// One block of 512 threads per SM (Ling's shape: 512 experts in 8 groups of 64, 4 groups kept, top-8, bias, scores
// normalized), the logits in registers before the clock starts, as launch A has them after its grid barrier:
//   candidates   router_select_fast (the default: router_select_cand, its fallback beyond 32 candidates)
//   two-pass     router_select_block's ranked path (session 27's default; now the fallback)
// each timed with clock64 over 50 warm repetitions (the weights included: block 0 of launch A writes them), then the
// latency of the warp collectives and block barrier the chains are made of (16 dependent ones each). Then the two
// paths' picks and weights are compared, bit for bit, on 40 inputs: random, equal scores across and inside groups
// (the candidate path's tie-break) and three values only (its fallback).
// Built as the target select_chain (CUDA builds). It runs in a second; it needs no model.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "ling/cuda/router.cuh"
#include "probe_util.cuh"

namespace {

using namespace ling::cuda::kernels;

enum Mode { kCand, kTwoPass, kBar, kShfl, kRedux, kBallot, kMatch, kLds, kModes };
char const* const kNames[kModes] = {"candidates (router_select_fast)", "two-pass (router_select_block)",
                                    "__syncthreads, 512 threads", "shfl", "redux.max", "ballot", "match.any",
                                    "dependent shared load"};

__global__ void __launch_bounds__(512, 1) chain_kernel(RouteSel a, int iters, int mode, long long* cycles, int* picks) {
  extern __shared__ float4 smem_f4[];
  float* const scratch = reinterpret_cast<float*>(smem_f4);
  __shared__ int s_idx[32];
  __shared__ float s_w[32];
  RouteAhead ra;
  route_ahead_bias(a, ra);
  route_ahead_logits(a, ra);
  long long sum = 0;
  unsigned v = threadIdx.x * 2654435761u;
  for (int it = 0; it < iters; ++it) {
    __syncthreads();
    long long const t0 = clock64();
    if (mode == kCand) {
      router_select_fast(a, ra, true, scratch, s_idx, s_w, nullptr, nullptr);
      __syncthreads();
    } else if (mode == kTwoPass) {
      router_select_block(a, scratch, scratch + a.experts, s_idx, s_w, ra, true);
      __syncthreads();
    } else if (mode == kBar) {
#pragma unroll
      for (int i = 0; i < 16; ++i) __syncthreads();
    } else if (mode == kShfl) {
#pragma unroll
      for (int i = 0; i < 16; ++i) v = __shfl_sync(0xffffffffu, v, (v + 1) & 31);
    } else if (mode == kRedux) {
#pragma unroll
      for (int i = 0; i < 16; ++i) v = __reduce_max_sync(0xffffffffu, v) ^ threadIdx.x;
    } else if (mode == kBallot) {
#pragma unroll
      for (int i = 0; i < 16; ++i) v = __ballot_sync(0xffffffffu, v & 1u) + v;
    } else if (mode == kMatch) {
#pragma unroll
      for (int i = 0; i < 16; ++i) v = __match_any_sync(0xffffffffu, v & 7u) + v;
    } else {
      unsigned* const s = reinterpret_cast<unsigned*>(scratch);
      s[threadIdx.x] = (threadIdx.x + 1) & 511u;
      __syncwarp();
#pragma unroll
      for (int i = 0; i < 16; ++i) v = s[v & 511u];
    }
    long long const t1 = clock64();
    if (it >= 2) sum += t1 - t0;
  }
  if (threadIdx.x == 0) cycles[blockIdx.x] = sum / (iters - 2) + (v == 0x9E3779B9u);  // v kept alive
  if (blockIdx.x == 0 && threadIdx.x < 8) {
    picks[threadIdx.x] = s_idx[threadIdx.x];
    std::memcpy(&picks[8 + threadIdx.x], &s_w[threadIdx.x], 4);
  }
}

}  // namespace

int main() {
  int const E = 512, blocks = 132, iters = 52;
  int sms = 0, clk = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
  float *dl = nullptr, *db = nullptr;
  long long* dcyc = nullptr;
  int* dpicks = nullptr;
  CK(cudaMalloc(&dl, E * sizeof(float)));
  CK(cudaMalloc(&db, E * sizeof(float)));
  CK(cudaMalloc(&dcyc, blocks * sizeof(long long)));
  CK(cudaMalloc(&dpicks, 16 * sizeof(int)));
  CK(cudaFuncSetAttribute(chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * E * int(sizeof(float))));
  RouteSel a;
  a.logits = dl;
  a.bias = db;
  a.experts = E;
  a.top_k = 8;
  a.n_group = 8;
  a.topk_group = 4;
  a.norm_topk_prob = 1;
  a.routed_scaling = 2.5f;
  auto upload = [&](int t) {  // input t: random; t % 4 == 1 rounded to halves; 2: three values; t >= 20, t % 4 == 0: equal pairs
    std::mt19937 rng(100u + unsigned(t));
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> l(E), b(E);
    for (int e = 0; e < E; ++e) {
      float x = nd(rng);
      if (t % 4 == 1) x = float(int(x * 2.f)) / 2.f;
      if (t % 4 == 2) x = float(rng() % 3u);
      l[std::size_t(e)] = x;
      b[std::size_t(e)] = t % 4 >= 2 ? 0.f : 0.05f * nd(rng);
    }
    if (t % 4 == 0 && t >= 20) {
      for (int i = 0; i < 64; ++i) l[std::size_t(64 + i)] = l[std::size_t(i)], b[std::size_t(64 + i)] = b[std::size_t(i)];
      for (int i = 0; i < 64; i += 2) l[std::size_t(129 + i)] = l[std::size_t(128 + i)], b[std::size_t(129 + i)] = b[std::size_t(128 + i)];
    }
    CK(cudaMemcpy(dl, l.data(), E * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, b.data(), E * sizeof(float), cudaMemcpyHostToDevice));
  };
  upload(0);
  std::printf("select_chain: %d SMs at %d MHz; cycles per call (or per 16 dependent ops), mean over %d blocks\n", sms,
              clk / 1000, blocks);
  for (int m = 0; m < kModes; ++m) {
    chain_kernel<<<blocks, E, 2 * E * sizeof(float)>>>(a, iters, m, dcyc, dpicks);
    CK(cudaDeviceSynchronize());
    std::vector<long long> c(blocks);
    CK(cudaMemcpy(c.data(), dcyc, blocks * sizeof(long long), cudaMemcpyDeviceToHost));
    double mean = 0;
    for (long long x : c) mean += double(x) / blocks;
    std::printf("  %-34s %7.0f cycles  %6.0f ns%s\n", kNames[m], mean, mean * 1e6 / clk, m >= kBar ? "  (16 ops)" : "");
  }
  int differ = 0;
  for (int t = 0; t < 40; ++t) {
    upload(t);
    int got[2][16];
    for (int m = 0; m < 2; ++m) {
      CK(cudaMemset(dpicks, 0xFF, 16 * sizeof(int)));
      chain_kernel<<<1, E, 2 * E * sizeof(float)>>>(a, 3, m, dcyc, dpicks);
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(got[m], dpicks, sizeof got[m], cudaMemcpyDeviceToHost));
    }
    differ += std::memcmp(got[0], got[1], sizeof got[0]) != 0;
  }
  std::printf("picks and weights of the two paths differ on %d of 40 inputs\n", differ);
  return differ == 0 ? 0 : 1;
}
