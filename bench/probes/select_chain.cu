// Probe: how long does MoE launch A's expert selection take by itself, warm, and how long are the steps it is made of?
// (docs/performance.md, session 28: launch A's selection took ~2.6 µs after its grid barrier, and a second pass over
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
using ling::cuda::kRouterMaxExperts;

enum Mode { kCand, kTwoPass, kBar, kShfl, kRedux, kBallot, kMatch, kLds, kMarked, kModes };
char const* const kNames[kModes] = {"candidates (router_select_fast)",
                                    "two-pass (router_select_block)",
                                    "__syncthreads, 512 threads",
                                    "shfl",
                                    "redux.max",
                                    "ballot",
                                    "match.any",
                                    "dependent shared load",
                                    "candidates with marks (below)"};

// Thread 0's clock after `dep` is computed (the asm takes it as an input, so the compiler cannot move the read before
// the value's chain).
__device__ __forceinline__ long long mark_after(std::uint32_t dep) {
  long long t;
  asm volatile("{\n\t.reg .u32 d;\n\tmov.u32 d, %1;\n\tmov.u64 %0, %%clock64;\n\t}" : "=l"(t) : "r"(dep) : "memory");
  return t;
}
inline constexpr int kMarks = 11;
char const* const kMarkNames[kMarks] = {"score (sigmoid, bias, key)",
                                        "chunk top-2 (two redux, ballot, store)",
                                        "block barrier 1",
                                        "group top-2 (shared loads)",
                                        "kept groups (8 shfl, ballot)",
                                        "threshold (redux.min), candidate ballot",
                                        "append (shared atomic, shfl, stores)",
                                        "block barrier 2",
                                        "warp 0 ranks (16 loads, compares, stores)",
                                        "block barrier 3",
                                        "weights (router_write_picks)"};

__device__ __forceinline__ void put(long long* mk, int i, long long t) {
  if (threadIdx.x == 0) mk[i] = t;
}

// router_select_cand followed by router_select_fast's weights, the same steps with thread 0's clock read after each
// (the default's code, copied here for the marks only; Ling's shape, where the candidate path applies).
__device__ void cand_marked(RouteSel const& a, RouteAhead const& ra, int* out_idx, float* out_w, long long* mk) {
  __shared__ __align__(16) uint2 s_top2[kRouterMaxExperts / 32];
  __shared__ __align__(16) unsigned long long s_ckey[32];
  __shared__ float s_cs[32];
  __shared__ int s_n;
  int const e = int(threadIdx.x), lane = e & 31, warp = e >> 5;
  int const nh = (a.experts / a.n_group) >> 5;
  put(mk, 0, clock64());
  float const s = router_score(ra.l[0]), v = s + ra.b[0];
  std::uint32_t const key = ordered_bits(v);
  put(mk, 1, mark_after(key));
  router_chunk_top2(v, s_top2[warp]);
  if (e == 0) s_n = 0;
  put(mk, 2, mark_after(s_top2[0].x));
  __syncthreads();
  put(mk, 3, clock64());
  uint2 const t = router_group_top2(a, s_top2, nh);
  put(mk, 4, mark_after(t.x ^ t.y));
  unsigned const keep = router_keep_groups(a, t);
  put(mk, 5, mark_after(keep));
  std::uint32_t const thr = __reduce_min_sync(0xffffffffu, ((keep >> lane) & 1u) ? t.y : 0xFFFFFFFFu);
  bool const cand = ((keep >> (warp / nh)) & 1u) && key >= thr;
  unsigned const bal = __ballot_sync(0xffffffffu, cand);
  put(mk, 6, mark_after(bal));
  if (bal != 0u) {
    int const lead = __ffs(bal) - 1;
    int base = 0;
    if (lane == lead) base = atomicAdd(&s_n, __popc(bal));
    base = __shfl_sync(0xffffffffu, base, lead);
    int const slot = base + __popc(bal & ((1u << lane) - 1u));
    if (cand && slot < 32) {
      s_ckey[slot] = (static_cast<unsigned long long>(key) << 32) | (0xFFFFFFFFu - std::uint32_t(e));
      s_cs[slot] = s;
    }
  }
  put(mk, 7, clock64());
  __syncthreads();
  put(mk, 8, clock64());
  int const n = s_n;
  if (warp == 0 && n <= 32 && n >= a.top_k) {
    unsigned long long const ck = lane < n ? s_ckey[lane] : 0ull;
    float const cs = lane < n ? s_cs[lane] : 0.f;
    ulonglong2 const* const k2 = reinterpret_cast<ulonglong2 const*>(s_ckey);
    std::uint32_t gt = 0u;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      ulonglong2 const w = k2[i];
      gt |= (std::uint32_t(w.x > ck) << (2 * i)) | (std::uint32_t(w.y > ck) << (2 * i + 1));
    }
    int const r = __popc(gt & (n == 32 ? 0xFFFFFFFFu : (1u << n) - 1u));
    if (lane < n && r < a.top_k) {
      out_idx[r] = int(0xFFFFFFFFu - std::uint32_t(ck & 0xFFFFFFFFu));
      s_cs[r] = cs;  // (the default writes a separate array; here the ranks overwrite the candidates' scores)
    }
    put(mk, 9, mark_after(gt));
  }
  __syncthreads();
  put(mk, 10, clock64());
  if (threadIdx.x < 32) {
    int const chosen = lane < a.top_k ? out_idx[lane] : 0;
    float const w = lane < a.top_k ? s_cs[lane] : 0.f;
    router_write_picks(a, chosen, w, s_cs, nullptr, out_w, nullptr, nullptr);
    put(mk, 11, mark_after(__float_as_uint(lane < a.top_k ? out_w[lane] : 0.f)));
  }
}

