#pragma once
// Router kernel (declarations in router.hpp; spec §2 "MoE FFN"). nvcc only.
// All blocks compute logits (one row per warp task); the last block to finish (a counter after a fence) does the
// grouped top-k selection in shared memory and re-arms the counter for the next launch. Without a counter the launch
// stops at the logits: MoE launch A then selects (router_select_fast in every block; fused routing).
#include <cuda_runtime.h>

#include "ling/cuda/linear.cuh"
#include "ling/cuda/router.hpp"

namespace ling::cuda::kernels {

struct RouterArgs {
  MatrixArgs w;
  float const* bias;
  float* logits;
  unsigned int* counter;
  int* idx;
  float* weights;
  int top_k, n_group, topk_group;
  float routed_scaling;
  int norm_topk_prob;
  unsigned long long* trace = nullptr;  // step timeline region (measurements), or null
};

// What the grouped top-k selection reads: the E router logits (complete in global memory) and the config.
struct RouteSel {
  float const* logits = nullptr;  // null: no selection here (the ids come from elsewhere)
  float const* bias = nullptr;
  int experts = 0, top_k = 0, n_group = 1, topk_group = 1, norm_topk_prob = 0;
  float routed_scaling = 1.f;
  int ranked = 1;  // 0: the ranked path is not taken (LING_ROUTER_RANKED=0 in the model: A/B measurements)
};

// The selection's first inputs in registers, loaded ahead of the caller's other prologue work (MoE launch A: the
// biases before its PDL wait, the logits right after it, both in flight while the input is staged), so that the
// selection does not start with another L2 round trip: thread i holds experts i + k · blockDim.x, k < kRouteAhead.
inline constexpr int kRouteAhead = 2;
struct RouteAhead {
  float l[kRouteAhead], b[kRouteAhead];
};
__device__ __forceinline__ void route_ahead_bias(RouteSel const& a, RouteAhead& r) {
#pragma unroll
  for (int k = 0; k < kRouteAhead; ++k) {
    int const e = int(threadIdx.x) + k * int(blockDim.x);
    r.b[k] = a.bias && e < a.experts ? a.bias[e] : 0.f;
  }
}
__device__ __forceinline__ void route_ahead_logits(RouteSel const& a, RouteAhead& r) {
#pragma unroll
  for (int k = 0; k < kRouteAhead; ++k) {
    int const e = int(threadIdx.x) + k * int(blockDim.x);
    r.l[k] = e < a.experts ? __ldcg(a.logits + e) : 0.f;  // written by the router launch: bypass L1
  }
}

// An expert's score from its router logit, as the CPU router computes it (the value of linear.cuh's gate_sigmoid;
// kept as a division, the form every selection path was measured with).
__device__ __forceinline__ float router_score(float l) { return 1.0f / (1.0f + expf(-l)); }

// Lane k < top_k of the calling warp holds pick k (id chosen, weight w); s_w[k] is w_k for every k < top_k (shared
// memory): writes the pick and its weight. The weight sum is added in pick order, as the CPU adds them (sum += w_0,
// sum += w_1, ...); the eight loads of a step are issued before its eight adds, so the chain is one load latency and
// the adds, not a shuffle latency per pick.
__device__ __forceinline__ void router_write_picks(RouteSel const& a, int chosen, float w, float const* s_w,
                                                   int* out_idx, float* out_w, int* out_idx2, float* out_w2) {
  int const lane = threadIdx.x & 31;
  float sum = 0.f;
#pragma unroll 1
  for (int k0 = 0; k0 < a.top_k; k0 += 8) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = k0 + i < a.top_k ? s_w[k0 + i] : 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (k0 + i < a.top_k) sum += v[i];
  }
  if (lane < a.top_k) {
    float const wk = (a.norm_topk_prob ? w / (sum + 1e-20f) : w) * a.routed_scaling;
    if (out_idx) out_idx[lane] = chosen;  // null: written already (router_select_cand)
    if (out_w) out_w[lane] = wk;
    if (out_idx2) {
      out_idx2[lane] = chosen;
      out_w2[lane] = wk;
    }
  }
}

