#pragma once
// Tensor-core variant of mla_attend (mla.cuh) for Ling's MLA shape (H = 32 heads, r = 512, r + dr a multiple of 16
// and at most 576): per 32-token tile, scores S = Q̂ Cᵀ and the update O += P C run as bf16 mma.sync m16n8k16 with
// fp32 accumulation (Q̂ and P rounded to bf16; the cache is bf16 already), while the next tiles stream in with
// cp.async. Same split/combine contract as mla_attend_kernel. nvcc only.
#include <cstdint>

#include "ling/cuda/device_common.cuh"
#include "ling/cuda/mla.hpp"
#include "ling/cuda/model_ops.cuh"

namespace ling::cuda {

namespace mma_detail {
__device__ __forceinline__ unsigned smem_u32(void const* p) { return unsigned(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2_trans(unsigned addr, unsigned& r0, unsigned& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], unsigned const (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// {lo, hi} rounded to bf16 (RNE) in one register, lo in the low half, by one cvt.rn.bf16x2.f32 (which takes the high
// value first; a NaN becomes the canonical one)
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  unsigned d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
__device__ __forceinline__ void cp_async16(unsigned dst, void const* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }
}  // namespace mma_detail

inline constexpr int kMmaHeads = 32, kMmaRank = 512, kMmaTile = 32;

// ---- pipelined tensor-core attention (default) -----------------------------------------------------------------
// Restructured in session 12 for latency and shared-memory traffic (session 2's kernel took ~3 µs per 32-token tile:
// 27 µs per layer at context 4096 on 17 blocks, one tile in flight, Q̂ reloaded from shared memory four times per tile):
//  - kMlaStages tile buffers: tile it + kMlaStages − 1 is requested when tile it is about to be computed (one
//    cp.async group per tile, the ring buffer freed by the barrier at the top of the iteration), so ~110 KB per SM
//    are in flight instead of one 37 KB tile;
//  - scores split over the latent dimension: warp (kq, nh) holds Q̂'s A fragments of its quarter of the k-steps for
//    all 32 heads in registers (loaded once), and multiplies them with tokens [16 nh, 16 nh + 16) of the tile; the four
//    quarters' partial scores meet in shared memory. The old mapping (warp = 16 heads × 8 tokens over all of k)
//    reloaded Q̂ from shared memory four times per tile (147 of its ~260 KB of shared-memory reads per tile);
//  - the online softmax keeps each head's running max and sum in registers of the 8 lanes that own it (4 tokens
//    per lane, 3 shuffle rounds per reduction for 4 heads at once); only the rescale factors go through shared memory;
//  - splits of at least kMlaMmaMinChunk tokens, so short contexts use most SMs (the old minimum of 256 put a
//    context of 4096 on 17 blocks of 8 tiles each).
inline constexpr int kMlaStages = 4;
inline constexpr int kMlaKq = 9;        // k-steps (16 latent values) per quarter: latent ≤ 576
// the partial-score row stride (floats; float4 reads) for tiles_per_pass tiles: 36 for one, 68 for two
LING_HOST_DEVICE constexpr int mla_mma_sp(int tiles_per_pass) { return tiles_per_pass * kMmaTile + 4; }
inline constexpr int kMlaCopies = (kMmaTile * 4 * 16 * kMlaKq / 8 + 255) / 256;  // 16-byte copies per thread per tile

inline bool mla_mma_supported(MlaDims const& d) {
  return d.heads == kMmaHeads && d.rank == kMmaRank && d.latent() % 16 == 0 && d.latent() <= 4 * 16 * kMlaKq;
}

// Shared memory: Q̂ (bf16, read once into registers; its region then holds the partial scores), the tile ring, P and
// the rescale factors: 189.6 KB at Ling's shape. Kept under ~196 KB on purpose: a launch that needs more makes the SM
// take its largest shared-memory carveout, which measured +0.04 ms per token at context 0 (the partial scores in
// their own 18 KB region) through the launches that follow (docs/perf-log.md, sessions 10 and 12).
// Bytes of the first region: Q̂ in bf16 rows of Lp, then the four quarters' partial scores.
LING_HOST_DEVICE inline int mla_mma_q_bytes(int Lp, int tiles_per_pass = 1) {
  int const qb = 2 * kMmaHeads * Lp, sb = 4 * 4 * kMmaHeads * mla_mma_sp(tiles_per_pass);
  return qb > sb ? qb : sb;
}
inline std::size_t mla_mma_smem(MlaDims const& d, int tiles_per_pass = 1) {
  std::size_t const Lp = std::size_t(d.latent() + 8);
  return std::size_t(mla_mma_q_bytes(int(Lp), tiles_per_pass)) + 2 * std::size_t(kMlaStages) * kMmaTile * Lp +
         2 * kMmaHeads * (std::size_t(tiles_per_pass) * kMmaTile + 8) + 4 * kMmaHeads;
}

// Instructions per tile (session 12, cuobjdump, nvcc 13.0): the first version of this kernel had ~800 SASS
// instructions per warp per tile, ~370 of them in the tile copies (a division, a 64-bit clamp and 64-bit addresses per
// 16-byte copy), at 2 warps per scheduler, so it was latency- and issue-bound (~2 µs per tile). This one (~460 per
// tile; measured on the H200 on 2026-12-02: 3.060 against 3.134 ms/token at context 131072, 2.788 against 2.791 at
// 32768, equal at 4096):
//  - copies a whole tile from per-thread shared-memory offsets computed once and immediate source offsets;
//  - runs the score k-steps without a predicate (and its WARPSYNC per MMA) when the latent fills the 4 quarters;
//  - rounds Q̂ (once per block) and P to bf16 two values per instruction (cvt.rn.bf16x2.f32: the same RNE; a NaN
//    stays a NaN, in the canonical pattern).
// kSwz (the default when the latent is a multiple of 64; MlaDecodeArgs::kernel 2 forces the padded tiles): the cache tiles
// in rows of exactly L values, 16-byte chunk c of row t stored at chunk c ^ (t mod 8), instead of rows padded to L + 8
// values. The padding keeps ldmatrix free of bank conflicts but starts every odd row 16 bytes past a 32-byte boundary,
// so half of the tile copies (16-byte cp.async) straddle sectors; the XOR keeps the ldmatrix reads conflict-free (eight
// rows of one chunk column land in eight different 16-byte bank groups) with every row 128-byte aligned. Launch A's
// router-row copies made twice the L2 sectors at such an offset (ncu, docs/kernels.md, session 22). Measured in the
// model (H200, 2026-12-03, 5 reps, alternated with the padded tiles): 2.412 / 2.564 / 2.812 against 2.411 / 2.572 /
// 2.848 ms/token at contexts 4096 / 32768 / 131072.
// kDiag (measurements only, MlaDecodeArgs::diag, LING_MLA_DIAG in the model; the outputs are then wrong): 1 streams the
// tiles with the same copies, waits and barriers but computes nothing on them; 2 computes on every tile but copies
// only the first kMlaStages − 1 (later tiles reuse the buffers' contents). Which of the two sets a tile's ~2 µs.
// Measured (H200, 2026-12-03, ms/token at 4096 / 32768 / 131072): the default 2.350 / 2.504 / 2.749, copies only
// 2.400 / 2.490 / 2.681, math only 2.349 / 2.551 / 2.746: the math sets the time at long contexts, and the copies
// alone are only ~10 µs per layer faster at 131072.
// kTP (MlaDecodeArgs::kernel 4, LING_MLA_KERNEL=4; swizzled tiles only; not yet measured): two tiles per pass, so that
// each of a pass's three phases behind a barrier works on 64 tokens (twice the independent MMA chains in the scores,
// 8 tokens per lane in the softmax, 4 k-steps in P·C) and a token pays half the barriers and shuffle rounds. The price:
// the kMlaStages buffers hold the pass's two tiles and the next pass's two, so tiles are requested one pass ahead
// (all four before the first pass) instead of three tiles ahead, and a split's last pass may hold one tile.
// Measured (H200, 2026-12-03, 3 reps, alternated with kernel 3, two rounds): 2.308 / 2.350 / 2.505 / 2.733 against
// 2.306 / 2.354 / 2.505 / 2.755 ms/token at contexts 0 / 4096 / 32768 / 131072 (docs/perf-log.md, session 24).
// kQFirst (the automatic choice since session 24, MlaDecodeArgs::kernel 0 or 5; 6 = 4 with it): every Q̂ load of
// a thread (18 float4 at Ling's shape) is issued before the tile copies, and all at once. ncu of the default at context
// 32768 (session 23) put 17% of the kernel's stall samples on the first use of Q̂'s first batch of loads: three
// batches of 6, each requested after the ~110 KB of tile copies of the block's first three tiles, which an SM serves
// first (docs/perf-log.md, session 21: an SM's loads are served in the order it requests them). Measured (H200,
// 2026-12-03, 3 reps, alternated, two rounds, ms/token at contexts 0 / 4096 / 32768 / 131072): 2.302 / 2.341 / 2.495 /
// 2.741 against 2.306 / 2.354 / 2.505 / 2.755 for kernel 3; with two tiles per pass (kernel 6) 2.324 / 2.353 / 2.496 /
// 2.722: the fastest at 131072, the slowest at 0.
template <bool kSwz, int kDiag = 0, int kTP = 1, bool kQFirst = false>
__global__ void __launch_bounds__(256, 1) mla_attend_mma_kernel(MlaDecodeArgs a) {
  using namespace mma_detail;
  extern __shared__ __align__(16) unsigned char smraw[];
  int const L = a.d.latent(), Lp = L + 8, r = a.d.rank, KS = L / 16;
  int const Lc = kSwz ? L : Lp;  // the cache tiles' row pitch (values)
  constexpr int H = kMmaHeads, T = kMmaTile, NS = kMlaStages, KQ = kMlaKq;
  constexpr int PT = kTP * T, Sp = mla_mma_sp(kTP), Pp = PT + 8;  // tokens per pass, partial-score and P strides
  constexpr int TL = PT / 8;                                         // softmax: tokens per lane
  static_assert(kTP == 1 || kTP == 2, "one or two tiles per pass");
  int const qbytes = mla_mma_q_bytes(Lp, kTP);
  std::uint16_t* Qb = reinterpret_cast<std::uint16_t*>(smraw);         // [H][Lp] bf16, until the fragments are loaded
  float* Sf = reinterpret_cast<float*>(smraw);                          // then [4 quarters][H][Sp] partial scores
  std::uint16_t* Cb = reinterpret_cast<std::uint16_t*>(smraw + qbytes);  // [NS][T][Lc] bf16
  std::uint16_t* Pb = Cb + NS * T * Lc;                                 // [H][Pp] probabilities of a pass, bf16
  float* alpha = reinterpret_cast<float*>(Pb + H * Pp);                // [H] this tile's rescale factors
  int const tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tg = lane & 3;
  ops::pdl_trigger();
  ops::pdl_wait();
  std::int64_t const len = std::int64_t(*a.position) + 1;
  std::int64_t const chunk = mla_chunk(len, a.splits, a.min_chunk);
  std::int64_t const begin = std::int64_t(blockIdx.x) * chunk;
  if (begin >= len) return;
  std::int64_t const end = begin + chunk < len ? begin + chunk : len;
  int const ntiles = int((end - begin + T - 1) / T);
  int const vec = L / 8;
  // copy k of this thread is 16-byte piece tid + 256 k of a tile, whose shared-memory offset is the same in every
  // tile (computed once), and whose source is that piece of the tile's contiguous span of T · L values
  int soff[kMlaCopies];
  bool const kfull = KS == 4 * KQ;  // every warp has all KQ k-steps
#pragma unroll
  for (int k = 0; k < kMlaCopies; ++k) {
    int const i = tid + 256 * k, row = i / vec, v = i - row * vec;
    soff[k] = i < T * vec ? row * Lc + (kSwz ? v ^ (row & 7) : v) * 8 : -1;
  }
  auto load_tile = [&](int it) {  // uncommitted
    std::uint16_t* dst = Cb + (it % NS) * T * Lc;
    std::int64_t const t0 = begin + std::int64_t(it) * T;
    if (t0 + T <= end) {  // a whole tile (all but possibly a split's last)
      std::uint16_t const* src = a.cache + t0 * L + 8 * tid;
#pragma unroll
      for (int k = 0; k < kMlaCopies; ++k)
        if (soff[k] >= 0) cp_async16(smem_u32(dst + soff[k]), src + 2048 * k);
      return;
    }
    for (int i = tid; i < T * vec; i += 256) {
      int const row = i / vec, v = i - row * vec;
      std::int64_t const t = t0 + row < end ? t0 + row : end - 1;  // rows past the split: a valid row, masked by p = 0
      cp_async16(smem_u32(dst + row * Lc + (kSwz ? v ^ (row & 7) : v) * 8), a.cache + t * L + v * 8);
    }
  };
  float const scale = rsqrtf(float(a.d.qk()));
  float4 const* q4 = reinterpret_cast<float4 const*>(a.q_hat);
  int const n4 = H * L / 4, l4 = L / 4;
  constexpr int kQn = (kMmaHeads * 16 * 4 * kMlaKq / 4 + 255) / 256;  // Q̂'s float4 per thread at the largest latent
  float4 qv[kQFirst ? kQn : 1];
  if constexpr (kQFirst) {
#pragma unroll
    for (int k = 0; k < kQn; ++k) qv[k] = tid + k * 256 < n4 ? q4[tid + k * 256] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  auto put_q = [&](int i, float4 v) {  // float4 i of Q̂ · qk^-1/2 as bf16
    int const h = i / l4, c = (i - h * l4) * 4;
    *reinterpret_cast<uint2*>(Qb + h * Lp + c) =
        make_uint2(pack_bf16x2(v.x * scale, v.y * scale), pack_bf16x2(v.z * scale, v.w * scale));
  };
#pragma unroll
  for (int s = 0; s < (kTP == 1 ? NS - 1 : NS); ++s) {  // kTP = 2: every buffer before the first pass
    if (s < ntiles) load_tile(s);
    cp_commit();
  }
  if constexpr (kQFirst) {  // Q̂'s loads went out before the tile copies
#pragma unroll
    for (int k = 0; k < kQn; ++k)
      if (tid + k * 256 < n4) put_q(tid + k * 256, qv[k]);
  } else {  // float4 loads in batches of 6 per thread, after the tile copies
    constexpr int kB = 6;
    for (int i0 = tid; i0 < n4; i0 += kB * 256) {
      float4 v[kB];
#pragma unroll
      for (int k = 0; k < kB; ++k) v[k] = i0 + k * 256 < n4 ? q4[i0 + k * 256] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int k = 0; k < kB; ++k)
        if (i0 + k * 256 < n4) put_q(i0 + k * 256, v[k]);
    }
  }
  __syncthreads();
  // scores: warp -> latent quarter kq (k-steps [KQ kq, KQ kq + KQ) ∩ [0, KS)), tokens [16 nh, 16 nh + 16)
  int const kq = warp >> 1, nh = warp & 1;
  unsigned qf[2][KQ][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int k = 0; k < KQ; ++k) {
      int const ks = kq * KQ + k;
      if (ks < KS) {
        ldsm_x4(smem_u32(Qb + (m * 16 + (lane & 15)) * Lp + ks * 16 + (lane >> 4) * 8), qf[m][k]);
      } else {
        qf[m][k][0] = qf[m][k][1] = qf[m][k][2] = qf[m][k][3] = 0u;
      }
    }
  // softmax ownership: head sh = 4 warp + lane / 8, tokens TL (lane % 8) .. +TL−1 of each pass
  int const sh = warp * 4 + (lane >> 3), sj = (lane & 7) * TL;
  float m_run = -INFINITY, l_run = 0.f;
  float acc[2][8][4] = {};
  auto tile_of = [&](int it) { return static_cast<std::uint16_t const*>(Cb + (it % NS) * T * Lc); };
  auto pass_len = [&](int it) {  // valid tokens of the pass that starts at tile it (≤ PT)
    std::int64_t const t0 = begin + std::int64_t(it) * T;
    return int(end - t0 < PT ? end - t0 : PT);
  };
  // partial scores of quarter kq: c[u][m][nt] = Q̂[16 m .. +16) · C_u[16 nh + 8 nt .. +8)ᵀ over its k-steps -> Sf, for
  // the pass's tiles u < nt (tile u's tokens at columns T u ..)
  auto scores = [&](int it, int nt) {
    float c[kTP][2][2][4] = {};
    // ldmatrix x4: matrices 0, 1 = n-tile 0 (k low, k high), 2, 3 = n-tile 1
    // kSwz: the row's position mod 8 is lane & 7, and chunk 2 ks + hb sits at that XOR lane & 7
    int const hb = (lane >> 3) & 1;
    unsigned const roff = unsigned((nh * 16 + (lane >> 4) * 8 + (lane & 7)) * Lc + (kSwz ? 0 : hb * 8)) * 2u;
    unsigned ca[kTP];
#pragma unroll
    for (int u = 0; u < kTP; ++u) ca[u] = smem_u32(tile_of(it + u)) + roff;  // tile it + 1 read only when nt = 2
    auto kstep = [&](int u, int k) {
      unsigned b[4];
      if constexpr (kSwz)
        ldsm_x4(ca[u] + 16u * unsigned((2 * (kq * KQ + k) + hb) ^ (lane & 7)), b);
      else
        ldsm_x4(ca[u] + 32u * unsigned(kq * KQ + k), b);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        mma_bf16(c[u][m][0], qf[m][k], b[0], b[1]);
        mma_bf16(c[u][m][1], qf[m][k], b[2], b[3]);
      }
    };
    auto ksteps = [&](auto both) {  // both: the two tiles' k-steps interleaved (independent chains)
      constexpr int nu = decltype(both)::value ? 2 : 1;
      if (kfull) {
#pragma unroll
        for (int k = 0; k < KQ; ++k)
#pragma unroll
          for (int u = 0; u < nu; ++u) kstep(u, k);
      } else {
#pragma unroll
        for (int k = 0; k < KQ; ++k)
          if (kq * KQ + k < KS)
#pragma unroll
            for (int u = 0; u < nu; ++u) kstep(u, k);
      }
    };
    if (kTP == 2 && nt == 2)
      ksteps(std::integral_constant<bool, kTP == 2>{});
    else
      ksteps(std::false_type{});
    float* sq = Sf + kq * H * Sp;
#pragma unroll
    for (int u = 0; u < kTP; ++u)
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          int const h0 = m * 16 + g, tt = u * T + nh * 16 + j * 8 + tg * 2;
          *reinterpret_cast<float2*>(sq + h0 * Sp + tt) = make_float2(c[u][m][j][0], c[u][m][j][1]);
          *reinterpret_cast<float2*>(sq + (h0 + 8) * Sp + tt) = make_float2(c[u][m][j][2], c[u][m][j][3]);
        }
  };
  // online softmax of head sh over the pass that starts at tile it (the quarters summed in a fixed order): Sf -> Pb,
  // alpha
  auto softmax = [&](int it) {
    int const n = pass_len(it);
    float sv[TL];
#pragma unroll
    for (int v = 0; v < TL / 4; ++v) {
      float4 const p0 = *reinterpret_cast<float4 const*>(Sf + 0 * H * Sp + sh * Sp + sj + 4 * v);
      float4 const p1 = *reinterpret_cast<float4 const*>(Sf + 1 * H * Sp + sh * Sp + sj + 4 * v);
      float4 const p2 = *reinterpret_cast<float4 const*>(Sf + 2 * H * Sp + sh * Sp + sj + 4 * v);
      float4 const p3 = *reinterpret_cast<float4 const*>(Sf + 3 * H * Sp + sh * Sp + sj + 4 * v);
      sv[4 * v + 0] = ((p0.x + p1.x) + p2.x) + p3.x;
      sv[4 * v + 1] = ((p0.y + p1.y) + p2.y) + p3.y;
      sv[4 * v + 2] = ((p0.z + p1.z) + p2.z) + p3.z;
      sv[4 * v + 3] = ((p0.w + p1.w) + p2.w) + p3.w;
    }
    float s[TL], mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < TL; ++k) {
      s[k] = sj + k < n ? sv[k] : -INFINITY;
      mx = fmaxf(mx, s[k]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    float const mnew = fmaxf(m_run, mx);
    float p[TL], sum = 0.f;
#pragma unroll
    for (int k = 0; k < TL; ++k) {
      p[k] = sj + k < n ? __expf(s[k] - mnew) : 0.f;
      sum += p[k];
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    sum += __shfl_xor_sync(0xffffffffu, sum, 4);
    float const al = __expf(m_run - mnew);
    l_run = l_run * al + sum;
    m_run = mnew;
    if constexpr (TL == 4) {
      *reinterpret_cast<uint2*>(Pb + sh * Pp + sj) = make_uint2(pack_bf16x2(p[0], p[1]), pack_bf16x2(p[2], p[3]));
    } else {
      *reinterpret_cast<uint4*>(Pb + sh * Pp + sj) = make_uint4(pack_bf16x2(p[0], p[1]), pack_bf16x2(p[2], p[3]),
                                                                pack_bf16x2(p[4], p[5]), pack_bf16x2(p[6], p[7]));
    }
    if ((lane & 7) == 0) alpha[sh] = al;
  };
  // O += P C over the pass's tiles u < nt: warp -> latent columns [64 warp, 64 warp + 64) (8 n-tiles), both m-tiles
  auto pv = [&](int it, int nt) {
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      float const a0 = alpha[m * 16 + g], a1 = alpha[m * 16 + g + 8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        acc[m][j][0] *= a0;
        acc[m][j][1] *= a0;
        acc[m][j][2] *= a1;
        acc[m][j][3] *= a1;
      }
    }
#pragma unroll
    for (int k0 = 0; k0 < PT; k0 += 16) {
      if (k0 >= T && nt < 2) break;  // a split's last pass with one tile
      std::uint16_t const* Cc = tile_of(it + k0 / T);
      unsigned af[2][4];
#pragma unroll
      for (int m = 0; m < 2; ++m) ldsm_x4(smem_u32(Pb + (m * 16 + (lane & 15)) * Pp + k0 + (lane >> 4) * 8), af[m]);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        unsigned b0, b1;
        ldsm_x2_trans(smem_u32(Cc + (k0 % T + (lane & 15)) * Lc + (warp * 8 + (kSwz ? j ^ (lane & 7) : j)) * 8), b0, b1);
        mma_bf16(acc[0][j], af[0], b0, b1);
        mma_bf16(acc[1][j], af[1], b0, b1);
      }
    }
  };
  // three phases per tile, each behind a barrier (a software-pipelined order, tile it's P·C beside tile it + 1's
  // scores with two barriers per tile, measured slower: 228 registers, one tile fewer in flight; docs/kernels.md)
  for (int it = 0; it < ntiles; it += kTP) {
    int const nt = kTP == 2 && it + 1 < ntiles ? 2 : 1;  // tiles in this pass
    if constexpr (kTP == 1) {
      cp_wait<NS - 2>();  // tile it has landed (this thread's copies)
    } else if (it == 0) {
      cp_wait<NS - 2>();  // tiles 0 and 1 (of the four requested before the loop)
    } else {
      cp_wait<0>();  // tiles it and it + 1, requested at the top of the previous pass (the newest groups)
    }
    __syncthreads();  // everyone's copies; every warp is done with the previous pass, whose buffers are refilled now
                      // (and, before the first pass, with Q̂'s region, which the partial scores overwrite)
    if constexpr (kTP == 1) {
      if (kDiag != 2 && it + NS - 1 < ntiles) load_tile(it + NS - 1);
      cp_commit();
    } else if (it > 0) {  // the previous pass's buffers take tiles it + 2 and it + 3
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        if (kDiag != 2 && it + 2 + u < ntiles) load_tile(it + 2 + u);
        cp_commit();
      }
    }
    if constexpr (kDiag == 1) continue;
    scores(it, nt);
    __syncthreads();
    softmax(it);
    __syncthreads();
    pv(it, nt);
  }
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      int const h = m * 16 + g, col = (warp * 8 + j) * 8 + tg * 2;
      float* o0 = a.part_o + (std::int64_t(blockIdx.x) * H + h) * r + col;
      float* o1 = a.part_o + (std::int64_t(blockIdx.x) * H + h + 8) * r + col;
      *reinterpret_cast<float2*>(o0) = make_float2(acc[m][j][0], acc[m][j][1]);
      *reinterpret_cast<float2*>(o1) = make_float2(acc[m][j][2], acc[m][j][3]);
    }
  if ((lane & 7) == 0) {
    a.part_ml[(std::int64_t(blockIdx.x) * H + sh) * 2] = m_run;
    a.part_ml[(std::int64_t(blockIdx.x) * H + sh) * 2 + 1] = l_run;
  }
}

}  // namespace ling::cuda
