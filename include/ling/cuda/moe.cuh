#pragma once
// Fused MoE kernels (declarations in moe.hpp; spec §2 "MoE FFN"). nvcc only.
// Launch A: one warp task = row r of one slot (top_k routed experts, then the shared expert): the gate and up rows
//   are read together (NR = 2, one pass over the staged input) and φ is applied in the epilogue.
// Launch B: one warp task = output row r: lanes own the 16-byte chunks of the concatenated down rows of all top_k
//   experts (so all their loads are in flight together), each chunk weighted by its expert's routing weight; then
//   the shared expert's down row; one warp sum; plus the residual.
// Those are the register-streaming kernels (any policy). MXFP4 experts with an FP8-block shared expert run launch A on
// the streamed kernel instead (section "streamed MoE": per-warp cp.async rings in shared memory), launch B optionally.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <type_traits>

#include "ling/cuda/async_copy.cuh"
#include "ling/cuda/grid_round.hpp"
#include "ling/cuda/linear.cuh"
#include "ling/cuda/moe.hpp"
#include "ling/cuda/moe_pace.hpp"
#include "ling/cuda/router.cuh"
#include "ling/cuda/wgmma.cuh"

namespace ling::cuda::kernels {

inline constexpr int kMoeFlatUnroll = 8;  // chunks per lane per batch in launch B
// SM cycles between the routed tiles' copies of successive warps of a launch A block (MoeArgs::pace) where the device's
// attributes cannot be read; otherwise the launcher derives the pace from the device (moe_pace.hpp). Measured (H200,
// 2026-12-04, context 0, alternated in one process): 2.238 / 2.238 ms/token against 2.263 / 2.264 issued at once;
// 450 cycles 2.255 / 2.255, 550 2.239, 1000 cycles 2.278. On an H100 (2026-12-06): 2.538-2.540 against 2.528 at 850.
inline constexpr int kMoePaceA = 700;

__device__ __forceinline__ float swiglu(float a, float b, float limit) {
  float s = a / (1.0f + expf(-a));
  if (limit > 0.f) {
    s = fminf(s, limit);
    b = fminf(fmaxf(b, -limit), limit);
  }
  return s * b;
}

template <class P>
__device__ __forceinline__ void const* batch_data(MatrixArgs const& m, int e) {
  return static_cast<char const*>(m.data) + std::int64_t(e) * m.data_stride;
}
template <class P>
__device__ __forceinline__ void const* batch_scales(MatrixArgs const& m, int e) {
  return m.scales ? static_cast<char const*>(m.scales) + std::int64_t(e) * m.scale_stride : nullptr;
}

struct MoeArgs {
  MatrixArgs gate, up, down, sgate, sup, sdown;
  int const* idx;
  float const* weights;
  int top_k;
  int has_shared;
  float routed_limit, shared_limit;
  // route.logits set: launch A selects the experts itself (every block, from the router logits) instead of reading
  // idx, and block 0 writes the picks to sel_idx / sel_w, which launch B then reads as idx / weights
  RouteSel route;
  int* sel_idx;
  float* sel_w;
  int route_ahead = 1;          // the streamed launch A loads the selection's inputs ahead (router.cuh RouteAhead)
  // Router rows in launch A (the streamed kernel only; launch_moe_gate_up_stream decides, else a router launch computes
  // the logits first): each block computes the logits of its rows of the BF16 router matrix (loaded before the PDL
  // wait) into router_out (= route.logits), the blocks meet at a grid-wide barrier (grid_bar), then select as usual.
  // router.data null: the logits come from a router launch.
  MatrixArgs router{};
  float* router_out = nullptr;
  unsigned long long* grid_bar = nullptr;
  unsigned long long* trace_a;  // step timeline regions of launch A and B (measurements), or null
  unsigned long long* trace_b;
  // Where the streamed launch A marks its midpoint (LING_TRACE_MOEA, measurements): 0 after the expert selection (the
  // default), 1 after staging its input, 2 after the router rows' dot (before the grid barrier), 3 after the barrier;
  // 4 when the block's last tile has landed (the latest of its warps), 5 when its warps have issued their tiles' copies.
  int trace_mid = 0;
  // Launch A's r-th warp with routed tiles issues them pace · r SM cycles after the selection, so that a block's
  // tiles land in order (bench/probes/tile_landing; docs/kernels.md "Launch A's routed tiles paced"). Negative: the
  // launcher sets the device's pace for the routed tile's bytes (moe_pace_device); LING_MOE_PACE (moe_pace_a) sets it
  // for the model; 0 issues them all at once.
  int pace = -1;
};

// Stages idx into shared memory; an id out of range becomes -1 (its outputs turn NaN, never a wild read).
__device__ __forceinline__ void stage_idx(int* s_idx, float* s_w, MoeArgs const& a) {
  for (int s = threadIdx.x; s < a.top_k; s += blockDim.x) {
    int e = a.idx[s];
    s_idx[s] = (e >= 0 && e < a.gate.count) ? e : -1;
    if (s_w) s_w[s] = a.weights[s];
  }
}

// ---- router rows inside launch A ---------------------------------------------------------------------------------
// Each MoE layer had a router launch (2.6 MB of BF16 rows at Ling's shape, 0.6 µs of bytes) between the attention's
// output launch and launch A; the step timeline measured it at 5.4 µs per layer, nearly all of it the launch boundary
// (its blocks become resident only as the previous launch's leave). Here the streamed launch A computes the logits
// itself: block b's warp kW - 1 - j takes router row b + j · grid, copied into shared memory before the PDL wait
// (cp.async, its own commit group: no registers held across the wait; holding the row in registers took launch A from
// 101 to 127 registers per thread, the whole register file at 16 warps), writes its logit, and the blocks meet at
// grid_barrier before the selection. The sums are the router launch's (RowDot<Bf16>::lane_dot), in its order:
// bit-identical logits. Shared memory: a ring buffer of the warp that no early tile holds (the last warps' first
// tiles are routed ones, issued only after the selection; the launcher checks that every router warp has one, else a
// router launch computes the logits). Measured on the H200 (2026-12-02, context 0): 2.595 ms/token with the rows in
// ring buffers, 2.666 with the router launch, 2.705 with the rows in a region of their own (+20 KB per block, session
// 10's first version, removed: slower than the router launch): that made the next layer's projections 2.5 µs longer.
// Our reading (not measured directly): 192 KB per block fits the SM's 196 KB shared-memory configuration, 212 KB needs
// the 228 KB one, which leaves the launches after it 28 KB of L1 instead of 60 (the FP8 block scales are read
// through L1).
__device__ __forceinline__ void router_row_copy(MatrixArgs const& w, std::int64_t r, unsigned char* dst) {
  std::int64_t const bytes = w.ld * 2;  // BF16 rows, whole 16-byte chunks (the launcher checks)
  warp_copy(dst, Span16{static_cast<char const*>(w.data) + r * bytes, std::uint32_t(bytes), 0u});
}
// The row's logit (every lane returns it) from its copy in shared memory.
__device__ __forceinline__ float router_row_dot(MatrixArgs const& w, unsigned char const* row, float const* xs) {
  int const nchunks = int(w.ld / 8);  // BF16: 8 columns per chunk
  float acc = 0.f;
  for (int j = int(threadIdx.x & 31); j < nchunks; j += 32) {  // a lane reads the chunks it copied itself
    uint4 const vv[1] = {reinterpret_cast<uint4 const*>(row)[j]};
    float d[1];
    FastOps<quant::Bf16>::dot<1>(vv, xs + xpad(j * 8), d);
    acc += d[0];  // the router launch's fmaf(chunk scale, d, acc) with a BF16 chunk scale of 1: the same sum
  }
  return warp_sum(acc) * RowDot<quant::Bf16>::row_scale(nullptr, 0);
}

// A grid-wide barrier for a launch whose blocks are all resident at once (the launcher checks the occupancy; a later
// launch can take an SM only after every block of this one has started, PDL's rule). One atomic per block on a 64-bit
// counter that is never reset: every round adds exactly 2^32 in total, so the value a block's atomic returns names its
// round, and the block waits until the counter reaches the round's end (grid_round.hpp, tested on the CPU). Any grid
// size, any sequence of launches, nothing to re-arm. Bounded: if the round never completed (impossible when the
// launcher's check holds) the block traps, which the host sees as a launch error, instead of hanging. The barrier
// orders the blocks' earlier global writes before everyone's later reads (fence, then acquire), which must bypass L1
// (__ldcg).
// Measured and removed (session 22): an acquire-release fence (fence.acq_rel.gpu, MEMBAR.ALL.GPU) instead of
// __threadfence()'s MEMBAR.SC.GPU before the atomic, 2.366 / 2.365 against 2.365 / 2.364 ms/token: no effect.
__device__ __forceinline__ void grid_barrier(unsigned long long* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    std::uint64_t const target = grid_round::target(atomicAdd(bar, grid_round::increment(blockIdx.x, gridDim.x)));
    for (unsigned n = 0;; ++n) {
      unsigned long long v;
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(bar) : "memory");
      if (grid_round::reached(v, target)) break;
      if (n > (1u << 24)) __trap();  // seconds: never in a correct launch
    }
  }
  __syncthreads();
}

// Launch A's expert ids into s_idx: the router's selection, here in every block (fused routing: no last-block handoff in
// the router launch; block 0 writes the picks for launch B), or the ids the router launch wrote. Ends synchronized.
// scratch: 2 · route.experts floats of shared memory, free until the end of this call (the selection's scores), 16-byte
// aligned (the selection loads its keys, scratch + route.experts, 16 bytes at a time; else it takes a slower path).
// kCand (the streamed launch A): router_select_fast (the candidate selection; its fallback out of line), which ends
// synchronized itself; block 0's warp 0 writes launch B's picks after that barrier. Else router_select_block inline.
template <bool kCand = false>
__device__ __forceinline__ void moe_block_routing(MoeArgs const& a, int* s_idx, float* scratch, RouteAhead const& ahead = {},
                                                  bool use_ahead = false) {
  if (a.route.logits) {
    bool const first = blockIdx.x == 0;
    if constexpr (kCand) {
      (void)router_select_fast(a.route, ahead, use_ahead, scratch, s_idx, nullptr, first ? a.sel_idx : nullptr,
                               first ? a.sel_w : nullptr);
      return;
    }
    __shared__ float s_wsel[kMoeMaxTopK];
    router_select_block(a.route, scratch, scratch + a.route.experts, s_idx, s_wsel, ahead, use_ahead,
                        first ? a.sel_idx : nullptr, first ? a.sel_w : nullptr);
  } else {
    stage_idx(s_idx, nullptr, a);
  }
  __syncthreads();
}

// The shared expert's gate and up rows r · xs (its own policy, CUDA cores): the warp-summed dot products.
template <class PS>
__device__ __forceinline__ float2 shared_gate_up_row(MoeArgs const& a, float const* xs, std::int64_t r) {
  void const* data[2] = {a.sgate.data, a.sup.data};
  void const* scales[2] = {a.sgate.scales, a.sup.scales};
  std::int64_t rr[2] = {r, r};
  bool valid[2] = {true, true};
  float acc[2] = {0.f, 0.f};
  // at most 5 chunks per lane in flight (Ling's 2560-column FP8 rows are 160 chunks): the default 8 spilled here
  constexpr int kU = RowDot<PS>::kUnroll < 5 ? RowDot<PS>::kUnroll : 5;
  RowDot<PS>::template lane_dot<2, kU>(data, scales, rr, valid, a.sgate, xs, acc);
  return make_float2(warp_sum(acc[0]) * RowDot<PS>::row_scale(scales[0], r),
                     warp_sum(acc[1]) * RowDot<PS>::row_scale(scales[1], r));
}

// Launch B's input: the routed slots' h[s * inter + j] at segments of `seg` staged floats each (zero past inter), then
// the shared expert's h at segment top_k (seg = 0: no routed slots, the dense MLP).
template <class PS>
__device__ __forceinline__ void stage_down_input(float* xs, float const* __restrict__ h, MoeArgs const& a, int seg) {
  int const top_k = a.top_k;
  std::int64_t const inter = a.down.cols, shared_n = a.has_shared ? a.sdown.cols : 0;
  stage(xs, std::int64_t(top_k) * seg + (a.has_shared ? round32(staged_elems<PS>(a.sdown)) : 0), [=](int c) {
    int const s = (seg > 0 && c / seg < top_k) ? c / seg : top_k, j = c - s * seg;
    if (s < top_k) return j < inter ? h[s * inter + j] : 0.f;
    return j < shared_n ? h[std::int64_t(top_k) * inter + j] : 0.f;
  });
}

// Routed experts that take the int8 path below. Launch A (gate/up) uses it by default; launch B (down) does not: its
// input (top_k × inter = 6144 values in Ling) is quantized again by every block, which costs about what the cheaper
// decode saves (2026-11-30, H200, ling bench at context 0: 3.407 ms/token with launch A on int8, 3.422 with both,
// 3.527 with neither; launch A alone 14.9 µs on int8 against 17.1 on the fp32 decoder). LING_MOE_Q8=0: neither
// launch, =2: both (A/B measurements); moe_q8_mode() in moe.hpp reads it at each launch.
template <class P>
inline constexpr bool kMoeQ8 = std::is_same_v<P, quant::Mxfp4>;
// ---- MXFP4 experts on int8 dot products (CUDA cores) ---------------------------------------------------------
// E2M1 codes are integers at twice their value (0, 1, 2, 3, 4, 6, 8, 12, signed), so their products with int8
// activations are exact. PRMT looks up four codes at once in an 8-byte table: a code with its sign bit set selects
// 0 there (prmt's sign mode replicates the msb of the selected byte, 0 in every entry), and a second lookup with the
// sign bits flipped gives the negative codes' magnitudes; DP4A accumulates both against the activation limbs in
// int32, pos and neg apart. Activations, per 32-element block: x ≈ sx (q0 + q1 / 254) with q0, q1 ∈ [-127, 127]
// (two int8 limbs, error ≤ amax / 64516 ≈ 1.5e-5 amax). Per weight ~1.75 instructions (PRMT, LOP3, 2 × DP4A per 4
// codes and limb) instead of ~4.7 for the fp32 bit-pattern decoder (SHL + LOP3 for the magnitude, SHL + LOP3 for the
// sign, FFMA); ncu on launch A: 10.4M → 7.6M instructions.
inline constexpr std::uint32_t kE2m1TabLo = 0x03020100u, kE2m1TabHi = 0x0C080604u;  // 2 × {0, .5, 1, 1.5, 2, 3, 4, 6}
inline constexpr float kQ8LimbScale = 1.0f / 254.0f;

