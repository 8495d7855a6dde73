#pragma once
// Matrix-vector kernels (declarations and layouts in linear.hpp). nvcc only.
//
// One warp computes the dot products of NR rows at a time: lane l owns the 16-byte chunks l, l+32, ... of each row,
// issues the loads of U chunks of all NR rows before any arithmetic (memory-level parallelism), and reads the input
// once from shared memory for the NR rows. The input is staged in shared memory with one 16-byte pad per 32 floats
// (xpad), so the lanes' chunk-sized reads fall in distinct banks. A persistent grid of 256-thread blocks strides
// over row tasks; several matrices sharing the input are one launch (their tasks are concatenated).
//
// Policies: FastOps<P> is the 16-byte-chunk decoder of the fast layouts; RowDot<P> uses it when it exists and
// otherwise falls back to the generic form, which only calls P::decode (any policy, even one defined outside the
// library, runs with no new kernel).
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "ling/cuda/async_copy.cuh"
#include "ling/cuda/linear.hpp"
#include "ling/cuda/runtime.hpp"

namespace ling::cuda::kernels {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;

// ---- small device helpers ------------------------------------------------------------------------------
__host__ __device__ constexpr std::int64_t round32(std::int64_t n) { return (n + 31) / 32 * 32; }
// Shared-memory position of input element c: one float4 of padding after every 32 floats.
__host__ __device__ constexpr int xpad(int c) { return c + ((c >> 5) << 2); }
// Floats of shared memory that hold n input elements (n rounded up to 32).
__host__ __device__ constexpr int xs_floats(std::int64_t n) { return xpad(int(round32(n))); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Streaming 16-byte load: read-only path, no L1 allocation (each weight byte is used once per token).
__device__ __forceinline__ uint4 ld_stream(void const* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Inputs are staged multiplied by kXPre (2^48) so that products with weights decoded at a tiny scale (the fast
// decoders build fp32 bit patterns from the stored codes: E4M3 lands 2^-120 below its value, E2M1 2^-126) stay
// normal; each policy's kPost undoes both. Powers of two: exact.
inline constexpr float kXPre = 281474976710656.0f;  // 2^48

// Stages src(c) for c < n_stage (rounded up to 32; src returns 0 past the input) into xs (padded layout), times
// kXPre. Loads are batched (kStageBatch per thread in flight) so the prologue costs one L2 round trip, not n/256.
inline constexpr int kStageBatch = 16;
template <class Src>
__device__ __forceinline__ void stage(float* xs, std::int64_t n_stage, Src src) {
  int const end = int(round32(n_stage));
  for (int base = threadIdx.x; base < end; base += blockDim.x * kStageBatch) {
    float v[kStageBatch];
#pragma unroll
    for (int i = 0; i < kStageBatch; ++i) {
      int const c = base + i * int(blockDim.x);
      v[i] = c < end ? src(c) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kStageBatch; ++i) {
      int const c = base + i * int(blockDim.x);
      if (c < end) xs[xpad(c)] = v[i] * kXPre;
    }
  }
}
// Stages x[0..n), zero-filled up to n_stage.
__device__ __forceinline__ void stage_x(float* xs, float const* __restrict__ x, std::int64_t n, std::int64_t n_stage) {
  stage(xs, n_stage, [=](int c) { return c < n ? x[c] : 0.f; });
}
// x[c..c+4) of a 16-byte-aligned x of nn elements (c a multiple of 4), zeros past the end.
__device__ __forceinline__ float4 ld_x4(float const* __restrict__ x, int c, int nn) {
  if (c + 3 < nn) return __ldg(reinterpret_cast<float4 const*>(x + c));
  return make_float4(c < nn ? x[c] : 0.f, c + 1 < nn ? x[c + 1] : 0.f, c + 2 < nn ? x[c + 2] : 0.f,
                     c + 3 < nn ? x[c + 3] : 0.f);
}
// ld_x4 where nn is a multiple of 4: no partial vector, so no element-wise tail (a quarter of the code).
__device__ __forceinline__ float4 ld_x4_whole(float const* __restrict__ x, int c, int nn) {
  return c < nn ? __ldg(reinterpret_cast<float4 const*>(x + c)) : make_float4(0.f, 0.f, 0.f, 0.f);
}
// Stages x[0..nn) (16-byte aligned) into xs times `pre` (kWeighted: times w[c] instead, w 16-byte aligned and loaded
// with x: the RMSNorm prologue's one batch of loads; nn then a multiple of 4, loaded by ld_x4_whole), zero-filled up to
// `end` (a multiple of 32), kB float4 loads (or pairs) in flight per thread; returns this thread's Σ x² (the RMSNorm
// statistic; unused results cost nothing).
template <int kB, bool kWeighted = false>
__device__ __forceinline__ float stage4(float* xs, float const* __restrict__ x, int nn, int end, float pre,
                                        float const* __restrict__ w = nullptr) {
  float ss = 0.f;
  for (int base = threadIdx.x; base < end / 4; base += blockDim.x * kB) {
    float4 v[kB], g[kWeighted ? kB : 1];
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      int const c = 4 * (base + i * int(blockDim.x));
      v[i] = kWeighted ? ld_x4_whole(x, c, nn) : ld_x4(x, c, nn);
      if constexpr (kWeighted) g[i] = ld_x4_whole(w, c, nn);
    }
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      int const c = 4 * (base + i * int(blockDim.x));
      if (c < end) {
        float4 const m = kWeighted ? g[i] : make_float4(pre, pre, pre, pre);
        *reinterpret_cast<float4*>(xs + xpad(c)) = make_float4(v[i].x * m.x, v[i].y * m.y, v[i].z * m.z, v[i].w * m.w);
        ss = fmaf(v[i].x, v[i].x, fmaf(v[i].y, v[i].y, fmaf(v[i].z, v[i].z, fmaf(v[i].w, v[i].w, ss))));
      }
    }
  }
  return ss;
}
// Stages x[0..n), zero-filled up to n_stage, four elements per load when x is 16-byte aligned (the input of a
// launch is usually a whole workspace buffer): a straight copy, no per-element index arithmetic.
__device__ __forceinline__ void stage_x4(float* xs, float const* __restrict__ x, std::int64_t n, std::int64_t n_stage) {
  if ((reinterpret_cast<std::uintptr_t>(x) & 15) != 0) {
    stage(xs, n_stage, [=](int c) { return c < n ? x[c] : 0.f; });
    return;
  }
  stage4<8>(xs, x, int(n), int(round32(n_stage)), kXPre);
}

// q / d without a division instruction: one multiply-high by m = ceil(2^32 / d), exact whenever q * d < 2^32
// (then q * (m d - 2^32) < 2^32, so the rounding of m never reaches the next integer). `plain` (d = 1, or a range
// the bound does not cover) falls back to the division. Built once per thread, used per task or chunk.
struct FastDiv {
  std::uint32_t d, m;
  bool plain;
  __device__ FastDiv(std::uint32_t d_, std::uint64_t q_max) : d(d_), m(0), plain(true) {
    if (d > 1 && q_max < (std::uint64_t(1) << 32) / d) {
      m = std::uint32_t(0xFFFFFFFFu / d + 1u);
      plain = false;
    }
  }
  __device__ __forceinline__ std::uint32_t div(std::uint32_t q) const { return plain ? q / d : __umulhi(q, m); }
};


__device__ __forceinline__ float block_sum(float v, float* red) {  // red: 32 floats of shared memory
  v = warp_sum(v);
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = int(blockDim.x + 31) >> 5;
  __syncthreads();  // red may still be read by an earlier call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < nwarps ? red[lane] : 0.f;
  return warp_sum(t);
}

inline constexpr int kMaxGatedHeads = 256;
// The gated head norm's sigmoid, 1 / (1 + e^-t) correctly rounded: one definition for the o_proj staging and the KDA
// step (KdaStepArgs::out_gate), which must give the same bits.
__device__ __forceinline__ float gate_sigmoid(float t) { return __frcp_rn(1.0f + expf(-t)); }
// KDA's gated head norm staging (x, gate, w 16-byte aligned, head 128 or 256, at most kMaxGatedHeads heads):
// x and gate of each float4 are loaded together and staged as x · w · sigmoid(gate) (w, one head's weights, from L1);
// the heads' Σ x² gather in s_hs (a warp's 32 float4 of one batch lie in one head: one atomic per warp and head, at
// most two per head, so the sums do not depend on the atomics' order).
template <int kB>
__device__ __forceinline__ void stage4_gated(float* xs, float* s_hs, float const* __restrict__ x, InputPrologue const& p, int nn,
                                             int end) {
  int const shift = p.head == 128 ? 7 : 8;  // head 128 or 256 on this path
  for (int base = threadIdx.x; base < end / 4; base += blockDim.x * kB) {
    float4 v[kB], g[kB], wn[kB];
#pragma unroll
    for (int i = 0; i < kB; ++i) {  // every load of the batch first: the staging stores below may alias them (generic
      int const c = 4 * (base + i * int(blockDim.x));  // pointers), so a load after a store would wait for it
      v[i] = ld_x4(x, c, nn);
      g[i] = ld_x4(p.gate, c, nn);
      wn[i] = ld_x4(p.norm_w, c & (p.head - 1), p.head);
    }
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      int const c = 4 * (base + i * int(blockDim.x));
      float const ss = s_hs ? warp_sum(fmaf(v[i].x, v[i].x, fmaf(v[i].y, v[i].y, fmaf(v[i].z, v[i].z, v[i].w * v[i].w)))) : 0.f;
      if (c < end) {
        float4 const w = wn[i];
        *reinterpret_cast<float4*>(xs + xpad(c)) =
            make_float4(v[i].x * w.x * gate_sigmoid(g[i].x), v[i].y * w.y * gate_sigmoid(g[i].y),
                        v[i].z * w.z * gate_sigmoid(g[i].z), v[i].w * w.w * gate_sigmoid(g[i].w));
        if (s_hs && (threadIdx.x & 31) == 0 && c < nn) atomicAdd(&s_hs[c >> shift], ss);
      }
    }
  }
}

__device__ __forceinline__ bool is_aligned16(void const* q) { return (reinterpret_cast<std::uintptr_t>(q) & 15) == 0; }

// stage_input's other cases (unaligned inputs, prologues without fused weights), out of line: every launch inlines
// stage_input, and what it inlines is code its warps fetch right after their PDL wait (ncu of MoE launch A: instruction
// fetch was its largest stall). red: 32 floats of shared memory.
// kHeadScale: PrologueKind::kHeadScale's general path is compiled in (stage_input's kAttnFused).
template <bool kHeadScale>
inline __device__ __noinline__ void stage_input_slow(float* xs, float const* __restrict__ x, std::int64_t n, std::int64_t n_stage,
                                                     InputPrologue const& p, float* red) {
  int const end = int(round32(n_stage)), nn = int(n);
  float const pre = p.kind == PrologueKind::kPlain ? kXPre : 1.f;
  float ss = 0.f;
  if (is_aligned16(x)) {  // four elements per load (the usual case)
    ss = stage4<4>(xs, x, nn, end, pre);
  } else {
    for (int base = threadIdx.x; base < end; base += blockDim.x * kStageBatch) {
      float v[kStageBatch];
#pragma unroll
      for (int i = 0; i < kStageBatch; ++i) {
        int const c = base + i * int(blockDim.x);
        v[i] = c < nn ? x[c] : 0.f;
      }
#pragma unroll
      for (int i = 0; i < kStageBatch; ++i) {
        int const c = base + i * int(blockDim.x);
        if (c < end) xs[xpad(c)] = v[i] * pre;
        ss = fmaf(v[i], v[i], ss);
      }
    }
  }
  if (p.kind == PrologueKind::kRmsNorm) {
    // block_sum's barriers order every thread's staging stores before this rescale of other threads' elements
    float const inv = rsqrtf(block_sum(ss, red) / float(n) + p.eps) * kXPre;
    for (int c = threadIdx.x; c < nn; c += blockDim.x) xs[xpad(c)] *= inv * p.norm_w[c];
  } else if (kHeadScale && p.kind == PrologueKind::kHeadScale) {  // the launcher checked head_ss and ss_parts
    __syncthreads();
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = int(blockDim.x) >> 5;
    for (int h = warp; h < nn / p.head; h += nwarps) {
      float part = 0.f;
      for (int i = lane; i < p.ss_parts; i += 32) part += p.head_ss[std::int64_t(h) * p.ss_parts + i];
      float const f = rsqrtf(warp_sum(part) / float(p.head) + p.eps) * kXPre;
      for (int i = lane; i < p.head; i += 32) xs[xpad(h * p.head + i)] *= f;
    }
  } else if (p.kind == PrologueKind::kGatedHeadNorm) {
    __syncthreads();
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = int(blockDim.x) >> 5;
    for (int h = warp; h < nn / p.head; h += nwarps) {
      int const c0 = h * p.head;
      float hs = 0.f;
      for (int i = lane; i < p.head; i += 32) hs = fmaf(xs[xpad(c0 + i)], xs[xpad(c0 + i)], hs);
      float const inv = rsqrtf(warp_sum(hs) / float(p.head) + p.eps) * kXPre;
      for (int i = lane; i < p.head; i += 32) {
        float const g = p.gate[c0 + i];
        xs[xpad(c0 + i)] *= inv * p.norm_w[i] / (1.0f + expf(-g));
      }
    }
  }
}

// Stages x[0..n) through the prologue p into xs (padded layout, times kXPre), zero-filled up to n_stage. The caller
// synchronizes the block afterwards. Aligned inputs (the usual case) take one batch of loads: the norm weights (and
// KDA's gate) are loaded with x and applied while staging; the statistic then rescales shared memory only.
// kAttnFused: the attention outputs' prologues (kGatedHeadNorm, kHeadScale) take their fused paths. False for the
// launches that never get one, MoE and router: kGatedHeadNorm then goes to stage_input_slow (staged in full), and
// kHeadScale, which stage_input_slow<false> has no path for, is refused by ops::router and ops::moe before any launch.
// Every block fetches this code right after its PDL wait, and MoE launch A stalls on instruction fetch
// (docs/kernels.md "Launch A's code size").
template <bool kAttnFused = true>
__device__ __forceinline__ void stage_input(float* xs, float const* __restrict__ x, std::int64_t n, std::int64_t n_stage,
                                            InputPrologue const& p) {
  __shared__ float red[32];
  int const end = int(round32(n_stage)), nn = int(n);
  bool const fused = p.flags & InputPrologue::kFusedWeights;
  if (fused && p.kind == PrologueKind::kRmsNorm && is_aligned16(x) && is_aligned16(p.norm_w) && nn % 4 == 0) {
    // pairs of 2 per thread: the registers of the plain batch of 4 (a batch of 3 made the pipelined matvec spill the
    // row it loads before its PDL wait, measured 2026-11-30). Widths that are not a multiple of 4 (none of Ling's)
    // take stage_input_slow, which rounds x · w · inv as x · (inv · w).
    float const ss = stage4<2, true>(xs, x, nn, end, 1.f, p.norm_w);
    // block_sum's barriers order every thread's staging stores before this rescale of other threads' elements
    float const inv = rsqrtf(block_sum(ss, red) / float(n) + p.eps) * kXPre;
    for (int c = threadIdx.x; c < nn; c += blockDim.x) xs[xpad(c)] *= inv;
    return;
  }
  if constexpr (kAttnFused) if (fused && p.kind == PrologueKind::kGatedHeadNorm && is_aligned16(x) && is_aligned16(p.gate) &&
      is_aligned16(p.norm_w) && (p.head == 128 || p.head == 256) && nn % p.head == 0 && nn / p.head <= kMaxGatedHeads) {
    __shared__ float s_hs[kMaxGatedHeads];
    int const heads = nn / p.head;
    float const inv_head = 1.0f / float(p.head);
    // With the producer's partial sums (p.head_ss: the KDA step's, ss_parts per head, a power of two <= 32) each head's
    // factor comes from them: thread t < heads · ss_parts loads partial t before the staging's own loads (one register
    // held across it), then the ss_parts lanes of a head sum them by shuffles. No shared atomics, two block barriers
    // fewer. Otherwise the staging gathers each head's Σ x² itself.
    int const np = heads * p.ss_parts;
    bool const given = p.head_ss && p.ss_parts >= 1 && p.ss_parts <= 32 && (p.ss_parts & (p.ss_parts - 1)) == 0 &&
                       np <= int(blockDim.x);
    if (given) {
      int const t = int(threadIdx.x);
      float part = t < np ? p.head_ss[t] : 0.f;
      stage4_gated<2>(xs, nullptr, x, p, nn, end);
      for (int o = 1; o < p.ss_parts; o <<= 1) part += __shfl_xor_sync(0xffffffffu, part, o);  // uniform trip count
      if (t < np && (t & (p.ss_parts - 1)) == 0) s_hs[t / p.ss_parts] = rsqrtf(part * inv_head + p.eps) * kXPre;
    } else {
      for (int h = threadIdx.x; h < heads; h += blockDim.x) s_hs[h] = 0.f;
      __syncthreads();
      stage4_gated<2>(xs, s_hs, x, p, nn, end);
      __syncthreads();
      // each head's factor once (its division by the power-of-two head is a multiply), then one multiply per element:
      // a division and an rsqrt per element made this prologue ~7 µs of o_proj's ~9 in place (trace, 2026-12-01)
      for (int h = threadIdx.x; h < heads; h += blockDim.x) s_hs[h] = rsqrtf(s_hs[h] * inv_head + p.eps) * kXPre;
    }
    __syncthreads();
    int const shift = p.head == 128 ? 7 : 8;
    for (int c = 4 * int(threadIdx.x); c < nn; c += 4 * int(blockDim.x)) {
      float4* const q = reinterpret_cast<float4*>(xs + xpad(c));
      float const f = s_hs[c >> shift];
      float4 const v = *q;
      *q = make_float4(v.x * f, v.y * f, v.z * f, v.w * f);
    }
    return;
  }
  if constexpr (kAttnFused) if (fused && p.kind == PrologueKind::kHeadScale && is_aligned16(x) && (p.head == 128 || p.head == 256) &&
      nn % p.head == 0 && nn / p.head <= kMaxGatedHeads && p.ss_parts >= 1 && p.ss_parts <= 32 &&
      (p.ss_parts & (p.ss_parts - 1)) == 0 && (nn / p.head) * p.ss_parts <= int(blockDim.x)) {
    // one round trip: this thread's first batch of x and its head partial are loaded together, the partials summed by
    // shuffles into one factor per head (s_hf), then x is staged times its head's factor
    __shared__ float s_hf[kMaxGatedHeads];
    constexpr int kB = 4;
    int const t = int(threadIdx.x), np = (nn / p.head) * p.ss_parts, shift = p.head == 128 ? 7 : 8;
    float4 v[kB];
#pragma unroll
    for (int i = 0; i < kB; ++i) v[i] = ld_x4(x, 4 * (t + i * int(blockDim.x)), nn);
    float part = t < np ? p.head_ss[t] : 0.f;
    for (int o = 1; o < p.ss_parts; o <<= 1) part += __shfl_xor_sync(0xffffffffu, part, o);  // uniform trip count
    if (t < np && (t & (p.ss_parts - 1)) == 0) s_hf[t / p.ss_parts] = rsqrtf(part * (1.0f / float(p.head)) + p.eps) * kXPre;
    __syncthreads();
    for (int base = t;; base += int(blockDim.x) * kB) {
#pragma unroll
      for (int i = 0; i < kB; ++i) {
        int const c = 4 * (base + i * int(blockDim.x));
        if (c < end) {
          float const f = c < nn ? s_hf[c >> shift] : 0.f;
          *reinterpret_cast<float4*>(xs + xpad(c)) = make_float4(v[i].x * f, v[i].y * f, v[i].z * f, v[i].w * f);
        }
      }
      if (4 * (base + int(blockDim.x) * kB) >= end) break;
#pragma unroll
      for (int i = 0; i < kB; ++i) v[i] = ld_x4(x, 4 * (base + int(blockDim.x) * kB + i * int(blockDim.x)), nn);
    }
    return;
  }
  // four elements per load (the usual plain case). Not inlined in the MoE and router launches (!kAttnFused), whose
  // input the model always normalizes: stage_input_slow stages it with the same loads and products.
  if constexpr (kAttnFused)
    if (p.kind == PrologueKind::kPlain && is_aligned16(x)) {
      stage4<4>(xs, x, nn, end, kXPre);
      return;
    }
  stage_input_slow<kAttnFused>(xs, x, n, n_stage, p, red);
}

// ---- programmatic dependent launch (PDL) ---------------------------------------------------------------------
// A kernel of the decode step triggers its dependents at entry (their blocks are scheduled as this grid's blocks
// retire), prefetches into L2 the weights it is about to stream (they depend on no earlier kernel), and only then
// waits for the previous kernel's results. Launched without the PDL attribute both instructions are no-ops.
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void prefetch_l2(void const* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
// One warp prefetches `bytes` from p, one 128-byte line per lane per step.
__device__ __forceinline__ void warp_prefetch(void const* p, std::int64_t bytes) {
  for (std::int64_t off = std::int64_t(threadIdx.x & 31) * 128; off < bytes; off += 32 * 128)
    prefetch_l2(static_cast<char const*>(p) + off);
}

// Before the PDL wait: the prologue's weights (RMSNorm: n floats; gated head norm: one head's) into L2, each 128-byte
// line by one lane of the grid (lane l of block b takes line 32 b + l): every block reads them right after the wait.
__device__ __forceinline__ void prologue_prefetch(InputPrologue const& p, std::int64_t n) {
  if (!(p.flags & InputPrologue::kPrefetchWeights) || !p.norm_w || threadIdx.x >= 32) return;
  std::int64_t const m = p.kind == PrologueKind::kRmsNorm ? n : p.kind == PrologueKind::kGatedHeadNorm ? p.head : 0;
  std::int64_t const line = std::int64_t(blockIdx.x) * 32 + threadIdx.x;
  if (line * 32 < m) prefetch_l2(p.norm_w + line * 32);
}

// ---- step timeline (measurements only; CudaModel's LING_TRACE) --------------------------------------------------
// A launch given a trace region t writes %globaltimer (ns) per block: phase 0 at entry, 1 after the PDL wait, 2 at a
// kernel-specific midpoint, 3 when its last warp ends (atomicMax over the warps; the region is zeroed before). Word 4
// of a block's record (kTracePhases words) is the SM it ran on plus one, written with phase 0 (`ling bench`'s
// LING_TRACE_BLOCKS prints the blocks one by one).
inline constexpr int kTracePhases = 5, kTraceBlocks = 1024;
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long v;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
  return v;
}
__device__ __forceinline__ unsigned sm_id() {
  unsigned v;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
  return v;
}
__device__ __forceinline__ unsigned trace_block() { return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); }
__device__ __forceinline__ void trace_mark(unsigned long long* t, int p) {
  if (t && threadIdx.x == 0 && trace_block() < unsigned(kTraceBlocks)) {
    t[trace_block() * kTracePhases + p] = global_ns();
    if (p == 0) t[trace_block() * kTracePhases + 4] = sm_id() + 1u;
  }
}
// Point p of the block's record as the latest of its warps' calls (lane 0 of each calling warp).
__device__ __forceinline__ void trace_mark_max(unsigned long long* t, int p) {
  if (t && (threadIdx.x & 31) == 0 && trace_block() < unsigned(kTraceBlocks))
    atomicMax(&t[trace_block() * kTracePhases + p], global_ns());
}
__device__ __forceinline__ void trace_end(unsigned long long* t) {
  if (t && (threadIdx.x & 31) == 0 && trace_block() < unsigned(kTraceBlocks))
    atomicMax(&t[trace_block() * kTracePhases + 3], global_ns());
}

