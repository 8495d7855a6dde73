#pragma once
// The FP8-block matvec on FP8 wgmma, its weights streamed by tensor-map copies (TMA) into a ring of shared memory
// (docs/kernels.md "FP8 matvec on wgmma with tensor-map copies"). Opt-in (the model's LING_MATVEC_KERNEL=wg, wgproj or
// wgbig): measured slower in place than the CUDA-core kernel (session 32: 2.252-2.254 against 2.239-2.243 ms/token
// with the KDA projections on it), faster in a chain of launches. nvcc only, sm_90a.
//
// Why: the CUDA-core matvec spends ~7 instructions per weight (decode, FMA, addresses) and can request the next
// weights only as far as its registers reach. Here
//   - one producer lane per block requests tiles of R rows × kKbs k-blocks of 128 bytes (16 KB) by one
//     cp.async.bulk.tensor each, into a ring of as many slots as fit (at most kWgvMaxStages), from the kernel's entry
//     (the weights depend on no earlier kernel, so the producer never waits on the PDL); a unit's first slot also
//     brings the unit's row of weight scales (a 1D tensor map);
//   - units of R rows: the first is the block's index, the rest are claimed from a counter (so that an SM served late
//     takes fewer), one unit ahead;
//   - the tensor map lands each k-block as [R rows][128 bytes] with the 128-byte swizzle that wgmma's K-major shared
//     descriptor reads: the weights reach the tensor cores as stored, with no decode instruction;
//   - twelve warps (the consumer warpgroup and eight stagers) stage the input from registers and cut x (times the
//     RMSNorm's weights) into kWgvLimbs E4M3 limbs per element (each the remainder of the one before times 16), with
//     one power-of-two scale per k-block of 128; 1 / rms multiplies the outputs. A k-block's four k-steps accumulate on
//     the tensor core and are added in fp32 with the block's weight scale, so the tensor core's own accumulation spans
//     128 products only.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <utility>

#include "ling/cuda/async_copy.cuh"
#include "ling/cuda/linear.cuh"
#include "ling/cuda/wgmma.cuh"