__device__ __forceinline__ std::uint32_t prmt_sign(std::uint32_t a, std::uint32_t b, std::uint32_t sel) {
  std::uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Limb storage: group g (elements 4g..4g+3) at q8_slot(g) as int2 {q0 bytes, q1 bytes}; one int2 of padding per
// 32-element block so that lanes reading different blocks hit different banks.
__host__ __device__ constexpr int q8_slot(int g) { return g + (g >> 3); }
__host__ __device__ constexpr int q8_slots(int nblocks) { return nblocks * 9; }

// One group of 4 elements (v, group g) of a 32-element block quantized by its 8 consecutive lanes (all lanes of the
// warp call it: the block maximum and sums take 3 shuffles each): the limbs of g, and by the block's first group the
// block scale amax · post and the bias correction {−12 Σ q0, −12 Σ q1} (q8u_chunk) in the block's padding slot.
// NaN's bits exceed all others, so a NaN input makes its block's scale NaN.
__device__ __forceinline__ void q8_group(float4 const& v, int g, bool ok, int2* q, float* sx, float post) {
  unsigned m = max(max(__float_as_uint(fabsf(v.x)), __float_as_uint(fabsf(v.y))),
                   max(__float_as_uint(fabsf(v.z)), __float_as_uint(fabsf(v.w))));
  m = max(m, __shfl_xor_sync(0xffffffffu, m, 1));
  m = max(m, __shfl_xor_sync(0xffffffffu, m, 2));
  m = max(m, __shfl_xor_sync(0xffffffffu, m, 4));
  float const amax = __uint_as_float(m);
  float const inv = amax > 0.f ? __fdividef(127.f, amax) : 0.f;  // |v inv| <= 127 (1 + 2 ulp): rounds to <= 127
  float const e[4] = {v.x * inv, v.y * inv, v.z * inv, v.w * inv};
  std::uint32_t w0 = 0, w1 = 0;
  int s0 = 0, s1 = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    float const f0 = rintf(e[k]);
    int const i0 = int(f0), i1 = int(rintf((e[k] - f0) * 254.f));
    w0 |= (std::uint32_t(i0) & 0xFFu) << (8 * k);
    w1 |= (std::uint32_t(i1) & 0xFFu) << (8 * k);
    s0 += i0;
    s1 += i1;
  }
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) {  // the block's Σ q0, Σ q1
    s0 += __shfl_xor_sync(0xffffffffu, s0, o);
    s1 += __shfl_xor_sync(0xffffffffu, s1, o);
  }
  if (ok) {
    q[q8_slot(g)] = make_int2(int(w0), int(w1));
    if ((g & 7) == 0) {
      sx[g >> 3] = amax * post;
      q[9 * (g >> 3) + 8] = make_int2(-12 * s0, -12 * s1);
    }
  }
}

// Quantizes staged blocks [0, nblocks) of xs (padded float layout, times `unit`) into limbs q and block scales sx
// (which fold in 0.5 for the doubled E2M1 codes and 1 / unit). A thread takes a group of 4 elements (one float4, one
// int2 store), 8 consecutive lanes a block (q8_group). A NaN or infinite input makes its block's scale NaN, so the rows
// that read it turn NaN (never a silent finite value).
__device__ __forceinline__ void stage_q8(int2* q, float* sx, float const* xs, int nblocks, float unit) {
  int const ngroups = nblocks * 8;
  float const post = 0.5f / 127.f / unit;
  for (int base = 0; base < ngroups; base += int(blockDim.x)) {  // uniform trip count: the shuffles see every lane
    int const g = base + int(threadIdx.x);
    bool const ok = g < ngroups;
    float4 const v = ok ? *reinterpret_cast<float4 const*>(xs + xpad(4 * g)) : make_float4(0.f, 0.f, 0.f, 0.f);
    q8_group(v, g, ok, q, sx, post);
  }
}

// Σ over one 32-code chunk per row n: ap/an += positive/negative codes · limb 0, bp/bn the same for limb 1.
template <int NR>
__device__ __forceinline__ void q8_chunk(uint4 const (&v)[NR], int2 const* xq, int (&ap)[NR], int (&an)[NR],
                                         int (&bp)[NR], int (&bn)[NR]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // word i: elements 8i..8i+7 = limb groups 2i (low half) and 2i + 1
    int2 const xl = xq[2 * i], xh = xq[2 * i + 1];
#pragma unroll
    for (int n = 0; n < NR; ++n) {
      std::uint32_t const w = word(v[n], i), nw = w ^ 0x88888888u;
      int const p0 = int(prmt_sign(kE2m1TabLo, kE2m1TabHi, w)), m0 = int(prmt_sign(kE2m1TabLo, kE2m1TabHi, nw));
      int const p1 = int(prmt_sign(kE2m1TabLo, kE2m1TabHi, w >> 16)), m1 = int(prmt_sign(kE2m1TabLo, kE2m1TabHi, nw >> 16));
      ap[n] = __dp4a(p0, xl.x, ap[n]);
      an[n] = __dp4a(m0, xl.x, an[n]);
      bp[n] = __dp4a(p0, xl.y, bp[n]);
      bn[n] = __dp4a(m0, xl.y, bn[n]);
      ap[n] = __dp4a(p1, xh.x, ap[n]);
      an[n] = __dp4a(m1, xh.x, an[n]);
      bp[n] = __dp4a(p1, xh.y, bp[n]);
      bn[n] = __dp4a(m1, xh.y, bn[n]);
    }
  }
}

// Biased lookup (launch A's streamed kernel and launch B's lane kernel): u = 2 E2M1 + 12 ∈ [0, 24], one PRMT pair
// (positive codes from one table, negative from the other, each zero where the other applies) and one DP4A per limb
// per 4 codes, instead of two DP4A (positive and negative codes apart). Σ u q = Σ (2 E2M1) q + 12 Σ q, so each DP4A
// chain starts at −12 Σ q of its block and limb, kept in the block's padding slot of the limb layout (stage_q8 and
// stage_q8_global write it). Exact integer sums, as the unbiased path.
inline constexpr std::uint32_t kE2m1PosLo = 0x0F0E0D0Cu, kE2m1PosHi = 0x18141210u;  // 12 + 2 × {0, .5, 1, 1.5, 2, 3, 4, 6}
inline constexpr std::uint32_t kE2m1NegLo = 0x090A0B0Cu, kE2m1NegHi = 0x00040608u;  // 12 − the same

// ue8m0_float without branches (the kernels' inner loops): 0xFF is NaN, 0 is 2^-127.
__device__ __forceinline__ float ue8m0_float_sel(std::uint32_t s) {
  std::uint32_t b = s << 23;
  b = s == 0 ? 0x00400000u : b;
  return __uint_as_float(s == 0xFF ? 0x7FC00000u : b);
}

// Quantizes x[0, 32 nblocks) (global memory, 16-byte aligned) into limbs q (q8_slot layout; block b's slot 9 b + 8
// holds {−12 Σ q0, −12 Σ q1}) and scales sx = amax / 254 (the 0.5 of the doubled codes folded in). All of a thread's
// loads are issued before any math (one L2 round trip for up to 4 × blockDim groups). NaN or Inf in a block makes its
// scale NaN or Inf, so the rows that read it turn NaN.
__device__ __forceinline__ void stage_q8_global(int2* q, float* sx, float const* __restrict__ x, int nblocks) {
  constexpr int kB = 4;
  int const ngroups = nblocks * 8;
  for (int base = 0; base < ngroups; base += kB * int(blockDim.x)) {  // uniform trip count: the shuffles see every lane
    float4 v[kB];
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      int const g = base + i * int(blockDim.x) + int(threadIdx.x);
      v[i] = g < ngroups ? __ldg(reinterpret_cast<float4 const*>(x) + g) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      if (base + i * int(blockDim.x) >= ngroups) break;  // uniform: no lane of the block has a group past here
      int const g = base + i * int(blockDim.x) + int(threadIdx.x);
      q8_group(v[i], g, g < ngroups, q, sx, 0.5f / 127.f);
    }
  }
}

// {Σ (2 E2M1) q0, Σ (2 E2M1) q1} of the 32-code chunks v[n] (NR rows) against one limb block xq (9 int2: 8 groups,
// the correction), each limb word loaded once for all rows. pos_lo / neg_lo: the tables' low words in registers
// (e2m1_tables_load).
template <int NR>
__device__ __forceinline__ void q8u_chunk(uint4 const (&v)[NR], int2 const* xq, std::uint32_t pos_lo, std::uint32_t neg_lo,
                                          int2 (&d)[NR]) {
  int2 const c = xq[8];
#pragma unroll
  for (int n = 0; n < NR; ++n) d[n] = c;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int2 const xl = xq[2 * i], xh = xq[2 * i + 1];
#pragma unroll
    for (int n = 0; n < NR; ++n) {
      std::uint32_t const w = word(v[n], i), nw = w ^ 0x88888888u;
      int const u0 = int(prmt_sign(pos_lo, kE2m1PosHi, w) | prmt_sign(neg_lo, kE2m1NegHi, nw));
      int const u1 = int(prmt_sign(pos_lo, kE2m1PosHi, w >> 16) | prmt_sign(neg_lo, kE2m1NegHi, nw >> 16));
      d[n].x = __dp4a(u0, xl.x, d[n].x);
      d[n].y = __dp4a(u0, xl.y, d[n].y);
      d[n].x = __dp4a(u1, xh.x, d[n].x);
      d[n].y = __dp4a(u1, xh.y, d[n].y);
    }
  }
}

// The biased tables' low words (q8u_chunk's pos_lo, neg_lo): s_tab (2 words, 8-byte aligned shared memory) written
// with e2m1_tables_store before a __syncthreads, read into registers with a volatile load, so that the compiler neither
// folds them back into immediates nor ptxas rematerializes them (register pressure made it rebuild an immediate before
// every PRMT, one extra instruction per 4 codes).
__device__ __forceinline__ void e2m1_tables_store(std::uint32_t* s_tab) {
  if (threadIdx.x == 0) {
    s_tab[0] = kE2m1PosLo;
    s_tab[1] = kE2m1NegLo;
  }
}
__device__ __forceinline__ void e2m1_tables_load(std::uint32_t const* s_tab, std::uint32_t& pos_lo, std::uint32_t& neg_lo) {
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];"
               : "=r"(pos_lo), "=r"(neg_lo)
               : "r"(std::uint32_t(__cvta_generic_to_shared(s_tab))));
}

// Lane partials of rows r of NR Mxfp4 matrices (data[n], scales[n], shape m) against the limbs: Σ over this lane's
// chunks j of (a + b / 254) · sx[j] · 2^(scale - 127). Chunk j of a row is block j (one scale byte).
template <int NR>
__device__ __forceinline__ void q8_lane_dot(void const* const (&data)[NR], void const* const (&scales)[NR],
                                            std::int64_t r, MatrixArgs const& m, int2 const* q, float const* sx,
                                            float (&acc)[NR]) {
  constexpr int kU = 3;  // Ling's 2560 columns: 80 chunks, at most 3 per lane, so one batch of loads
  int const lane = threadIdx.x & 31;
  int const nchunks = int(m.cols >> 5);
  std::int64_t const rb = m.ld * std::int64_t(sizeof(typename quant::Mxfp4::storage_type));
  for (int base = lane; base < nchunks; base += 32 * kU) {
    uint4 v[kU][NR];
    float sc[kU][NR];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      int const j = base + 32 * u;
#pragma unroll
      for (int n = 0; n < NR; ++n) {
        bool const ok = j < nchunks;
        v[u][n] = ok ? ld_stream(reinterpret_cast<uint4 const*>(static_cast<char const*>(data[n]) + r * rb) + j)
                     : make_uint4(0, 0, 0, 0);
        sc[u][n] = ok ? ue8m0_float(__ldg(static_cast<std::uint8_t const*>(scales[n]) + r * nchunks + j)) : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      int const j = base + 32 * u;
      if (j < nchunks) {
        int ap[NR] = {}, an[NR] = {}, bp[NR] = {}, bn[NR] = {};
        uint4 vv[NR];
#pragma unroll
        for (int n = 0; n < NR; ++n) vv[n] = v[u][n];
        q8_chunk<NR>(vv, q + q8_slot(8 * j), ap, an, bp, bn);
        float const xsc = sx[j];
#pragma unroll
        for (int n = 0; n < NR; ++n)
          acc[n] = fmaf(fmaf(float(bp[n] - bn[n]), kQ8LimbScale, float(ap[n] - an[n])), sc[u][n] * xsc, acc[n]);
      }
    }
  }
}

// Before the PDL wait only the shared expert's rows are known (the routed ids come from the router): each warp
// prefetches the shared gate/up rows of its tasks (task t >= routed is shared row t - routed, `rpt` rows per task).
template <class PS>
__device__ __forceinline__ void prefetch_shared_gate_up(MoeArgs const& a, std::int64_t routed, int rpt) {
  if constexpr (has_fast_kernel<PS>) {
    if (!a.has_shared) return;
    std::int64_t const total = routed + (a.sgate.rows + rpt - 1) / rpt;
    std::int64_t const rb = a.sgate.ld * std::int64_t(sizeof(typename PS::storage_type));
    for (std::int64_t t = std::int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); t < total; t += std::int64_t(gridDim.x) * kWarps) {
      if (t < routed) continue;
      std::int64_t const r = (t - routed) * rpt;
      std::int64_t const n = a.sgate.rows - r < rpt ? a.sgate.rows - r : rpt;
      warp_prefetch(static_cast<char const*>(a.sgate.data) + r * rb, n * rb);
      warp_prefetch(static_cast<char const*>(a.sup.data) + r * rb, n * rb);
    }
  }
}
// The shared expert's down rows [r, r + n) of this warp's tasks.
template <class PS>
__device__ __forceinline__ void prefetch_shared_down(MoeArgs const& a, int rpt) {
  if constexpr (has_fast_kernel<PS>) {
    if (!a.has_shared) return;
    std::int64_t const rb = a.sdown.ld * std::int64_t(sizeof(typename PS::storage_type));
    std::int64_t const rows = a.sdown.rows;
    for (std::int64_t t = std::int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); t * rpt < rows; t += std::int64_t(gridDim.x) * kWarps) {
      std::int64_t const n = rows - t * rpt < rpt ? rows - t * rpt : rpt;
      warp_prefetch(static_cast<char const*>(a.sdown.data) + t * rpt * rb, n * rb);
    }
  }
}