// LING_NO_PDL=1 turns the attribute off (A/B measurements).
inline bool pdl_enabled() {
  static bool const on = [] {
    char const* e = std::getenv("LING_NO_PDL");
    return !(e && *e && *e != '0');
  }();
  return on;
}

// Launches `kernel` with programmatic stream serialization (PDL) when enabled and `st` is not the legacy stream; with
// clusters of `cluster` blocks along x when cluster > 0 (the grid a multiple of it).
// Measured and removed (session 49, docs/perf-log.md): a preferred shared-memory carveout for every kernel
// launched here (LING_CARVEOUT), so that no SM changes its L1/shared split between launches. At 100% (the largest
// shared memory) 2.571 against 2.533 ms/token (H100): launch A's last wait exit 0.33-0.42 µs earlier, but the KDA
// projections 1.4 µs longer; with the lane matvecs left at the driver's choice 2.563 against 2.524; at 0% 2.781.
template <class... KArgs, class... Args>
inline cudaError_t launch_cluster_ex(void (*kernel)(KArgs...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t st,
                                     unsigned cluster, Args const&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster, attr[n].val.clusterDim.y = 1, attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl_enabled() && st != nullptr) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, KArgs(args)...);
}
template <class... KArgs, class... Args>
inline cudaError_t launch_ex(void (*kernel)(KArgs...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t st,
                             Args const&... args) {
  return launch_cluster_ex(kernel, grid, block, smem, st, 0u, args...);
}

__device__ __forceinline__ float ue8m0_float(std::uint8_t s) {
  if (s == 0xFF) return __uint_as_float(0x7FC00000u);
  if (s == 0) return __uint_as_float(0x00400000u);
  return __uint_as_float(std::uint32_t(s) << 23);
}

template <int NR>
__device__ __forceinline__ void zero(float (&a)[NR]) {
#pragma unroll
  for (int n = 0; n < NR; ++n) a[n] = 0.f;
}

__device__ __forceinline__ std::uint32_t word(uint4 const& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

inline constexpr float kPostPlain = 3.5527136788005009e-15f;  // 2^-48

// ---- fast chunk decoders -------------------------------------------------------------------------------
// kElems elements per 16-byte chunk (divides 32, so a chunk never straddles an xpad gap); kUnroll chunks per lane
// per batch of loads; dot<NR>() = Σ_e w[n][e] x[e] over one chunk of NR rows; chunk_scale / row_scale multiply it.
template <class P>
struct FastOps;

template <>
struct FastOps<quant::F32> {
  static constexpr int kElems = 4, kUnroll = 8;
  static constexpr float kPost = kPostPlain;
  template <int NR>
  __device__ static void dot(uint4 const (&v)[NR], float const* xp, float (&d)[NR]) {
    float4 x = *reinterpret_cast<float4 const*>(xp);
#pragma unroll
    for (int n = 0; n < NR; ++n)
      d[n] = __uint_as_float(v[n].x) * x.x + __uint_as_float(v[n].y) * x.y + __uint_as_float(v[n].z) * x.z +
             __uint_as_float(v[n].w) * x.w;
  }
  __device__ static float chunk_scale(void const*, MatrixArgs const&, std::int64_t, int) { return 1.f; }
  __device__ static float row_scale(void const*, std::int64_t) { return 1.f; }
};

// 16-bit formats: 8 elements per chunk, a 32-bit word holds elements 2i (low half) and 2i + 1; Pair converts one word.
template <class Pair>
struct HalfWordOps {
  static constexpr int kElems = 8, kUnroll = 8;
  static constexpr float kPost = kPostPlain;
  template <int NR>
  __device__ static void dot(uint4 const (&v)[NR], float const* xp, float (&d)[NR]) {
    float4 xa = reinterpret_cast<float4 const*>(xp)[0], xb = reinterpret_cast<float4 const*>(xp)[1];
    float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
    for (int n = 0; n < NR; ++n) {
      float a0 = 0.f, a1 = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float2 const f = Pair::convert(word(v[n], i));
        a0 = fmaf(f.x, xv[2 * i], a0);
        a1 = fmaf(f.y, xv[2 * i + 1], a1);
      }
      d[n] = a0 + a1;
    }
  }
  __device__ static float chunk_scale(void const*, MatrixArgs const&, std::int64_t, int) { return 1.f; }
  __device__ static float row_scale(void const*, std::int64_t) { return 1.f; }
};
struct Bf16Pair {  // bf16 is the top half of a float: shifts only
  __device__ static float2 convert(std::uint32_t u) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xFFFF0000u));
  }
};
struct F16Pair {
  __device__ static float2 convert(std::uint32_t u) {
    __half2_raw r;
    r.x = std::uint16_t(u & 0xFFFFu);
    r.y = std::uint16_t(u >> 16);
    return __half22float2(__half2(r));
  }
};
template <>
struct FastOps<quant::Bf16> : HalfWordOps<Bf16Pair> {};
template <>
struct FastOps<quant::F16> : HalfWordOps<F16Pair> {};