// The top-k of the selection by one warp, from the block's biased scores (s_sel, dropped groups at -inf): lane k
// returns pick k (router_write_picks writes them). The shapes outside the two-stage path take this one:
// each round every lane scans its experts (l, l + 32, ...) in shared memory, skipping the ones it already gave away
// (a bit per expert in a register), and one warp max picks the winner. A loop, not register arrays unrolled per
// expert count: MoE launch A inlines the selection in every block, and its code size is what the launch waits on
// (ncu: instruction-fetch stalls), while this path's few hundred shared loads do not matter.
static_assert(kRouterMaxExperts <= 32 * 32, "router_topk_warp keeps one 32-bit mask of taken experts per lane");
__device__ __forceinline__ int router_topk_warp(RouteSel const& a, float const* s_sel) {
  int const E = a.experts, lane = threadIdx.x & 31;
  int const per = (E + 31) / 32;
  unsigned taken = 0u;
  int chosen = 0;
#pragma unroll 1
  for (int k = 0; k < a.top_k; ++k) {
    unsigned long long best = 0ull;
    int bi = -1;
#pragma unroll 1
    for (int i = 0; i < per; ++i) {
      int const e = i * 32 + lane;
      if (e < E && !((taken >> i) & 1u)) {
        unsigned long long const key = argmax_key(s_sel[e], e);  // > 0 for every expert (the id is in the low bits)
        if (key > best) {
          best = key;
          bi = i;
        }
      }
    }
    unsigned long long const win = warp_max_u64_fast(best);
    if (bi >= 0 && best == win) taken |= 1u << bi;  // keys are unique: one lane owns the winner
    if (lane == k) chosen = int(0xFFFFFFFFu - std::uint32_t(win & 0xFFFFFFFFu));
  }
  return chosen;
}

// Two-stage top-k of the grouped selection, stage 2 (one warp; lane k returns pick k): lane l holds candidate key l
// (0: none) of the kept groups' own top-k lists; the top_k rounds are one warp max each.
__device__ __forceinline__ int router_topk_merge(RouteSel const& a, unsigned long long key) {
  int const lane = threadIdx.x & 31;
  int chosen = 0;
#pragma unroll 1
  for (int k = 0; k < a.top_k; ++k) {
    unsigned long long const best = warp_max_u64_fast(key);
    if (key == best) key = 0ull;
    if (lane == k) chosen = int(0xFFFFFFFFu - std::uint32_t(best & 0xFFFFFFFFu));
  }
  return chosen;
}

// The ranked path (router_select_block: groups of 32 or 64 experts, at most 32 candidates) finds the picks by counting,
// not by rounds of warp maxima: an expert's rank is the number of keys larger than its own (ordered bits of the biased
// score; equal bits: the lower id is larger, as in argmax_key), and keys are unique, so rank k is pick k. The counts
// read the 32 keys they compare with by broadcast loads, all issued at once; a warp's dependent chain is a load and
// its compares instead of top_k rounds of two dependent redux.sync each.

// Inverse of ordered_bits.
__device__ __forceinline__ float ordered_float(std::uint32_t u) {
  return __uint_as_float((u & 0x80000000u) ? (u & 0x7FFFFFFFu) : ~u);
}

// Ranked path, first pass (all lanes of a warp; v: the biased scores of the 32 consecutive experts of one chunk, which
// lie in one group): the chunk's two largest as ordered bits (the second equal to the first when the maximum occurs
// twice), NaN counted as -inf, which gives the group score of the scan in the other paths (its comparisons skip NaN).
__device__ __forceinline__ void router_chunk_top2(float v, uint2& out) {
  std::uint32_t const q = ordered_bits(v != v ? __uint_as_float(0xFF800000u) : v);
  std::uint32_t const m1 = __reduce_max_sync(0xffffffffu, q);
  std::uint32_t const at = __ballot_sync(0xffffffffu, q == m1);
  std::uint32_t const m2 = __reduce_max_sync(0xffffffffu, q == m1 ? 0u : q);  // every q is above 0 (-inf's bits)
  if ((threadIdx.x & 31) == 0) out = make_uint2(m1, (at & (at - 1u)) ? m1 : m2);
}