template <class KE, class KS, int kMinBlocks, bool kQ8>
__global__ void __launch_bounds__(kThreads, kMinBlocks) moe_gate_up_kernel(MoeArgs a, float const* __restrict__ u, InputPrologue pro,
                                                               float* h) {
  using PE = policy_of<KE>;
  using PS = policy_of<KS>;
  extern __shared__ float4 smem_f4[];
  float* xs = reinterpret_cast<float*>(smem_f4);
  __shared__ int s_idx[kMoeMaxTopK];
  std::int64_t n_stage = staged_elems<PE>(a.gate);
  if (a.has_shared && staged_elems<PS>(a.sgate) > n_stage) n_stage = staged_elems<PS>(a.sgate);
  pdl_trigger();
  trace_mark(a.trace_a, 0);
  prefetch_shared_gate_up<PS>(a, std::int64_t(a.top_k) * a.gate.rows, 1);
  prologue_prefetch(pro, a.has_shared ? a.sgate.cols : a.gate.cols);
  pdl_wait();
  trace_mark(a.trace_a, 1);
  stage_input<false>(xs, u, a.has_shared ? a.sgate.cols : a.gate.cols, n_stage, pro);
  __shared__ __align__(16) float s_route[2 * kRouterMaxExperts];  // see moe_block_routing
  moe_block_routing(a, s_idx, s_route);
  trace_mark(a.trace_a, 2);
  // int8 path: the limbs and block scales follow the staged floats in shared memory
  int const nblk = int(a.gate.cols >> 5);
  int2* const q = reinterpret_cast<int2*>(xs + xs_floats(n_stage));
  float* const sx = reinterpret_cast<float*>(q + q8_slots(nblk));
  if constexpr (kQ8) {
    stage_q8(q, sx, xs, nblk, kXPre);
    __syncthreads();
  }

  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  std::int64_t const inter = a.gate.rows, routed = std::int64_t(a.top_k) * inter;
  std::int64_t const total = routed + (a.has_shared ? a.sgate.rows : 0);
  FastDiv const fd{std::uint32_t(inter), std::uint64_t(routed)};
  for (std::int64_t t = std::int64_t(blockIdx.x) * kWarps + warp; t < total; t += std::int64_t(gridDim.x) * kWarps) {
    float acc[2] = {0.f, 0.f};
    float g, v, limit;
    if (t < routed) {
      int const s = int(fd.div(std::uint32_t(t)));
      std::int64_t const r = t - std::int64_t(s) * inter;
      int const e = s_idx[s];
      int const ee = e < 0 ? 0 : e;
      void const* data[2] = {batch_data<PE>(a.gate, ee), batch_data<PE>(a.up, ee)};
      void const* scales[2] = {batch_scales<PE>(a.gate, ee), batch_scales<PE>(a.up, ee)};
      if constexpr (kQ8) {
        q8_lane_dot<2>(data, scales, r, a.gate, q, sx, acc);
        g = warp_sum(acc[0]);
        v = warp_sum(acc[1]);
      } else {
        std::int64_t rr[2] = {r, r};
        bool valid[2] = {true, true};
        RowDot<PE>::template lane_dot<2>(data, scales, rr, valid, a.gate, xs, acc);
        g = warp_sum(acc[0]) * RowDot<PE>::row_scale(scales[0], r);
        v = warp_sum(acc[1]) * RowDot<PE>::row_scale(scales[1], r);
      }
      if (e < 0) g = __uint_as_float(0x7FC00000u);
      limit = a.routed_limit;
    } else {
      float2 const gu = shared_gate_up_row<PS>(a, xs, t - routed);
      g = gu.x;
      v = gu.y;
      limit = a.shared_limit;
    }
    if (lane == 0) h[t] = swiglu(g, v, limit);
  }
  trace_end(a.trace_a);
}

// Launch B's routed slots: each slot's down matrix and scales (nullptr for an id out of range) and its routing weight,
// resolved once per block so the chunk loop does no per-chunk expert arithmetic.
struct DownSlots {
  char const* data[kMoeMaxTopK];
  void const* scales[kMoeMaxTopK];
  float w[kMoeMaxTopK];
};
// Slot s of expert e (out of range: null pointers) with routing weight w.
template <class P>
__device__ __forceinline__ void put_down_slot(DownSlots& sl, MoeArgs const& a, int s, int e, float w) {
  bool const ok = e >= 0 && e < a.down.count;
  sl.data[s] = ok ? static_cast<char const*>(batch_data<P>(a.down, e)) : nullptr;
  sl.scales[s] = ok ? batch_scales<P>(a.down, e) : nullptr;
  sl.w[s] = w;
}
template <class P>
__device__ __forceinline__ void stage_down_slots(DownSlots& sl, MoeArgs const& a) {
  for (int s = threadIdx.x; s < a.top_k; s += blockDim.x) put_down_slot<P>(sl, a, s, a.idx[s], a.weights[s]);
}

// Lane partial of the concatenated down rows r of the top_k experts (fast layout), chunk-weighted. Chunk q of the
// concatenation is chunk j = q - s cpe of slot s = q / cpe (fd: cpe).
template <class P>
__device__ __forceinline__ float down_routed_fast(MoeArgs const& a, DownSlots const& sl, std::int64_t r,
                                                  float const* xs, int seg, FastDiv const& fd) {
  using Ops = FastOps<P>;
  using S = typename P::storage_type;
  int const lane = threadIdx.x & 31;
  MatrixArgs const& m = a.down;
  int const cpe = int(fd.d);
  int const nq = a.top_k * cpe;
  std::int64_t const row_off = r * m.ld * std::int64_t(sizeof(S));
  float acc = 0.f;
  for (int base = lane; base < nq; base += 32 * kMoeFlatUnroll) {
    uint4 v[kMoeFlatUnroll][1];
    float sc[kMoeFlatUnroll];
    int xoff[kMoeFlatUnroll];
#pragma unroll
    for (int u = 0; u < kMoeFlatUnroll; ++u) {
      int const q = base + 32 * u;
      int const s = int(fd.div(std::uint32_t(q))), j = q - s * cpe;
      char const* row = q < nq ? sl.data[s] : nullptr;
      if (row) {
        void const* scl = sl.scales[s];
        v[u][0] = ld_stream(reinterpret_cast<uint4 const*>(row + row_off) + j);
        sc[u] = Ops::chunk_scale(scl, m, r, j) * RowDot<P>::row_scale(scl, r) * sl.w[s];
      } else {
        v[u][0] = make_uint4(0, 0, 0, 0);
        sc[u] = q < nq ? __uint_as_float(0x7FC00000u) : 0.f;  // bad expert id: NaN, visibly
      }
      xoff[u] = xpad(s * seg + j * Ops::kElems);
    }
#pragma unroll
    for (int u = 0; u < kMoeFlatUnroll; ++u) {
      if (base + 32 * u < nq) {
        float d[1];
        Ops::template dot<1>(v[u], xs + xoff[u], d);
        acc = fmaf(sc[u], d[0], acc);
      }
    }
  }
  return acc;
}

// The same on the int8 path: chunk j of slot s reads limb block s · bps + j (bps: staged blocks per slot).
__device__ __forceinline__ float down_routed_q8(MoeArgs const& a, DownSlots const& sl, std::int64_t r, int2 const* q,
                                                float const* sx, int bps, FastDiv const& fd) {
  int const lane = threadIdx.x & 31;
  MatrixArgs const& m = a.down;
  int const cpe = int(fd.d);
  int const nq = a.top_k * cpe;
  std::int64_t const row_off = r * m.ld * std::int64_t(sizeof(typename quant::Mxfp4::storage_type));
  float acc = 0.f;
  for (int base = lane; base < nq; base += 32 * kMoeFlatUnroll) {
    uint4 v[kMoeFlatUnroll][1];
    float sc[kMoeFlatUnroll];
    int blk[kMoeFlatUnroll];
#pragma unroll
    for (int u = 0; u < kMoeFlatUnroll; ++u) {
      int const qq = base + 32 * u;
      int const s = int(fd.div(std::uint32_t(qq))), j = qq - s * cpe;
      char const* row = qq < nq ? sl.data[s] : nullptr;
      if (row) {
        v[u][0] = ld_stream(reinterpret_cast<uint4 const*>(row + row_off) + j);
        sc[u] = ue8m0_float(__ldg(static_cast<std::uint8_t const*>(sl.scales[s]) + r * cpe + j)) * sl.w[s];
      } else {
        v[u][0] = make_uint4(0, 0, 0, 0);
        sc[u] = qq < nq ? __uint_as_float(0x7FC00000u) : 0.f;  // bad expert id: NaN, visibly
      }
      blk[u] = s * bps + j;
    }
#pragma unroll
    for (int u = 0; u < kMoeFlatUnroll; ++u) {
      if (base + 32 * u < nq) {
        int ap[1] = {0}, an[1] = {0}, bp[1] = {0}, bn[1] = {0};
        q8_chunk<1>(v[u], q + q8_slot(8 * blk[u]), ap, an, bp, bn);
        acc = fmaf(fmaf(float(bp[0] - bn[0]), kQ8LimbScale, float(ap[0] - an[0])), sc[u] * sx[blk[u]], acc);
      }
    }
  }
  return acc;
}

// Generic policies: element by element through P::decode.
template <class P>
__device__ __forceinline__ float down_routed_generic(MoeArgs const& a, int const* s_idx, float const* s_w,
                                                     std::int64_t r, float const* xs, int seg) {
  using S = typename P::storage_type;
  using Sc = typename P::scale_type;
  int const lane = threadIdx.x & 31;
  MatrixArgs const& m = a.down;
  float acc = 0.f;
  for (int s = 0; s < a.top_k; ++s) {
    int const e = s_idx[s];
    if (e < 0) return __uint_as_float(0x7FC00000u);
    auto const* w = static_cast<S const*>(batch_data<P>(m, e));
    auto const* sc = static_cast<Sc const*>(batch_scales<P>(m, e));
    float part = 0.f;
    for (std::int64_t c = lane; c < m.cols; c += 32) part += P::decode(w, sc, m.rows, m.cols, r, c) * xs[xpad(s * seg + int(c))];
    acc = fmaf(s_w[s], part, acc);
  }
  return acc * RowDot<P>::row_scale(nullptr, 0);
}

// Launch B's shared-expert row: with the fast layout and at most 64 chunks (Ling's 768 FP8 columns are 48) it is
// loaded with the routed rows (`early`: one round trip for the whole task), else streamed after their math.
template <class PS>
__device__ __forceinline__ bool shared_down_early(MoeArgs const& a) {
  if constexpr (has_fast_kernel<PS>) return a.has_shared && a.sdown.ld * std::int64_t(sizeof(typename PS::storage_type)) / 16 <= 64;
  else return false;
}
// acc plus this lane's partial of the shared expert's down row r against its staged input xs_shared (row: the early
// load of the row, unused otherwise).
template <class PS>
__device__ __forceinline__ float shared_down_add(MoeArgs const& a, RowLoad<PS, 2> const& row, bool early, std::int64_t r,
                                                 float const* xs_shared, float acc) {
  if constexpr (has_fast_kernel<PS>) {
    if (early) acc = fmaf(row_math(row, a.sdown, xs_shared), RowDot<PS>::row_scale(a.sdown.scales, r), acc);
  }
  if (a.has_shared && !early) {
    void const* data[1] = {a.sdown.data};
    void const* scales[1] = {a.sdown.scales};
    std::int64_t rr[1] = {r};
    bool valid[1] = {true};
    float sacc[1] = {0.f};
    RowDot<PS>::template lane_dot<1>(data, scales, rr, valid, a.sdown, xs_shared, sacc);
    // row_scale is per row (FP8-row); fold it into the lane partial before the sum
    acc = fmaf(sacc[0], RowDot<PS>::row_scale(a.sdown.scales, r), acc);
  }
  return acc;
}

template <class KE, class KS, int kMinBlocks, bool kQ8>
__global__ void __launch_bounds__(kThreads, kMinBlocks) moe_down_kernel(MoeArgs a, float const* __restrict__ h,
                                                            float const* residual, float* out) {
  using PE = policy_of<KE>;
  using PS = policy_of<KS>;
  extern __shared__ float4 smem_f4[];
  float* xs = reinterpret_cast<float*>(smem_f4);
  __shared__ int s_idx[kMoeMaxTopK];
  __shared__ float s_w[kMoeMaxTopK];
  __shared__ DownSlots s_slots;
  int const seg = int(round32(staged_elems<PE>(a.down)));  // staged floats per routed slot
  std::int64_t const inter = a.down.cols;
  pdl_trigger();
  trace_mark(a.trace_b, 0);
  prefetch_shared_down<PS>(a, 1);
  pdl_wait();
  trace_mark(a.trace_b, 1);
  if (seg == inter)  // the staged layout is h itself (Ling: inter = 768): a straight copy
    stage_x4(xs, h, std::int64_t(a.top_k) * inter + (a.has_shared ? a.sdown.cols : 0),
             std::int64_t(a.top_k) * seg + (a.has_shared ? round32(staged_elems<PS>(a.sdown)) : 0));
  else
    stage_down_input<PS>(xs, h, a, seg);
  stage_idx(s_idx, s_w, a);
  if constexpr (RowDot<PE>::kFast) stage_down_slots<PE>(s_slots, a);
  __syncthreads();
  trace_mark(a.trace_b, 2);
  int const bps = seg / 32, nblk = a.top_k * bps;  // int8 path: limbs of the routed segments after the floats
  int2* const q = reinterpret_cast<int2*>(xs + xs_floats(std::int64_t(a.top_k) * seg + (a.has_shared ? round32(staged_elems<PS>(a.sdown)) : 0)));
  float* const sx = reinterpret_cast<float*>(q + q8_slots(nblk));
  if constexpr (kQ8) {
    stage_q8(q, sx, xs, nblk, kXPre);
    __syncthreads();
  }

  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  std::int64_t const rows = a.down.rows;
  FastDiv const fd(std::uint32_t(a.down.ld * std::int64_t(sizeof(typename PE::storage_type)) / 16),
                   std::uint64_t(a.top_k) * std::uint64_t(a.down.ld * std::int64_t(sizeof(typename PE::storage_type)) / 16) +
                       32u * kMoeFlatUnroll);
  float const* const xs_shared = xs + xpad(a.top_k * seg);
  for (std::int64_t r = std::int64_t(blockIdx.x) * kWarps + warp; r < rows; r += std::int64_t(gridDim.x) * kWarps) {
    // the shared expert's row (at most 64 chunks: Ling's 768 FP8 columns are 48) is loaded with the routed rows, not
    // after their math: one round trip for the whole task
    [[maybe_unused]] RowLoad<PS, 2> shared_row;
    bool const early = shared_down_early<PS>(a);
    if constexpr (has_fast_kernel<PS>) {
      if (early) row_load(shared_row, a.sdown, r);
    }
    float acc;
    if constexpr (kQ8) acc = down_routed_q8(a, s_slots, r, q, sx, bps, fd);
    else if constexpr (RowDot<PE>::kFast) acc = down_routed_fast<PE>(a, s_slots, r, xs, seg, fd);
    else acc = down_routed_generic<PE>(a, s_idx, s_w, r, xs, seg);
    acc = shared_down_add<PS>(a, shared_row, early, r, xs_shared, acc);
    float const v = warp_sum(acc);
    if (lane == 0) out[r] = residual ? residual[r] + v : v;
  }
  trace_end(a.trace_b);
}