// Applies the sign bit of `bits` (bit 31) to x: the MXFP4 decoder puts a code's sign on the input.
__device__ __forceinline__ float xor_sign(float x, std::uint32_t bits) {
  return __uint_as_float(__float_as_uint(x) ^ (bits & 0x80000000u));
}

// The FP8 decoder: hardware fp8x2 -> half2 -> float conversions (measured faster than building fp32 bit patterns
// from the codes at equal occupancy: KDA projections 28.9 vs 32.6 us, 2026-11-30; that variant was removed).
struct Fp8DotCvt {
  static constexpr int kElems = 16, kUnroll = 8;
  static constexpr float kPost = kPostPlain;
  template <int NR>
  __device__ static void dot(uint4 const (&v)[NR], float const* xp, float (&d)[NR]) {
    float4 const* x4 = reinterpret_cast<float4 const*>(xp);
    float a0[NR], a1[NR];
    zero(a0);
    zero(a1);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float4 x = x4[i];
#pragma unroll
      for (int n = 0; n < NR; ++n) {
        std::uint32_t u = word(v[n], i);
        __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(u & 0xFFFFu), __NV_E4M3);
        __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(u >> 16), __NV_E4M3);
        float2 fl = __half22float2(__half2(lo)), fh = __half22float2(__half2(hi));
        a0[n] = fmaf(fl.x, x.x, a0[n]);
        a1[n] = fmaf(fl.y, x.y, a1[n]);
        a0[n] = fmaf(fh.x, x.z, a0[n]);
        a1[n] = fmaf(fh.y, x.w, a1[n]);
      }
    }
#pragma unroll
    for (int n = 0; n < NR; ++n) d[n] = a0[n] + a1[n];
  }
};

using Fp8Dot = Fp8DotCvt;

// Fp8DotCvt::dot<1> of one chunk against kT inputs (xp + k · ld): each chunk decoded once, token k's sum in dot<1>'s
// order (the same bits as dot<1> on its input).
template <int kT>
__device__ __forceinline__ void fp8_dot_tokens(uint4 const& v, float const* xp, int ld, float (&d)[kT]) {
  float a0[kT], a1[kT];
  zero(a0);
  zero(a1);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    std::uint32_t const u = word(v, i);
    __half2_raw const lo = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(u & 0xFFFFu), __NV_E4M3);
    __half2_raw const hi = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(u >> 16), __NV_E4M3);
    float2 const fl = __half22float2(__half2(lo)), fh = __half22float2(__half2(hi));
#pragma unroll
    for (int k = 0; k < kT; ++k) {
      float4 const x = reinterpret_cast<float4 const*>(xp + k * ld)[i];
      a0[k] = fmaf(fl.x, x.x, a0[k]);
      a1[k] = fmaf(fl.y, x.y, a1[k]);
      a0[k] = fmaf(fh.x, x.z, a0[k]);
      a1[k] = fmaf(fh.y, x.w, a1[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < kT; ++k) d[k] = a0[k] + a1[k];
}

template <>
struct FastOps<quant::Fp8Block> : Fp8Dot {
  // chunk j covers columns [16j, 16j+16): inside one 128-column block
  __device__ static float chunk_scale(void const* s, MatrixArgs const& m, std::int64_t r, int j) {
    return __ldg(static_cast<float const*>(s) + (r >> 7) * ((m.cols + 127) >> 7) + (j >> 3));
  }
  __device__ static float row_scale(void const*, std::int64_t) { return 1.f; }
};

template <>
struct FastOps<quant::Fp8Row> : Fp8Dot {
  __device__ static float chunk_scale(void const*, MatrixArgs const&, std::int64_t, int) { return 1.f; }
  __device__ static float row_scale(void const* s, std::int64_t r) { return __ldg(static_cast<float const*>(s) + r); }
};

// MXFP4: a chunk = 32 elements = one scale block. Each E2M1 code's exponent/mantissa bits go to float bits 22..24
// (value * 2^-126; code 1 is the denormal 2^-127, exact as an FFMA input) and its sign onto x, as for FP8: no
// conversion instructions. Element i of a 32-bit word is nibble i (low nibble = even element).
template <int kI>
__device__ __forceinline__ float e2m1_mag(std::uint32_t w) {
  constexpr int s = 22 - 4 * kI;  // nibble i's bits 0..2 -> float bits 22..24
  return __uint_as_float((s >= 0 ? (w << (s >= 0 ? s : 0)) : (w >> (s < 0 ? -s : 0))) & 0x01C00000u);
}
template <int kI>
__device__ __forceinline__ float e2m1_signed_x(float x, std::uint32_t w) {
  return xor_sign(x, w << (28 - 4 * kI));  // nibble i's bit 3 -> bit 31
}
struct Mxfp4DotBits {
  static constexpr int kElems = 32, kUnroll = 4;
  static constexpr float kPost = 302231454903657293676544.0f;  // 2^78 = 2^126 / kXPre
  template <int NR>
  __device__ static void dot(uint4 const (&v)[NR], float const* xp, float (&d)[NR]) {
    float4 const* x4 = reinterpret_cast<float4 const*>(xp);
    float a0[NR], a1[NR];
    zero(a0);
    zero(a1);
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // 32-bit word i: elements 8i..8i+7
      float4 xa = x4[2 * i], xb = x4[2 * i + 1];
#pragma unroll
      for (int n = 0; n < NR; ++n) {
        std::uint32_t const w = word(v[n], i);
        a0[n] = fmaf(e2m1_mag<0>(w), e2m1_signed_x<0>(xa.x, w), a0[n]);
        a1[n] = fmaf(e2m1_mag<1>(w), e2m1_signed_x<1>(xa.y, w), a1[n]);
        a0[n] = fmaf(e2m1_mag<2>(w), e2m1_signed_x<2>(xa.z, w), a0[n]);
        a1[n] = fmaf(e2m1_mag<3>(w), e2m1_signed_x<3>(xa.w, w), a1[n]);
        a0[n] = fmaf(e2m1_mag<4>(w), e2m1_signed_x<4>(xb.x, w), a0[n]);
        a1[n] = fmaf(e2m1_mag<5>(w), e2m1_signed_x<5>(xb.y, w), a1[n]);
        a0[n] = fmaf(e2m1_mag<6>(w), e2m1_signed_x<6>(xb.z, w), a0[n]);
        a1[n] = fmaf(e2m1_mag<7>(w), e2m1_signed_x<7>(xb.w, w), a1[n]);
      }
    }
#pragma unroll
    for (int n = 0; n < NR; ++n) d[n] = a0[n] + a1[n];
  }
};