// Ranked path: bit j of gt is keys[j] > ua, bit j of ge is keys[j] >= ub, for the 32 keys at keys (shared memory,
// 16-byte aligned; every lane reads the same ones). Bit masks, one after the other, let the compiler pack seven
// compare predicates at a time into a register (P2R) instead of adding each one.
__device__ __forceinline__ void router_rank_masks(std::uint32_t const* keys, std::uint32_t ua, std::uint32_t ub,
                                                  std::uint32_t& gt, std::uint32_t& ge) {
  uint4 const* const k4 = reinterpret_cast<uint4 const*>(keys);
  std::uint32_t k[32];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    uint4 const v = k4[i];
    k[4 * i] = v.x;
    k[4 * i + 1] = v.y;
    k[4 * i + 2] = v.z;
    k[4 * i + 3] = v.w;
  }
  gt = 0u;
  ge = 0u;
#pragma unroll
  for (int j = 0; j < 32; ++j) gt |= std::uint32_t(k[j] > ua) << j;
#pragma unroll
  for (int j = 0; j < 32; ++j) ge |= std::uint32_t(k[j] >= ub) << j;
}

// Ranked paths (all lanes of a warp; n_group <= 32). router_group_top2: lane g < n_group gets group g's two largest
// biased scores (ordered bits, NaN as -inf) merged from its nh chunks' (top2, router_chunk_top2); other lanes get
// ~0u twice. router_keep_groups: the kept groups as a bit mask: lane g scores group g as b1 + b2, ranks it among the
// others by shuffles (ties: lower index) and a ballot keeps the topk_group best.
__device__ __forceinline__ uint2 router_group_top2(RouteSel const& a, uint2 const* top2, int nh) {
  int const lane = threadIdx.x & 31;
  uint2 t = make_uint2(0xFFFFFFFFu, 0xFFFFFFFFu);
  if (lane < a.n_group) {
    t = top2[lane * nh];
    if (nh == 2) {
      uint2 const o = top2[lane * 2 + 1];
      t = make_uint2(umax(t.x, o.x), umax(umin(t.x, o.x), umax(t.y, o.y)));
    }
  }
  return t;
}
__device__ __forceinline__ unsigned router_keep_groups(RouteSel const& a, uint2 t) {
  int const lane = threadIdx.x & 31;
  float const v = lane < a.n_group ? ordered_float(t.x) + ordered_float(t.y) : 0.f;
  int rank = 0;
#pragma unroll 1
  for (int o0 = 0; o0 < a.n_group; o0 += 8) {  // the eight shuffles before their compares
    float w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = __shfl_sync(0xffffffffu, v, o0 + i);
    std::uint32_t better = 0u;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int const o = o0 + i;
      better |= std::uint32_t((o < a.n_group) & ((w[i] > v) | ((w[i] == v) & (o < lane)))) << i;
    }
    rank += __popc(better);
  }
  return __ballot_sync(0xffffffffu, lane < a.n_group && rank < a.topk_group);
}

// Where the candidate selection applies (router_select_cand): one expert per thread, groups of 32 or 64 experts,
// n_group <= 32, and the kept groups' two largest scores (2 · topk_group of them) at least top_k.
__host__ __device__ inline bool router_cand_fits(RouteSel const& a, int threads) {
  if (!a.ranked || a.experts != threads || threads % 32 != 0 || a.n_group <= 1 || a.n_group > 32) return false;
  if (a.topk_group >= a.n_group || a.experts % a.n_group != 0 || a.top_k < 1 || a.top_k > 2 * a.topk_group) return false;
  int const gsize = a.experts / a.n_group;
  return gsize == 32 || gsize == 64;
}