template <class PE, class PS>
MoeArgs moe_args(MoeWeights<PE, PS> const& w, MoeStep const& step) {
  MoeArgs a{};
  a.gate = w.gate.args();
  a.up = w.up.args();
  a.down = w.down.args();
  a.has_shared = w.has_shared() ? 1 : 0;
  if (a.has_shared) {
    a.sgate = w.shared_gate.args();
    a.sup = w.shared_up.args();
    a.sdown = w.shared_down.args();
  }
  a.idx = step.idx;
  a.weights = step.weights;
  a.top_k = step.top_k;
  a.routed_limit = step.routed_limit;
  a.shared_limit = step.shared_limit;
  return a;
}

template <class PE, class PS>
bool moe_shapes_ok(MoeWeights<PE, PS> const& w, MoeStep const& step) {
  if (step.top_k <= 0 || step.top_k > kMoeMaxTopK || !step.idx || !step.weights) return false;
  if (w.gate.empty() || w.up.rows() != w.gate.rows() || w.up.cols() != w.gate.cols() || w.up.count() != w.gate.count())
    return false;
  if (w.down.rows() != w.gate.cols() || w.down.cols() != w.gate.rows() || w.down.count() != w.gate.count()) return false;
  if (w.has_shared()) {
    if (w.shared_gate.cols() != w.gate.cols() || w.shared_up.rows() != w.shared_gate.rows() ||
        w.shared_up.cols() != w.gate.cols() || w.shared_down.rows() != w.gate.cols() ||
        w.shared_down.cols() != w.shared_gate.rows())
      return false;
  }
  return true;
}

// ---- streamed MoE: each warp copies its next tiles into shared memory (cp.async; async_copy.cuh) ---------------------
// One block per SM of kW warps. The block's tiles (a tile: a few rows of every matrix it needs, plus the span of their
// scales) are dealt to its warps round robin; each warp keeps a private ring of `stages` tile buffers, issues the
// copies of its first `stages` tiles at once, and then for each tile waits for its own copies (one commit group per
// tile), decodes it from shared memory, and reuses the buffer for its next tile. No block-wide synchronization after
// the prologue, and the weight bytes in flight do not depend on registers: at Ling's shapes every tile of a block is
// requested before the first one is decoded. What depends on no earlier kernel (the shared expert's rows) is copied
// before the PDL wait.
inline constexpr int kStreamMaxStages = 4;
static_assert(kStreamMaxStages <= 32, "launch A: lane k of each warp initializes ring buffer k's barrier");
// Launch A's tiles: 4 routed gate/up row pairs (MXFP4: 11 KB at hidden 2560) and 2 shared-expert row pairs (FP8: 10 KB).
// At Ling's shapes that is 1 920 tiles, at most one per warp of 16 warps × 132 blocks, all requested at once (one ring
// stage each); with 2 and 1 row pairs (3 840 tiles, two stages) a third of the warps decoded two routed tiles one
// after the other, and each tile paid its copy and setup instructions. Measured on the H200 (2026-12-02, context 0,
// session 13's code with only this change, alternated with it in one process): 2.534 against 2.545 ms per token
// (docs/perf-log.md, session 14).
inline constexpr int kStreamRowsA = 4;
inline constexpr int kStreamSharedRowsA = 2;

__host__ __device__ constexpr std::int64_t round128(std::int64_t n) { return (n + 127) / 128 * 128; }

struct StreamPlan {
  int stages = 0, stage_bytes = 0, prologue_bytes = 0;  // per warp: stages buffers of stage_bytes
  int rows = 0, srows = 0;                              // rows per routed tile; per shared tile (launch A)
  int tiles_per_slot = 0, shared_tiles = 0, tiles = 0;
};

__device__ __forceinline__ std::uint32_t addr_skew(void const* p) {
  return std::uint32_t(reinterpret_cast<std::uintptr_t>(p) & 15);
}
// Tiles of this block (tile k of the block is b + k * gridDim).
__device__ __forceinline__ int block_tiles(StreamPlan const& sp) {
  int const b = int(blockIdx.x), g = int(gridDim.x);
  return b < sp.tiles ? (sp.tiles - 1 - b) / g + 1 : 0;
}

// ---- launch A's routed decode on FP8 wgmma (LING_MOE_DIAG_A=9, a trial; docs/kernels.md "Launch A's routed decode on
// FP8 wgmma") ----
// B, the input: 4 E4M3 limbs per element (x = 2^e · Σ limbs, e per 32-element block), kWgN columns per k-step. A
// k-step s of B holds the block s (the rows' first half, h = 0) and s + nblk / 2 (second half, h = 1); two k-steps
// make an accumulator group, the q-th of a group in units 2 q + h (4 columns each), so that the lane with t = lane % 4
// finds block 2 p + c + h S's limbs (h = t / 2) in accumulator chunk c.
inline constexpr int kWgN = 16, kWgLimbs = 4, kWgRowPad = 16;
// Bytes of B for nblk blocks (+ 128: B starts on a 128-byte boundary of the slots).
__host__ __device__ constexpr int wg_b_bytes(int nblk) { return (nblk / 2) * kWgN * 32 + 128; }
// The int2 slots after the staged input in the =9 instance: the selection's scratch, then B.
__host__ __device__ constexpr int stream_q_slots_wg(int nblk, RouteSel const& r) {
  return r.logits && r.experts * 8 > wg_b_bytes(nblk) ? r.experts : (wg_b_bytes(nblk) + 7) / 8;
}
// Stages xs (staged floats, kXPre times the input; padded layout) as B and exf[blk] = 2^(e + 6) / kXPre (the scale of
// block blk's limbs, times the 2^6 of the E2M1 codes in E4M3). A task is 8 elements of a block (4 lanes a block). NaN or
// Inf in a block makes NaN limbs, so its rows' outputs turn NaN.
__device__ __forceinline__ void stage_e4m3_limbs(unsigned char* B, float* exf, float const* xs, int nblk) {
  int const S = nblk >> 1;
  for (int base = 0; base < nblk * 4; base += int(blockDim.x)) {  // uniform trip count: the shuffles see every lane
    int const task = base + int(threadIdx.x), a = task & 3;
    bool const ok = task < nblk * 4;
    int const blk = ok ? task >> 2 : 0;
    float4 const z = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 const p0 = ok ? *reinterpret_cast<float4 const*>(xs + xpad(32 * blk + 8 * a)) : z;
    float4 const p1 = ok ? *reinterpret_cast<float4 const*>(xs + xpad(32 * blk + 8 * a + 4)) : z;
    float const v[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
    std::uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) m = max(m, __float_as_uint(fabsf(v[i])));
    m = max(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = max(m, __shfl_xor_sync(0xffffffffu, m, 2));
    int const e = max(int(m >> 23) - 134, -100);  // the block's largest · 2^-e < 256 (NaN, Inf: e = 121)
    float const inv = __uint_as_float(std::uint32_t(127 - e) << 23);
    std::uint32_t lw[2][kWgLimbs] = {};  // [element parity][limb]: elements 8 a + parity + 2 c in byte c
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float r = v[i] * inv;
      if (!(fabsf(r) <= 3.0e38f)) r = __uint_as_float(0x7FC00000u);  // Inf: NaN limbs (satfinite would clamp it)
#pragma unroll
      for (int l = 0; l < kWgLimbs; ++l) {
        __nv_fp8_storage_t const c = __nv_cvt_float_to_fp8(r, __NV_SATFINITE, __NV_E4M3);
        lw[i & 1][l] |= std::uint32_t(c) << (8 * (i >> 1));
        r -= __half2float(__half(__nv_cvt_fp8_to_halfraw(c, __NV_E4M3)));
      }
    }
    if (ok) {
      if (a == 0) exf[blk] = ldexpf(1.f, e + 6) * (1.f / kXPre);
      int const h = blk >= S ? 1 : 0, sp = blk - h * S, q = sp & 1, u = 2 * q + h, zu = 2 * (1 - q) + h;
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int l = 0; l < kWgLimbs; ++l) {  // elements 8 a + b + 2 c are rows 16 b + 4 a + c of the k-step
          *reinterpret_cast<std::uint32_t*>(B + wgmma_b_offset(kWgN, sp, kWgLimbs * u + l, 16 * b + 4 * a)) = lw[b][l];
          *reinterpret_cast<std::uint32_t*>(B + wgmma_b_offset(kWgN, sp, kWgLimbs * zu + l, 16 * b + 4 * a)) = 0u;
        }
    }
  }
}
// The =9 instance's groups of two k-steps (its one shape: 2560 columns, 80 blocks; the launcher checks).
inline constexpr int kWgGroups = 20;
// B in the q slots, from their first 128-byte boundary (wg_b_bytes has the room).
__device__ __forceinline__ unsigned char* wg_b(int2* q) {
  unsigned char* const p = reinterpret_cast<unsigned char*>(q);
  return p + ((0u - smem_u32(p)) & 127u);
}
// A warp's routed tile on wgmma (the calling warpgroup together; kNG = nblk / 4 groups of two k-steps): its 8 rows
// (4 gate, 4 up: rows g of the warp's wgmma rows, their second half rows g + 8) at `rows`, pitch bytes apart (1296 at
// Ling's 2560 columns, so that ldmatrix's 8 rows miss no bank); their scale bytes gsc, usc (rows of nblk). `has`
// false: the warp has no tile, its A is zero (it still takes part). Lane 4 g returns row g's dot product.
template <int kNG>
__device__ __forceinline__ float routed_decode_wgmma(unsigned char const* rows, int pitch, std::uint8_t const* gsc,
                                                     std::uint8_t const* usc, unsigned char const* B, float const* exf,
                                                     bool has, int one) {
  constexpr int S = 2 * kNG, nblk = 2 * S;
  int const lane = int(threadIdx.x & 31), g = lane >> 2, h = (lane & 3) >> 1, j = lane >> 3;
  std::uint8_t const* sc = g < 4 ? gsc + g * nblk : usc + (g - 4) * nblk;
  // ldmatrix: lane i gives row i % 8 of matrix j = i / 8, which is the group's k-step j / 2 of half j % 2
  unsigned char const* const rowp = rows + (lane & 7) * pitch + 16 * ((j >> 1) + (j & 1) * S);
  std::uint64_t const desc0 = wgmma_desc_kmajor(B);
  float acc[2][kWgN / 2] = {};
  float tot = 0.f;
  auto epilogue = [&](float (&d)[kWgN / 2], int p) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      int const blk = 2 * p + c + h * S;
      tot = fmaf(ue8m0_float_sel(sc[blk]) * exf[blk], h ? d[4 * c + 2] + d[4 * c + 3] : d[4 * c] + d[4 * c + 1], tot);
    }
  };
#pragma unroll
  for (int p = 0; p < kNG; ++p) {  // fully unrolled: with a rolled loop ptxas serialized the wgmmas
    std::uint32_t r[4] = {0u, 0u, 0u, 0u};
    if (has) ldmatrix_x4(r, rowp + 32 * p);
    std::uint32_t a0[4], a1[4];
    e2m1_nibbles_e4m3(r[0], a0[0], a0[2]);
    e2m1_nibbles_e4m3(r[1], a0[1], a0[3]);
    e2m1_nibbles_e4m3(r[2], a1[0], a1[2]);
    e2m1_nibbles_e4m3(r[3], a1[1], a1[3]);
    float (&d)[kWgN / 2] = acc[p & 1];
    wgmma_fence();
    wgmma_e4m3_rs<kWgN>(d, a0, desc0 + std::uint64_t((2 * p) * (kWgN * 32 / 16)), one - 1);
    wgmma_e4m3_rs<kWgN>(d, a1, desc0 + std::uint64_t((2 * p + 1) * (kWgN * 32 / 16)), one);
    wgmma_commit();
    if (p > 0) {
      wgmma_wait<1>();
      wgmma_fence_acc(acc[(p - 1) & 1]);
      epilogue(acc[(p - 1) & 1], p - 1);
    }
  }
  wgmma_wait<0>();
  wgmma_fence_acc(acc[(kNG - 1) & 1]);
  epilogue(acc[(kNG - 1) & 1], kNG - 1);
  tot += __shfl_xor_sync(0xffffffffu, tot, 1);
  return tot + __shfl_xor_sync(0xffffffffu, tot, 2);
}

// Launch A streamed: the int2 slots after the staged input, shared by the limbs (q8_slots) and, before them, the fused
// selection's scores (2 · experts floats = experts slots). In dynamic shared memory rather than the selection's own
// static arrays (8 KB for kRouterMaxExperts), which left room for one ring stage per warp instead of two at Ling's
// shapes: the second tile of each warp was requested only after the first was decoded.
__host__ __device__ constexpr int stream_q_slots(int nblk, RouteSel const& r) {
  return r.logits && r.experts > q8_slots(nblk) ? r.experts : q8_slots(nblk);
}