template <class Dot>
struct Mxfp4Ops : Dot {
  __device__ static float chunk_scale(void const* s, MatrixArgs const& m, std::int64_t r, int j) {
    return ue8m0_float(__ldg(static_cast<std::uint8_t const*>(s) + r * (m.cols >> 5) + j));
  }
  __device__ static float row_scale(void const*, std::int64_t) { return 1.f; }
};
template <>
struct FastOps<quant::Mxfp4> : Mxfp4Ops<Mxfp4DotBits> {};

// ---- one warp, NR rows ----------------------------------------------------------------------------------
// Lane partial sums (not yet reduced across the warp) of rows r[n] of the matrices whose storage and scales start
// at data[n], scales[n] (all of shape m), against the staged input xs. Rows with valid[n] false contribute 0.
template <class P, class Enable = void>
struct RowDot {  // generic: P::decode, element by element
  static constexpr bool kFast = false;
  static constexpr int kUnroll = 1;
  template <int NR, int kU = 1>
  __device__ static void lane_dot(void const* const (&data)[NR], void const* const (&scales)[NR],
                                  std::int64_t const (&r)[NR], bool const (&valid)[NR], MatrixArgs const& m,
                                  float const* xs, float (&acc)[NR]) {
    using S = typename P::storage_type;
    using Sc = typename P::scale_type;
    int const lane = threadIdx.x & 31;
    for (std::int64_t c = lane; c < m.cols; c += 32) {
      float const xv = xs[xpad(int(c))];
#pragma unroll
      for (int n = 0; n < NR; ++n)
        if (valid[n])
          acc[n] += P::decode(static_cast<S const*>(data[n]), static_cast<Sc const*>(scales[n]), m.rows, m.cols, r[n], c) * xv;
    }
  }
  __device__ static float row_scale(void const*, std::int64_t) { return kPostPlain; }
};

template <class P>
struct RowDot<P, std::enable_if_t<has_fast_kernel<P>>> {
  static constexpr bool kFast = true;
  using Ops = FastOps<P>;
  using S = typename P::storage_type;
  static constexpr int kElems = Ops::kElems, kUnroll = Ops::kUnroll;

  template <int NR, int kU = kUnroll>  // kU: chunks per lane per batch of loads
  __device__ static void lane_dot(void const* const (&data)[NR], void const* const (&scales)[NR],
                                  std::int64_t const (&r)[NR], bool const (&valid)[NR], MatrixArgs const& m,
                                  float const* xs, float (&acc)[NR]) {
    int const lane = threadIdx.x & 31;
    int const nchunks = int(m.ld * std::int64_t(sizeof(S)) / 16);
    uint4 const* rowp[NR];
#pragma unroll
    for (int n = 0; n < NR; ++n)
      rowp[n] = reinterpret_cast<uint4 const*>(static_cast<char const*>(data[n]) + r[n] * m.ld * std::int64_t(sizeof(S)));
    for (int base = lane; base < nchunks; base += 32 * kU) {
      uint4 v[kU][NR];
      float sc[kU][NR];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        int const j = base + 32 * u;
#pragma unroll
        for (int n = 0; n < NR; ++n) {
          bool const ok = j < nchunks && valid[n];
          v[u][n] = ok ? ld_stream(rowp[n] + j) : make_uint4(0, 0, 0, 0);
          sc[u][n] = ok ? Ops::chunk_scale(scales[n], m, r[n], j) : 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        int const j = base + 32 * u;
        if (j < nchunks) {
          float d[NR];
          Ops::template dot<NR>(v[u], xs + xpad(j * kElems), d);
#pragma unroll
          for (int n = 0; n < NR; ++n) acc[n] = fmaf(sc[u][n], d[n], acc[n]);
        }
      }
    }
  }
  // the policy's row scale times its kPost (undoes kXPre and the decoder's exponent offset)
  __device__ static float row_scale(void const* s, std::int64_t r) { return Ops::row_scale(s, r) * Ops::kPost; }
};

// Input elements to stage for a matrix: the padded row in the fast layout, cols otherwise.
template <class P>
__host__ __device__ constexpr std::int64_t staged_elems(MatrixArgs const& m) {
  if constexpr (has_fast_kernel<P>)
    return m.ld * std::int64_t(sizeof(typename P::storage_type)) / 16 * FastOps<P>::kElems;
  else
    return m.cols;
}

// Policy P read from its own storage, element by element through P::decode (DeviceLayout's primary template: no fast
// kernel): what a matrix whose rows are not a whole number of 16-byte chunks runs (the model keeps checkpoint bytes
// as they are; tiny test shapes hit this).
template <class P>
struct Unaligned : P {};

// ---- kernel template keys ------------------------------------------------------------------------------------
// nvcc 13.0's host stub cannot spell a __global__ template instantiated on quant::Plain<T, kName> (a pointer to a
// char array as template argument), nor any typedef that names it, so kernels are instantiated on a key returned
// by make_key<P>() (deduced, so the stub sees PlainKey<N>) and map it back with policy_of.
template <int kId>
struct PlainKey {};
template <class P>
constexpr auto make_key() {
  if constexpr (std::is_same_v<P, quant::Bf16>) return PlainKey<1>{};
  else if constexpr (std::is_same_v<P, quant::F16>) return PlainKey<2>{};
  else if constexpr (std::is_same_v<P, quant::F32>) return PlainKey<3>{};
  else if constexpr (std::is_same_v<P, Unaligned<quant::Bf16>>) return PlainKey<4>{};
  else if constexpr (std::is_same_v<P, Unaligned<quant::F32>>) return PlainKey<6>{};
  else return P{};
}
template <class K> struct PolicyOf { using type = K; };
template <> struct PolicyOf<PlainKey<1>> { using type = quant::Bf16; };
template <> struct PolicyOf<PlainKey<2>> { using type = quant::F16; };
template <> struct PolicyOf<PlainKey<3>> { using type = quant::F32; };
template <> struct PolicyOf<PlainKey<4>> { using type = Unaligned<quant::Bf16>; };
template <> struct PolicyOf<PlainKey<6>> { using type = Unaligned<quant::F32>; };
template <class K> using policy_of = typename PolicyOf<K>::type;

// ---- the matvec kernel -------------------------------------------------------------------------------------
struct MultiArgs {
  MatrixArgs m[kMaxMultiMatrices];
  std::int64_t task_begin[kMaxMultiMatrices + 1];  // prefix sums of tasks (NR rows each)
  std::int64_t row_begin[kMaxMultiMatrices + 1];   // prefix sums of rows (argmax ids)
  float* out[kMaxMultiMatrices];                   // output of matrix i, [rows_i]
  float const* residual[kMaxMultiMatrices];        // added to it (may alias out[i]), or null
  int count = 0;
  unsigned long long* trace = nullptr;             // step timeline region (measurements), or null
  // Dynamic tail (matvec_lane_kernel, blocks of kWarps; asked for by the caller, ops::matvec or
  // launch_matvec_multi_tail, and clamped by launch_matvec_pipe, which drops it where it does not apply): the last
  // kWarps · tail_groups tasks go to blocks in groups of kWarps by tickets from *tail, in the order the blocks get
  // there, instead of by the static stride. *tail is 0 between launches (each launch takes exactly tail_groups +
  // gridDim.x tickets and atomicInc wraps it to 0). Null: every task by the static stride. Other kernels ignore it.
  unsigned* tail = nullptr;
  int tail_groups = 0;
  // Several input rows (tokens, for a speculative verification step): token k's input at x + k · x_ld (and its
  // kGatedHeadNorm gate at gate + k · x_ld, its head partials at head_ss + k · ss_ld), its outputs at out[i] + k ·
  // out_ld[i] (its residual at residual[i] + k · out_ld[i]). Each weight row is read once for all of them; token k's
  // outputs are the bits of a one-token launch on its input. matvec_lane_kernel takes 2; launch_matvec_args runs other
  // kernels and counts once per token.
  int tokens = 1;
  std::int64_t x_ld = 0, ss_ld = 0;
  std::int64_t out_ld[kMaxMultiMatrices] = {};
};

struct ArgmaxArgs {
  unsigned long long* key = nullptr;  // best (ordered logit << 32 | ~id); null: no argmax
  unsigned int* counter = nullptr;
  int* out = nullptr;
  std::int32_t* position = nullptr;   // when set, the last block also advances it (the decode step's final write)
};

// Orders floats as unsigned integers (larger float, larger key); NaN sorts above everything.
__device__ __forceinline__ std::uint32_t ordered_bits(float f) {
  std::uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ unsigned long long argmax_key(float v, std::int64_t id) {
  return (static_cast<unsigned long long>(ordered_bits(v)) << 32) | (0xFFFFFFFFu - std::uint32_t(id));
}
__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    unsigned long long t = __shfl_xor_sync(0xffffffffu, v, o);
    v = t > v ? t : v;
  }
  return v;
}
// The same through two 32-bit redux.sync reductions (sm_80+): the high words, then the low words of the lanes that
// hold the maximal high word. Two instructions instead of five shuffle rounds of 64-bit values.
__device__ __forceinline__ unsigned long long warp_max_u64_fast(unsigned long long v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned const hi = unsigned(v >> 32), lo = unsigned(v);
  unsigned const mh = __reduce_max_sync(0xffffffffu, hi);
  unsigned const ml = __reduce_max_sync(0xffffffffu, hi == mh ? lo : 0u);
  return (static_cast<unsigned long long>(mh) << 32) | ml;
#else
  return warp_max_u64(v);
#endif
}

