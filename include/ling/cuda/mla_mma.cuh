#pragma once
// Tensor-core variant of mla_attend (mla.cuh) for Ling's MLA shape (H = 32 heads, r = 512, r + dr a multiple of 16):
// per 32-token tile, scores S = Q̂ Cᵀ and the update O += P C run as bf16 mma.sync m16n8k16 with fp32 accumulation
// (Q̂ and P rounded to bf16; the cache is bf16 already); the next tile streams in with cp.async while this one is
// computed (two buffers). Same split/combine contract as mla_attend_kernel. nvcc only.
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
__device__ __forceinline__ void ldsm_x2(unsigned addr, unsigned& r0, unsigned& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2_trans(unsigned addr, unsigned& r0, unsigned& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], unsigned const (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void cp_async16(unsigned dst, void const* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }
}  // namespace mma_detail

inline constexpr int kMmaHeads = 32, kMmaRank = 512, kMmaTile = 32;

inline bool mla_mma_supported(MlaDims const& d) {
  return d.heads == kMmaHeads && d.rank == kMmaRank && d.latent() % 16 == 0;
}
inline std::size_t mla_mma_smem(MlaDims const& d) {
  std::size_t const Lp = std::size_t(d.latent() + 8);
  return 2 * (kMmaHeads * Lp + 2 * kMmaTile * Lp) + 4 * kMmaHeads * (kMmaTile + 1) + 2 * kMmaHeads * (kMmaTile + 8) +
         4 * 3 * kMmaHeads;
}

__global__ void __launch_bounds__(256, 1) mla_attend_mma_kernel(MlaDecodeArgs a) {
  using namespace mma_detail;
  extern __shared__ __align__(16) unsigned char smraw[];
  int const L = a.d.latent(), Lp = L + 8, r = a.d.rank;
  constexpr int H = kMmaHeads, T = kMmaTile, Sp = T + 1, Pp = T + 8;
  std::uint16_t* Qb = reinterpret_cast<std::uint16_t*>(smraw);  // [H][Lp] bf16
  std::uint16_t* Cb[2] = {Qb + H * Lp, Qb + H * Lp + T * Lp};   // [T][Lp] bf16, two buffers
  float* Sf = reinterpret_cast<float*>(Qb + H * Lp + 2 * T * Lp);  // [H][Sp] scores
  std::uint16_t* Pb = reinterpret_cast<std::uint16_t*>(Sf + H * Sp);  // [H][Pp] probabilities, bf16
  float* mrun = reinterpret_cast<float*>(Pb + H * Pp);
  float* lrun = mrun + H;
  float* alpha = lrun + H;
  int const tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tg = lane & 3;
  ops::pdl_trigger();
  ops::pdl_wait();
  std::int64_t const len = std::int64_t(*a.position) + 1;
  std::int64_t const chunk = mla_chunk(len, a.splits);
  std::int64_t const begin = std::int64_t(blockIdx.x) * chunk;
  if (begin >= len) return;
  std::int64_t const end = begin + chunk < len ? begin + chunk : len;
  int const vec = L / 8;
  auto load_tile = [&](std::uint16_t* dst, std::int64_t t0) {
    for (int i = tid; i < T * vec; i += 256) {
      int row = i / vec, v = i % vec;
      std::int64_t t = t0 + row < len ? t0 + row : len - 1;  // rows past the end: a valid row, masked by p = 0
      cp_async16(smem_u32(dst + row * Lp + v * 8), a.cache + t * L + v * 8);
    }
    cp_commit();
  };
  load_tile(Cb[0], begin);
  float const scale = rsqrtf(float(a.d.qk()));
#pragma unroll 8
  for (int i = tid; i < H * L; i += 256) Qb[(i / L) * Lp + i % L] = bf16_from_float(a.q_hat[i] * scale).bits;
  if (tid < H) {
    mrun[tid] = -INFINITY;
    lrun[tid] = 0.f;
  }
  float acc[2][8][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.f;
  int it = 0;
  for (std::int64_t t0 = begin; t0 < end; t0 += T, ++it) {
    std::uint16_t const* Cc = Cb[it & 1];
    int const n = int(end - t0 < T ? end - t0 : T);
    if (t0 + T < end) {
      load_tile(Cb[(it + 1) & 1], t0 + T);
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    {  // scores: warp -> m-tile (16 heads) warp>>2, n-tile (8 tokens) warp&3
      int const mt = warp >> 2, nt = warp & 3;
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      for (int k0 = 0; k0 < L; k0 += 16) {
        unsigned af[4], b0, b1;
        ldsm_x4(smem_u32(Qb + (mt * 16 + (lane & 15)) * Lp + k0 + (lane >> 4) * 8), af);
        ldsm_x2(smem_u32(Cc + (nt * 8 + (lane & 7)) * Lp + k0 + ((lane >> 3) & 1) * 8), b0, b1);
        mma_bf16(c, af, b0, b1);
      }
      int const h0 = mt * 16 + g, tt = nt * 8 + tg * 2;
      Sf[h0 * Sp + tt] = c[0];
      Sf[h0 * Sp + tt + 1] = c[1];
      Sf[(h0 + 8) * Sp + tt] = c[2];
      Sf[(h0 + 8) * Sp + tt + 1] = c[3];
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // online softmax: warp -> 4 heads, lane -> token
      int const h = warp * 4 + j;
      float const mold = mrun[h];
      float const s = lane < n ? Sf[h * Sp + lane] : -INFINITY;
      float const mnew = fmaxf(mold, dev::warp_max(s));
      float const p = lane < n ? __expf(s - mnew) : 0.f;
      float const sum = dev::warp_sum(p);
      Pb[h * Pp + lane] = bf16_from_float(p).bits;
      __syncwarp();  // every lane has read mrun[h] before lane 0 rewrites it (racecheck cannot see the shuffles' sync)
      if (lane == 0) {
        float const al = __expf(mold - mnew);
        alpha[h] = al;
        lrun[h] = lrun[h] * al + sum;
        mrun[h] = mnew;
      }
    }
    __syncthreads();
    {  // O += P C: warp -> latent columns [64 warp, 64 warp + 64) (8 n-tiles), both m-tiles
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
      for (int k0 = 0; k0 < T; k0 += 16) {
        unsigned af[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) ldsm_x4(smem_u32(Pb + (m * 16 + (lane & 15)) * Pp + k0 + (lane >> 4) * 8), af[m]);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          unsigned b0, b1;
          ldsm_x2_trans(smem_u32(Cc + (k0 + (lane & 15)) * Lp + (warp * 8 + j) * 8), b0, b1);
          mma_bf16(acc[0][j], af[0], b0, b1);
          mma_bf16(acc[1][j], af[1], b0, b1);
        }
      }
    }
    __syncthreads();  // this buffer is refilled two tiles later; Sf/Pb/alpha are rewritten next tile
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
  if (tid < H) {
    a.part_ml[(std::int64_t(blockIdx.x) * H + tid) * 2] = mrun[tid];
    a.part_ml[(std::int64_t(blockIdx.x) * H + tid) * 2 + 1] = lrun[tid];
  }
}

}  // namespace ling::cuda