namespace ling::cuda::kernels {

inline constexpr int kWgvLimbs = 4;    // E4M3 limbs per input element (B's columns 0-3; 4-7 are zero)
inline constexpr int kWgvStagers = 8;  // warps that only stage the input (beside the consumers)
inline constexpr int kWgvStageWarps = 4 + kWgvStagers;
// warps 0-3: the consumer warpgroup; warp 4: the producer; warps 5 on: the stagers
inline constexpr int kWgvThreads = 32 * (5 + kWgvStagers);
inline constexpr int kWgvStageBytes = 16384;         // one tensor-map copy: R rows × (16384 / 128 R) k-blocks
inline constexpr int kWgvMaxStages = 12;             // ring slots, at most (as many as fit: WgvArgs::stages)
inline constexpr int kWgvMaxCols = 6144;             // B's 8 bytes per column (48 KB at most; the ring takes the rest)
inline constexpr int kWgvMaxKb = kWgvMaxCols / 128;  // k-blocks of a row, at most
inline constexpr int kWgvCounters = 256;             // claim counters, taken round robin by the launches

struct WgvArgs {
  CUtensorMap map[kMaxMultiMatrices];   // [128 bytes, rows, k-blocks], boxes of [128, R, kKbs], 128-byte swizzle
  CUtensorMap smap[kMaxMultiMatrices];  // the weight scales, 1D, boxes of wgv_kb_pad(nkb) floats: a unit's row of them
  float* out[kMaxMultiMatrices];
  float const* residual[kMaxMultiMatrices];
  std::int32_t rows[kMaxMultiMatrices];
  std::int32_t unit_begin[kMaxMultiMatrices + 1];  // prefix sums of units (R rows each)
  int count = 0, cols = 0, nkb = 0;
  int stages = 8;  // ring slots (wgv_smem)
  int mid = 0;     // the trace's midpoint (LING_WGV_MID): 0 the input staged, 1 its first load back, 2 before the fence
  int xbar_late = 0;            // LING_WGV_XBAR_LATE: the producer's rest released after the fence and barrier
  int prefill = kWgvMaxStages;  // slots the producer requests before the consumers have their input (then it waits)
  unsigned* ctr = nullptr;      // the launch's claim counter: zero at rest, put back to zero by the last claim
  unsigned long long* trace = nullptr;
  unsigned long long* dbg = nullptr;  // measurements (bench/probes/matvec_wg): kWgvDbg values per block, or null
};
// The measurement points of WgvArgs::dbg (global ns, but 6, 7 and 9: SM cycles summed): 0 entry, 1 the producer's
// start, 2 the PDL wait passed, 3 the input staged, 4 the input's first load back (thread 0), 5 the first slot landed,
// 6 the consumers' waits for slots, 7 the producer's waits for free slots, 8 the consumers' end, 9 the consumers' waits
// for their wgmmas, 10 the input's proxy fence passed (thread 0), 11 the staging's barrier passed and 1 / rms computed
// (thread 0).
inline constexpr int kWgvDbg = 12;
__device__ __forceinline__ void wgv_dbg(unsigned long long* d, int i, unsigned long long v) {
  if (d) d[blockIdx.x * kWgvDbg + i] = v;
}

// A tensor-map copy of the box at coordinates (c0, c1, c2) into dst, completing on bar.
__device__ __forceinline__ void tma_load_2d(void* dst, CUtensorMap const* map, int c0, int c1, std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::
          "r"(smem_u32(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load_1d(void* dst, CUtensorMap const* map, int c0, std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2}], [%3];" ::"r"(
          smem_u32(dst)),
      "l"(map), "r"(c0), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(void* dst, CUtensorMap const* map, int c0, int c1, int c2,
                                            std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];" ::"r"(smem_u32(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
}
// k-blocks rounded up to a whole ring slot (at most 4 k-blocks per slot): B's size.
__host__ __device__ constexpr int wgv_kb_pad(int nkb) { return (nkb + 3) / 4 * 4; }
// B's layout, R = 32 (kPair): a wgmma's 64 rows of A are a unit's 32 rows of two k-blocks (kb, kb + 1: the tiles lie
// one after the other), so B is m64n16: columns 0-3 the limbs of k-block kb, 8-11 those of kb + 1, at the same k-step;
// rows 0-31 of D use columns 0-3, rows 32-63 columns 8-11. R = 64: n8, columns 0-3. The byte of limb l, element k of
// k-step kk of k-block kb:
template <bool kPair>
__host__ __device__ constexpr int wgv_b_offset(int kb, int kk, int l, int k) {
  return kPair ? wgmma_b_offset(16, 4 * (kb >> 1) + kk, 8 * (kb & 1) + l, k) : wgmma_b_offset(8, 4 * kb + kk, l, k);
}
// Shared memory of the kernel, from a 1024-byte boundary: the ring, B (8 bytes per column, whole slots), the limbs'
// scales, the units' weight scales (a row of up to kWgvMaxKb per ring slot, 256 bytes apart), the units' log, 4 floats
// for the RMS sum, 2 × 32 for R = 32's row sums, the barriers.
struct WgvSmem {
  int ring, b, xsc, wsc, ulog, red, red2, bars, total;
};
__host__ __device__ constexpr WgvSmem wgv_smem(int cols, int stages) {
  WgvSmem s{};
  int const nkb = cols / 128;
  s.ring = 0;
  s.b = stages * kWgvStageBytes;
  s.wsc = s.b + 8 * 128 * wgv_kb_pad(nkb);  // 1024-byte multiple: the tensor copies' 128-byte alignment
  s.xsc = s.wsc + 256 * kWgvMaxStages;
  s.ulog = s.xsc + 4 * kWgvMaxKb;
  s.red = s.ulog + 4 * kWgvMaxStages;
  s.red2 = s.red + 4 * kWgvStageWarps;        // [2][32] floats: R = 32's row sums of warps 2-3, by unit parity
  s.bars = (s.red2 + 256 + 15) / 16 * 16;     // mbarriers: 8-byte aligned
  s.total = s.bars + 16 * kWgvMaxStages + 8;  // + the input's barrier
  return s;
}

// The staging warps (the consumer warpgroup and kWgvStagers more: kWgvStageWarps in all, staging warp sw) stage the
// input: x (and, for the RMSNorm prologue, the norm's weights) into registers, 4 elements per thread and k-block
// (staging warp sw takes k-blocks sw, sw + kWgvStageWarps, ...; lane l elements 4 l .. 4 l + 3 of each), then each
// k-block's kWgvLimbs E4M3 limbs of x · w into B. The RMS statistic's 1 / rms multiplies the outputs instead
// (W (x · w / rms) = (W (x · w)) / rms), so no barrier precedes the limbs: each warp's partial sum of squares goes to
// red[sw], read after the staging's barrier. xsc[kb] = the value of limb 0's unit (the k-block's 2^e); NaN when the
// k-block holds a NaN or an infinity. No staged copy of x: the limbs are built from registers. kJ: the most k-blocks
// per warp.
template <int kJ>
struct WgvInput {
  float4 v[kJ], w[kJ];
};
// Before the PDL wait: the RMSNorm's weights (a weight, like the matrix: no earlier kernel writes them); 1 otherwise.
template <int kJ>
__device__ __forceinline__ void wgv_load_norm(WgvInput<kJ>& in, InputPrologue const& p, int cols, int sw) {
  int const lane = int(threadIdx.x & 31), nkb = cols / 128;
  bool const norm = p.kind == PrologueKind::kRmsNorm;
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
    int const kb = sw + kWgvStageWarps * j, c = 128 * kb + 4 * lane;
    in.w[j] = kb < nkb && norm ? __ldg(reinterpret_cast<float4 const*>(p.norm_w + c)) : make_float4(1.f, 1.f, 1.f, 1.f);
  }
}
template <bool kPair, int kJ>
__device__ __forceinline__ void wgv_stage_input(unsigned char* B, float* xsc, float* red, float const* __restrict__ x,
                                                InputPrologue const& p, int cols, WgvInput<kJ>& in, int sw,
                                                unsigned long long* mark) {
  int const lane = int(threadIdx.x & 31), nkb = cols / 128;
  float4(&v)[kJ] = in.v;
  float4 const(&w)[kJ] = in.w;
#pragma unroll
  for (int j = 0; j < kJ; ++j) {  // every load first: one round trip
    int const kb = sw + kWgvStageWarps * j, c = 128 * kb + 4 * lane;
    v[j] = kb < nkb ? __ldg(reinterpret_cast<float4 const*>(x + c)) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (mark) {  // the time its first load is back (the asm takes the loaded value: it waits for it)
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "f"(v[0].x));
    *mark = t;
  }
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
    int const kb = sw + kWgvStageWarps * j;
    if (kb >= nkb) continue;
    float const e4[4] = {v[j].x * w[j].x, v[j].y * w[j].y, v[j].z * w[j].z, v[j].w * w[j].w};
    std::uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) m = max(m, __float_as_uint(fabsf(e4[i])));
    m = __reduce_max_sync(0xffffffffu, m);
    bool const finite = m < 0x7F800000u;
    // the k-block's largest · 2^-e in [128, 256) (an all-zero block: any e; subnormal maxima: the smallest)
    int const e = m == 0 ? 0 : max(int(m >> 23) - 134, -126);
    float const sc = __uint_as_float(std::uint32_t(127 - e) << 23);
    float2 r[2] = {make_float2(finite ? e4[0] * sc : 0.f, finite ? e4[1] * sc : 0.f),
                   make_float2(finite ? e4[2] * sc : 0.f, finite ? e4[3] * sc : 0.f)};
    std::uint32_t lw[kWgvLimbs] = {};