// Launch A streamed: MXFP4 routed experts on the int8 path, the shared expert FP8-block. Tiles: the shared expert's
// (srows row pairs each) first, then top_k × tiles_per_slot routed ones (rows row pairs of slot s each).
// kBiased: the routed rows on q8u_chunk (the default; LING_MOE_Q8U=0: q8_chunk, moe_q8u_on). A tile arrives by four
// bulk copies that one lane issues (cp.async.bulk, completing on the buffer's mbarrier) instead of cp.async (16 bytes
// per lane and instruction, ~22 per lane for a tile of 11 KB): 2.486 against 2.506 ms/token at context 0, launch A
// 17.8 against 18.3 µs in the step timeline (H200, 2026-12-02; docs/kernels.md, session 15).
// The ring buffers start at a 128-byte boundary of shared memory (the launcher adds 128 bytes of slack), and so do
// the up rows' scale spans (round128 caps). Before, the ring started where the static shared memory ends: 64 bytes past
// a 128-byte boundary (3 520 bytes of static shared memory), 80 bytes past in instances that read s_tab (3 536), where
// ncu counted twice the L2 sectors for the router rows' cp.async and the bulk copies went out ~3 µs later after the
// selection (docs/kernels.md, session 22). Aligned (H200, 2026-12-03, context 0, alternated in one process): 2.346 /
// 2.342 ms/token against 2.365 / 2.363; aligned with the biased lookup 2.302 / 2.303 (the default since session 23).
// kDiag (measurements only, LING_MOE_DIAG_A; the outputs are then wrong): 1 decodes the first half of each routed
// row's chunks, 2 none, so that the step's time with less decode work tells how much of launch A's tail is decode;
// 3 skips the selection (fixed picks: experts k · experts / top_k), 4 also the router rows' dots and the grid barrier,
// so that the step's time tells what a faster selection, or none, could gain (session 25's next step 1); 7 is
// session 27's default selection (the two-pass ranked path, router_select_block, inline): outputs correct, for A/B
// against the default's candidate selection (router_select_fast; session 28: 2.267 against 2.298-2.300 ms/token,
// H200). Session 27's 5, the same with trace marks inside it (LING_TRACE_MOEA=6|7|8), measured that path and is
// removed with its marks (session 28). 8 is session 28's tile issue (outputs correct): every warp issues its routed
// tiles' copies at once after stage_q8's block barrier, against the default's paced issue. 9 decodes the routed tiles
// on FP8 wgmma (routed_decode_wgmma; a trial): one tile per warp, the shared expert's on warps 0-3 and the routed ones
// on warps 4-15, whose warpgroups decode their four tiles together; the routed rows copied one by one, kWgRowPad bytes
// apart; B staged instead of stage_q8's limbs; the warpgroups paced 4 · pace cycles apart.
// The paced issue (the default since session 30; docs/kernels.md "Launch A's routed tiles paced"): the r-th warp of the
// block with routed tiles issues their copies MoeArgs::pace · r SM cycles after the selection, so that they land in
// the order of the warps' decode (bench/probes/tile_landing: issued at once they land together at the end of the
// DRAM phase). No block barrier waits for a paced warp: each thread arrives on an mbarrier once its limbs are staged,
// and every warp waits on it before its decode. H200, 2026-12-04, context 0, alternated in one process: 2.238 / 2.238
// ms/token against 2.263 / 2.264 for =8. Session 29's trial of the pace inside the kernel with stage_q8's block barrier
// kept measured 2.272-2.278 against 2.265: the warps after the first waited for the barrier.
// Measured and removed (session 28, docs/kernels.md "Launch A's selection by candidates"): the selection run dry by the
// warps without a router row while the others computed theirs (one code copy, named barriers), so that its code was
// warm for the real pass: 2.396 against 2.296-2.298 ms/token (the dry pass held back the grid barrier by 2.5 us);
// the selection run twice, the second pass warm: it took 2.37 of the first's 2.9 us (not instruction fetch).
// Measured and removed (session 25): two routed row pairs per lane group and pass on the biased lookup (each limb word
// read once for both, 8 DP4A chains; 116 registers), 2.314 against 2.307 ms/token; each warp's first routed tile's
// copies computed before the PDL wait but for the expert term (48 instead of ~250 SASS instructions between the
// selection's barrier and the first bulk copy), 2.320 / 2.322 against 2.305 / 2.307 (docs/kernels.md).
template <int kW, bool kBiased, int kDiag = 0>
__global__ void __launch_bounds__(kW * 32, 1)
    moe_gate_up_stream_kernel(MoeArgs a, float const* __restrict__ u, InputPrologue pro, float* h, StreamPlan sp) {
  extern __shared__ float4 smem_f4[];
  __shared__ int s_idx[kMoeMaxTopK];
  constexpr bool kPaced = kDiag != 8;  // kDiag 8: session 28's issue, every warp at once after a block barrier
  __shared__ std::uint64_t s_bar[kW * kStreamMaxStages + (kPaced ? 1 : 0)];  // paced: + the limbs' barrier
  __shared__ __align__(8) std::uint32_t s_tab[2];
  float* xs = reinterpret_cast<float*>(smem_f4);
  int const cols = int(a.gate.cols), nblk = cols >> 5;
  std::int64_t const n_stage = a.has_shared && a.sgate.ld > cols ? a.sgate.ld : cols;  // staged floats (FP8: ld)
  int2* const q = reinterpret_cast<int2*>(xs + xs_floats(n_stage));  // also the selection's scratch before stage_q8
  constexpr bool kWg = kDiag == 9;  // the routed decode on wgmma (a trial; routed_decode_wgmma)
  int const q_slots = kWg ? stream_q_slots_wg(nblk, a.route) : stream_q_slots(nblk, a.route);
  float* const sx = reinterpret_cast<float*>(q + q_slots);
  int const warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  int const D = sp.stages, G = int(gridDim.x), b = int(blockIdx.x), ntiles = block_tiles(sp);
  // kWg: the block's tiles k = 0, 1, ... (b + k G) go one per warp, its ns shared-expert tiles to warps 0 .. ns - 1
  // and its routed ones to warps 4, 5, ... (whole warpgroups; the launcher checks ns <= 4, ntiles - ns <= 12)
  int const ns = b < sp.shared_tiles ? (sp.shared_tiles - 1 - b) / G + 1 : 0;
  int const wk = !kWg ? warp : warp < 4 ? (warp < ns ? warp : -1) : (warp - 4 + ns < ntiles ? warp - 4 + ns : -1);
  int const mine = kWg ? (wk >= 0 ? 1 : 0) : warp < ntiles ? (ntiles - 1 - warp) / kW + 1 : 0;  // k = warp + m kW
  unsigned char* ring0 = reinterpret_cast<unsigned char*>(smem_f4) + sp.prologue_bytes;
  ring0 += (0u - smem_u32(ring0)) & 127u;  // a 128-byte boundary (the launcher's slack)
  unsigned char* const ring = ring0 + std::size_t(warp) * std::size_t(D) * std::size_t(sp.stage_bytes);
  int const R = sp.rows, R2 = sp.srows, ncb = (cols + 127) >> 7;
  std::int64_t const rb = a.gate.ld, srb = a.has_shared ? a.sgate.ld : 0;  // bytes per row (uint8 storage)
  std::int64_t const inter = a.gate.rows, sinter = a.has_shared ? a.sgate.rows : 0;
  auto cap = [](std::int64_t n) { return round128(span16_cap(n)); };  // a scale span's room
  std::int64_t const scap = cap(std::int64_t(R) * nblk), sscap = cap(std::int64_t(ncb) * 4);
  auto tile_of = [&](int m) { return kWg ? b + wk * G : b + (warp + m * kW) * G; };
  int const pitch = int(rb) + kWgRowPad;  // kWg: a routed tile's rows one by one, this far apart
  // one barrier per ring buffer: its k-th tile's copies complete phase k (parity k & 1)
  std::uint64_t* const bars = s_bar + warp * kStreamMaxStages;
  // the copies of this warp's m-th tile into buffer m % D: lane 0 issues four bulk copies (gate rows, up rows, gate
  // scales, up scales; shared-expert or routed) that complete on the buffer's barrier. kRouted (the issue after the
  // selection: a warp's shared-expert tiles lead its list, and the first D of them went before the wait) leaves the
  // shared-expert branch out of that copy of the code.
  auto issue = [&]<bool kRouted = false>(int m, std::bool_constant<kRouted> = {}) {
    if (lane != 0) return;
    int const t = tile_of(m);
    unsigned char* dst = ring + std::size_t(m % D) * std::size_t(sp.stage_bytes);
    char const *s0, *s1, *s2, *s3;
    std::int64_t n01, n23, o1, o2, o3;
    if (!kRouted && t < sp.shared_tiles) {
      std::int64_t const r0 = std::int64_t(t) * R2, nr = sinter - r0 < R2 ? sinter - r0 : R2;
      std::int64_t const so = (r0 >> 7) * ncb * 4;
      s0 = static_cast<char const*>(a.sgate.data) + r0 * srb;
      s1 = static_cast<char const*>(a.sup.data) + r0 * srb;
      s2 = static_cast<char const*>(a.sgate.scales) + so;
      s3 = static_cast<char const*>(a.sup.scales) + so;
      n01 = nr * srb, n23 = std::int64_t(ncb) * 4;
      o1 = R2 * srb, o2 = 2 * R2 * srb, o3 = 2 * R2 * srb + sscap;
    } else {
      int const tr = t - sp.shared_tiles, s = tr / sp.tiles_per_slot;
      std::int64_t const r0 = std::int64_t(tr - s * sp.tiles_per_slot) * R, nr = inter - r0 < R ? inter - r0 : R;
      int const e = s_idx[s] < 0 ? 0 : s_idx[s];  // a bad id reads expert 0; its outputs turn NaN below
      s0 = static_cast<char const*>(batch_data<quant::Mxfp4>(a.gate, e)) + r0 * rb;
      s1 = static_cast<char const*>(batch_data<quant::Mxfp4>(a.up, e)) + r0 * rb;
      s2 = static_cast<char const*>(batch_scales<quant::Mxfp4>(a.gate, e)) + r0 * nblk;
      s3 = static_cast<char const*>(batch_scales<quant::Mxfp4>(a.up, e)) + r0 * nblk;
      n01 = nr * rb, n23 = nr * nblk;
      o1 = R * rb, o2 = 2 * R * rb, o3 = 2 * R * rb + scap;
      if constexpr (kWg) {  // each row by itself at `pitch`, the scales after the 2 R rows
        Span16 const c2 = span16(s2, n23), c3 = span16(s3, n23);
        std::uint64_t* const bar = bars + m % D;
        mbar_arrive_expect(bar, std::uint32_t(2 * nr * rb) + c2.bytes + c3.bytes);
        for (std::int64_t i = 0; i < nr; ++i) {
          bulk_copy(dst + i * pitch, s0 + i * rb, std::uint32_t(rb), bar);
          bulk_copy(dst + (R + i) * pitch, s1 + i * rb, std::uint32_t(rb), bar);
        }
        bulk_copy(dst + 2 * R * pitch, c2.src, c2.bytes, bar);
        bulk_copy(dst + 2 * R * pitch + scap, c3.src, c3.bytes, bar);
        return;
      }
    }
    Span16 const c0 = span16(s0, n01), c1 = span16(s1, n01), c2 = span16(s2, n23), c3 = span16(s3, n23);
    std::uint64_t* const bar = bars + m % D;
    mbar_arrive_expect(bar, c0.bytes + c1.bytes + c2.bytes + c3.bytes);
    bulk_copy(dst, c0.src, c0.bytes, bar);
    bulk_copy(dst + o1, c1.src, c1.bytes, bar);
    bulk_copy(dst + o2, c2.src, c2.bytes, bar);
    bulk_copy(dst + o3, c3.src, c3.bytes, bar);
  };

  pdl_trigger();
  trace_mark(a.trace_a, 0);
  // lane k < D initializes buffer k's barrier (a loop over k by lane 0 unrolled to ~250 instructions: each init
  // with a non-uniform address is a loop of its own)
  if (lane < D) mbar_init(bars + lane, 1);
  if (kPaced && warp == 0 && lane == 0)
    mbar_init(s_bar + kW * kStreamMaxStages, kW * 32);  // every thread's limbs staged
  if (lane < D) mbar_init_fence();
  __syncwarp();
  // this warp's leading shared-expert tiles, issued before the wait
  int pre = 0;
  while (pre < mine && pre < D && tile_of(pre) < sp.shared_tiles) ++pre;
  // router rows in this launch: warp kW - 1 - j takes row b + j · grid, copied before the wait (cp.async, the only
  // commit group) into the warp's first ring buffer that no early tile holds (its routed tiles are issued only after
  // the selection; router_rows_in_ring checked that this buffer exists for every router warp)
  bool const rin = a.router.data != nullptr;
  std::int64_t const rrow = std::int64_t(b) + std::int64_t(kW - 1 - warp) * G;
  bool const rmine = rin && rrow < a.router.rows;
  unsigned char* const rsm = ring + std::size_t(pre) * std::size_t(sp.stage_bytes);
  if (rmine) router_row_copy(a.router, rrow, rsm);
  if (rin) cp_async_commit();
  for (int m = 0; m < pre; ++m) issue(m);
  prologue_prefetch(pro, a.has_shared ? a.sgate.cols : cols);
  bool const ahead = a.route.logits && a.route_ahead;
  RouteAhead ra{};
  if (ahead) route_ahead_bias(a.route, ra);
  pdl_wait();
  trace_mark(a.trace_a, 1);
  if (ahead && !rin) route_ahead_logits(a.route, ra);  // in flight while the input is staged
  stage_input<false>(xs, u, a.has_shared ? a.sgate.cols : cols, n_stage, pro);
  if (a.trace_mid == 1) trace_mark(a.trace_a, 2);  // thread 0's staging done (a measurement point, LING_TRACE_MOEA)
  if (kDiag == 4 && rin) {  // measurements only: the router row's copy waited for, no dots, no grid barrier
    cp_async_wait(0);
    __syncthreads();
  } else if (rin) {
    cp_async_wait(0);  // the router row
    __syncthreads();   // the staged input is complete
    if (rmine) {
      float const v = router_row_dot(a.router, rsm, xs);
      if (lane == 0) a.router_out[rrow] = v;
    }
    if (a.trace_mid == 2) {  // every router row's dot done: the block's arrival at the barrier (a uniform branch)
      __syncthreads();
      trace_mark(a.trace_a, 2);
    }
    grid_barrier(a.grid_bar);
    if (a.trace_mid == 3) trace_mark(a.trace_a, 2);
    if (ahead) route_ahead_logits(a.route, ra);
  }
  if constexpr (kDiag == 3 || kDiag == 4) {  // measurements only: fixed picks, evenly spaced experts, equal weights
    int const t = int(threadIdx.x);
    if (t < a.top_k) {
      int const e = t * (a.route.experts / a.top_k);
      s_idx[t] = e;
      if (b == 0 && a.sel_idx) {
        a.sel_idx[t] = e;
        a.sel_w[t] = 1.0f / float(a.top_k);
      }
    }
    __syncthreads();
  } else {
    moe_block_routing<kDiag != 7>(a, s_idx, reinterpret_cast<float*>(q), ra, ahead);
  }
  if (a.trace_mid == 0) trace_mark(a.trace_a, 2);
  fence_proxy_async_smem();  // the router row's reads of its buffer before the bulk copies into it
  if constexpr (!kPaced) {
    for (int m = pre; m < D && m < mine; ++m) issue(m);
    if (a.trace_mid == 5) trace_mark_max(a.trace_a, 2);
    e2m1_tables_store(s_tab);
    stage_q8(q, sx, xs, nblk, kXPre);
    __syncthreads();
  } else {  // paced (MoeArgs::pace): the r-th warp with routed tiles issues them pace · r cycles from now
    int const first_routed = sp.shared_tiles > b ? min(kW, (sp.shared_tiles - b - 1) / G + 1) : 0;
    // kWg: the r-th warpgroup with routed tiles, 4 pace · r cycles (its four tiles together)
    int const r = kWg ? (warp < 4 ? -1 : (warp - 4) >> 2) : warp - first_routed;
    long long const at = clock64() + static_cast<long long>(a.pace) * (kWg ? 4 : 1) * r;
    std::uint64_t* const qbar = s_bar + kW * kStreamMaxStages;
    // One copy of the issue code for both orders (r <= 0: before the staging; r > 0: after it and the pace): pass 0
    // stages, and each warp issues in the pass its order names. Inlined twice, the issue code was ~4 KB more that
    // every SM fetched right after the selection (docs/kernels.md "Launch A's code size").
    int const pass_issue = r > 0 ? 1 : 0;
#pragma unroll 1
    for (int pass = 0; pass < 2; ++pass) {
      if (pass == pass_issue && pre < D && pre < mine) {
        if (pass == 1 && lane == 0)
          while (clock64() < at) __nanosleep(20);
        __syncwarp();
#pragma unroll 1
        for (int m = pre; m < D && m < mine; ++m) issue(m, std::true_type{});
      }
      if (pass == 0) {
        e2m1_tables_store(s_tab);
        if constexpr (kWg) {
          stage_e4m3_limbs(wg_b(q), sx, xs, nblk);
          fence_proxy_async_smem();  // B's writes before the wgmmas read it (the async proxy)
        } else {
          stage_q8(q, sx, xs, nblk, kXPre);
        }
        mbar_arrive(qbar);  // this thread's limbs are staged: no block barrier that the paced warps would hold back
      }
    }
    if (a.trace_mid == 5) trace_mark_max(a.trace_a, 2);
    mbar_wait(qbar, 0);  // every thread's limbs (and thread 0's tables) are staged
  }
  if constexpr (kWg) {
    if (warp >= 4) {  // the routed tiles: a warpgroup decodes its four together (routed_decode_wgmma)
      if (4 * ((warp >> 2) - 1) >= ntiles - ns) {  // no routed tile in this warpgroup
        trace_end(a.trace_a);
        return;
      }
      bool const has = mine > 0;
      int s = 0, e = -1, nrow = 0;
      std::int64_t r0 = 0;
      std::uint8_t const *gsc = ring, *usc = ring;
      if (has) {
        mbar_wait(bars, 0u);  // the tile has landed
        int const tr = tile_of(0) - sp.shared_tiles;
        s = tr / sp.tiles_per_slot;
        r0 = std::int64_t(tr - s * sp.tiles_per_slot) * R;
        nrow = int(inter - r0 < R ? inter - r0 : R);
        e = s_idx[s];
        int const ee = e < 0 ? 0 : e;
        gsc = ring + 2 * R * pitch +
              addr_skew(static_cast<char const*>(batch_scales<quant::Mxfp4>(a.gate, ee)) + r0 * nblk);
        usc = ring + 2 * R * pitch + scap +
              addr_skew(static_cast<char const*>(batch_scales<quant::Mxfp4>(a.up, ee)) + r0 * nblk);
      }
      if (a.trace_mid == 4) trace_mark_max(a.trace_a, 2);
      float const v = routed_decode_wgmma<kWgGroups>(ring, pitch, gsc, usc, wg_b(q), sx, has, a.top_k > 0 ? 1 : 0);
      float const up = __shfl_down_sync(0xffffffffu, v, 16);  // lane 4 i: gate row i; lane 4 i + 16: up row i
      int const i = lane >> 2;
      if (has && (lane & 3) == 0 && i < 4 && i < nrow)
        h[std::int64_t(s) * inter + r0 + i] = swiglu(e < 0 ? __uint_as_float(0x7FC00000u) : v, up, a.routed_limit);
      trace_end(a.trace_a);
      return;
    }
  }
  std::uint32_t pos_lo = 0, neg_lo = 0;
  if constexpr (kBiased) e2m1_tables_load(s_tab, pos_lo, neg_lo);

  // lanes per row: 16 when a row's chunks split evenly (Ling: 80 chunks, 5 per lane), so a warp decodes 2 row pairs
  int const L = (nblk % 16 == 0) ? 16 : 32, sub = lane / L, sl = lane % L;
  for (int m = 0; m < mine; ++m) {
    mbar_wait(bars + m % D, unsigned(m / D) & 1u);  // tile m has landed
    if (a.trace_mid == 4 && m == mine - 1) trace_mark_max(a.trace_a, 2);
    int const t = tile_of(m);
    unsigned char const* base = ring + std::size_t(m % D) * std::size_t(sp.stage_bytes);
    if (t < sp.shared_tiles) {
      std::int64_t const r0 = std::int64_t(t) * R2;
      int const nr = int(sinter - r0 < R2 ? sinter - r0 : R2), nc = int(srb / 16);
      std::int64_t const so = (r0 >> 7) * ncb * 4;
      float const* gsc = reinterpret_cast<float const*>(base + 2 * R2 * srb + addr_skew(static_cast<char const*>(a.sgate.scales) + so));
      float const* usc = reinterpret_cast<float const*>(base + 2 * R2 * srb + sscap + addr_skew(static_cast<char const*>(a.sup.scales) + so));
      for (int i = 0; i < nr; ++i) {
        uint4 const* gr = reinterpret_cast<uint4 const*>(base + i * srb);
        uint4 const* ur = reinterpret_cast<uint4 const*>(base + (R2 + i) * srb);
        float ag = 0.f, au = 0.f;
        for (int j = lane; j < nc; j += 32) {
          uint4 const v[2] = {gr[j], ur[j]};
          float d[2];
          Fp8Dot::dot<2>(v, xs + xpad(j * 16), d);
          ag = fmaf(gsc[j >> 3], d[0], ag);
          au = fmaf(usc[j >> 3], d[1], au);
        }
        float const g = warp_sum(ag) * kPostPlain, v = warp_sum(au) * kPostPlain;
        if (lane == 0) h[std::int64_t(a.top_k) * inter + r0 + i] = swiglu(g, v, a.shared_limit);
      }
    } else {
      int const tr = t - sp.shared_tiles, s = tr / sp.tiles_per_slot;
      std::int64_t const r0 = std::int64_t(tr - s * sp.tiles_per_slot) * R;
      int const nr = int(inter - r0 < R ? inter - r0 : R);
      int const e = s_idx[s], ee = e < 0 ? 0 : e;
      std::uint8_t const* gsc =
          base + 2 * R * rb + addr_skew(static_cast<char const*>(batch_scales<quant::Mxfp4>(a.gate, ee)) + r0 * nblk);
      std::uint8_t const* usc = base + 2 * R * rb + scap +
                                addr_skew(static_cast<char const*>(batch_scales<quant::Mxfp4>(a.up, ee)) + r0 * nblk);
      for (int i0 = 0; i0 < nr; i0 += 32 / L) {
        int const i = i0 + sub;
        float ag = 0.f, au = 0.f;
        if (i < nr) {
          uint4 const* gr = reinterpret_cast<uint4 const*>(base + i * rb);
          uint4 const* ur = reinterpret_cast<uint4 const*>(base + (R + i) * rb);
          int const jend = kDiag == 1 ? nblk / 2 : kDiag == 2 ? 0 : nblk;
          for (int j = sl; j < jend; j += L) {
            float const xsc = sx[j];
            if constexpr (kBiased) {
              uint4 const v[2] = {gr[j], ur[j]};
              int2 d[2];
              q8u_chunk<2>(v, q + 9 * j, pos_lo, neg_lo, d);
              ag = fmaf(fmaf(float(d[0].y), kQ8LimbScale, float(d[0].x)), ue8m0_float_sel(gsc[i * nblk + j]) * xsc, ag);
              au = fmaf(fmaf(float(d[1].y), kQ8LimbScale, float(d[1].x)), ue8m0_float_sel(usc[i * nblk + j]) * xsc, au);
            } else {
              uint4 const v[2] = {gr[j], ur[j]};
              int ap[2] = {0, 0}, an[2] = {0, 0}, bp[2] = {0, 0}, bn[2] = {0, 0};
              q8_chunk<2>(v, q + q8_slot(8 * j), ap, an, bp, bn);
              ag = fmaf(fmaf(float(bp[0] - bn[0]), kQ8LimbScale, float(ap[0] - an[0])), ue8m0_float(gsc[i * nblk + j]) * xsc, ag);
              au = fmaf(fmaf(float(bp[1] - bn[1]), kQ8LimbScale, float(ap[1] - an[1])), ue8m0_float(usc[i * nblk + j]) * xsc, au);
            }
          }
        }
        for (int o = L >> 1; o > 0; o >>= 1) {
          ag += __shfl_xor_sync(0xffffffffu, ag, o);
          au += __shfl_xor_sync(0xffffffffu, au, o);
        }
        if (i < nr && sl == 0)
          h[std::int64_t(s) * inter + r0 + i] = swiglu(e < 0 ? __uint_as_float(0x7FC00000u) : ag, au, a.routed_limit);
      }
    }
    if (m + D < mine) {
      __syncwarp();  // every lane has read the buffer before it is refilled
      fence_proxy_async_smem();
      issue(m + D);
    }
  }
  trace_end(a.trace_a);
}