// The selection by candidates (MoE launch A; router_cand_fits(a, blockDim.x); all threads call it): thread e scores
// expert e from its logit l and bias. After one block barrier every warp finds the kept groups itself (the group
// scores from the chunks' two largest, router_keep_groups) and T, the smallest of the kept groups' two largest biased
// scores. These are 2 · topk_group >= top_k experts at T or above, so the top_k lie at T or above: the kept experts at
// T or above are the candidates, usually about top_k of them. They append themselves (a shared counter) as 64-bit
// keys (ordered bits of the biased score, then the complement of the id, as in argmax_key: unique, and equal bits
// rank the lower id first) with their scores. After a second barrier warp 0 ranks them by counting and writes pick k
// to out_idx[k] (shared or global memory) and its unnormalized score to out_s[k] (shared; top_k each); the caller
// synchronizes before reading them, and router_write_picks makes the weights (its sum runs over out_s in pick order).
// Returns false in every thread when there are more than 32 candidates (ties at T, or NaN scores) or fewer than
// top_k (negative NaN scores): nothing is written then, and the caller runs router_select_block. The same picks and
// weights as the other paths (tested against the CPU on ties and on the fallback; bench/probes/select_chain compares
// the two paths bit for bit).
// Against the ranked path of router_select_block: each kept group's top_k ranked by one warp (2 330 of its ~4 800
// cycles, H200) becomes a threshold and an append, and the weights leave the chain.
__device__ __forceinline__ bool router_select_cand(RouteSel const& a, float l, float bias, int* out_idx, float* out_s) {
  __shared__ __align__(16) uint2 s_top2[kRouterMaxExperts / 32];
  __shared__ __align__(16) unsigned long long s_ckey[32];
  __shared__ float s_cs[32];
  __shared__ int s_n;
  int const e = int(threadIdx.x), lane = e & 31, warp = e >> 5;
  int const nh = (a.experts / a.n_group) >> 5;
  float const s = router_score(l), v = s + bias;
  std::uint32_t const key = ordered_bits(v);
  router_chunk_top2(v, s_top2[warp]);
  if (e == 0) s_n = 0;
  __syncthreads();
  uint2 const t = router_group_top2(a, s_top2, nh);
  unsigned const keep = router_keep_groups(a, t);
  std::uint32_t const thr = __reduce_min_sync(0xffffffffu, ((keep >> lane) & 1u) ? t.y : 0xFFFFFFFFu);
  bool const cand = ((keep >> (warp / nh)) & 1u) && key >= thr;
  unsigned const bal = __ballot_sync(0xffffffffu, cand);
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
  __syncthreads();
  int const n = s_n;
  if (n > 32 || n < a.top_k) return false;  // n < top_k: negative NaN scores (keys below -inf's)
  if (warp == 0) {
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
      out_s[r] = cs;
    }
  }
  return true;
}