#pragma unroll
    for (int l = 0; l < kWgvLimbs; ++l)
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // two elements per conversion
        __nv_fp8x2_storage_t const c = __nv_cvt_float2_to_fp8x2(r[h], __NV_SATFINITE, __NV_E4M3);
        lw[l] |= std::uint32_t(c) << (16 * h);
        float2 const back = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(c, __NV_E4M3)));
        r[h] = make_float2((r[h].x - back.x) * 16.f, (r[h].y - back.y) * 16.f);
      }
    int const k = 4 * (lane & 7), s = lane >> 3;  // the k-step of the k-block and its row of the 4 elements
#pragma unroll
    for (int l = 0; l < kWgvLimbs; ++l) *reinterpret_cast<std::uint32_t*>(B + wgv_b_offset<kPair>(kb, s, l, k)) = lw[l];
    if (lane == 0) xsc[kb] = finite ? ldexpf(1.f, e) : __uint_as_float(0x7FC00000u);
  }
  if (p.kind == PrologueKind::kRmsNorm) {  // off the limbs' path
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < kJ; ++j)
      ss = fmaf(v[j].x, v[j].x, fmaf(v[j].y, v[j].y, fmaf(v[j].z, v[j].z, fmaf(v[j].w, v[j].w, ss))));
    ss = warp_sum(ss);
    if (lane == 0) red[sw] = ss;
  }
}