// The argmax epilogue of a matvec launch (all threads of every block call it; kNW warps per block; best: this lane's
// largest argmax_key, the same in every lane of a warp): the block maximum, one atomic per block; the last block
// publishes the id and re-arms the workspace.
template <int kNW>
__device__ __forceinline__ void argmax_publish(ArgmaxArgs const& am, unsigned long long best) {
  if (!am.key) return;
  __shared__ unsigned long long s_best[kNW];
  __shared__ bool s_last;
  int const lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  if (lane == 0) s_best[warp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long b = 0;
    for (int w = 0; w < kNW; ++w) b = s_best[w] > b ? s_best[w] : b;
    atomicMax(am.key, b);
    __threadfence();
    s_last = atomicAdd(am.counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (s_last && threadIdx.x == 0) {
    __threadfence();
    unsigned long long k = atomicExch(am.key, 0ull);
    *am.out = int(0xFFFFFFFFu - std::uint32_t(k & 0xFFFFFFFFu));
    *am.counter = 0u;
    if (am.position) *am.position += 1;
  }
}

template <class P>
inline constexpr int kMatvecRows = 2;  // rows per warp task
template <>
inline constexpr int kMatvecRows<quant::Fp8Block> = 1;  // measured 2026-11-30: 1 row, 3 blocks/SM beat 2 rows, 2 blocks/SM
template <class P>
inline constexpr int kMatvecMinBlocks = 2;  // resident blocks per SM the register budget must allow
template <>
inline constexpr int kMatvecMinBlocks<quant::Fp8Block> = 3;

// Matrix of task t (t < a.task_begin[a.count]).
__device__ __forceinline__ int task_matrix(MultiArgs const& a, std::int64_t t) {
  int i = 0;
  while (t >= a.task_begin[i + 1]) ++i;
  return i;
}

// The warp prefetches into L2 the rows of task t (fast layouts; weights only), if it exists.
template <class P, int NR>
__device__ __forceinline__ void prefetch_task(MultiArgs const& a, std::int64_t t) {
  if constexpr (has_fast_kernel<P>) {
    if (t >= a.task_begin[a.count]) return;
    int const i = task_matrix(a, t);
    MatrixArgs const& m = a.m[i];
    std::int64_t const rb = m.ld * std::int64_t(sizeof(typename P::storage_type));
    std::int64_t const r0 = (t - a.task_begin[i]) * NR, nr = m.rows - r0 < NR ? m.rows - r0 : NR;
    warp_prefetch(static_cast<char const*>(m.data) + r0 * rb, nr * rb);
  }
}
// Tasks whose rows each warp prefetches before the PDL wait (a prefetch of every next task inside the loop was
// measured slower: LM head 108 -> 120 µs, KDA projections 20.5 -> 21.5 µs, 2026-11-30).
inline constexpr int kPrefetchAhead = 2;

// (kThreads, 2): at most 128 registers, two resident blocks per SM; without the cap the FP8 kernels grew to 151-168
// registers, one block per SM, and ran ~30% slower (measured 2026-11-30).
template <class K, int NR, int kMinBlocks = 2>
__global__ void __launch_bounds__(kThreads, kMinBlocks) matvec_kernel(MultiArgs a, float const* __restrict__ x, InputPrologue pro,
                                                          ArgmaxArgs am) {
  using P = policy_of<K>;
  extern __shared__ float4 smem_f4[];
  float* xs = reinterpret_cast<float*>(smem_f4);
  pdl_trigger();
  trace_mark(a.trace, 0);
  {
    std::int64_t const stride = std::int64_t(gridDim.x) * kWarps, t0 = std::int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    for (int k = 0; k < kPrefetchAhead; ++k) prefetch_task<P, NR>(a, t0 + k * stride);
  }
  prologue_prefetch(pro, a.m[0].cols);
  pdl_wait();
  trace_mark(a.trace, 1);
  stage_input(xs, x, a.m[0].cols, staged_elems<P>(a.m[0]), pro);
  __syncthreads();

  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  std::int64_t const total = a.task_begin[a.count];
  unsigned long long best = 0;
  for (std::int64_t t = std::int64_t(blockIdx.x) * kWarps + warp; t < total; t += std::int64_t(gridDim.x) * kWarps) {
    int const i = task_matrix(a, t);
    MatrixArgs const& m = a.m[i];
    std::int64_t const r0 = (t - a.task_begin[i]) * NR;
    void const* data[NR];
    void const* scales[NR];
    std::int64_t r[NR];
    bool valid[NR];
#pragma unroll
    for (int n = 0; n < NR; ++n) {
      data[n] = m.data;
      scales[n] = m.scales;
      valid[n] = r0 + n < m.rows;
      r[n] = valid[n] ? r0 + n : r0;
    }
    float acc[NR];
    zero(acc);
    RowDot<P>::template lane_dot<NR>(data, scales, r, valid, m, xs, acc);
    float* const out = a.out[i];
    float const* const res = a.residual[i];
#pragma unroll
    for (int n = 0; n < NR; ++n) {
      float v = warp_sum(acc[n]) * RowDot<P>::row_scale(m.scales, r[n]);
      if (valid[n]) {
        if (res) v += res[r[n]];
        if (lane == 0) out[r[n]] = v;
        if (am.key) {
          unsigned long long k = argmax_key(v, a.row_begin[i] + r[n]);
          best = k > best ? k : best;
        }
      }
    }
  }
  trace_end(a.trace);
  argmax_publish<kWarps>(am, best);
}

// ---- software-pipelined matvec: one row per warp task, the next task's loads in flight during this one's math ----
// A warp's tasks are serial round trips in matvec_kernel (load, wait ~1 µs, math, next). Here the loads of task
// t + stride are issued before the math of task t, so each warp keeps a row in flight while it computes; rows must
// fit in one batch (chunks <= 32 kU). Used for the one-row policies (block FP8: the KDA / MLA projections).
template <class P, int kU>
struct RowLoad {
  uint4 v[kU];
  float sc[kU];
};
template <class P, int kU>
__device__ __forceinline__ void row_load(RowLoad<P, kU>& L, MatrixArgs const& m, std::int64_t r) {
  using S = typename P::storage_type;
  int const lane = threadIdx.x & 31;
  int const nchunks = int(m.ld * std::int64_t(sizeof(S)) / 16);
  auto const* rowp = reinterpret_cast<uint4 const*>(static_cast<char const*>(m.data) + r * m.ld * std::int64_t(sizeof(S)));
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    int const j = lane + 32 * u;
    bool const ok = j < nchunks;
    L.v[u] = ok ? ld_stream(rowp + j) : make_uint4(0, 0, 0, 0);
    L.sc[u] = ok ? FastOps<P>::chunk_scale(m.scales, m, r, j) : 0.f;
  }
}
template <class P, int kU>
__device__ __forceinline__ float row_math(RowLoad<P, kU> const& L, MatrixArgs const& m, float const* xs) {
  using S = typename P::storage_type;
  int const lane = threadIdx.x & 31;
  int const nchunks = int(m.ld * std::int64_t(sizeof(S)) / 16);
  float acc = 0.f;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    int const j = lane + 32 * u;
    if (j < nchunks) {
      uint4 const vv[1] = {L.v[u]};
      float d[1];
      FastOps<P>::template dot<1>(vv, xs + xpad(j * FastOps<P>::kElems), d);
      acc = fmaf(L.sc[u], d[0], acc);
    }
  }
  return acc;
}

// The one-row kernels' prologue once the first row's loads are out: task t_next's rows into L2, the prologue's weights
// into L2, the PDL wait, the input staged (block-synchronized).
template <class P>
__device__ __forceinline__ void pipe_prologue(MultiArgs const& a, float const* __restrict__ x, InputPrologue const& pro,
                                              float* xs, std::int64_t t_next) {
  prefetch_task<P, 1>(a, t_next);
  prologue_prefetch(pro, a.m[0].cols);
  pdl_wait();
  trace_mark(a.trace, 1);
  stage_input(xs, x, a.m[0].cols, staged_elems<P>(a.m[0]), pro);
  __syncthreads();
  trace_mark(a.trace, 2);
}
// The same for a.tokens = kT input rows: token k staged at xs + k · xf (xf = xs_floats of one input), one after the
// other (stage_input's shared scratch serves each in turn).
template <class P, int kT>
__device__ __forceinline__ void pipe_prologue_tokens(MultiArgs const& a, float const* __restrict__ x,
                                                     InputPrologue const& pro, float* xs, int xf, std::int64_t t_next) {
  prefetch_task<P, 1>(a, t_next);
  prologue_prefetch(pro, a.m[0].cols);
  pdl_wait();
  trace_mark(a.trace, 1);
#pragma unroll 1
  for (int k = 0; k < kT; ++k) {
    InputPrologue p = pro;
    if (p.gate) p.gate += k * a.x_ld;
    if (p.head_ss) p.head_ss += k * a.ss_ld;
    if (k > 0) __syncthreads();
    stage_input(xs + k * xf, x + k * a.x_ld, a.m[0].cols, staged_elems<P>(a.m[0]), p);
  }
  __syncthreads();
  trace_mark(a.trace, 2);
}

template <class K, int kU, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) matvec_pipe_kernel(MultiArgs a, float const* __restrict__ x,
                                                                         InputPrologue pro) {
  using P = policy_of<K>;
  extern __shared__ float4 smem_f4[];
  float* xs = reinterpret_cast<float*>(smem_f4);
  std::int64_t const stride = std::int64_t(gridDim.x) * kWarps;
  std::int64_t t = std::int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  std::int64_t const total = a.task_begin[a.count];
  pdl_trigger();
  trace_mark(a.trace, 0);
  // weights do not depend on the producer: the first row's loads go out before the PDL wait (into registers), the
  // second row's into L2
  RowLoad<P, kU> cur, nxt;
  int ci = 0;
  std::int64_t cr = 0;
  if (t < total) {
    ci = task_matrix(a, t);
    cr = t - a.task_begin[ci];
    row_load(cur, a.m[ci], cr);
  }
  pipe_prologue<P>(a, x, pro, xs, t + stride);
  int const lane = threadIdx.x & 31;
  for (; t < total; t += stride) {
    std::int64_t const tn = t + stride;
    int ni = ci;
    std::int64_t nr = 0;
    if (tn < total) {
      ni = task_matrix(a, tn);
      nr = tn - a.task_begin[ni];
      row_load(nxt, a.m[ni], nr);
    }
    MatrixArgs const& m = a.m[ci];
    float v = warp_sum(row_math(cur, m, xs)) * RowDot<P>::row_scale(m.scales, cr);
    if (float const* res = a.residual[ci]) v += res[cr];
    if (lane == 0) a.out[ci][cr] = v;
    cur = nxt;
    ci = ni;
    cr = nr;
  }
  trace_end(a.trace);
}

// ---- the one-row block-FP8 matvec with lane-fixed chunks (default for block FP8 since session 9) -------------------
// ncu of the model's KDA projections on matvec_pipe_kernel (H200, 2026-12-02): 536 SASS instructions per row of 2560
// columns, of which the dot itself is ~230. The rest: per chunk a predicate and a branch, x's shared-memory address
// rebuilt, a block-scale load behind 64-bit index arithmetic; per row the matrix lookup from the parameter space from
// matrix 0 on and a 30-register copy of the next row's loads. Here lane l owns chunks l + 32u of every row it reads (as
// MoE launch B's lane kernel does): x's address is one base plus immediates (xpad(16 (l + 32u)) = xpad(16 l) + 576u),
// the block scales one pointer per row plus immediates (chunk j's scale column is j / 8 = l / 8 + 4u), no predicates
// when a row is exactly 32 kU chunks (kFull: Ling's 2560 and 4096 columns), the matrix index only moves forward, and
// two register sets alternate (no copies). The same sums in the same order as matvec_pipe_kernel: bit-identical.
// Row FP8 (the LM head, session 18) runs the same kernel: its chunk scales are 1 and its row scale comes with the
// row's loads (LaneRow::rs); the same sums in the same order as matvec_kernel, so the same bits.
template <int kU>
struct LaneRow {
  uint4 v[kU];
  float sc[kU];
  float rs;  // row FP8: the row's scale
};
template <class P, int kU, bool kFull>
__device__ __forceinline__ void lane_row_load(LaneRow<kU>& L, MatrixArgs const& m, std::int64_t r, int lane, int nchunks) {
  constexpr bool kRow = std::is_same_v<P, quant::Fp8Row>;
  char const* const rowp = static_cast<char const*>(m.data) + r * m.ld + 16 * lane;  // FP8: 1-byte storage
  float const* const sp = static_cast<float const*>(m.scales) + (kRow ? r : (r >> 7) * ((m.cols + 127) >> 7) + (lane >> 3));
  if constexpr (kRow) L.rs = __ldg(sp);
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    bool const ok = kFull || lane + 32 * u < nchunks;
    L.v[u] = ok ? ld_stream(rowp + 512 * u) : make_uint4(0, 0, 0, 0);
    if constexpr (kRow) L.sc[u] = ok ? 1.f : 0.f;
    else L.sc[u] = ok ? __ldg(sp + 4 * u) : 0.f;
  }
}