// The selection's paths other than the ranked one (router_select_block: the two-stage grouped top-k, or groups dropped
// and one warp over all experts), after the scores are in s_score and s_sel (block synchronized); the group scores,
// keep flags and candidate keys go through the caller's shared arrays. Out of line: MoE launch A inlines the
// selection in every block and at Ling's shapes only ever takes the ranked path, and unexecuted code in launch A
// measured ~0.1 ms per token (H200, session 14: instruction fetch). Ends like router_select_block.
inline __device__ __noinline__ void router_select_rest(RouteSel a, float* s_score, float* s_sel, float* s_gscore,
                                                       unsigned char* s_keep, unsigned long long* s_key, bool two,
                                                       int* out_idx, float* out_w, int* out_idx2, float* out_w2) {
  int const E = a.experts, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = int(blockDim.x >> 5);
  float const ninf = __uint_as_float(0xFF800000u);
  int const gsize = E / a.n_group;
  bool const grouped = a.n_group > 1 && a.topk_group < a.n_group;
  if (grouped) {
    // group score = sum of the two largest biased scores of the group (one warp per group)
    for (int g = warp; g < a.n_group; g += nwarps) {  // any block size (the streamed MoE has 9+ warps)
      float b1 = ninf, b2 = ninf;
      for (int i = lane; i < gsize; i += 32) {
        float v = s_sel[g * gsize + i];
        if (v > b1) { b2 = b1; b1 = v; } else if (v > b2) b2 = v;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        float o1 = __shfl_xor_sync(0xffffffffu, b1, o), o2 = __shfl_xor_sync(0xffffffffu, b2, o);
        float n1 = fmaxf(b1, o1);
        float n2 = fmaxf(fminf(b1, o1), fmaxf(b2, o2));
        b1 = n1;
        b2 = n2;
      }
      __syncwarp();
      if (lane == 0) s_gscore[g] = gsize >= 2 ? b1 + b2 : b1;
    }
    __syncthreads();
    // keep the topk_group best groups (ties: lower index): each group counts its betters
    auto rank_of = [&](int g) {
      float const v = s_gscore[g];
      int rank = 0;
      for (int o = 0; o < a.n_group; ++o) {
        float const w = s_gscore[o];
        rank += (w > v || (w == v && o < g)) ? 1 : 0;
      }
      return rank;
    };
    if (two) {
      // every warp ranks the groups itself (lane o group o; a ballot is the keep mask), so no barrier before the warps
      // take the kept groups (2 keys per lane); then warp 0 merges the topk_group · top_k candidates
      unsigned const keep = __ballot_sync(0xffffffffu, lane < a.n_group && rank_of(lane) < a.topk_group);
      for (int g = warp; g < a.n_group; g += nwarps) {
        if (!((keep >> g) & 1u)) continue;
        int const j = __popc(keep & ((1u << g) - 1u));
        int const e0 = g * gsize + lane, e1 = e0 + 32;
        unsigned long long k0 = lane < gsize ? argmax_key(s_sel[e0], e0) : 0ull;
        unsigned long long k1 = lane + 32 < gsize ? argmax_key(s_sel[e1], e1) : 0ull;
#pragma unroll 1
        for (int k = 0; k < a.top_k; ++k) {
          unsigned long long const best = warp_max_u64_fast(k0 > k1 ? k0 : k1);
          if (k0 == best) k0 = 0ull;
          if (k1 == best) k1 = 0ull;
          if (lane == k) s_key[j * a.top_k + k] = best;
        }
      }
      __syncthreads();
    } else {
      if (threadIdx.x < a.n_group) s_keep[threadIdx.x] = rank_of(int(threadIdx.x)) < a.topk_group ? 1 : 0;
      __syncthreads();
      for (int e = threadIdx.x; e < E; e += blockDim.x)
        if (!s_keep[e / gsize]) s_sel[e] = ninf;
      __syncthreads();
    }
  }
  // the top-k by warp 0 (no block barriers): the two-stage merge, or one warp over all experts; the weights in order
  // then replace the scores in s_sel
  if (warp != 0) return;
  int const chosen = two ? router_topk_merge(a, s_key[lane]) : router_topk_warp(a, s_sel);
  float const w = lane < a.top_k ? s_score[chosen] : 0.f;
  __syncwarp();  // every lane's reads of s_sel are done
  if (lane < a.top_k) s_sel[lane] = w;
  __syncwarp();
  router_write_picks(a, chosen, w, s_sel, out_idx, out_w, out_idx2, out_w2);
}