// LING_MOE_STREAM=0: launch A on the register kernel instead of the streamed one (A/B measurements; read at each
// launch). Launch B streamed measured slower than its register kernel (H200, 2026-11-30, bench/cuda_ops: 16.6 against
// 11.5 µs; launch A 11.8 against 14.4) and was removed in session 37 (docs/kernels.md).
inline bool moe_stream_on() { return !env_off("LING_MOE_STREAM"); }
// LING_MOE_Q8U=0: launch A's streamed kernel on q8_chunk instead of the biased lookup (q8u_chunk, the default since
// session 23). The biased lookup was faster alone (bench/cuda_ops, H200, 2026-12-01: 11.9 against 12.6 µs) but slower
// in the model in sessions 7, 8 and 19 (3.047 against 2.984, 2.621 against 2.585 ms/token). The cause, found in session
// 22: its instance keeps s_tab, which moved the ring buffers to 80 bytes past a 128-byte boundary. With the ring
// aligned (H200, 2026-12-03, context 0, alternated): 2.302 / 2.303 against 2.346 / 2.342 ms/token on q8_chunk.
inline bool moe_q8u_on() { return !env_off("LING_MOE_Q8U"); }
// Launch A's streamed kernel: one block of 16 warps per SM by default. Measured against two blocks of 8 once the
// selection's code shrank (H200, 2026-12-01, ms/token, same run): 2.748 / 2.750 against 2.804 (8 warps, one ring stage)
// and 2.882 (8 warps, two stages: the blocks then fill the SM's shared memory). Two blocks run the staging and the
// expert selection twice per SM. LING_MOE_STREAM_WARPS_A=8 or 20 for the others.
inline int moe_stream_warps_a() {
  char const* e = std::getenv("LING_MOE_STREAM_WARPS_A");
  int const n = e && *e ? std::atoi(e) : 16;
  return n == 8 || n == 20 ? n : 16;
}
// LING_MOE_ROWS_A=r,s: launch A's routed and shared-expert row pairs per tile (measurements; default kStreamRowsA,
// kStreamSharedRowsA; r even, both 1..8).
inline void moe_stream_rows_a(int& rows, int& srows) {
  rows = kStreamRowsA, srows = kStreamSharedRowsA;
  char const* e = std::getenv("LING_MOE_ROWS_A");
  int r = 0, s = 0;
  if (e && std::sscanf(e, "%d,%d", &r, &s) == 2 && r >= 2 && r <= 8 && r % 2 == 0 && s >= 1 && s <= 8) rows = r, srows = s;
}
// LING_MOE_STREAM_STAGES=n caps the ring stages per warp (measurements: n = 1 is launch A's plan before the selection's
// scratch moved into dynamic shared memory).
inline int moe_stream_stage_cap() {
  char const* e = std::getenv("LING_MOE_STREAM_STAGES");
  int const n = e && *e ? std::atoi(e) : 0;
  return n >= 1 ? n : kStreamMaxStages;
}
// LING_MOE_DIAG_A=1|2|3|4 (measurements only: wrong outputs): launch A's default streamed kernel (16 warps, either
// lookup; other settings ignore it) decodes half of each routed row's chunks (1) or none (2); docs/perf-log.md,
// session 20's next step 1. With the biased lookup and fused routing: fixed picks instead of the selection (3), and no
// router dots or grid barrier either (4); session 25's next step 1.
// =7: the two-pass ranked selection (router_select_block inline, session 27's default; outputs correct), for A/B
// against the candidate selection.
// =8: session 28's tile issue (every warp issues its routed tiles at once, after a block barrier; outputs correct), for
// A/B against the paced issue.
// =9: the routed decode on FP8 wgmma (a trial, session 30: routed_decode_wgmma; moe_wg_a_fits says where it applies,
// elsewhere the default runs): outputs within the FP8 tensor core's accumulation of the default's.
inline int moe_diag_a() { return env_level("LING_MOE_DIAG_A", 9); }
// MoeArgs::pace for the model: LING_MOE_PACE=n SM cycles between a block's routed warps; unset, -1 (the launcher takes
// the device's, moe_pace_device)
inline int moe_pace_a() {
  static int const v = [] {
    char const* e = std::getenv("LING_MOE_PACE");
    return e && *e ? std::max(0, std::min(std::atoi(e), moe_pace::kMaxCycles)) : -1;
  }();
  return v;
}
// The device's pace for routed tiles of tile_bytes (moe_pace.hpp): one tile at the SM's share of the DRAM's peak rate;
// kMoePaceA where the attributes cannot be read.
inline int moe_pace_device(std::int64_t tile_bytes) {
  static int const sm_khz = current_device_attribute(cudaDevAttrClockRate);
  static int const mem_khz = current_device_attribute(cudaDevAttrMemoryClockRate);
  static int const bus = current_device_attribute(cudaDevAttrGlobalMemoryBusWidth);
  return moe_pace::cycles(tile_bytes, sm_count(), sm_khz, mem_khz, bus, kMoePaceA);
}
inline int moe_stream_blocks_per_sm(int warps) { return warps == 8 ? 2 : 1; }
inline int smem_per_sm_bytes() {
  static int const v = current_device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
  return v;
}
inline int smem_optin_bytes() {
  static int const v = current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  return v;
}
inline bool aligned16(void const* p, std::int64_t a = 0, std::int64_t b = 0) {
  return ((reinterpret_cast<std::uintptr_t>(p) | std::uintptr_t(a) | std::uintptr_t(b)) & 15) == 0;
}

// Sizes the warps' rings for `kernel` (kW warps × stages buffers of stage_bytes after prologue bytes of dynamic shared
// memory, within the device's opt-in limit; no more stages than a warp has tiles) on min(SMs × blocks per SM, tiles)
// blocks, and sets the kernel's shared-memory limit. Returns false (nothing to launch) when not even one buffer per warp
// fits: the caller then runs the register-streaming kernels.
template <class Kernel>
bool stream_plan(Kernel kernel, int warps, StreamPlan& sp, std::int64_t prologue, std::int64_t stage_bytes, std::size_t& smem,
                 int& blocks, cudaError_t& err, int slack = 0) {
  if (sp.tiles <= 0) return false;
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) return false;
  int const per_sm = moe_stream_blocks_per_sm(warps);
  blocks = sp.tiles < sm_count() * per_sm ? sp.tiles : sm_count() * per_sm;
  int const per_warp = ((sp.tiles + blocks - 1) / blocks + warps - 1) / warps;
  sp.prologue_bytes = int(round128(prologue));
  sp.stage_bytes = int(round128(stage_bytes));
  std::int64_t limit = smem_optin_bytes();  // per block; with 2 per SM, half the SM's (1 KB of each is reserved)
  if (per_sm > 1 && std::int64_t(smem_per_sm_bytes()) / per_sm - 1024 < limit) limit = smem_per_sm_bytes() / per_sm - 1024;
  std::int64_t const avail = limit - std::int64_t(fa.sharedSizeBytes) - sp.prologue_bytes - slack;
  std::int64_t st = avail / (std::int64_t(warps) * sp.stage_bytes);
  if (st > kStreamMaxStages) st = kStreamMaxStages;
  if (st > per_warp) st = per_warp;
  if (st > moe_stream_stage_cap()) st = moe_stream_stage_cap();
  if (st < 1) return false;
  sp.stages = int(st);
  smem = std::size_t(sp.prologue_bytes) + std::size_t(slack) + std::size_t(warps) * std::size_t(sp.stages) * std::size_t(sp.stage_bytes);
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  return true;
}
// stream_plan, then the launch; false: nothing launched (see stream_plan).
template <class Kernel, class... Args>
bool stream_launch(Kernel kernel, int warps, StreamPlan sp, std::int64_t prologue, std::int64_t stage_bytes,
                   cudaStream_t stream, cudaError_t& err, Args const&... args) {
  std::size_t smem = 0;
  int blocks = 0;
  if (!stream_plan(kernel, warps, sp, prologue, stage_bytes, smem, blocks, err)) return false;
  if (err == cudaSuccess) err = launch_ex(kernel, dim3(unsigned(blocks)), dim3(unsigned(warps * 32)), smem, stream, args..., sp);
  return true;
}