template <int R>
__global__ void __launch_bounds__(kWgvThreads, 1)
    matvec_wg_kernel(__grid_constant__ WgvArgs const a, float const* x, InputPrologue pro) {
  constexpr int kKbs = kWgvStageBytes / (R * 128);  // k-blocks per ring slot
  constexpr bool kPair = R == 32;                   // wgmma m64n16 over two k-blocks (wgv_b_offset)
  constexpr int kMma = kPair ? kKbs / 2 : kKbs;     // wgmma chains per slot
  constexpr int kAcc = kPair ? 8 : 4;               // accumulators per chain and thread
  extern __shared__ __align__(1024) unsigned char wgv_raw[];
  pdl_trigger();
  trace_mark(a.trace, 0);
  if (threadIdx.x == 0) wgv_dbg(a.dbg, 0, global_ns());
  unsigned char* const base = smem_align1024(wgv_raw);
  WgvSmem const L = wgv_smem(a.cols, a.stages);
  int const S = a.stages;
  unsigned char* const ring = base + L.ring;
  unsigned char* const B = base + L.b;
  float* const xsc = reinterpret_cast<float*>(base + L.xsc);
  float* const wsc = reinterpret_cast<float*>(base + L.wsc);  // [S][64]: a unit's weight scales
  int* const ulog = reinterpret_cast<int*>(base + L.ulog);    // [S]: the block's units, in order; -1 ends
  float* const red = reinterpret_cast<float*>(base + L.red);
  float* const red2 = reinterpret_cast<float*>(base + L.red2);
  auto* const full = reinterpret_cast<std::uint64_t*>(base + L.bars);
  std::uint64_t* const empty = full + kWgvMaxStages;
  std::uint64_t* const xbar = empty + kWgvMaxStages;
  int const warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), nkb = a.nkb;
  bool const dbg = a.dbg != nullptr;  // the measurement points' timers (probe only)
  int const units = a.unit_begin[a.count], spu = (nkb + kKbs - 1) / kKbs;  // ring slots per unit
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full + s, 1);
      mbar_init(empty + s, 4);  // the consumer warps
    }
    mbar_init(xbar, 1);  // the consumers' input loaded (thread 0)
    mbar_init_fence();
  }
  __syncthreads();
  auto unit_of = [&](int u, int& m, int& r0) {
    m = 0;
    while (m + 1 < a.count && u >= a.unit_begin[m + 1]) ++m;
    r0 = (u - a.unit_begin[m]) * R;
  };
  if (warp == 4) {  // the producer: weights only, so no PDL wait; it joins no barrier of the consumers'
    if (lane == 0) {
      wgv_dbg(a.dbg, 1, global_ns());
      // Units: the first is blockIdx.x, the others by claims on the launch's counter (tickets 0, 1, ... name units
      // gridDim.x, gridDim.x + 1, ...), each claimed when the unit before it starts, so that its answer is back by the
      // time it is needed (no instruction reads it before). Every block stops at its first failed claim: `units`
      // claims in all, and the block that drew the last one (ticket units - 1) puts the counter back to zero for the
      // next launch that takes it.
      int const grid = int(gridDim.x), dyn = units - grid;
      unsigned ticket = atomicAdd(a.ctr, 1u);  // the claim for the second unit
      int u = int(blockIdx.x), s = 0, ul = 0;  // ul: the unit's row of ulog and wsc
      unsigned q = 0, ph = 0;  // slots issued; the parity of the ring's round (empty waits from the second on)
      long long pwait = 0;
      for (;;) {
        int m = 0, r0 = 0;
        if (u >= 0) unit_of(u, m, r0);
        for (int j = 0; j < (u >= 0 ? spu : 1); ++j) {
          if (q >= unsigned(S)) {
            long long const t0 = dbg ? clock64() : 0;
            mbar_wait(empty + s, ph ^ 1u);
            if (dbg) pwait += clock64() - t0;
          }
          if (a.prefill < S && q == unsigned(a.prefill)) mbar_wait(xbar, 0u);
          if (j == 0) ulog[ul] = u;  // released to the consumers by the arrival below
          if (u < 0) {
            mbar_arrive(full + s);  // the end: no bytes
          } else {
            unsigned char* const dst = ring + std::size_t(s) * kWgvStageBytes;
            if (j == 0) {
              mbar_arrive_expect(full + s, unsigned(kWgvStageBytes + 4 * wgv_kb_pad(nkb)));
              tma_load_1d(wsc + ul * 64, &a.smap[m], (r0 / 128) * nkb, full + s);
            } else {
              mbar_arrive_expect(full + s, unsigned(kWgvStageBytes));
            }
            tma_load_3d(dst, &a.map[m], 0, r0, j * kKbs, full + s);
          }
          ++q;
          if (++s == S) s = 0, ph ^= 1u;
        }
        if (u < 0) break;
        if (++ul == S) ul = 0;
        if (ticket == unsigned(units - 1)) atomicExch(a.ctr, 0u);
        if (int(ticket) < dyn) {
          u = grid + int(ticket);
          ticket = atomicAdd(a.ctr, 1u);  // the next claim, answered while this unit streams
        } else {
          u = -1;
        }
      }
      wgv_dbg(a.dbg, 7, (unsigned long long)pwait);
    }
    trace_end(a.trace);
    return;
  }
  // the staging warps (the consumers and the stagers), before the PDL wait: B zeroed (the limbs fill their columns
  // after the wait), the norm's weights
  int const sw = warp < 4 ? warp : warp - 1, stid = 32 * sw + lane;  // staging warp, thread
  for (int i = stid; i < wgv_kb_pad(nkb) * 1024 / 16; i += 32 * kWgvStageWarps)
    reinterpret_cast<uint4*>(B)[i] = make_uint4(0u, 0u, 0u, 0u);
  WgvInput<(kWgvMaxKb + kWgvStageWarps - 1) / kWgvStageWarps> in;
  wgv_load_norm(in, pro, a.cols, sw);
  named_sync(2, 32 * kWgvStageWarps);  // the zeros before any thread's limbs
  pdl_wait();
  trace_mark(a.trace, 1);
  if (threadIdx.x == 0) wgv_dbg(a.dbg, 2, global_ns());
  unsigned long long* const xmark =
      dbg && threadIdx.x == 0 ? a.dbg + blockIdx.x * kWgvDbg + 4
      : a.mid == 1 && a.trace && threadIdx.x == 0 && trace_block() < unsigned(kTraceBlocks)
          ? a.trace + trace_block() * kTracePhases + 2
          : nullptr;
  wgv_stage_input<kPair>(B, xsc, red, x, pro, a.cols, in, sw, xmark);
  if (threadIdx.x == 0) wgv_dbg(a.dbg, 3, global_ns());
  if (a.mid == 2) trace_mark(a.trace, 2);
  if (!a.xbar_late && threadIdx.x == 0) mbar_arrive(xbar);  // the input is in: the producer requests the rest
  fence_proxy_async_smem();  // B's generic writes before the wgmmas read it (the async proxy)
  if (warp >= 5) {           // a stager: its limbs and partial sum are in; it leaves
    named_arrive(1, 32 * kWgvStageWarps);
    trace_end(a.trace);
    return;
  }
  if (threadIdx.x == 0) wgv_dbg(a.dbg, 10, global_ns());
  named_sync(1, 32 * kWgvStageWarps);
  if (a.xbar_late && threadIdx.x == 0) mbar_arrive(xbar);
  if (a.mid == 0) trace_mark(a.trace, 2);
  float inv = 1.f;  // 1 / rms, for the outputs
  if (pro.kind == PrologueKind::kRmsNorm) {
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < kWgvStageWarps; ++i) ss += red[i];
    inv = rsqrtf(ss / float(a.cols) + pro.eps);
  }
  if (threadIdx.x == 0) wgv_dbg(a.dbg, 11, global_ns());
  // the consumer warpgroup: per slot, the wgmmas of all its k-blocks (chains interleaved), then the slot before it
  // awaited and added up (the loop below). Its position by counters: the issue side (ring slot is, its parity iph,
  // slot ij of the block's unit iul) and the retire side one slot behind.
  int const one = nkb > 0 ? 1 : 0;  // a run-time 1 (wgmma's accumulate flag must not be a constant)
  int const t = lane & 3, g = lane >> 2;
  float const c0 = t == 0 ? 1.f : t == 1 ? 1.f / 256.f : 0.f;  // the limbs' weights, columns 2 t and 2 t + 1
  float const c1 = t == 0 ? 1.f / 16.f : t == 1 ? 1.f / 4096.f : 0.f;
  std::uint64_t const db0 = wgmma_desc_kmajor(B);
  constexpr int kWgvDepth = 2;  // slots whose wgmmas are in flight
  float acc[kWgvDepth][kMma][kAcc], fq[kWgvDepth][kKbs];
  float tot0 = 0.f, tot1 = 0.f;
  long long cwait = 0, gwait = 0;
  int is = 0, ij = 0, iul = 0, rs = 0, rj = 0, rul = 0, rpar = 0;  // iul, rul: rows of ulog and wsc
  unsigned iph = 0;
  bool first = true;
  auto issue = [&]<int p>(std::integral_constant<int, p>) -> bool {  // the next slot's wgmmas; false: no more units
    unsigned char const* const st = ring + std::size_t(is) * kWgvStageBytes;
    long long const t0 = dbg ? clock64() : 0;
    mbar_wait(full + is, iph);
    if (dbg) cwait += clock64() - t0;
    if (first && threadIdx.x == 0) wgv_dbg(a.dbg, 5, global_ns());
    first = false;
    if (ij == 0 && ulog[iul] < 0) return false;
    float const* const sc = wsc + iul * 64;
#pragma unroll
    for (int i = 0; i < kKbs; ++i) {
      int const kb = ij * kKbs + i;
      fq[p][i] = kb < nkb ? sc[kb] * xsc[kb] : 0.f;  // past nkb: 0 (B and the tile are zero there)
    }
    // the descriptors: the slot's and the k-blocks' bases once, then constant offsets (16-byte units of the address
    // field, which no offset here carries out of)
    std::uint64_t const da0 = wgmma_desc_sw128(st),
                        db1 = db0 + std::uint64_t(wgv_b_offset<kPair>(ij * kKbs, 0, 0, 0) >> 4);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int i = 0; i < kMma; ++i) {  // chain i: k-block (kPair ? 2 : 1) i of the slot
        std::uint64_t const da = da0 + std::uint64_t(((kPair ? 2 : 1) * i * R * 128 + kk * 32) >> 4);
        std::uint64_t const db = db1 + std::uint64_t(wgv_b_offset<kPair>((kPair ? 2 : 1) * i, kk, 0, 0) >> 4);
        if constexpr (kPair)
          wgmma_e4m3_ss_n16(acc[p][i], da, db, kk > 0 ? one : one - 1);
        else
          wgmma_e4m3_ss_n8(acc[p][i], da, db, kk > 0 ? one : one - 1);
      }
    wgmma_commit();
    if (++is == S) is = 0, iph ^= 1u;
    if (++ij == spu) ij = 0, iul = iul + 1 == S ? 0 : iul + 1;
    return true;
  };
  auto retire = [&]<int p>(std::integral_constant<int, p>) {  // the oldest slot in flight is done
    // kPair: warps 0-1 hold the chain's first k-block (columns 0-3: d[0-3]), warps 2-3 its second (columns 8-11:
    // d[4-7]), both for the unit's rows 16 (warp % 2) + g and + 8
    bool const hi = kPair && warp >= 2;
#pragma unroll
    for (int i = 0; i < kMma; ++i) {
      wgmma_fence_acc(acc[p][i]);
      float const(&d)[kAcc] = acc[p][i];
      float const d0 = hi ? d[kAcc - 4] : d[0], d1 = hi ? d[kAcc - 3] : d[1];  // selects: no indexing of registers
      float const d2 = hi ? d[kAcc - 2] : d[2], d3 = hi ? d[kAcc - 1] : d[3];
      float const f = kPair ? (hi ? fq[p][(2 * i + 1) % kKbs] : fq[p][2 * i]) : fq[p][i];
      tot0 = fmaf(fmaf(d0, c0, d1 * c1), f, tot0);
      tot1 = fmaf(fmaf(d2, c0, d3 * c1), f, tot1);
    }
    if (rj == spu - 1) {  // the unit's last slot: its rows (the unit's log entry outlives this slot's return)
      int m, r0;
      unit_of(ulog[rul], m, r0);
      float s0 = tot0 + __shfl_xor_sync(0xffffffffu, tot0, 1), s1 = tot1 + __shfl_xor_sync(0xffffffffu, tot1, 1);
      if constexpr (kPair) {  // warps 2-3's sums (the odd k-blocks) to warps 0-1, through shared memory
        float* const r2 = red2 + 32 * rpar;
        if (hi && t == 0) r2[16 * (warp - 2) + g] = s0, r2[16 * (warp - 2) + g + 8] = s1;
        named_sync(3, 128);
        if (!hi) s0 += r2[16 * warp + g], s1 += r2[16 * warp + g + 8];
      }
      if (t == 0 && warp < (kPair ? 2 : R / 16)) {
        int const ra = r0 + 16 * warp + g, rb = ra + 8;
        s0 *= inv, s1 *= inv;
        if (ra < a.rows[m]) a.out[m][ra] = a.residual[m] ? s0 + a.residual[m][ra] : s0;
        if (rb < a.rows[m]) a.out[m][rb] = a.residual[m] ? s1 + a.residual[m][rb] : s1;
      }
      tot0 = tot1 = 0.f;
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + rs);  // the producer may refill the slot
    if (++rs == S) rs = 0;
    if (++rj == spu) rj = 0, rul = rul + 1 == S ? 0 : rul + 1, rpar ^= 1;
  };
  // the next slot's wgmmas issued, then the one before it awaited and added up (two slots in flight). The block's end
  // is the producer's log entry -1, met at a unit's first slot.
  using P0 = std::integral_constant<int, 0>;
  using P1 = std::integral_constant<int, 1>;
  auto wait1 = [&] {
    long long const t0 = dbg ? clock64() : 0;
    wgmma_wait<1>();
    if (dbg) gwait += clock64() - t0;
  };
  issue(P0{});  // every block has a unit (the grid is at most the units)
  for (;;) {
    if (!issue(P1{})) {
      wgmma_wait<0>();
      retire(P0{});
      break;
    }
    wait1();
    retire(P0{});
    if (!issue(P0{})) {
      wgmma_wait<0>();
      retire(P1{});
      break;
    }
    wait1();
    retire(P1{});
  }
  if (threadIdx.x == 0) wgv_dbg(a.dbg, 9, (unsigned long long)gwait);
  if (threadIdx.x == 0) wgv_dbg(a.dbg, 6, (unsigned long long)cwait), wgv_dbg(a.dbg, 8, global_ns());
  trace_end(a.trace);
}