// The selection by one block (all its threads call it; it synchronizes the block): lane k of warp 0 writes pick k
// to out_idx[k] and its weight to out_w[k] (global or shared memory; the caller synchronizes before reading them).
// s_score and s_sel: the caller's shared scratch of a.experts floats each (MoE launch A lends it part of its dynamic
// shared memory, so that the selection's scratch does not cost its warps a ring stage); s_sel 16-byte aligned, or
// the selection takes the slower paths.
// out_idx2 / out_w2: a second copy of the picks (MoE launch A's block 0: global memory for launch B), or null.
__device__ __forceinline__ void router_select_block(RouteSel const& a, float* s_score, float* s_sel, int* out_idx, float* out_w,
                                                    RouteAhead const& ahead = {}, bool use_ahead = false,
                                                    int* out_idx2 = nullptr, float* out_w2 = nullptr) {
  __shared__ __align__(16) union {
    float score[kRouterMaxGroups];       // the group scores
    uint2 top2[kRouterMaxExperts / 32];  // ranked path: each 32-expert chunk's two largest biased scores (ordered bits)
  } s_group;
  __shared__ unsigned char s_keep[kRouterMaxGroups];
  __shared__ __align__(16) union {
    unsigned long long key[32];  // two-stage path: the kept groups' top-k lists (0: none)
    struct {
      std::uint32_t key[32];  // ranked path: the same lists as ordered bits (0: none) and ids
      int id[32];
    } rank;
  } s_cand;
  int const E = a.experts, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = int(blockDim.x >> 5);
  int const gsize = E / a.n_group;
  bool const grouped = a.n_group > 1 && a.topk_group < a.n_group;
  // ranked path: a group is one or two 32-expert chunks, which the first pass's warps cover whole; s_sel holds keys
  bool const ranked = a.ranked && grouped && (gsize == 32 || gsize == 64) && a.topk_group * a.top_k <= 32 &&
                      (blockDim.x & 31u) == 0 && (reinterpret_cast<std::uintptr_t>(s_sel) & 15u) == 0;
  // two-stage top-k (the same picks, in the same order: the overall top_k lie in the kept groups' own top_k lists)
  bool const two = !ranked && grouped && gsize <= 64 && a.topk_group * a.top_k <= 32 && a.n_group <= 32;
  auto put = [&](int e, float l, float bias) {
    float const s = router_score(l), v = s + bias;
    s_score[e] = s;
    if (ranked) {
      reinterpret_cast<std::uint32_t*>(s_sel)[e] = ordered_bits(v);
      router_chunk_top2(v, s_group.top2[e >> 5]);  // the warp's 32 experts: e's chunk (E, blockDim multiples of 32)
    } else {
      s_sel[e] = v;
    }
  };
  int e0 = threadIdx.x;
  if (use_ahead) {
#pragma unroll
    for (int k = 0; k < kRouteAhead; ++k) {
      int const e = int(threadIdx.x) + k * int(blockDim.x);
      if (e < E) put(e, ahead.l[k], ahead.b[k]);
    }
    e0 += kRouteAhead * int(blockDim.x);
  }
  for (int e = e0; e < E; e += blockDim.x) put(e, __ldcg(a.logits + e), a.bias ? a.bias[e] : 0.f);  // written by other blocks: bypass L1
  if ((two || ranked) && threadIdx.x < 32) s_cand.key[threadIdx.x] = 0ull;
  __syncthreads();
  if (!ranked) {
    router_select_rest(a, s_score, s_sel, s_group.score, s_keep, s_cand.key, two, out_idx, out_w, out_idx2, out_w2);
    return;
  }
  std::uint32_t const below = (1u << lane) - 1u;
  int const nh = gsize >> 5;
  // warps j < topk_group: the group scores at lanes g (b1 + b2 from the group's chunks), each group's rank among
  // them (ties: lower index) by shuffles, the keep mask by a ballot; then warp j ranks the j-th kept group's experts
  if (warp < a.topk_group) {
    unsigned const keep = router_keep_groups(a, router_group_top2(a, s_group.top2, nh));
    for (int j = warp; j < a.topk_group; j += nwarps) {
      int const g = __ffs(__ballot_sync(0xffffffffu, ((keep >> lane) & 1u) && __popc(keep & below) == j)) - 1;
      // lane l ranks experts l (key ka) and 32 + l (kb) of the group against all its experts. The first chunk's
      // ids are all lower than the second's, so the keys larger than ka are the keys > ka and ka's equals in lower
      // lanes (match.any), and those larger than kb are the keys >= kb but kb itself and its equals in higher
      // lanes. The matches follow the first chunk's compares (not the key loads, which would hold back the
      // chunk's loads), so that the second chunk's hide their latency.
      std::uint32_t const* const keys = reinterpret_cast<std::uint32_t const*>(s_sel) + g * gsize;
      std::uint32_t const ka = keys[lane], kb = nh == 2 ? keys[32 + lane] : 0u;
      int ra = 0, rb = 0;
#pragma unroll 1
      for (int h = 0; h < gsize; h += 32) {
        std::uint32_t gt, ge;
        router_rank_masks(keys + h, ka, kb, gt, ge);
        if (h == 0) {
          ra += __popc(__match_any_sync(0xffffffffu, ka) & below);
          if (nh == 2) rb -= __popc(__match_any_sync(0xffffffffu, kb) & ~below);
        }
        ra += __popc(gt);
        rb += __popc(ge);
      }
      int const c0 = j * a.top_k, e = g * gsize + lane;
      if (ra < a.top_k) {
        s_cand.rank.key[c0 + ra] = ka;
        s_cand.rank.id[c0 + ra] = e;
      }
      if (nh == 2 && rb < a.top_k) {
        s_cand.rank.key[c0 + rb] = kb;
        s_cand.rank.id[c0 + rb] = e + 32;
      }
    }
  }
  __syncthreads();
  // the top-k by warp 0 (no block barriers), then the picks and their weights
  if (warp != 0) return;
  // candidate l's rank among the topk_group · top_k candidates. Equal keys of two candidates: the one in the lower
  // slot has the lower id (slots follow the group index, then the rank in the group), so the same count of greater
  // keys and lower lanes' equal keys ranks them. The picks in order go through the keys' scratch (no longer read).
  int const nc = a.topk_group * a.top_k;
  std::uint32_t const key = s_cand.rank.key[lane];
  int const id = lane < nc ? s_cand.rank.id[lane] : 0;
  float const wl = lane < nc ? s_score[id] : 0.f;
  std::uint32_t gt, ge;
  router_rank_masks(s_cand.rank.key, key, 0u, gt, ge);
  int const r = __popc(gt) + __popc(__match_any_sync(0xffffffffu, key) & below);
  int* const s_pick = reinterpret_cast<int*>(s_sel);
  float* const s_pick_w = s_sel + 32;
  if (lane < nc && r < a.top_k) {
    s_pick[r] = id;
    s_pick_w[r] = wl;
  }
  __syncwarp();
  int const chosen = lane < a.top_k ? s_pick[lane] : 0;
  float const w = lane < a.top_k ? s_pick_w[lane] : 0.f;
  router_write_picks(a, chosen, w, s_pick_w, out_idx, out_w, out_idx2, out_w2);
}