// Launch A's router rows (MoeArgs::router) on their own router launch: the logits only (no counter; launch A selects).
inline cudaError_t launch_router_logits(MoeArgs const& a, float const* u, InputPrologue const& pro, cudaStream_t stream) {
  RouterArgs ra{};
  ra.w = a.router;
  ra.logits = a.router_out;
  return launch_router_keyed(make_key<quant::Bf16>(), ra, u, pro, stream);
}

// Whether launch A's router rows fit its ring buffers: a row per warp (warps kW - 1, kW - 2, ... take one each) and
// every router warp with a buffer free before the wait (no early shared-expert tile in it: warp w's early tiles are
// m < stages with (w + m · warps) · blocks + b < shared tiles, most at b = 0) that holds a row.
inline bool router_rows_in_ring(MatrixArgs const& w, StreamPlan const& p, int warps, int blocks) {
  if (blocks <= 0 || w.ld * 2 > p.stage_bytes) return false;
  std::int64_t const rpb = (w.rows + blocks - 1) / blocks;
  if (rpb > warps) return false;
  for (std::int64_t j = 0; j < rpb; ++j) {
    std::int64_t const warp = warps - 1 - j;
    int early = 0;
    for (int m = 0; m < p.stages; ++m) early += (warp + std::int64_t(m) * warps) * blocks < p.shared_tiles ? 1 : 0;
    if (early >= p.stages) return false;
  }
  return true;
}
// Whether launch A, planned as p on `blocks` blocks of `warps` warps with smem bytes of shared memory, can take its
// router rows: whole 16-byte chunks, a staged input that covers the rows, the rows in ring buffers, and every block
// resident at once (the grid barrier; the occupancy query counts registers and shared memory).
template <class Kernel>
bool router_in_a_fits(Kernel kernel, MoeArgs const& a, StreamPlan const& p, std::int64_t n_stage, int warps, std::size_t smem,
                      int blocks) {
  MatrixArgs const& w = a.router;
  if (!w.data || !a.router_out || !a.grid_bar || w.rows <= 0) return false;
  if (w.ld % 8 != 0 || w.ld > round32(n_stage) || !aligned16(w.data)) return false;
  if (!router_rows_in_ring(w, p, warps, blocks)) return false;
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, warps * 32, smem) != cudaSuccess) return false;
  return std::int64_t(per_sm) * sm_count() >= blocks;
}

// Whether launch A's wgmma instance (LING_MOE_DIAG_A=9) applies on `blocks` blocks of 16 warps: its one shape (2560
// columns: kWgGroups; rows of the checkpoint's 1280 bytes; 4 row pairs per routed tile), one tile per warp with a
// block's shared-expert tiles on warps 0-3 and its routed ones on warps 4-15 (whole warpgroups), and the router rows
// on routed warps (at most 12 per block).
inline bool moe_wg_a_fits(MoeArgs const& a, StreamPlan const& sp, int blocks) {
  if (blocks <= 0 || a.gate.cols != 4 * 32 * kWgGroups || a.gate.ld != a.gate.cols / 2 || sp.rows != 4) return false;
  if (a.router.data && (a.router.rows + blocks - 1) / blocks > 12) return false;
  for (int b = 0; b < blocks; ++b) {
    int const nt = b < sp.tiles ? (sp.tiles - 1 - b) / blocks + 1 : 0;
    int const ns = b < sp.shared_tiles ? (sp.shared_tiles - 1 - b) / blocks + 1 : 0;
    if (ns > 4 || nt - ns > 12) return false;
  }
  return true;
}

// Launch A on the streamed kernel when it applies (MXFP4 experts on the int8 path, FP8-block or no shared expert,
// 16-byte aligned rows); false: not launched.
template <class PE, class PS>
bool launch_moe_gate_up_stream(MoeArgs const& a, float const* u, InputPrologue const& pro, float* h, cudaStream_t stream,
                               cudaError_t& err) {
  if constexpr (!std::is_same_v<PE, quant::Mxfp4> || !std::is_same_v<PS, quant::Fp8Block>) {
    return false;
  } else {
    if (!moe_stream_on() || moe_q8_mode() < 1) return false;
    if (!aligned16(a.gate.data, a.gate.data_stride, a.gate.ld) || !aligned16(a.up.data, a.up.data_stride, a.up.ld))
      return false;
    if (a.has_shared && (!aligned16(a.sgate.data, a.sgate.ld) || !aligned16(a.sup.data, a.sup.ld))) return false;
    StreamPlan sp;
    moe_stream_rows_a(sp.rows, sp.srows);
    sp.tiles_per_slot = int((a.gate.rows + sp.rows - 1) / sp.rows);
    sp.shared_tiles = a.has_shared ? int((a.sgate.rows + sp.srows - 1) / sp.srows) : 0;
    sp.tiles = sp.shared_tiles + a.top_k * sp.tiles_per_slot;
    std::int64_t const cols = a.gate.cols, nblk = cols / 32, ncb = (cols + 127) / 128;
    std::int64_t const n_stage = a.has_shared && a.sgate.ld > cols ? a.sgate.ld : cols;
    std::int64_t const prologue = std::int64_t(xs_floats(n_stage)) * 4 + std::int64_t(stream_q_slots(int(nblk), a.route)) * 8 + nblk * 4;
    // scale spans rounded to 128 bytes (the kernel's layout; within the 128-byte rounding of the stage at Ling's shapes)
    std::int64_t routed = 2 * sp.rows * a.gate.ld + 2 * round128(span16_cap(sp.rows * nblk));
    std::int64_t shared = a.has_shared ? 2 * sp.srows * a.sgate.ld + 2 * round128(span16_cap(ncb * 4)) : 0;
    std::int64_t const stage = routed > shared ? routed : shared;
    bool const biased = moe_q8u_on();
    int const warps = moe_stream_warps_a();
    // the router rows ride along when they fit (router_in_a_fits); else their own launch goes first
    auto go = [&](auto kernel, int w, std::int64_t pbytes = -1, std::int64_t sbytes = -1) {  // -1: prologue, stage
      std::size_t smem = 0;
      int blocks = 0;
      StreamPlan p = sp;
      if (!stream_plan(kernel, w, p, pbytes < 0 ? prologue : pbytes, sbytes < 0 ? stage : sbytes, smem, blocks, err, 128))
        return false;  // 128: the ring's alignment
      if (err != cudaSuccess) return true;
      MoeArgs b = a;
      if (b.pace < 0) b.pace = moe_pace_device(2 * std::int64_t(sp.rows) * (a.gate.ld + nblk));  // rows + scales
      moe_pace_used() = b.pace;
      if (a.router.data && !router_in_a_fits(kernel, a, p, n_stage, w, smem, blocks)) {
        if ((err = launch_router_logits(a, u, pro, stream)) != cudaSuccess) return true;
        b.router = MatrixArgs{};
      }
      err = launch_ex(kernel, dim3(unsigned(blocks)), dim3(unsigned(w * 32)), smem, stream, b, u, pro, h, p);
      return true;
    };
    if (int const diag = moe_diag_a(); diag > 0 && warps == 16) {
      if (diag <= 2) {
        if (biased) return diag == 1 ? go(moe_gate_up_stream_kernel<16, true, 1>, 16) : go(moe_gate_up_stream_kernel<16, true, 2>, 16);
        return diag == 1 ? go(moe_gate_up_stream_kernel<16, false, 1>, 16) : go(moe_gate_up_stream_kernel<16, false, 2>, 16);
      }
      if (biased && diag == 7) return go(moe_gate_up_stream_kernel<16, true, 7>, 16);
      if (biased && diag == 8) return go(moe_gate_up_stream_kernel<16, true, 8>, 16);
      if (biased && diag == 9 && moe_wg_a_fits(a, sp, sp.tiles < sm_count() ? sp.tiles : sm_count())) {
        std::int64_t const pro9 =
            std::int64_t(xs_floats(n_stage)) * 4 + std::int64_t(stream_q_slots_wg(int(nblk), a.route)) * 8 + nblk * 4;
        std::int64_t const routed9 = 2 * sp.rows * (a.gate.ld + kWgRowPad) + 2 * round128(span16_cap(sp.rows * nblk));
        if (go(moe_gate_up_stream_kernel<16, true, 9>, 16, pro9, routed9 > shared ? routed9 : shared)) {
          ++moe_wg_a_launches();
          return true;
        }
      }
      // 3 and 4: fused routing only (launch B reads the fixed picks from sel_idx); elsewhere the default instance runs
      if (biased && a.route.logits && a.route.experts >= a.top_k)
        return diag == 3 ? go(moe_gate_up_stream_kernel<16, true, 3>, 16) : go(moe_gate_up_stream_kernel<16, true, 4>, 16);
    }
    // 20 warps: q8_chunk only (with the biased lookup it measured 2.577 against 2.306 ms/token for 16 warps, H200,
    // 2026-12-03; that instance is removed, and LING_MOE_STREAM_WARPS_A=20 then runs the 16-warp one)
    if (warps == 20 && !biased) return go(moe_gate_up_stream_kernel<20, false>, 20);
    if (warps == 8) return biased ? go(moe_gate_up_stream_kernel<8, true>, 8) : go(moe_gate_up_stream_kernel<8, false>, 8);
    return biased ? go(moe_gate_up_stream_kernel<16, true>, 16) : go(moe_gate_up_stream_kernel<16, false>, 16);
  }
}