// ---- host side --------------------------------------------------------------------------------------------
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 const fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A tensor map over a byte matrix (FP8) of `rows` rows `ld` bytes apart, 3D: [128 bytes of a k-block, rows, nkb
// k-blocks], the k-block dimension with stride 128 inside the row stride (strides that do not nest: the driver accepts
// them, bench/probes/tma_box checks the bytes that land). Boxes of [128, R rows, kbs k-blocks] land as
// [k-block][row][128 bytes] with the 128-byte swizzle (wgmma_desc_sw128); rows and k-blocks past the matrix as zeros.
inline CUresult encode_kblock_map(CUtensorMap& map, void const* data, std::int64_t rows, std::int64_t ld, int nkb,
                                  int R, int kbs) {
  PFN_cuTensorMapEncodeTiled_v12000 const encode = tensor_map_encoder();
  if (!encode) return CUDA_ERROR_NOT_SUPPORTED;
  cuuint64_t const gd[3] = {128, cuuint64_t(rows), cuuint64_t(nkb)};
  cuuint64_t const gs[2] = {cuuint64_t(ld), 128};
  cuuint32_t const bd[3] = {128, cuuint32_t(R), cuuint32_t(kbs)};
  cuuint32_t const es[3] = {1, 1, 1};
  return encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(data), gd, gs, bd, es,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// A tensor map over n floats (16-byte aligned; n a multiple of 4), boxes of `box` floats (a multiple of 4, at most
// 256).
inline CUresult encode_float_map(CUtensorMap& map, float const* data, std::int64_t n, int box) {
  PFN_cuTensorMapEncodeTiled_v12000 const encode = tensor_map_encoder();
  if (!encode) return CUDA_ERROR_NOT_SUPPORTED;
  cuuint64_t const gd[1] = {cuuint64_t(n)};
  cuuint64_t const gs[1] = {cuuint64_t(4 * n)};  // no stride at rank 1, but the driver (580) refuses null
  cuuint32_t const bd[1] = {cuuint32_t(box)};
  cuuint32_t const es[1] = {1};
  return encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 1, const_cast<float*>(data), gd, gs, bd, es,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// The launches' claim counters (WgvArgs::ctr): zero at rest, each put back to zero by its launch's last claim. Taken
// round robin, so that launches that may overlap (PDL) never share one. One pool per translation unit (static: each
// unit's device image has its own; the launcher hands the kernel the address of the one it registered).
static __device__ unsigned wgv_counters[kWgvCounters];
inline unsigned* wgv_counter() {
  static unsigned* const pool = [] {
    void* p = nullptr;
    return cudaGetSymbolAddress(&p, wgv_counters) == cudaSuccess ? static_cast<unsigned*>(p) : nullptr;
  }();
  static std::atomic<unsigned> next{0};
  return pool ? pool + next.fetch_add(1u, std::memory_order_relaxed) % unsigned(kWgvCounters) : nullptr;
}

// Whether the wgmma matvec takes these matrices: FP8-block, a multiple of 512 columns (4 k-blocks: a unit's row of
// scales is whole 16-byte units and never runs past the scales; at 128 columns, with maps over 1 and 3 floats and boxes
// of 4, the scales' copy stopped the kernel with an illegal instruction, session 32), rows in place (ld = cols),
// 16-byte aligned data and scales.
template <class P>
inline bool matvec_wg_supported(MultiArgs const& a) {
  if constexpr (!std::is_same_v<P, quant::Fp8Block>) {
    return false;
  } else {
    if (a.count <= 0 || a.count > kMaxMultiMatrices || a.tokens != 1) return false;
    std::int64_t const cols = a.m[0].cols;
    if (cols <= 0 || cols % 512 != 0 || cols > kWgvMaxCols) return false;  // whole rows of scales in 16-byte units
    for (int i = 0; i < a.count; ++i)
      if (a.m[i].cols != cols || a.m[i].ld != cols || a.m[i].rows <= 0 || a.m[i].rows > (1 << 30) || !a.m[i].scales ||
          (reinterpret_cast<std::uintptr_t>(a.m[i].data) & 15) != 0 ||
          (reinterpret_cast<std::uintptr_t>(a.m[i].scales) & 15) != 0)
        return false;
    return true;
  }
}

// Units of R rows for the matrices of a: 64 or 32, whichever deals them to the SMs more evenly (64 on a tie: no rows
// read twice by the tensor core). The busiest SM's rows against the mean.
inline int matvec_wg_rows(MultiArgs const& a, int sms) {
  auto spread = [&](std::int64_t R) {
    std::int64_t units = 0, rows = 0;
    for (int i = 0; i < a.count; ++i) units += (a.m[i].rows + R - 1) / R, rows += a.m[i].rows;
    return double((units + sms - 1) / sms * R) * double(sms) / double(rows);
  };
  return spread(64) <= spread(32) * 1.01 ? 64 : 32;
}

// out_i = W_i · prologue(x) (+ residual_i) for the matrices of a (FP8-block): cudaErrorInvalidValue when the kernel
// does not take them (matvec_wg_supported) or a tensor map is refused; the caller then runs launch_matvec_args.
template <class P>
cudaError_t launch_matvec_wg_args(MultiArgs const& a, float const* x, InputPrologue const& pro, cudaStream_t stream,
                                  int rows_per_unit = 0, unsigned long long* dbg = nullptr) {
  if (!matvec_wg_supported<P>(a)) return cudaErrorInvalidValue;
  // the prologues it stages itself (wgv_stage_input), from 16-byte aligned vectors
  auto aligned = [](void const* q) { return (reinterpret_cast<std::uintptr_t>(q) & 15) == 0; };
  if (!aligned(x) || !(pro.kind == PrologueKind::kPlain || (pro.kind == PrologueKind::kRmsNorm && aligned(pro.norm_w))))
    return cudaErrorInvalidValue;
  if (!tensor_map_encoder()) return cudaErrorInvalidValue;
  int const sms = sm_count();
  // A/B measurements: LING_WGV_R (32 or 64) forces the unit where the caller does not, LING_WGV_PREFILL sets the slots
  // requested before the input (default: all), LING_WGV_STAGES the ring's slots (default: as many as fit),
  // LING_WGV_MID the trace's midpoint and LING_WGV_XBAR_LATE the release of the rest after the staging (WgvArgs)
  static int const env_r = env_int("LING_WGV_R", 0), env_pre = env_int("LING_WGV_PREFILL", -1),
                   env_stages = env_int("LING_WGV_STAGES", 0), env_mid = env_int("LING_WGV_MID", 0),
                   env_late = env_int("LING_WGV_XBAR_LATE", 0);
  static int const optin = current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  if (rows_per_unit == 0) rows_per_unit = env_r;
  int const R = rows_per_unit == 32 || rows_per_unit == 64 ? rows_per_unit : matvec_wg_rows(a, sms);
  int const kbs = kWgvStageBytes / (R * 128);
  WgvArgs w{};
  w.count = a.count;
  w.cols = int(a.m[0].cols);
  w.nkb = w.cols / 128;
  int const fixed = wgv_smem(w.cols, 0).total + 1024;  // + the 1024-byte alignment
  int const fit = std::min(kWgvMaxStages, (optin - fixed) / kWgvStageBytes);
  if (fit < 2) return cudaErrorInvalidValue;
  w.stages = env_stages >= 2 && env_stages <= fit ? env_stages : fit;
  w.prefill = env_pre >= 0 && env_pre < w.stages ? env_pre : w.stages;
  w.trace = a.trace;
  w.dbg = dbg;
  w.mid = env_mid;
  w.xbar_late = env_late;
  w.ctr = wgv_counter();
  if (!w.ctr) return cudaErrorInvalidValue;
  w.unit_begin[0] = 0;
  for (int i = 0; i < a.count; ++i) {
    MatrixArgs const& m = a.m[i];
    if (encode_kblock_map(w.map[i], m.data, m.rows, m.ld, w.nkb, R, kbs) != CUDA_SUCCESS) return cudaErrorInvalidValue;
    if (encode_float_map(w.smap[i], static_cast<float const*>(m.scales), P::scale_count(m.rows, m.cols),
                         wgv_kb_pad(w.nkb)) != CUDA_SUCCESS)
      return cudaErrorInvalidValue;
    w.out[i] = a.out[i];
    w.residual[i] = a.residual[i];
    w.rows[i] = std::int32_t(m.rows);
    w.unit_begin[i + 1] = w.unit_begin[i] + std::int32_t((m.rows + R - 1) / R);
  }
  std::size_t const smem = std::size_t(wgv_smem(w.cols, w.stages).total) + 1024;
  int const units = w.unit_begin[a.count];
  unsigned const blocks = unsigned(units < sms ? units : sms);
  auto kernel = R == 64 ? matvec_wg_kernel<64> : matvec_wg_kernel<32>;
  if (cudaError_t e = allow_dynamic_smem(kernel, smem); e != cudaSuccess) return e;
  return launch_ex(kernel, dim3(blocks), dim3(kWgvThreads), smem, stream, w, x, pro);
}

}  // namespace ling::cuda::kernels

namespace ling::cuda {

// Declared in linear.hpp.
template <quant::weight_policy P>
cudaError_t launch_matvec_multi_wg(std::span<DeviceMatrix<P> const* const> ws, float const* x, float* y,
                                   cudaStream_t stream, InputPrologue const& pro, float const* residual,
                                   int rows_per_unit) {
  bool ok = false;
  kernels::MultiArgs a = kernels::multi_args<P>(ws.data(), int(ws.size()), y, residual, ok);
  if (!ok) return cudaErrorInvalidValue;
  return kernels::launch_matvec_wg_args<P>(a, x, pro, stream, rows_per_unit);
}

}  // namespace ling::cuda