// router_select_fast's fallback, out of line (MoE launch A inlines the selection in every block; this code runs only
// when router_select_cand declines): router_select_block from the scores in registers, then a block barrier.
inline __device__ __noinline__ void router_select_fallback(RouteSel a, RouteAhead ra, bool use_ahead, float* scratch,
                                                           int* out_idx, float* out_w, int* out_idx2, float* out_w2) {
  router_select_block(a, scratch, scratch + a.experts, out_idx, out_w, ra, use_ahead, out_idx2, out_w2);
  __syncthreads();
}

// The selection as MoE launch A runs it (all threads of the block call it; scratch: 2 · a.experts floats of shared
// memory, 16-byte aligned, free until the end of the call): router_select_cand where it fits and has at most 32
// candidates, else router_select_block (out of line). At return the block is synchronized and out_idx (shared or
// global) holds the picks. The weights go to out_w and the picks and weights to out_idx2 / out_w2 where those are
// non-null; with the candidate path warp 0 writes them after that barrier, so the caller synchronizes again before
// reading them (launch A does not read them: block 0 writes them for launch B). Returns whether the candidate path ran.
__device__ __forceinline__ bool router_select_fast(RouteSel const& a, RouteAhead const& ra, bool use_ahead, float* scratch,
                                                   int* out_idx, float* out_w, int* out_idx2, float* out_w2) {
  __shared__ float s_cs[32];
  if (use_ahead && router_cand_fits(a, int(blockDim.x)) && router_select_cand(a, ra.l[0], ra.b[0], out_idx, s_cs)) {
    __syncthreads();
    if (threadIdx.x < 32 && (out_w || out_idx2)) {
      int const lane = int(threadIdx.x);
      int const chosen = lane < a.top_k ? out_idx[lane] : 0;
      float const w = lane < a.top_k ? s_cs[lane] : 0.f;
      router_write_picks(a, chosen, w, s_cs, nullptr, out_w, out_idx2, out_w2);
    }
    return true;
  }
  router_select_fallback(a, ra, use_ahead, scratch, out_idx, out_w, out_idx2, out_w2);
  return false;
}