// kBW: warps per block. kBW > kWarps (matvec_lane_one_warps): the launcher gives every warp at most one row, on a grid
// that is resident at once, so no warp takes a second row after the others are done.
// kT: input rows (a.tokens), each row's chunks decoded once for all of them (fp8_dot_tokens); no argmax when kT > 1.
template <class K, int kU, int kMinBlocks, bool kFull, int kBW = kWarps, int kT = 1>
__global__ void __launch_bounds__(kBW * 32, kMinBlocks)
    matvec_lane_kernel(MultiArgs a, float const* __restrict__ x, InputPrologue pro, ArgmaxArgs am) {
  using P = policy_of<K>;
  constexpr bool kRow = std::is_same_v<P, quant::Fp8Row>;
  static_assert(std::is_same_v<P, quant::Fp8Block> || kRow, "lane-fixed chunks: FP8 rows (16 columns per chunk)");
  static_assert(kT >= 1 && kT <= 4, "input rows per launch");
  constexpr bool kOne = kBW > kWarps;
  extern __shared__ float4 smem_f4[];
  float* xs = reinterpret_cast<float*>(smem_f4);
  int const lane = int(threadIdx.x & 31);
  std::int64_t const stride = std::int64_t(gridDim.x) * kBW;
  std::int64_t t = std::int64_t(blockIdx.x) * kBW + (threadIdx.x >> 5);
  std::int64_t const total = a.task_begin[a.count];
  int const nchunks = int(a.m[0].ld / 16);  // every matrix has this ld (the launcher checks)
  pdl_trigger();
  trace_mark(a.trace, 0);
  // the first row's loads go out before the PDL wait (into registers), the second row's into L2
  LaneRow<kU> r0, r1;
  int ci = 0;  // matrix of task t; tasks only grow, so it only moves forward
  if (t < total) {
    while (t >= a.task_begin[ci + 1]) ++ci;
    lane_row_load<P, kU, kFull>(r0, a.m[ci], t - a.task_begin[ci], lane, nchunks);
  }
  // the dynamic tail's slots, after the staged inputs (zeroed before pipe_prologue's block barrier)
  int const xf = int(xs_floats(staged_elems<P>(a.m[0])));  // floats of one staged input
  int* const slots = reinterpret_cast<int*>(xs + kT * xf);
  if (a.tail)
    for (int i = int(threadIdx.x); i <= a.tail_groups; i += kBW * 32) slots[i] = 0;
  if constexpr (kT == 1)
    pipe_prologue<P>(a, x, pro, xs, kOne ? a.task_begin[a.count] : t + stride);
  else
    pipe_prologue_tokens<P, kT>(a, x, pro, xs, xf, kOne ? a.task_begin[a.count] : t + stride);
  float const* const xl = xs + xpad(16 * lane);
  float const post = FastOps<P>::kPost;  // times the row scale for row FP8 (block FP8: the block scales are per chunk)
  unsigned long long best = 0;           // argmax (am.key): this warp's largest key
  auto load = [&](std::int64_t tn, int& i, LaneRow<kU>& L) {
    while (tn >= a.task_begin[i + 1]) ++i;
    lane_row_load<P, kU, kFull>(L, a.m[i], tn - a.task_begin[i], lane, nchunks);
  };
  auto finish = [&](std::int64_t tt, int i, LaneRow<kU> const& L) {
    if constexpr (kT == 1) {
      float acc = 0.f;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (kFull || lane + 32 * u < nchunks) {
          uint4 const vv[1] = {L.v[u]};
          float d[1];
          FastOps<P>::template dot<1>(vv, xl + 576 * u, d);
          acc = fmaf(L.sc[u], d[0], acc);
        }
      }
      float v = warp_sum(acc) * (kRow ? L.rs * post : post);
      std::int64_t const r = tt - a.task_begin[i];
      if (float const* res = a.residual[i]) v += res[r];
      if (lane == 0) a.out[i][r] = v;
      if (am.key) {
        unsigned long long const k = argmax_key(v, a.row_begin[i] + r);
        best = k > best ? k : best;
      }
    } else {
      float acc[kT];
      zero(acc);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (kFull || lane + 32 * u < nchunks) {
          float d[kT];
          fp8_dot_tokens<kT>(L.v[u], xl + 576 * u, xf, d);
#pragma unroll
          for (int k = 0; k < kT; ++k) acc[k] = fmaf(L.sc[u], d[k], acc[k]);
        }
      }
      std::int64_t const r = tt - a.task_begin[i];
      float const* const res = a.residual[i];
#pragma unroll
      for (int k = 0; k < kT; ++k) {
        float v = warp_sum(acc[k]) * (kRow ? L.rs * post : post);
        std::int64_t const o = r + k * a.out_ld[i];
        if (res) v += res[o];
        if (lane == 0) a.out[i][o] = v;
      }
    }
  };
  if constexpr (kOne) {
    if (t < total) finish(t, ci, r0);
    trace_end(a.trace);
    argmax_publish<kBW>(am, best);
    return;
  }
  // The dynamic tail (a.tail): tasks [s_end, total) in groups of kBW, group g's task s_end + kBW g + warp for each
  // warp. Lane 0 of warp 0 takes the block's tickets from *a.tail: the first when the warp starts its last static task,
  // each next one when a tail round starts (so a ticket's round trip overlaps a row). It publishes round r's group in
  // slots[r] (+1; 0: not yet), where the other warps wait for it. A group >= tail_groups ends the block's work: each
  // block takes exactly one such ticket, so a launch takes tail_groups + gridDim.x, the wrap value of atomicInc.
  // Measured and removed (session 49): only the first s% of the blocks in the tail, the others leaving after their
  // static tasks so that the KDA step's blocks enter sooner (LING_MATVEC_TAIL_SHARE): 2.549 (67%) and 2.594 (34%)
  // against 2.520 ms/token (H100).
  std::int64_t const s_end = a.tail ? total - std::int64_t(kBW) * a.tail_groups : total;
  bool const taker = a.tail && threadIdx.x == 0;
  unsigned ticket = 0;  // the ticket in flight (taker)
  auto ask = [&] { ticket = atomicInc(a.tail, unsigned(a.tail_groups) + gridDim.x - 1u); };
  if (taker && t + stride >= s_end) ask();  // after the PDL wait (pipe_prologue): the previous launch is done
  int round = 0;
  auto next = [&](std::int64_t tt) -> std::int64_t {
    if (tt + stride < s_end) {
      if (taker && tt + 2 * stride >= s_end) ask();
      return tt + stride;
    }
    if (!a.tail) return total;
    // shared-memory atomics for the slots: ordered without a barrier, and not data accesses to racecheck
    int g = 0;
    if (lane == 0) {
      if (threadIdx.x == 0) {  // warp 0's lane 0 holds the ticket
        g = int(ticket);
        atomicExch(slots + round, g + 1);
        if (g < a.tail_groups) ask();
      } else {
        while ((g = atomicAdd(slots + round, 0)) == 0) __nanosleep(32);
        g -= 1;
      }
    }
    g = __shfl_sync(0xffffffffu, g, 0);
    ++round;
    return g < a.tail_groups ? s_end + std::int64_t(kBW) * g + (threadIdx.x >> 5) : total;
  };
  int ni = ci;
  while (t < total) {  // two register sets in turn: r0 holds task t, r1 takes the next task
    std::int64_t tn = next(t);
    if (tn < total) load(tn, ni, r1);
    finish(t, ci, r0);
    ci = ni;
    t = tn;
    if (t >= total) break;
    tn = next(t);
    if (tn < total) load(tn, ni, r0);
    finish(t, ci, r1);
    ci = ni;
    t = tn;
  }
  trace_end(a.trace);
  argmax_publish<kBW>(am, best);
}

// ---- matvec with its weights preloaded into shared memory before the PDL wait ---------------------------------
// Every launch of the step starts reading its weights only when its blocks become resident, and they become resident
// only as the previous launch's blocks leave (each launch fills the register file): a step of dependent launches then
// pays each launch's whole read after the previous one ends (bench/probes/read_shot.cu: ~0.9 µs + N / 4.3 TB/s). The
// weights do not depend on the producer. Here one block per SM, small enough to be resident next to the previous
// launch (512 threads at <= 64 registers: half the register file; its slice of rows in shared memory), copies its
// contiguous slice of rows (whole rows, 512 bytes per warp instruction) with cp.async at entry, so the bytes stream
// while the producer still runs; after the wait it stages the input and computes from shared memory. Fits matrices of
// up to ~100 KB of rows per SM (o_proj: 20 rows x 4 KB); the launcher refuses larger ones. Opt-in
// (LING_MATVEC_PRELOAD=1 in the model): measured slower (H200, 2026-12-01: o_proj 6.95 against 5.30 µs, 3.095 against
// 3.021 ms/token; H100, 2026-12-06, with the scales in shared memory: 2.713 against 2.526). The blocks do enter early
// (sessions 39 and 46); what loses is the part after the wait: 16 warps re-read x from shared memory for every row
// (~410 KB of shared-memory reads per SM for o_proj, ~1.8 µs at 128 bytes a cycle), and their blocks' end is ~4 µs
// after the staging (docs/kernels.md).
inline constexpr int kPreloadThreads = 512, kPreloadWarps = kPreloadThreads / 32;
inline constexpr std::size_t kPreloadMaxRowBytes = 112 * 1024;  // the slice of rows a block may hold

// The matrix of global row t (a.row_begin: prefix sums of rows).
__device__ __forceinline__ int row_matrix(MultiArgs const& a, std::int64_t t) {
  int i = 0;
  while (t >= a.row_begin[i + 1]) ++i;
  return i;
}

// Block FP8's scales of a slice's rows go into shared memory with the rows (before the PDL wait): read from global in
// the row loop, each was a dependent DRAM round trip after the wait (session 39's trace: the preloaded o_proj's blocks
// ended 5.95 µs after the wait, against 2.81 for the lane kernel, which loads the scales with the rows). Row k's
// 128-column block scales sit at preload_scale_floats's offset k * nb (nb = ceil(cols / 128)).
template <class P>
inline constexpr bool kPreloadScales = std::is_same_v<P, quant::Fp8Block>;
// Floats of shared memory for a slice's scales (a multiple of 4, so that xs stays 16-byte aligned).
template <class P>
__host__ __device__ constexpr std::int64_t preload_scale_floats(std::int64_t slice, std::int64_t cols) {
  if constexpr (kPreloadScales<P>)
    return (slice * ((cols + 127) >> 7) + 3) / 4 * 4;
  else
    return 0;
}