// ---- launch B on int8 dot products, each lane fixed on its chunks of the concatenated expert rows ------------------
// MXFP4 experts (whole 32-column blocks, 16-byte aligned rows). One block per SM quantizes the routed slots' down
// inputs once (two int8 limbs per element, stage_q8_global: 132 quantizations per step, not one per resident block of
// the register kernel). Lane l owns chunks q = l + 32 u (u < kU) of the concatenation of the top_k experts' rows for
// every output row it computes, so each chunk's expert offsets, limb address and routing weight × input scale are
// computed once per lane, not per chunk and row (the register kernel's per-chunk slot, address and scale arithmetic was
// ~100 of its ~160 instructions per chunk). Each warp takes R adjacent output rows at once (their loads in flight
// together, each limb word read once for all), and the launcher sizes the blocks (warps = rows / (R × SMs), rounded
// up; Ling: 20 of one row or 10 of two) so that every warp has one pass: with 16 warps of one row, 448 warps had a
// second pass and the last blocks ended 4 µs after the median one. The codes are looked up biased (q8u_chunk).
// kFull: top_k × cols / 32 == 32 kU (Ling: 8 × 24 = 192, kU = 6), every lane has all kU chunks (no predicates).
// R: rows per warp (1: up to 20 warps at <= 102 registers; 2: up to 12 warps at <= 170).
__host__ __device__ constexpr int lane_max_warps(int rows_per_warp) { return rows_per_warp == 1 ? 20 : 12; }
// Its shared memory: the staged shared-expert input, the limbs and their scales.
__host__ __device__ constexpr std::size_t lane_smem_bytes(std::int64_t n_sh, int nq) {
  return (std::size_t(xs_floats(n_sh)) * sizeof(float) + std::size_t(q8_slots(nq)) * sizeof(int2) +
          std::size_t(nq) * sizeof(float) + 15) / 16 * 16;
}
// moe_down_lane_kernel's staging in one batch of loads: the routed slots' input groups (kB float4 per thread, as
// stage_q8_global), the shared expert's input (one float4 per thread, as stage_x4) and the picks (as stage_down_slots)
// are all requested before any is used, instead of one L2 round trip per part (the same values, so the same bits).
// Launch B's staging took 1.47 instead of 2.08 µs after its wait and the step 2.364 instead of 2.384 ms per token
// (H200, 2026-12-03, context 0, alternated in one process; docs/perf-log.md, session 21). Needs nq · 8 ≤ kB ·
// threads, the shared input ≤ 4 · threads and 16-byte aligned; returns false (nothing done) otherwise.
__device__ __forceinline__ bool stage_down_lane_once(float* xs, DownSlots& sl, int2* q, float* sx, float const* __restrict__ h,
                                                     MoeArgs const& a, int nq, std::int64_t n_sh) {
  constexpr int kB = 4;
  int const tid = int(threadIdx.x), nt = int(blockDim.x), ngroups = nq * 8, top_k = a.top_k;
  float const* const hs = h + std::int64_t(top_k) * a.down.cols;
  int const end = int(round32(n_sh)), ns = a.has_shared ? int(a.sdown.cols) : 0;
  if (ngroups > kB * nt || end > 4 * nt || (a.has_shared && (reinterpret_cast<std::uintptr_t>(hs) & 15) != 0)) return false;
  float4 v[kB];
#pragma unroll
  for (int i = 0; i < kB; ++i) {
    int const g = i * nt + tid;
    v[i] = g < ngroups ? __ldg(reinterpret_cast<float4 const*>(h) + g) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  int const c = 4 * tid;
  float4 const x4 = c < end ? ld_x4(hs, c, ns) : make_float4(0.f, 0.f, 0.f, 0.f);
  int const e = tid < top_k ? a.idx[tid] : -1;
  float const w = tid < top_k ? a.weights[tid] : 0.f;
  if (c < end) *reinterpret_cast<float4*>(xs + xpad(c)) = make_float4(x4.x * kXPre, x4.y * kXPre, x4.z * kXPre, x4.w * kXPre);
  if (tid < top_k) put_down_slot<quant::Mxfp4>(sl, a, tid, e, w);
#pragma unroll
  for (int i = 0; i < kB; ++i) {
    if (i * nt >= ngroups) break;  // uniform: no thread of the block has a group past here
    int const g = i * nt + tid;
    q8_group(v[i], g, g < ngroups, q, sx, 0.5f / 127.f);
  }
  return true;
}
// kOnce: the staging by stage_down_lane_once when it applies (the launcher's instance at Ling's shape, the one
// measured; the others keep the three staging calls).
// Measured and removed (session 22, docs/kernels.md): the lanes' first-row codes and scale words copied into shared
// memory (cp.async) once the one-batch staging's loads had returned, before the quantization (LING_MOE_B_EARLY=1):
// 2.462 against 2.365 ms/token. Session 25 (docs/kernels.md): each lane's picks loaded with the staging's loads and its
// first row requested before the block barrier, into L2 (prefetch.global.L2) or into registers after the
// quantization: 2.353 and 2.333 against 2.305 ms/token; into registers before the quantization: 2.390 (the wait for
// the staged inputs also covered the rows).
// Sessions 40-41 probed it (LING_MOE_B_DIAG, removed once answered; docs/kernels.md "Launch B's rows by bulk copies"):
// without its decode it ends 0.6 µs sooner, and its rows come back ~5 µs after its staging, so its loads set its time.
template <class KS, int kU, bool kFull, int R, bool kOnce = false>
__global__ void __launch_bounds__(lane_max_warps(R) * 32, 1)
    moe_down_lane_kernel(MoeArgs a, float const* __restrict__ h, float const* residual, float* out) {
  using PS = policy_of<KS>;
  extern __shared__ float4 smem_f4[];
  __shared__ DownSlots s_slots;
  __shared__ __align__(8) std::uint32_t s_tab[2];
  float* xs = reinterpret_cast<float*>(smem_f4);  // the shared expert's input (padded floats, times kXPre)
  int const top_k = a.top_k, C = int(a.down.cols >> 5), nq = top_k * C;
  std::int64_t const inter = a.down.cols, rows = a.down.rows, rb = a.down.ld;  // uint8 storage: ld in bytes
  std::int64_t const n_sh = a.has_shared ? round32(staged_elems<PS>(a.sdown)) : 0;
  int2* const q = reinterpret_cast<int2*>(xs + xs_floats(n_sh));
  float* const sx = reinterpret_cast<float*>(q + q8_slots(nq));
  int const W = int(blockDim.x >> 5), warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  std::int64_t const first = (std::int64_t(blockIdx.x) * W + warp) * R, stride = std::int64_t(gridDim.x) * W * R;
  pdl_trigger();
  trace_mark(a.trace_b, 0);
  if constexpr (has_fast_kernel<PS>) {  // the shared expert's rows of this warp (no dependence on earlier kernels)
    if (a.has_shared) {
      std::int64_t const srb = a.sdown.ld * std::int64_t(sizeof(typename PS::storage_type));
      for (std::int64_t r = first; r < rows; r += stride)
        warp_prefetch(static_cast<char const*>(a.sdown.data) + r * srb, (rows - r < R ? rows - r : R) * srb);
    }
  }
  pdl_wait();
  trace_mark(a.trace_b, 1);
  // once: staged by stage_down_lane_once; uniform
  bool const once = kOnce && stage_down_lane_once(xs, s_slots, q, sx, h, a, nq, n_sh);
  if (once) {
    e2m1_tables_store(s_tab);
  } else {
    if (a.has_shared) stage_x4(xs, h + std::int64_t(top_k) * inter, a.sdown.cols, n_sh);
    stage_down_slots<quant::Mxfp4>(s_slots, a);
    e2m1_tables_store(s_tab);
    stage_q8_global(q, sx, h, nq);
  }
  __syncthreads();
  trace_mark(a.trace_b, 2);

  // this lane's chunks: byte offsets of their 16 bytes of row 0 from the first expert's data and of their scale byte
  // from its scales (32 bits: the launcher checks the expert tensors are < 4 GB), routing weight × input scale
  auto const* const data0 = static_cast<char const*>(a.down.data);
  auto const* const scales0 = static_cast<std::uint8_t const*>(a.down.scales);
  std::uint32_t po[kU], pso[kU];
  float f[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    int const qq = kFull || lane + 32 * u < nq ? lane + 32 * u : 0;
    int const s = qq / C, j = qq - s * C;
    char const* d = s_slots.data[s];  // null: a bad id, which reads expert 0 with a NaN weight
    po[u] = std::uint32_t((d ? d - data0 : 0) + 16 * j);
    pso[u] = std::uint32_t((d ? static_cast<std::uint8_t const*>(s_slots.scales[s]) - scales0 : 0) + j);
    f[u] = d ? s_slots.w[s] * sx[qq] : __uint_as_float(0x7FC00000u);
  }
  std::uint32_t pos_lo, neg_lo;
  e2m1_tables_load(s_tab, pos_lo, neg_lo);
  float const* const xs_shared = xs;
  for (std::int64_t r0 = first; r0 < rows; r0 += stride) {
    std::int64_t rr[R];  // rows past the end repeat r0 (computed, not written)
#pragma unroll
    for (int n = 0; n < R; ++n) rr[n] = r0 + n < rows ? r0 + n : r0;
    [[maybe_unused]] RowLoad<PS, 2> shared_row[R];
    bool const early = shared_down_early<PS>(a);
    if constexpr (has_fast_kernel<PS>) {
      if (early) {
#pragma unroll
        for (int n = 0; n < R; ++n) row_load(shared_row[n], a.sdown, rr[n]);
      }
    }
    uint4 v[kU][R];
    std::uint32_t sc[kU][R];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (kFull || lane + 32 * u < nq) {
#pragma unroll
        for (int n = 0; n < R; ++n) {
          v[u][n] = ld_stream(data0 + rr[n] * rb + po[u]);
          sc[u][n] = __ldg(scales0 + rr[n] * C + pso[u]);
        }
      }
    }
    float acc[R];
#pragma unroll
    for (int n = 0; n < R; ++n) acc[n] = 0.f;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (kFull || lane + 32 * u < nq) {
        int2 d[R];
        q8u_chunk<R>(v[u], q + 9 * (lane + 32 * u), pos_lo, neg_lo, d);
#pragma unroll
        for (int n = 0; n < R; ++n)
          acc[n] = fmaf(fmaf(float(d[n].y), kQ8LimbScale, float(d[n].x)), ue8m0_float_sel(sc[u][n]) * f[u], acc[n]);
      }
    }
#pragma unroll
    for (int n = 0; n < R; ++n) {
      acc[n] = shared_down_add<PS>(a, shared_row[n], early, rr[n], xs_shared, acc[n]);
      float const sum = warp_sum(acc[n]);
      if (lane == 0 && r0 + n < rows) out[r0 + n] = residual ? residual[r0 + n] + sum : sum;
    }
  }
  trace_end(a.trace_b);
}

// LING_MOE_DOWN_LANE=0: launch B on the register kernel instead (A/B measurements; LING_MOE_Q8=0 also turns it off,
// as it turns off every int8 path); read at each launch.
inline bool moe_down_lane_on() {
  return !env_off("LING_MOE_DOWN_LANE");
}
// LING_MOE_LANE_ROWS=2: two rows per warp (A/B measurements; default one).
inline int moe_lane_rows() {
  char const* e = std::getenv("LING_MOE_LANE_ROWS");
  return e && *e == '2' ? 2 : 1;
}
// moe_down_lane_kernel's kOnce at Ling's shape (one row per warp, 192 chunks): on by default; LING_MOE_B_STAGE1=0 for
// the three staging calls (A/B measurements).
inline bool moe_down_stage_once() { return !env_off("LING_MOE_B_STAGE1"); }
// Launch B on moe_down_lane_kernel when it applies (MXFP4 experts in whole 32-column blocks with 16-byte aligned rows,
// top_k × cols / 32 ≤ 256 chunks, 16-byte aligned h); false: not launched.
template <class PE, class KS>
bool launch_moe_down_lane(KS, MoeArgs const& a, float const* h, float const* residual, float* out, cudaStream_t stream,
                          cudaError_t& err) {
  using PS = policy_of<KS>;
  if constexpr (!std::is_same_v<PE, quant::Mxfp4>) {
    return false;
  } else {
    if (!moe_down_lane_on() || moe_q8_mode() < 1 || a.down.cols % 32 != 0) return false;
    if (!aligned16(a.down.data, a.down.data_stride, a.down.ld) || !aligned16(h)) return false;
    int const nq = a.top_k * int(a.down.cols / 32);
    if (nq <= 0 || nq > 32 * 8) return false;
    // 32-bit chunk offsets from the first expert (moe_down_lane_kernel)
    if (a.down.count * a.down.data_stride >= (std::int64_t(1) << 32) ||
        a.down.count * a.down.scale_stride >= (std::int64_t(1) << 32))
      return false;
    std::int64_t const n_sh = a.has_shared ? round32(staged_elems<PS>(a.sdown)) : 0;
    std::size_t const smem = lane_smem_bytes(n_sh, nq);
    if (smem > std::size_t(smem_optin_bytes())) return false;
    // one block per SM, warps enough for one pass over the rows (R each), 4 to lane_max_warps(R)
    int const R = moe_lane_rows();
    std::int64_t const tasks = (a.down.rows + R - 1) / R;
    std::int64_t warps = (tasks + sm_count() - 1) / sm_count();
    warps = warps < 4 ? 4 : warps > lane_max_warps(R) ? lane_max_warps(R) : warps;
    std::int64_t const want = (tasks + warps - 1) / warps;
    int const blocks = int(want < sm_count() ? want : sm_count());
    auto go = [&](auto kernel) {
      if (smem > 48 * 1024) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
        if (err != cudaSuccess) return true;
      }
      err = launch_ex(kernel, dim3(unsigned(blocks)), dim3(unsigned(warps * 32)), smem, stream, a, h, residual, out);
      return true;
    };
    if (R == 1 && nq == 32 * 6 && moe_down_stage_once()) return go(moe_down_lane_kernel<KS, 6, true, 1, true>);
    if (R == 2) return nq == 32 * 6 ? go(moe_down_lane_kernel<KS, 6, true, 2>) : go(moe_down_lane_kernel<KS, 8, false, 2>);
    return nq == 32 * 6 ? go(moe_down_lane_kernel<KS, 6, true, 1>) : go(moe_down_lane_kernel<KS, 8, false, 1>);
  }
}

// kMinBlocks: resident blocks per SM the register budget must allow; 3 measured best for both launches at Ling's
// shapes (2026-11-30: 36 µs per step vs 38 with 2 and 43-46 with 4).
inline constexpr int kMoeMinBlocks = 3;
template <int kMinBlocks = kMoeMinBlocks, class KE, class KS>
cudaError_t launch_moe_gate_up_keyed(KE, KS, MoeArgs const& a, float const* u, InputPrologue const& pro, float* h,
                                     cudaStream_t stream) {
  using PE = policy_of<KE>;
  using PS = policy_of<KS>;
  std::int64_t n_stage = staged_elems<PE>(a.gate);
  if (a.has_shared && staged_elems<PS>(a.sgate) > n_stage) n_stage = staged_elems<PS>(a.sgate);
  {
    cudaError_t err = cudaSuccess;
    if (launch_moe_gate_up_stream<PE, PS>(a, u, pro, h, stream, err)) return err;
  }
  if (a.router.data) {  // the register kernels do not read router rows: their own launch first
    cudaError_t const e = launch_router_logits(a, u, pro, stream);
    if (e != cudaSuccess) return e;
  }
  std::size_t smem = std::size_t(xs_floats(n_stage)) * sizeof(float);
  std::int64_t const tasks = std::int64_t(a.top_k) * a.gate.rows + (a.has_shared ? a.sgate.rows : 0);
  auto go = [&](auto kernel) {
    int blocks = 0;
    cudaError_t e = persistent_grid(kernel, smem, (tasks + kWarps - 1) / kWarps, blocks);
    if (e != cudaSuccess) return e;
    return launch_ex(kernel, dim3(unsigned(blocks)), dim3(kThreads), smem, stream, a, u, pro, h);
  };
  if constexpr (kMoeQ8<PE>) {
    if (moe_q8_mode() >= 1) {
      int const nblk = int(a.gate.cols >> 5);
      smem += std::size_t(q8_slots(nblk)) * sizeof(int2) + std::size_t(nblk) * sizeof(float);
      return go(moe_gate_up_kernel<KE, KS, kMinBlocks, true>);
    }
  }
  return go(moe_gate_up_kernel<KE, KS, kMinBlocks, false>);
}

template <int kMinBlocks = kMoeMinBlocks, class KE, class KS>
cudaError_t launch_moe_down_keyed(KE, KS, MoeArgs const& a, float const* h, float const* residual, float* out,
                                  cudaStream_t stream) {
  using PE = policy_of<KE>;
  using PS = policy_of<KS>;
  {
    cudaError_t err = cudaSuccess;
    if (launch_moe_down_lane<PE>(KS{}, a, h, residual, out, stream, err)) return err;
  }
  std::int64_t const seg = round32(staged_elems<PE>(a.down));
  std::int64_t n = seg * a.top_k + (a.has_shared ? round32(staged_elems<PS>(a.sdown)) : 0);
  std::size_t smem = std::size_t(xs_floats(n)) * sizeof(float);
  auto go = [&](auto kernel) {
    int blocks = 0;
    cudaError_t e = persistent_grid(kernel, smem, (a.down.rows + kWarps - 1) / kWarps, blocks);
    if (e != cudaSuccess) return e;
    return launch_ex(kernel, dim3(unsigned(blocks)), dim3(kThreads), smem, stream, a, h, residual, out);
  };
  if constexpr (kMoeQ8<PE>) {
    if (moe_q8_mode() == 2) {
      int const nblk = int(seg / 32) * a.top_k;
      smem += std::size_t(q8_slots(nblk)) * sizeof(int2) + std::size_t(nblk) * sizeof(float);
      return go(moe_down_kernel<KE, KS, kMinBlocks, true>);
    }
  }
  return go(moe_down_kernel<KE, KS, kMinBlocks, false>);
}

}  // namespace ling::cuda::kernels

namespace ling::cuda {

template <quant::weight_policy PE, quant::weight_policy PS>
cudaError_t launch_moe_gate_up(MoeWeights<PE, PS> const& w, MoeStep const& step, float const* u, float* h,
                               cudaStream_t stream) {
  using namespace kernels;
  if (!moe_shapes_ok(w, step)) return cudaErrorInvalidValue;
  return launch_moe_gate_up_keyed(make_key<PE>(), make_key<PS>(), moe_args(w, step), u, InputPrologue{}, h, stream);
}

template <quant::weight_policy PE, quant::weight_policy PS>
cudaError_t launch_moe_down(MoeWeights<PE, PS> const& w, MoeStep const& step, float const* h, float const* residual,
                            float* out, cudaStream_t stream) {
  using namespace kernels;
  if (!moe_shapes_ok(w, step)) return cudaErrorInvalidValue;
  return launch_moe_down_keyed(make_key<PE>(), make_key<PS>(), moe_args(w, step), h, residual, out, stream);
}

}  // namespace ling::cuda