template <class K>
__global__ void __launch_bounds__(kThreads) router_kernel(RouterArgs a, float const* __restrict__ u, InputPrologue pro) {
  using P = policy_of<K>;
  constexpr int NR = 1;  // one row per warp task: twice the blocks of NR = 2, so the logits take one memory round trip
  extern __shared__ float4 smem_f4[];
  float* xs = reinterpret_cast<float*>(smem_f4);
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  std::int64_t const tasks = (a.w.rows + NR - 1) / NR;
  pdl_trigger();
  trace_mark(a.trace, 0);
  if constexpr (has_fast_kernel<P>) {  // the whole router matrix (2.6 MB in Ling-3.0-flash) is known before the wait
    std::int64_t const rb = a.w.ld * std::int64_t(sizeof(typename P::storage_type));
    for (std::int64_t t = std::int64_t(blockIdx.x) * kWarps + warp; t < tasks; t += std::int64_t(gridDim.x) * kWarps)
      warp_prefetch(static_cast<char const*>(a.w.data) + t * NR * rb, (a.w.rows - t * NR < NR ? a.w.rows - t * NR : NR) * rb);
  }
  prologue_prefetch(pro, a.w.cols);
  pdl_wait();
  trace_mark(a.trace, 1);
  stage_input<false>(xs, u, a.w.cols, staged_elems<P>(a.w), pro);
  __syncthreads();
  for (std::int64_t t = std::int64_t(blockIdx.x) * kWarps + warp; t < tasks; t += std::int64_t(gridDim.x) * kWarps) {
    void const* data[NR] = {a.w.data};
    void const* scales[NR] = {a.w.scales};
    std::int64_t r[NR];
    bool valid[NR];
#pragma unroll
    for (int n = 0; n < NR; ++n) {
      valid[n] = t * NR + n < a.w.rows;
      r[n] = valid[n] ? t * NR + n : t * NR;
    }
    float acc[NR] = {0.f};
    // one batch of loads per row: a BF16 row of Ling's 2560 columns is 320 chunks, 10 per lane (the default batch
    // of 8 made it two serial round trips; each warp has a single row)
    RowDot<P>::template lane_dot<NR, (RowDot<P>::kFast ? 10 : 1)>(data, scales, r, valid, a.w, xs, acc);
#pragma unroll
    for (int n = 0; n < NR; ++n) {
      float v = warp_sum(acc[n]) * RowDot<P>::row_scale(a.w.scales, r[n]);
      if (valid[n] && lane == 0) a.logits[r[n]] = v;
    }
  }
  trace_end(a.trace);
  if (!a.counter) return;  // logits only: the selection runs in the MoE launch (fused routing)
  __shared__ bool s_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(a.counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  RouteSel const sel{a.logits, a.bias, int(a.w.rows), a.top_k, a.n_group, a.topk_group, a.norm_topk_prob, a.routed_scaling};
  __shared__ float s_score[kRouterMaxExperts];
  __shared__ __align__(16) float s_sel[kRouterMaxExperts];  // the ranked path loads its keys 16 bytes at a time
  router_select_block(sel, s_score, s_sel, a.idx, a.weights);
  if (threadIdx.x == 0) *a.counter = 0u;  // re-armed for the next launch (no other block reads it any more)
}

template <class K>
cudaError_t launch_router_keyed(K, RouterArgs const& a, float const* u, InputPrologue const& pro, cudaStream_t stream) {
  using P = policy_of<K>;
  std::size_t const smem = std::size_t(xs_floats(staged_elems<P>(a.w))) * sizeof(float);
  auto kernel = router_kernel<K>;
  int blocks = 0;
  cudaError_t e = persistent_grid(kernel, smem, (a.w.rows + kWarps - 1) / kWarps, blocks);
  if (e != cudaSuccess) return e;
  return launch_ex(kernel, dim3(unsigned(blocks)), dim3(kThreads), smem, stream, a, u, pro);
}

}  // namespace ling::cuda::kernels

namespace ling::cuda {

template <quant::weight_policy P>
cudaError_t launch_router(DeviceMatrix<P> const& w, float const* expert_bias, float const* u, RouterParams const& p,
                          RouterWorkspace const& ws, int* idx, float* weights, cudaStream_t stream) {
  using namespace kernels;
  if (w.empty() || !can_implement_router(w.rows(), p).is_ok() || ws.experts() < w.rows()) return cudaErrorInvalidValue;
  RouterArgs a{w.args(), expert_bias, ws.logits(), ws.counter(), idx, weights, p.top_k, p.n_group, p.topk_group,
               p.routed_scaling, p.norm_topk_prob ? 1 : 0};
  return launch_router_keyed(make_key<P>(), a, u, InputPrologue{}, stream);
}

}  // namespace ling::cuda