template <class K>
__global__ void __launch_bounds__(kPreloadThreads, 2) matvec_preload_kernel(MultiArgs a, float const* __restrict__ x,
                                                                          InputPrologue pro, std::int64_t slice) {
  using P = policy_of<K>;
  using S = typename P::storage_type;
  extern __shared__ float4 smem_f4[];
  std::int64_t const rb = a.m[0].ld * std::int64_t(sizeof(S));  // bytes per row (a multiple of 16: fast layout)
  char* const rows = reinterpret_cast<char*>(smem_f4);
  float* const ssc = reinterpret_cast<float*>(rows + slice * rb);  // kPreloadScales: row k's block scales at k * nb
  int const nb = int((a.m[0].cols + 127) >> 7);
  float* const xs = ssc + preload_scale_floats<P>(slice, a.m[0].cols);
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  std::int64_t const total = a.row_begin[a.count], t0 = std::int64_t(blockIdx.x) * slice;
  std::int64_t const n = total - t0 < slice ? total - t0 : slice;  // this block's rows [t0, t0 + n)
  pdl_trigger();
  trace_mark(a.trace, 0);
  for (std::int64_t k = warp; k < n; k += kPreloadWarps) {
    std::int64_t const t = t0 + k;
    int const i = row_matrix(a, t);
    char const* src = static_cast<char const*>(a.m[i].data) + (t - a.row_begin[i]) * rb;
    for (std::int64_t off = std::int64_t(lane) * 16; off < rb; off += 512) cp_async16(rows + k * rb + off, src + off);
    if constexpr (kPreloadScales<P>) {
      float const* sp = static_cast<float const*>(a.m[i].scales) + ((t - a.row_begin[i]) >> 7) * nb;
      for (int b = lane; b < nb; b += 32) cp_async4(ssc + k * nb + b, sp + b);
    }
  }
  cp_async_commit();
  prologue_prefetch(pro, a.m[0].cols);
  pdl_wait();
  trace_mark(a.trace, 1);
  stage_input(xs, x, a.m[0].cols, staged_elems<P>(a.m[0]), pro);
  cp_async_wait(0);
  __syncthreads();  // every warp's copies and the staged input, visible to the block
  trace_mark(a.trace, 2);
  int const nchunks = int(rb / 16);
  for (std::int64_t k = warp; k < n; k += kPreloadWarps) {
    std::int64_t const t = t0 + k;
    int const i = row_matrix(a, t);
    MatrixArgs const& m = a.m[i];
    std::int64_t const r = t - a.row_begin[i];
    uint4 const* row = reinterpret_cast<uint4 const*>(rows + k * rb);
    float const* const rsc = ssc + k * nb;
    float acc = 0.f;
    for (int j = lane; j < nchunks; j += 32) {
      uint4 const vv[1] = {row[j]};
      float d[1];
      FastOps<P>::template dot<1>(vv, xs + xpad(j * FastOps<P>::kElems), d);
      float sc;
      if constexpr (kPreloadScales<P>)
        sc = rsc[j >> 3];  // chunk j (16 columns) lies in 128-column block j / 8
      else
        sc = FastOps<P>::chunk_scale(m.scales, m, r, j);
      acc = fmaf(sc, d[0], acc);
    }
    float v = warp_sum(acc) * RowDot<P>::row_scale(m.scales, r);
    if (float const* res = a.residual[i]) v += res[r];
    if (lane == 0) a.out[i][r] = v;
  }
  trace_end(a.trace);
}

// Rows per block of the preloaded matvec for `total` rows of `row_bytes` each: 0 when the slice does not fit.
inline std::int64_t preload_slice(std::int64_t total, std::int64_t row_bytes, int sms) {
  if (total <= 0 || row_bytes <= 0 || sms <= 0) return 0;
  std::int64_t const slice = (total + sms - 1) / sms;
  return std::size_t(slice * row_bytes) <= kPreloadMaxRowBytes ? slice : 0;
}

// ---- host side -------------------------------------------------------------------------------------------
inline int sm_count() {
  static int n = [] {
    int dev = 0, c = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) c = 132;
    return c;
  }();
  return n;
}

// Raises the kernel's dynamic shared-memory limit when smem is over the default 48 KB.
template <class Kernel>
inline cudaError_t allow_dynamic_smem(Kernel k, std::size_t smem) {
  if (smem <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
}

// Blocks of a persistent grid: as many as fit at once (all resident), no more than there is work for.
template <class Kernel>
inline cudaError_t persistent_grid(Kernel k, std::size_t smem, std::int64_t work_blocks, int& blocks) {
  cudaError_t e = allow_dynamic_smem(k, smem);
  if (e != cudaSuccess) return e;
  int per_sm = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, smem);
  if (e != cudaSuccess) return e;
  std::int64_t cap = std::int64_t(per_sm > 0 ? per_sm : 1) * sm_count();
  blocks = int(work_blocks < cap ? (work_blocks > 0 ? work_blocks : 1) : cap);
  return cudaSuccess;
}

// The pipelined kernel's batch (chunks per lane) for rows of `nchunks` 16-byte chunks; 0: rows too long for it.
inline int pipe_unroll(std::int64_t nchunks) {
  return nchunks <= 64 ? 2 : nchunks <= 160 ? 5 : nchunks <= 256 ? 8 : 0;
}
// LING_MATVEC_LANE=0: block FP8 on matvec_pipe_kernel instead of matvec_lane_kernel (A/B; the outputs are the
// same bits); read at each launch.
inline bool matvec_lane_enabled() { return !env_off("LING_MATVEC_LANE"); }
// Warps per block of matvec_lane_kernel's one-row instances for `total` rows (0: the usual blocks of kWarps). When
// the usual grid (two blocks of kWarps per SM) would give some warps a second row, one block of w > kWarps warps per
// w rows, two per SM, gives each warp one row: KDA's o_proj (2560 rows) had 448 warps with a second row, a ~2 µs tail
// (step timeline, H200, 2026-12-02). Instances: 10 and 12 warps. LING_MATVEC_ONE=0 turns this off (A/B).
inline int matvec_lane_one_warps(std::int64_t total) {
  if (env_off("LING_MATVEC_ONE")) return 0;
  std::int64_t const two = 2 * std::int64_t(sm_count());
  if (total <= two * kWarps) return 0;
  return total <= two * 10 ? 10 : total <= two * 12 ? 12 : 0;
}
// The dynamic tail of matvec_lane_kernel (MultiArgs::tail): at most this many groups of kWarps tasks.
inline constexpr int kMaxTailGroups = 1024;
// Groups of the dynamic tail for `total` tasks on `blocks` blocks of kWarps warps, `want` asked for: at most
// kMaxTailGroups, and every warp keeps at least one static task (the first is loaded before the PDL wait).
inline int matvec_tail_groups(std::int64_t total, int blocks, int want) {
  std::int64_t const room = (total - std::int64_t(blocks) * kWarps) / kWarps;
  std::int64_t g = want < kMaxTailGroups ? want : kMaxTailGroups;
  g = g < room ? g : room;
  return g > 0 ? int(g) : 0;
}
// LING_MATVEC_ROW_LANE=0: row FP8 (the LM head) on matvec_kernel instead of matvec_lane_kernel (A/B; the same bits);
// read at each launch.
inline bool matvec_row_lane_enabled() {
  return !env_off("LING_MATVEC_ROW_LANE");
}
// am: the argmax epilogue (matvec_lane_kernel only: the caller passes none to the pipelined kernel).
template <class K>
cudaError_t launch_matvec_pipe(K, MultiArgs const& a, float const* x, InputPrologue const& pro, int ku, cudaStream_t stream,
                               ArgmaxArgs am = {}) {
  using P = policy_of<K>;
  constexpr bool kRow = std::is_same_v<P, quant::Fp8Row>;
  std::size_t const smem = std::size_t(xs_floats(staged_elems<P>(a.m[0]))) * sizeof(float);
  std::int64_t const total = a.task_begin[a.count];
  auto go = [&](auto kernel, std::size_t bytes, auto... tail) {  // tail: the lane kernel's argmax
    int blocks = 0;
    // the dynamic tail's slots: the grid sized for the most slots (kMaxTailGroups + 1 ints), so that it does not
    // depend on the tail's size
    bool const dyn = a.tail && !am.key;  // not with the argmax epilogue (the LM head: no gain, session 48)
    std::size_t const slot_bytes = dyn ? std::size_t(kMaxTailGroups + 1) * sizeof(int) : 0;
    cudaError_t e = persistent_grid(kernel, bytes + slot_bytes, (total + kWarps - 1) / kWarps, blocks);
    if (e != cudaSuccess) return e;
    MultiArgs b = a;
    b.tail_groups = dyn ? matvec_tail_groups(total, blocks, a.tail_groups) : 0;
    if (b.tail_groups == 0) b.tail = nullptr;
    std::size_t const sm = bytes + (b.tail ? std::size_t(b.tail_groups + 1) * sizeof(int) : 0);
    return launch_ex(kernel, dim3(unsigned(blocks)), dim3(kThreads), sm, stream, b, x, pro, tail...);
  };
  if constexpr (std::is_same_v<P, quant::Fp8Block> || kRow) {
    if (a.tokens == 2) {  // launch_matvec_args sends two input rows here only for the lane kernel, without argmax
      if (!(kRow || matvec_lane_enabled()) || am.key) return cudaErrorInvalidValue;
      bool const full = a.m[0].ld == std::int64_t(512) * ku;
      if (ku == 2)
        return full ? go(matvec_lane_kernel<K, 2, 3, true, kWarps, 2>, 2 * smem, am)
                    : go(matvec_lane_kernel<K, 2, 3, false, kWarps, 2>, 2 * smem, am);
      if (ku == 5)  // two blocks per SM: at three (80 registers) the two-row instances spilled
        return full ? go(matvec_lane_kernel<K, 5, 2, true, kWarps, 2>, 2 * smem, am)
                    : go(matvec_lane_kernel<K, 5, 2, false, kWarps, 2>, 2 * smem, am);
      return full ? go(matvec_lane_kernel<K, 8, 2, true, kWarps, 2>, 2 * smem, am)
                  : go(matvec_lane_kernel<K, 8, 2, false, kWarps, 2>, 2 * smem, am);
    }
    if (kRow || matvec_lane_enabled()) {
      // rows of exactly 32 ku chunks: no predicates
      bool const full = a.m[0].ld == std::int64_t(512) * ku;
      auto one = [&](auto kernel, int bw) {  // every warp one row (matvec_lane_one_warps): no tail to balance
        if (cudaError_t e = allow_dynamic_smem(kernel, smem); e != cudaSuccess) return e;
        MultiArgs b = a;
        b.tail = nullptr;
        b.tail_groups = 0;
        return launch_ex(kernel, dim3(unsigned((total + bw - 1) / bw)), dim3(unsigned(bw * 32)), smem, stream, b, x,
                         pro, am);
      };
      if (int const bw = matvec_lane_one_warps(total); bw > 0 && ku == 8 && full)
        return bw == 10 ? one(matvec_lane_kernel<K, 8, 2, true, 10>, 10)
                        : one(matvec_lane_kernel<K, 8, 2, true, 12>, 12);
      if (ku == 2)
        return full ? go(matvec_lane_kernel<K, 2, 3, true>, smem, am)
                    : go(matvec_lane_kernel<K, 2, 3, false>, smem, am);
      if (ku == 5)
        return full ? go(matvec_lane_kernel<K, 5, 3, true>, smem, am)
                    : go(matvec_lane_kernel<K, 5, 3, false>, smem, am);
      return full ? go(matvec_lane_kernel<K, 8, 2, true>, smem, am) : go(matvec_lane_kernel<K, 8, 2, false>, smem, am);
    }
  }
  if (a.tokens != 1) return cudaErrorInvalidValue;
  if constexpr (!kRow) {
    if (ku == 2) return go(matvec_pipe_kernel<K, 2, 3>, smem);
    if (ku == 5) return go(matvec_pipe_kernel<K, 5, 3>, smem);
    return go(matvec_pipe_kernel<K, 8, 2>, smem);  // two buffers of 8 chunks need the 128-register budget
  }
}
// LING_MATVEC_PIPE=0 turns the pipelined kernel off (A/B measurements); read at each launch.
inline bool matvec_pipe_enabled() {
  return !env_off("LING_MATVEC_PIPE");
}