__global__ void __launch_bounds__(512, 1)
    chain_kernel(RouteSel a, int iters, int mode, long long* cycles, int* picks, long long* marks) {
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
    } else if (mode == kMarked) {
      __shared__ long long mk[kMarks + 1];
      cand_marked(a, ra, s_idx, s_w, mk);
      __syncthreads();
      if (threadIdx.x == 0 && it >= 2)
        for (int i = 0; i < kMarks; ++i) marks[std::int64_t(blockIdx.x) * kMarks + i] += mk[i + 1] - mk[i];
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
  long long* dmarks = nullptr;
  CK(cudaMalloc(&dmarks, std::size_t(blocks) * kMarks * sizeof(long long)));
  CK(cudaMemset(dmarks, 0, std::size_t(blocks) * kMarks * sizeof(long long)));
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
    chain_kernel<<<blocks, E, 2 * E * sizeof(float)>>>(a, iters, m, dcyc, dpicks, dmarks);
    CK(cudaDeviceSynchronize());
    std::vector<long long> c(blocks);
    CK(cudaMemcpy(c.data(), dcyc, blocks * sizeof(long long), cudaMemcpyDeviceToHost));
    double mean = 0;
    for (long long x : c) mean += double(x) / blocks;
    std::printf("  %-34s %7.0f cycles  %6.0f ns%s\n", kNames[m], mean, mean * 1e6 / clk, m >= kBar ? "  (16 ops)" : "");
  }
  {  // the marked pass's steps: thread 0's clock between marks, mean over the blocks and repetitions
    std::vector<long long> mk(std::size_t(blocks) * kMarks);
    CK(cudaMemcpy(mk.data(), dmarks, mk.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    std::printf("candidates, step by step (thread 0's clock; the marks themselves add a few cycles each):\n");
    double total = 0;
    for (int i = 0; i < kMarks; ++i) {
      double mean = 0;
      for (int b = 0; b < blocks; ++b)
        mean += double(mk[std::size_t(b) * kMarks + std::size_t(i)]) / (iters - 2) / blocks;
      total += mean;
      std::printf("  %-44s %6.0f cycles\n", kMarkNames[i], mean);
    }
    std::printf("  %-44s %6.0f cycles\n", "sum", total);
  }
  int differ = 0;
  for (int t = 0; t < 40; ++t) {
    upload(t);
    int got[2][16];
    for (int m = 0; m < 2; ++m) {
      CK(cudaMemset(dpicks, 0xFF, 16 * sizeof(int)));
      chain_kernel<<<1, E, 2 * E * sizeof(float)>>>(a, 3, m, dcyc, dpicks, dmarks);
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(got[m], dpicks, sizeof got[m], cudaMemcpyDeviceToHost));
    }
    differ += std::memcmp(got[0], got[1], sizeof got[0]) != 0;
  }
  std::printf("picks and weights of the two paths differ on %d of 40 inputs\n", differ);
  return differ == 0 ? 0 : 1;
}