// The launch is written in a function templated on the kernel key (not the policy) so that nvcc's host stub never
// has to spell quant::Plain<...> (see make_key).
// kNR (rows per warp task; 0: kMatvecRows) and kMinBlocks (resident blocks per SM the register budget allows) are
// tuning knobs for the benchmarks; a.task_begin must count tasks of the NR rows used.
template <int kNR = 0, int kMinBlocks = 0, class K>
cudaError_t launch_matvec_keyed(K, MultiArgs const& a, float const* x, InputPrologue const& pro, ArgmaxArgs am,
                                cudaStream_t stream) {
  using P = policy_of<K>;
  constexpr int NR = kNR > 0 ? kNR : kMatvecRows<P>;
  if constexpr (kNR == 0 && kMinBlocks == 0 && has_fast_kernel<P>) {
    int const ku = pipe_unroll(a.m[0].ld * std::int64_t(sizeof(typename P::storage_type)) / 16);
    bool same_ld = true;
    for (int i = 1; i < a.count; ++i) same_ld = same_ld && a.m[i].ld == a.m[0].ld;
    if constexpr (NR == 1) {
      if (ku > 0 && same_ld && !am.key && matvec_pipe_enabled()) return launch_matvec_pipe(K{}, a, x, pro, ku, stream);
    }
    // row FP8 (the LM head, with or without its argmax) on matvec_lane_kernel: one row per task
    if constexpr (std::is_same_v<P, quant::Fp8Row>) {
      if (ku > 0 && same_ld && matvec_row_lane_enabled()) {
        MultiArgs b = a;
        for (int i = 0; i <= b.count; ++i) b.task_begin[i] = b.row_begin[i];
        return launch_matvec_pipe(K{}, b, x, pro, ku, stream, am);
      }
    }
  }
  std::size_t const smem = std::size_t(xs_floats(staged_elems<P>(a.m[0]))) * sizeof(float);
  constexpr int MB = kMinBlocks > 0 ? kMinBlocks : kMatvecMinBlocks<P>;
  auto kernel = matvec_kernel<K, NR, MB>;
  int blocks = 0;
  std::int64_t const total = a.task_begin[a.count];
  cudaError_t e = persistent_grid(kernel, smem, (total + kWarps - 1) / kWarps, blocks);
  if (e != cudaSuccess) return e;
  return launch_ex(kernel, dim3(unsigned(blocks)), dim3(kThreads), smem, stream, a, x, pro, am);
}
// Whether a.tokens = 2 input rows take matvec_lane_kernel's two-row instances (launch_matvec_keyed's path to
// launch_matvec_pipe, the lane kernel on): block and row FP8 in the fast layout, one row length.
template <class P>
bool matvec_tokens_fast(MultiArgs const& a, ArgmaxArgs const& am) {
  if constexpr (!std::is_same_v<P, quant::Fp8Block> && !std::is_same_v<P, quant::Fp8Row>) {
    return false;
  } else {
    if (a.tokens != 2 || am.key) return false;
    for (int i = 1; i < a.count; ++i)
      if (a.m[i].ld != a.m[0].ld) return false;
    if (pipe_unroll(a.m[0].ld / 16) == 0) return false;
    if constexpr (std::is_same_v<P, quant::Fp8Block>) return matvec_pipe_enabled() && matvec_lane_enabled();
    else return matvec_row_lane_enabled();
  }
}
// MultiArgs::tokens > 1: two rows on the lane kernel (matvec_tokens_fast), otherwise one launch per token (token k's
// inputs, outputs and prologue pointers offset by k strides: the same bits, each weight read once per token). The
// argmax epilogue takes one token.
template <class P>
cudaError_t launch_matvec_args(MultiArgs const& a, float const* x, InputPrologue const& pro, ArgmaxArgs am,
                               cudaStream_t stream) {
  if (a.tokens == 1) return launch_matvec_keyed(make_key<P>(), a, x, pro, am, stream);
  if (a.tokens < 1 || am.key) return cudaErrorInvalidValue;
  if (matvec_tokens_fast<P>(a, am)) return launch_matvec_keyed(make_key<P>(), a, x, pro, am, stream);
  for (int k = 0; k < a.tokens; ++k) {
    MultiArgs b = a;
    b.tokens = 1;
    for (int i = 0; i < a.count; ++i) {
      b.out[i] = a.out[i] + k * a.out_ld[i];
      b.residual[i] = a.residual[i] ? a.residual[i] + k * a.out_ld[i] : nullptr;
    }
    InputPrologue p = pro;
    if (p.gate) p.gate += k * a.x_ld;
    if (p.head_ss) p.head_ss += k * a.ss_ld;
    cudaError_t const e = launch_matvec_keyed(make_key<P>(), b, x + k * a.x_ld, p, am, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// The preloaded matvec (a.row_begin set; every matrix of one row length, fast layout): cudaErrorInvalidValue when the
// rows do not fit (the caller runs launch_matvec_args instead).
template <class K>
cudaError_t launch_matvec_preload_keyed(K, MultiArgs const& a, float const* x, InputPrologue const& pro, cudaStream_t stream) {
  using P = policy_of<K>;
  if constexpr (!has_fast_kernel<P>) {
    return cudaErrorInvalidValue;
  } else {
    if (a.count <= 0 || a.tokens != 1) return cudaErrorInvalidValue;
    for (int i = 1; i < a.count; ++i)
      if (a.m[i].ld != a.m[0].ld) return cudaErrorInvalidValue;
    std::int64_t const rb = a.m[0].ld * std::int64_t(sizeof(typename P::storage_type)), total = a.row_begin[a.count];
    std::int64_t const slice = preload_slice(total, rb, sm_count());
    if (slice == 0) return cudaErrorInvalidValue;
    std::size_t const smem =
        std::size_t(slice * rb) +
        std::size_t(preload_scale_floats<P>(slice, a.m[0].cols) + xs_floats(staged_elems<P>(a.m[0]))) * sizeof(float);
    auto kernel = matvec_preload_kernel<K>;
    if (cudaError_t e = allow_dynamic_smem(kernel, smem); e != cudaSuccess) return e;
    unsigned const blocks = unsigned((total + slice - 1) / slice);
    return launch_ex(kernel, dim3(blocks), dim3(kPreloadThreads), smem, stream, a, x, pro, slice);
  }
}
template <class P>
cudaError_t launch_matvec_preload_args(MultiArgs const& a, float const* x, InputPrologue const& pro, cudaStream_t stream) {
  return launch_matvec_preload_keyed(make_key<P>(), a, x, pro, stream);
}

// Tasks and row offsets of a MultiArgs whose m[0..count) are set; outputs concatenated into y (with residual, if
// any, at the same offsets).
template <class P, int NR = kMatvecRows<P>>
bool finish_multi_args(MultiArgs& a, float* y, float const* residual) {
  bool ok = a.count > 0 && a.count <= kMaxMultiMatrices;
  if (!ok) return false;
  a.task_begin[0] = 0;
  a.row_begin[0] = 0;
  for (int i = 0; i < a.count; ++i) {
    ok = ok && a.m[i].rows > 0 && a.m[i].cols == a.m[0].cols;
    a.task_begin[i + 1] = a.task_begin[i] + (a.m[i].rows + NR - 1) / NR;
    a.row_begin[i + 1] = a.row_begin[i] + a.m[i].rows;
    if (y) a.out[i] = y + a.row_begin[i];
    a.residual[i] = residual ? residual + a.row_begin[i] : nullptr;
  }
  return ok;
}

template <class P, int NR = kMatvecRows<P>>  // NR: rows per task
MultiArgs multi_args(DeviceMatrix<P> const* const* ws, int count, float* y, float const* residual, bool& ok) {
  MultiArgs a{};
  a.count = count;
  ok = count > 0 && count <= kMaxMultiMatrices;
  if (!ok) return a;
  for (int i = 0; i < count; ++i) {
    ok = ok && !ws[i]->empty();
    a.m[i] = ws[i]->args();
  }
  ok = ok && finish_multi_args<P, NR>(a, y, residual);
  return a;
}

}  // namespace ling::cuda::kernels

namespace ling::cuda {

template <quant::weight_policy P>
cudaError_t launch_matvec(DeviceMatrix<P> const& w, float const* x, float* y, cudaStream_t stream,
                          MatvecEpilogue epilogue) {
  DeviceMatrix<P> const* one[1] = {&w};
  bool ok = false;
  kernels::MultiArgs a = kernels::multi_args<P>(one, 1, y, epilogue.residual, ok);
  if (!ok) return cudaErrorInvalidValue;
  return kernels::launch_matvec_args<P>(a, x, InputPrologue{}, {}, stream);
}

template <quant::weight_policy P>
cudaError_t launch_matvec_multi(std::span<DeviceMatrix<P> const* const> ws, float const* x, float* y,
                                cudaStream_t stream) {
  bool ok = false;
  kernels::MultiArgs a = kernels::multi_args<P>(ws.data(), int(ws.size()), y, nullptr, ok);
  return ok ? kernels::launch_matvec_args<P>(a, x, InputPrologue{}, {}, stream) : cudaErrorInvalidValue;
}

template <quant::weight_policy P>
cudaError_t launch_matvec_multi_tail(std::span<DeviceMatrix<P> const* const> ws, float const* x, float* y,
                                     cudaStream_t stream, unsigned* counter, int tail_percent) {
  bool ok = false;
  kernels::MultiArgs a = kernels::multi_args<P>(ws.data(), int(ws.size()), y, nullptr, ok);
  if (!ok || !counter || tail_percent < 0 || tail_percent > 100) return cudaErrorInvalidValue;
  a.tail = counter;
  a.tail_groups = int(a.task_begin[a.count] * tail_percent / 100 / kernels::kWarps);
  return kernels::launch_matvec_args<P>(a, x, InputPrologue{}, {}, stream);
}

template <quant::weight_policy P>
cudaError_t launch_matvec_multi_preload(std::span<DeviceMatrix<P> const* const> ws, float const* x, float* y,
                                        cudaStream_t stream) {
  bool ok = false;
  kernels::MultiArgs a = kernels::multi_args<P>(ws.data(), int(ws.size()), y, nullptr, ok);
  return ok ? kernels::launch_matvec_preload_args<P>(a, x, InputPrologue{}, stream) : cudaErrorInvalidValue;
}

template <quant::weight_policy P>
cudaError_t launch_matvec_multi_tokens(std::span<DeviceMatrix<P> const* const> ws, float const* x, int tokens, float* y,
                                       cudaStream_t stream, InputPrologue const& pro, float const* residual) {
  bool ok = false;
  kernels::MultiArgs a = kernels::multi_args<P>(ws.data(), int(ws.size()), y, residual, ok);
  if (!ok || tokens < 1) return cudaErrorInvalidValue;
  if (pro.head_ss && (pro.head <= 0 || a.m[0].cols % pro.head != 0 || pro.ss_parts < 1)) return cudaErrorInvalidValue;
  a.tokens = tokens;
  a.x_ld = a.m[0].cols;
  a.ss_ld = pro.head_ss ? a.m[0].cols / pro.head * pro.ss_parts : 0;
  for (int i = 0; i < a.count; ++i) a.out_ld[i] = a.row_begin[a.count];
  return kernels::launch_matvec_args<P>(a, x, pro, {}, stream);
}

}  // namespace ling::cuda
