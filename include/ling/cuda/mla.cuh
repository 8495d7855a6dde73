#pragma once
// Gated MLA absorbed decode kernels (see mla.hpp). nvcc only.
//
// The two kv_b matvecs (q̂ = W_UKᵀ q_nope and O = W_UV o_lat) read kv_b 16 bytes per lane per row, as stored,
// with the weight loads issued before the PDL wait and every row of a thread in flight at once:
//  - mla_qhat_kernel: block (head, 8 chunks of columns); a thread owns one 16-byte column chunk and a stride-32 set
//    of the head's nope rows, accumulates the chunk's kElems columns, then a warp shuffle + shared-memory sum over
//    the row groups. Extra blocks write the new cache row and the roped q_rope part (in parallel with the matvec).
//  - mla_uv_fast_kernel: a warp owns 4 rows of one head; lane keeps its o_lat chunk(s) in registers for all 4 rows.
// Shapes whose rows are not whole 16-byte chunks take the element-wise kernels (mla_prepare_kernel, mla_uv_kernel).
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "ling/cuda/async_copy.cuh"
#include "ling/cuda/mla.hpp"
#include "ling/cuda/mla_mma.cuh"
#include "ling/cuda/model_ops.cuh"

namespace ling::cuda {

// Interleaved RoPE angle of pair j at position pos as the CPU reference forms it (fp32 inv_freq and product), its
// cos / sin in double, rounded to float.
__device__ inline float2 rope_cs(std::int64_t pos, int j, int dim, double theta) {
  float inv_freq = 1.0f / powf(float(theta), float(2 * j) / float(dim));
  float angle = float(pos) * inv_freq;
  return make_float2(float(cos(double(angle))), float(sin(double(angle))));
}
__device__ __forceinline__ void rope_rotate(float& x0, float& x1, float2 cs) {
  float a = x0, b = x1;
  x0 = a * cs.x - b * cs.y;
  x1 = a * cs.y + b * cs.x;
}
__device__ inline void rope_pair(float& x0, float& x1, std::int64_t pos, int j, int dim, double theta) {
  rope_rotate(x0, x1, rope_cs(pos, j, dim, theta));
}
// MlaDecodeArgs::rope_cs: rope_cs of every position below kMlaShortMaxLen and pair ([kMlaShortMaxLen, rope / 2] (cos,
// sin) pairs; the same function, so the same values as computed in place).
__global__ void mla_rope_table_kernel(float2* out, MlaDims d) {
  int const n = d.rope / 2, i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < kMlaShortMaxLen * n) out[i] = rope_cs(i / n, i % n, d.rope, d.rope_theta);
}
// Fills `out` (kMlaShortMaxLen · rope floats, 8-byte aligned) on `st`.
inline void mla_rope_table(float* out, MlaDims const& d, cudaStream_t st) {
  int const n = kMlaShortMaxLen * (d.rope / 2);
  if (n <= 0 || !d.use_rope) return;
  ops::launch(mla_rope_table_kernel, unsigned((n + 127) / 128), 128, 0, st, reinterpret_cast<float2*>(out), d);
  check_launch("mla_rope_table");
}

// 16 bytes of kv_b storage -> kElems fp32 values (unscaled) and the scale of (row r, chunk c) of a [rows, cols] matrix.
template <MatFormat F> struct MlaChunk;
template <> struct MlaChunk<MatFormat::kF32> {
  static constexpr int kElems = 4;
  __device__ static void decode(uint4 v, float* f) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
  __device__ static float scale(void const*, std::int64_t, std::int64_t, std::int64_t) { return 1.f; }
};
template <> struct MlaChunk<MatFormat::kBf16> {
  static constexpr int kElems = 8;
  __device__ static void decode(uint4 v, float* f) {
    std::uint32_t const u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(u[i] << 16);
      f[2 * i + 1] = __uint_as_float(u[i] & 0xFFFF0000u);
    }
  }
  __device__ static float scale(void const*, std::int64_t, std::int64_t, std::int64_t) { return 1.f; }
};
template <> struct MlaChunk<MatFormat::kFp8Block> {
  static constexpr int kElems = 16;
  __device__ static void decode(uint4 v, float* f) {
    dev::e4m3x4_to_float(v.x, f);
    dev::e4m3x4_to_float(v.y, f + 4);
    dev::e4m3x4_to_float(v.z, f + 8);
    dev::e4m3x4_to_float(v.w, f + 12);
  }
  // scale block (r/128, col/128) with col = 16c
  __device__ static float scale(void const* s, std::int64_t cols, std::int64_t r, std::int64_t c) {
    return static_cast<float const*>(s)[(r >> 7) * ((cols + 127) >> 7) + (c >> 3)];
  }
};
template <> struct MlaChunk<MatFormat::kFp8Row> {
  static constexpr int kElems = 16;
  __device__ static void decode(uint4 v, float* f) { MlaChunk<MatFormat::kFp8Block>::decode(v, f); }
  __device__ static float scale(void const* s, std::int64_t, std::int64_t r, std::int64_t) { return static_cast<float const*>(s)[r]; }
};
template <> struct MlaChunk<MatFormat::kMxfp4> {
  static constexpr int kElems = 32;  // 16 bytes = one UE8M0 scale block
  __device__ static void decode(uint4 v, float* f) {
    dev::e2m1x8_to_float_scaled(v.x, f);
    dev::e2m1x8_to_float_scaled(v.y, f + 8);
    dev::e2m1x8_to_float_scaled(v.z, f + 16);
    dev::e2m1x8_to_float_scaled(v.w, f + 24);
  }
  __device__ static float scale(void const* s, std::int64_t cols, std::int64_t r, std::int64_t c) {
    return dev::ue8m0_to_float(static_cast<std::uint8_t const*>(s)[r * (cols >> 5) + c]) * dev::kE2m1HalfFactor;
  }
};

// Values per 16 bytes of kv_b storage (MlaChunk<F>::kElems), 0 for a format without a chunk decoder.
inline int mla_chunk_elems(MatFormat f) {
  switch (f) {
    case MatFormat::kF32:
      return 4;
    case MatFormat::kBf16:
      return 8;
    case MatFormat::kFp8Block:
    case MatFormat::kFp8Row:
      return 16;
    case MatFormat::kMxfp4:
      return 32;
  }
  return 0;
}
// The fast kv_b paths need rows of whole 16-byte chunks (kv_b.cols == rank) at a 16-byte aligned base.
inline bool mla_kvb_vectorizable(MlaDecodeArgs const& a) {
  int const e = mla_chunk_elems(a.kv_b.format);
  return e > 0 && a.kv_b.cols == a.d.rank && a.d.rank % e == 0 && reinterpret_cast<std::uintptr_t>(a.kv_b.data) % 16 == 0;
}

inline constexpr int kQhatThreads = 256;
inline constexpr int kQhatChunks = 8;                              // 16-byte column chunks per block
inline constexpr int kQhatRowLanes = kQhatThreads / kQhatChunks;  // row groups (32: a warp spans 4)
inline constexpr int kQhatRowsInFlight = 4;                        // rows per thread per batch: 128 rows of the head
static_assert(kQhatChunks == 8 && kQhatRowLanes % 32 == 0, "the shuffle reduction assumes 8 chunks across a warp");

// The new cache row [RMSNorm(c) | RoPE(k_rope)] (one block).
__device__ inline void mla_write_cache_row(MlaDecodeArgs const& a, std::int64_t t, float* scratch) {
  MlaDims const d = a.d;
  int const tid = threadIdx.x, L = d.latent();
  float ss = 0.f;
  for (int i = tid; i < d.rank; i += blockDim.x) ss += a.kv_a[i] * a.kv_a[i];
  float inv = rsqrtf(dev::block_sum(ss, scratch) / float(d.rank) + d.eps);
  std::uint16_t* row = a.cache + t * L;
  for (int i = tid; i < d.rank; i += blockDim.x) row[i] = bf16_from_float(a.kv_norm[i] * (a.kv_a[i] * inv)).bits;
  if (d.use_rope) {
    for (int j = tid; j < d.rope / 2; j += blockDim.x) {
      float x0 = a.kv_a[d.rank + 2 * j], x1 = a.kv_a[d.rank + 2 * j + 1];
      rope_pair(x0, x1, t, j, d.rope, d.rope_theta);
      row[d.rank + 2 * j] = bf16_from_float(x0).bits;
      row[d.rank + 2 * j + 1] = bf16_from_float(x1).bits;
    }
  } else {
    for (int j = tid; j < d.rope; j += blockDim.x) row[d.rank + j] = bf16_from_float(a.kv_a[d.rank + j]).bits;
  }
}

inline int mla_qhat_col_blocks(MlaDims const& d, int elems) { return (d.rank / elems + kQhatChunks - 1) / kQhatChunks; }
inline int mla_qhat_rope_blocks(MlaDims const& d) {
  std::int64_t const items = std::int64_t(d.heads) * (d.use_rope ? d.rope / 2 : d.rope);
  return int((items + kQhatThreads - 1) / kQhatThreads);
}

// Blocks [0, H·col_blocks): q̂_h over one column range; block H·col_blocks: the cache row; the rest: q_rope of all heads.
template <MatFormat F>
__global__ void __launch_bounds__(kQhatThreads) mla_qhat_kernel(MlaDecodeArgs a, int col_blocks) {
  using D = MlaChunk<F>;
  constexpr int E = D::kElems;
  __shared__ __align__(16) float red[kQhatThreads / 32][kQhatChunks * E];
  __shared__ float scratch[32];
  MlaDims const d = a.d;
  int const tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int const L = d.latent();
  int const nq = d.heads * col_blocks;
  int const b = int(blockIdx.x);
  ops::pdl_trigger();
  if (b >= nq) {
    ops::pdl_wait();
    std::int64_t const t = *a.position;
    if (b == nq) {
      mla_write_cache_row(a, t, scratch);
      return;
    }
    int const per = d.use_rope ? d.rope / 2 : d.rope;
    std::int64_t const it = std::int64_t(b - nq - 1) * kQhatThreads + tid;
    if (per == 0 || it >= std::int64_t(d.heads) * per) return;
    int const h = int(it / per), j = int(it % per);
    float const* qh = a.q + std::int64_t(h) * d.qk() + d.nope;
    float* dst = a.q_hat + std::int64_t(h) * L + d.rank;
    if (d.use_rope) {
      float x0 = qh[2 * j], x1 = qh[2 * j + 1];
      rope_pair(x0, x1, t, j, d.rope, d.rope_theta);
      dst[2 * j] = x0;
      dst[2 * j + 1] = x1;
    } else {
      dst[j] = qh[j];
    }
    return;
  }
  int const h = b / col_blocks, cb = b % col_blocks;
  int const ch = tid % kQhatChunks, rg = tid / kQhatChunks;
  int const nchunks = d.rank / E;
  std::int64_t const chunk = std::int64_t(cb) * kQhatChunks + ch;
  bool const cok = chunk < nchunks;
  std::int64_t const rb = std::int64_t(nchunks) * 16;  // bytes per kv_b row
  std::int64_t const row0 = std::int64_t(h) * (d.nope + d.v);
  char const* wbase = static_cast<char const*>(a.kv_b.data) + row0 * rb + chunk * 16;
  float const* qh = a.q + std::int64_t(h) * d.qk();
  uint4 w[kQhatRowsInFlight];
  float sc[kQhatRowsInFlight];
  auto load = [&](int i0) {
#pragma unroll
    for (int m = 0; m < kQhatRowsInFlight; ++m) {
      int const i = i0 + rg + kQhatRowLanes * m;
      bool const ok = cok && i < d.nope;
      w[m] = ok ? ops::load_stream(wbase + std::int64_t(i) * rb) : make_uint4(0u, 0u, 0u, 0u);
      sc[m] = ok ? D::scale(a.kv_b.scales, a.kv_b.cols, row0 + i, chunk) : 0.f;
    }
  };
  load(0);  // weights: before the wait
  ops::pdl_wait();
  float acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  for (int i0 = 0; i0 < d.nope; i0 += kQhatRowLanes * kQhatRowsInFlight) {
    if (i0 > 0) load(i0);
    float qs[kQhatRowsInFlight];
#pragma unroll
    for (int m = 0; m < kQhatRowsInFlight; ++m) {
      int const i = i0 + rg + kQhatRowLanes * m;
      qs[m] = i < d.nope ? qh[i] * sc[m] : 0.f;  // sc = 0 outside the matrix
    }
#pragma unroll
    for (int m = 0; m < kQhatRowsInFlight; ++m) {
      float f[E];
      D::decode(w[m], f);
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] += f[e] * qs[m];
    }
  }
  // Sum the 4 row groups of the warp (lane bits 3 and 4), then the warps through shared memory.
#pragma unroll
  for (int e = 0; e < E; ++e) {
    acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], 8);
    acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], 16);
  }
  if (lane < kQhatChunks) {  // ch == lane
#pragma unroll
    for (int e = 0; e < E; e += 4)
      *reinterpret_cast<float4*>(&red[warp][ch * E + e]) = make_float4(acc[e], acc[e + 1], acc[e + 2], acc[e + 3]);
  }
  __syncthreads();
  for (int ci = tid; ci < kQhatChunks * E; ci += kQhatThreads) {
    std::int64_t const col = std::int64_t(cb) * kQhatChunks * E + ci;
    if (col < d.rank) {
      float sum = 0.f;
#pragma unroll
      for (int wi = 0; wi < kQhatThreads / 32; ++wi) sum += red[wi][ci];
      a.q_hat[std::int64_t(h) * L + col] = sum;
    }
  }
}

template <MatFormat F>
__global__ void __launch_bounds__(128) mla_prepare_kernel(MlaDecodeArgs a) {
  __shared__ float scratch[32];
  MlaDims const d = a.d;
  int const h = blockIdx.x, chunk = blockIdx.y, tid = threadIdx.x;
  int const L = d.latent(), qk = d.qk(), rowstride = d.nope + d.v;
  ops::pdl_trigger();
  ops::pdl_wait();
  std::int64_t const t = *a.position;
  float const* qh = a.q + std::int64_t(h) * qk;
  int const col = chunk * 128 + tid;
  if (col < d.rank) {  // q̂_h[col] = Σ_d W_kvb[h(dn+dv)+d, col] q_nope[d]
    float acc = 0.f;
#pragma unroll 8
    for (int i = 0; i < d.nope; ++i)
      acc += ops::Fmt<F>::at(a.kv_b.data, a.kv_b.scales, a.kv_b.rows, a.kv_b.cols, std::int64_t(h) * rowstride + i, col) * qh[i];
    a.q_hat[std::int64_t(h) * L + col] = acc;
  }
  if (chunk == 0) {
    float* dst = a.q_hat + std::int64_t(h) * L + d.rank;
    if (d.use_rope) {
      for (int j = tid; j < d.rope / 2; j += blockDim.x) {
        float x0 = qh[d.nope + 2 * j], x1 = qh[d.nope + 2 * j + 1];
        rope_pair(x0, x1, t, j, d.rope, d.rope_theta);
        dst[2 * j] = x0;
        dst[2 * j + 1] = x1;
      }
    } else {
      for (int j = tid; j < d.rope; j += blockDim.x) dst[j] = qh[d.nope + j];
    }
  }
  if (h == 0 && chunk == 0) mla_write_cache_row(a, t, scratch);
}


// Split s of the context, all heads. Thread (hg, cg) accumulates heads [hg·HPT, +HPT) × latent columns [4cg, 4cg+4).
template <int HPT>
__global__ void mla_attend_kernel(MlaDecodeArgs a) {
  extern __shared__ __align__(16) unsigned char smraw[];
  MlaDims const d = a.d;
  int const H = d.heads, L = d.latent(), Lp = L + 8, r = d.rank;
  float* Qs = reinterpret_cast<float*>(smraw);                        // [H][L]
  std::uint16_t* Cs = reinterpret_cast<std::uint16_t*>(Qs + H * L);  // [Tile][Lp]
  float* Ps = reinterpret_cast<float*>(Cs + kMlaTile * Lp);           // [Tile][H]
  float* mrun = Ps + kMlaTile * H;                                    // [H]
  float* lrun = mrun + H;
  float* alpha = lrun + H;
  int const tid = threadIdx.x, nthreads = blockDim.x;
  ops::pdl_trigger();
  ops::pdl_wait();
  std::int64_t const len = std::int64_t(*a.position) + 1;
  std::int64_t const chunk = mla_chunk(len, a.splits, a.min_chunk);
  std::int64_t const begin = std::int64_t(blockIdx.x) * chunk;
  if (begin >= len) return;
  std::int64_t const end = begin + chunk < len ? begin + chunk : len;
  float const scale = rsqrtf(float(d.qk()));
#pragma unroll 8
  for (int i = tid; i < H * L; i += nthreads) Qs[i] = a.q_hat[i] * scale;
  for (int h = tid; h < H; h += nthreads) {
    mrun[h] = -INFINITY;
    lrun[h] = 0.f;
  }
  int const ncg = r / 4;
  int const cg = tid % ncg, hg = tid / ncg;
  bool const active = hg < H / HPT;
  float acc[HPT][4];
#pragma unroll
  for (int i = 0; i < HPT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
  int const vec_per_row = L / 8;
  for (std::int64_t t0 = begin; t0 < end; t0 += kMlaTile) {
    int const n = int(end - t0 < kMlaTile ? end - t0 : kMlaTile);
    __syncthreads();  // previous tile fully consumed (and Qs/mrun ready on the first pass)
#pragma unroll 4
    for (int i = tid; i < n * vec_per_row; i += nthreads) {
      int row = i / vec_per_row, v = i % vec_per_row;
      uint4 val = ops::load_stream(a.cache + (t0 + row) * L + v * 8);
      *reinterpret_cast<uint4*>(Cs + row * Lp + v * 8) = val;
    }
    __syncthreads();
    // Scores: lane = token of the tile, each warp 4 heads at a time; one 16-byte read of the cache row serves 4 heads.
    {
      int const lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
      int const tt = lane;
      std::uint16_t const* c = Cs + tt * Lp;
      for (int h0 = warp * 4; h0 < H; h0 += nwarps * 4) {
        float s4[4] = {0.f, 0.f, 0.f, 0.f};
        if (tt < n) {
#pragma unroll 2
          for (int v = 0; v < vec_per_row; ++v) {
            uint4 cv = *reinterpret_cast<uint4 const*>(c + v * 8);
            float cf[8] = {__uint_as_float(cv.x << 16), __uint_as_float(cv.x & 0xFFFF0000u), __uint_as_float(cv.y << 16),
                           __uint_as_float(cv.y & 0xFFFF0000u), __uint_as_float(cv.z << 16), __uint_as_float(cv.z & 0xFFFF0000u),
                           __uint_as_float(cv.w << 16), __uint_as_float(cv.w & 0xFFFF0000u)};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              if (h0 + j < H) {
                float const* q = Qs + (h0 + j) * L + v * 8;
                float4 qa = *reinterpret_cast<float4 const*>(q);
                float4 qb = *reinterpret_cast<float4 const*>(q + 4);
                s4[j] += cf[0] * qa.x + cf[1] * qa.y + cf[2] * qa.z + cf[3] * qa.w + cf[4] * qb.x + cf[5] * qb.y +
                         cf[6] * qb.z + cf[7] * qb.w;
              }
            }
          }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (h0 + j < H) Ps[tt * H + h0 + j] = tt < n ? s4[j] : -INFINITY;
      }
    }
    __syncthreads();
    for (int h = tid; h < H; h += nthreads) {
      float mt = -INFINITY;
      for (int tt = 0; tt < n; ++tt) mt = fmaxf(mt, Ps[tt * H + h]);
      float mnew = fmaxf(mrun[h], mt);
      float al = __expf(mrun[h] - mnew);
      float sum = 0.f;
      for (int tt = 0; tt < n; ++tt) {
        float p = __expf(Ps[tt * H + h] - mnew);
        Ps[tt * H + h] = p;
        sum += p;
      }
      lrun[h] = lrun[h] * al + sum;
      mrun[h] = mnew;
      alpha[h] = al;
    }
    __syncthreads();
    if (active) {
#pragma unroll
      for (int i = 0; i < HPT; ++i) {
        float al = alpha[hg * HPT + i];
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] *= al;
      }
      for (int tt = 0; tt < n; ++tt) {
        uint2 cv = *reinterpret_cast<uint2 const*>(Cs + tt * Lp + 4 * cg);
        float c0 = __uint_as_float(cv.x << 16), c1 = __uint_as_float(cv.x & 0xFFFF0000u);
        float c2 = __uint_as_float(cv.y << 16), c3 = __uint_as_float(cv.y & 0xFFFF0000u);
        float const* p = Ps + tt * H + hg * HPT;
#pragma unroll
        for (int i = 0; i < HPT; ++i) {
          float pi = p[i];
          acc[i][0] += pi * c0;
          acc[i][1] += pi * c1;
          acc[i][2] += pi * c2;
          acc[i][3] += pi * c3;
        }
      }
    }
  }
  __syncthreads();
  if (active) {
#pragma unroll
    for (int i = 0; i < HPT; ++i) {
      float4 o = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
      *reinterpret_cast<float4*>(a.part_o + (std::int64_t(blockIdx.x) * H + hg * HPT + i) * r + 4 * cg) = o;
    }
  }
  for (int h = tid; h < H; h += nthreads) {
    a.part_ml[(std::int64_t(blockIdx.x) * H + h) * 2] = mrun[h];
    a.part_ml[(std::int64_t(blockIdx.x) * H + h) * 2 + 1] = lrun[h];
  }
}

// The combine's split weights for head h (after the PDL wait): ws[s] = exp(m_s − m) for the `used` splits, m their
// largest running max, in shared memory; returns the denominator Σ ws[s] · l_s to every thread of the block (whose
// barriers also publish ws).
__device__ inline float mla_combine_weights(MlaDecodeArgs const& a, int h, float* ws, float* scratch, int& used) {
  int const tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, H = a.d.heads;
  std::int64_t const len = std::int64_t(*a.position) + 1;
  std::int64_t const chunk = mla_chunk(len, a.splits, a.min_chunk);
  used = int((len + chunk - 1) / chunk);
  float m = -INFINITY;
  for (int s = tid; s < used; s += blockDim.x) m = fmaxf(m, a.part_ml[(std::int64_t(s) * H + h) * 2]);
  m = dev::warp_max(m);
  if (lane == 0) scratch[warp] = m;
  __syncthreads();
  m = scratch[0];
  for (int w = 1; w < int(blockDim.x >> 5); ++w) m = fmaxf(m, scratch[w]);
  float den = 0.f;
  for (int s = tid; s < used; s += blockDim.x) {
    float const w = __expf(a.part_ml[(std::int64_t(s) * H + h) * 2] - m);
    ws[s] = w;
    den += w * a.part_ml[(std::int64_t(s) * H + h) * 2 + 1];
  }
  return dev::block_sum(den, scratch);
}

// Block (head, 128 columns): the split weights exp(m_s − m) and the denominator once per block (shared memory), then
// each column is one pass of independent loads over the splits. Dynamic shared memory: `splits` floats.
__global__ void __launch_bounds__(128) mla_combine_kernel(MlaDecodeArgs a) {
  extern __shared__ float ws[];
  __shared__ float scratch[32];
  int const h = blockIdx.x, col = blockIdx.y * 128 + threadIdx.x;
  int const H = a.d.heads, r = a.d.rank;
  ops::pdl_trigger();
  ops::pdl_wait();
  int used = 0;
  float const den = mla_combine_weights(a, h, ws, scratch, used);
  if (col >= r) return;
  float const* po = a.part_o + std::int64_t(h) * r + col;
  std::int64_t const stride = std::int64_t(H) * r;
  float num = 0.f;
#pragma unroll 16
  for (int s = 0; s < used; ++s) num += ws[s] * po[s * stride];
  a.o_lat[std::int64_t(h) * r + col] = num / den;
}

// The same combine with the splits' partial outputs read in one round trip (the automatic choice since session 24;
// MlaDecodeArgs::combine 1 forces mla_combine_kernel). mla_combine_kernel gives each column one thread, which reads the `used` splits'
// values in batches of 16 dependent on nothing but issued batch after batch: at 132 splits ~9 L2 round trips, with
// 128 blocks of 4 warps (2 MB in flight for 8.65 MB of partial outputs at Ling's shape). Here a block takes 32 columns
// of one head: thread (g, q) reads float4 q of the columns from splits g, g + 32, ... (≤ 5 at 132 splits, all issued
// at once), and the 32 groups' sums meet in a fixed tree (deterministic, another order than mla_combine_kernel's).
// Grid (H, r / 32), 256 threads; r a multiple of 32, part_o and o_lat 16-byte aligned.
// Measured in the model (H200, 2026-12-03, 3 reps, alternated, two rounds): 2.447 / 2.690 against 2.505 / 2.755 ms/token
// at contexts 32768 / 131072, but 2.312 against 2.306 at context 0, where one split is used and the 32 groups' tree
// (5 barriers) was all the work; the tree now spans only the groups that read a split.
inline constexpr int kCombineGroups = 32, kCombineUnroll = 5;
__global__ void __launch_bounds__(256) mla_combine_wide_kernel(MlaDecodeArgs a) {
  extern __shared__ float ws[];
  __shared__ float scratch[32];
  __shared__ float4 part[kCombineGroups][8];
  int const h = blockIdx.x, tid = threadIdx.x;
  int const q = tid & 7, grp = tid >> 3, col = blockIdx.y * 32 + 4 * q;
  int const H = a.d.heads, r = a.d.rank;
  ops::pdl_trigger();
  ops::pdl_wait();
  int used = 0;
  float const den = mla_combine_weights(a, h, ws, scratch, used);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float const* po = a.part_o + std::int64_t(h) * r + col;
  std::int64_t const stride = std::int64_t(H) * r;
  for (int s0 = grp; s0 < used; s0 += kCombineGroups * kCombineUnroll) {
    float4 v[kCombineUnroll];
#pragma unroll
    for (int k = 0; k < kCombineUnroll; ++k) {
      int const s = s0 + k * kCombineGroups;
      v[k] = s < used ? *reinterpret_cast<float4 const*>(po + s * stride) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int k = 0; k < kCombineUnroll; ++k) {
      int const s = s0 + k * kCombineGroups;
      float const w = s < used ? ws[s] : 0.f;
      acc.x = fmaf(w, v[k].x, acc.x), acc.y = fmaf(w, v[k].y, acc.y);
      acc.z = fmaf(w, v[k].z, acc.z), acc.w = fmaf(w, v[k].w, acc.w);
    }
  }
  part[grp][q] = acc;
  __syncthreads();
  // the tree spans the groups that read a split (the others hold zeros): none past group 0 at one split (short
  // contexts), 32 from 32 splits on; `used` is the same in every thread, so the barriers are uniform
  int span = 1;
  while (span < used && span < kCombineGroups) span <<= 1;
  for (int half = span / 2; half > 0; half >>= 1) {
    if (grp < half) {
      float4 const o = part[grp + half][q];
      float4& p = part[grp][q];
      p.x += o.x, p.y += o.y, p.z += o.z, p.w += o.w;
    }
    __syncthreads();
  }
  if (grp == 0) {
    float4 const t = part[0][q];
    *reinterpret_cast<float4*>(a.o_lat + std::int64_t(h) * r + col) = make_float4(t.x / den, t.y / den, t.z / den, t.w / den);
  }
}

// O[h·dv + i] = (W_UV,h o_lat,h)[i] · gate: gate_mode 0 none, 1 head-wise sigmoid(gate[h]), 2 element-wise.
template <MatFormat F>
__global__ void __launch_bounds__(256) mla_uv_kernel(MlaDecodeArgs a, float const* gate, int gate_mode, float* out) {
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  MlaDims const d = a.d;
  ops::pdl_trigger();
  std::int64_t const idx = std::int64_t(blockIdx.x) * 8 + warp;
  bool const ok = idx < std::int64_t(d.heads) * d.v;
  int const h = ok ? int(idx / d.v) : 0, i = ok ? int(idx % d.v) : 0;
  if (ok) {  // W_UV rows are weights: prefetch before waiting for o_lat
    std::int64_t const rb = matrix_storage_bytes(F, 1, d.rank);
    ops::warp_prefetch(static_cast<char const*>(a.kv_b.data) + (std::int64_t(h) * (d.nope + d.v) + d.nope + i) * rb, rb);
  }
  ops::pdl_wait();
  if (!ok) return;
  void const* w[1] = {a.kv_b.data};
  void const* s[1] = {a.kv_b.scales};
  std::int64_t rows[1] = {a.kv_b.rows}, row[1] = {std::int64_t(h) * (d.nope + d.v) + d.nope + i};
  float const* x[1] = {a.o_lat + std::int64_t(h) * d.rank};
  float o[1];
  ops::warp_dots<F, 1>(w, s, rows, row, x, 1, d.rank, o);
  float g = gate_mode == 1 ? dev::sigmoidf_(gate[h]) : gate_mode == 2 ? dev::sigmoidf_(gate[idx]) : 1.f;
  if (lane == 0) out[idx] = o[0] * g;
}

inline constexpr int kUvWarps = 4;
inline constexpr int kUvRowsPerWarp = 4;
inline constexpr int kUvRowsPerBlock = kUvWarps * kUvRowsPerWarp;
inline constexpr int kUvMaxChunksPerLane = 2;  // rows of at most 64 chunks (rank 512 in bf16; 1024 in fp8)

// O[h·dv + i] = (W_UV,h o_lat,h)[i] · gate. Block = (head, 16 rows); warp = 4 rows, all loaded before the PDL wait;
// lane keeps o_lat columns of its chunk(s) in registers for the 4 rows.
template <MatFormat F>
__global__ void __launch_bounds__(kUvWarps * 32) mla_uv_fast_kernel(MlaDecodeArgs a, float const* gate, int gate_mode, float* out) {
  using D = MlaChunk<F>;
  constexpr int E = D::kElems, U = kUvMaxChunksPerLane, NR = kUvRowsPerWarp;
  MlaDims const d = a.d;
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int const bph = (d.v + kUvRowsPerBlock - 1) / kUvRowsPerBlock;
  int const h = int(blockIdx.x) / bph;
  int const i0 = (int(blockIdx.x) % bph) * kUvRowsPerBlock + warp * NR;
  int const nchunks = d.rank / E;
  std::int64_t const rb = std::int64_t(nchunks) * 16;
  std::int64_t const row0 = std::int64_t(h) * (d.nope + d.v) + d.nope + i0;
  ops::pdl_trigger();
  uint4 w[NR][U];
  float sc[NR][U];
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int const c = lane + 32 * u;
      bool const ok = i0 + r < d.v && c < nchunks;
      w[r][u] = ok ? ops::load_stream(static_cast<char const*>(a.kv_b.data) + (row0 + r) * rb + std::int64_t(c) * 16)
                   : make_uint4(0u, 0u, 0u, 0u);
      sc[r][u] = ok ? D::scale(a.kv_b.scales, a.kv_b.cols, row0 + r, c) : 0.f;
    }
  ops::pdl_wait();
  float x[U][E];
  float const* ol = a.o_lat + std::int64_t(h) * d.rank;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    int const c = lane + 32 * u;
#pragma unroll
    for (int e = 0; e < E; e += 4) {
      float4 v = c < nchunks ? *reinterpret_cast<float4 const*>(ol + std::int64_t(c) * E + e) : make_float4(0.f, 0.f, 0.f, 0.f);
      x[u][e] = v.x;
      x[u][e + 1] = v.y;
      x[u][e + 2] = v.z;
      x[u][e + 3] = v.w;
    }
  }
  float acc[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    acc[r] = 0.f;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float f[E];
      D::decode(w[r][u], f);
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) dot += f[e] * x[u][e];
      acc[r] += dot * sc[r][u];
    }
    acc[r] = dev::warp_sum(acc[r]);
  }
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (i0 + r >= d.v) break;
      std::int64_t const idx = std::int64_t(h) * d.v + i0 + r;
      float const g = gate_mode == 1 ? dev::sigmoidf_(gate[h]) : gate_mode == 2 ? dev::sigmoidf_(gate[idx]) : 1.f;
      out[idx] = acc[r] * g;
    }
}

inline int mla_heads_per_thread(MlaDims const& d) {
  // largest HPT in {16, 8, 4, 2, 1} dividing H with (r/4)·(H/HPT) <= 256 threads
  for (int hpt : {1, 2, 4, 8, 16})
    if (d.heads % hpt == 0 && (d.rank / 4) * (d.heads / hpt) <= 256) return hpt;
  return 0;
}
inline std::size_t mla_attend_smem(MlaDims const& d) {
  int const L = d.latent();
  return sizeof(float) * std::size_t(d.heads) * L + sizeof(std::uint16_t) * kMlaTile * std::size_t(L + 8) +
         sizeof(float) * (std::size_t(kMlaTile) * d.heads + 3 * d.heads);
}

inline Status mla_can_implement(MlaDims const& d) {
  if (d.rank % 4 != 0 || d.latent() % 8 != 0)
    return Status(ErrorCode::kUnsupported, "mla decode: kv_lora_rank must be a multiple of 4 and kv_lora_rank + qk_rope_head_dim of 8");
  if (mla_heads_per_thread(d) == 0)
    return Status(ErrorCode::kUnsupported, "mla decode: no thread layout for these heads and kv_lora_rank");
  if (d.use_rope && d.rope % 2) return Status(ErrorCode::kUnsupported, "mla decode: odd rope dim");
  return Status::ok();
}

// The one-launch kernels' new cache row, as mla_write_cache_row forms it: the RMSNorm's 1/rms over all of c (every
// block computes it), and the rope parts of the row (bf16, at row[off..]) and of q̂ (at qh[off..], from the head's q):
// threads tid, tid + nt, ... of the block; scratch: 32 floats.
__device__ __forceinline__ float mla_row_inv_rms(MlaDims const& d, float const* kv_a, int tid, int nt, float* scratch) {
  float ss = 0.f;
  for (int i = tid; i < d.rank; i += nt) ss += kv_a[i] * kv_a[i];
  return rsqrtf(dev::block_sum(ss, scratch) / float(d.rank) + d.eps);
}
// pre: this thread's first pair's rope_cs (j = tid), computed by the caller (valid where has_pre).
__device__ __forceinline__ void mla_rope_parts(MlaDims const& d, float const* kv_a, float const* q, std::int64_t t,
                                               std::uint16_t* row, float* qh, int off, int tid, int nt,
                                               bool has_pre = false, float2 pre = {}) {
  int const r = d.rank;
  if (d.use_rope) {
    for (int j = tid; j < d.rope / 2; j += nt) {
      float2 const cs = has_pre && j == tid ? pre : rope_cs(t, j, d.rope, d.rope_theta);
      float x0 = kv_a[r + 2 * j], x1 = kv_a[r + 2 * j + 1];
      rope_rotate(x0, x1, cs);
      row[off + 2 * j] = bf16_from_float(x0).bits;
      row[off + 2 * j + 1] = bf16_from_float(x1).bits;
      float y0 = q[d.nope + 2 * j], y1 = q[d.nope + 2 * j + 1];
      rope_rotate(y0, y1, cs);
      qh[off + 2 * j] = y0;
      qh[off + 2 * j + 1] = y1;
    }
  } else {
    for (int j = tid; j < d.rope; j += nt) {
      row[off + j] = bf16_from_float(kv_a[r + j]).bits;
      qh[off + j] = q[d.nope + j];
    }
  }
}

// The softmax's max and denominator over scores p[0, len), by one warp (every warp of the one-launch kernels does it
// itself: the same sums in the same order in each).
__device__ __forceinline__ void mla_softmax_stats(float const* p, std::int64_t len, int lane, float& m, float& l) {
  m = -INFINITY;
  for (int j = lane; j < len; j += 32) m = fmaxf(m, p[j]);
  m = dev::warp_max(m);
  l = 0.f;
  for (int j = lane; j < len; j += 32) l += __expf(p[j] - m);
  l = dev::warp_sum(l);
}

// o = the sum over the warp's tokens j = warp + NW·k < len of exp(score(k) − m) times their bf16 cache chunk chunk(k)
// (8 latent columns): one lane's share of o_lat in both one-launch kernels, in token order.
template <int TW, int NW, class Chunk, class Score>
__device__ __forceinline__ void mla_weighted_chunks(Chunk const& chunk, Score const& score, int warp, std::int64_t len,
                                                    float m, float (&o)[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = 0.f;
#pragma unroll
  for (int k = 0; k < TW; ++k) {
    if (warp + NW * k < len) {
      float const w = __expf(score(k) - m);
      float f[8];
      MlaChunk<MatFormat::kBf16>::decode(chunk(k), f);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = fmaf(w, f[e], o[e]);
    }
  }
}

// ---- the short-context chain in one launch (MlaDecodeArgs::kernel kMlaShortKernel) ----------------------------------
// At context 0 the chain above is four launches for ~4 MB of kv_b and a few cache rows: q̂ (mla_qhat_kernel), the
// attention on one split, the combine and W_UV (mla_uv_fast_kernel), each waiting for the one before (session 24's
// trace: 22.3 µs per MLA layer with the dense matvec, where a KDA layer's o_proj region takes 4.3). Every step of it is
// per head but the cache row, which every head can form itself. So one block per head does it all: its kv_b rows (W_UK
// then W_UV, one contiguous span: 128 KB in FP8 at Ling's shape) are copied into shared memory before the PDL wait
// (they depend on nothing); after it the block forms the new cache row in shared memory (block 0 also stores it), q̂
// (the warps' partial sums over W_UK's rows meet in shared memory), the scores of the `len` = position + 1 tokens, the
// softmax, o_lat and W_UV · o_lat times the gate. Warp w holds the cache rows of tokens w, w + 16, ... in registers
// (loaded from L2 right after the wait; the new one from shared memory): their scores, then their share of o_lat,
// the warps' shares added in warp order. Session 39 measured the first version (a warp per token reading its row in the
// score loop, a thread per column reading every row again for o_lat, each row's scale loaded in the row loops) at
// ~17 µs from the projections' end, the loops paying one L2 latency per iteration; so every global load of a phase
// is now issued before the phase's arithmetic, the scales before the wait. All in fp32 (the tensor-core attention
// rounds Q̂ and P to bf16), so its outputs are within 1e-4 of the CUDA-core chain's (another order of the sums). It
// also stores q̂ (a.q_hat), as the chain does. The caller guarantees len ≤ kMlaShortMaxLen (the model takes this
// kernel only in its short-context graph); a longer context gets NaN outputs, never a partial attention. Needs rows
// of at most 32 chunks (lane = chunk), nope and v_head_dim ≤ 128, a latent ≤ 768 and the shared memory of
// mla_short_smem (mla_short_fits).
inline constexpr int kMlaShortThreads = 512, kMlaShortWarps = kMlaShortThreads / 32;
// Rows of W_UK and of W_UV per warp (so nope and v_head_dim of at most 8 · 16 = 128), and 16-byte chunks of a cache
// row per lane (latent of at most 3 · 32 · 8 = 768), each held in registers.
inline constexpr int kMlaShortRowsPerWarp = 8, kMlaShortRowChunks = 3;
static_assert(kMlaShortMaxLen % kMlaShortWarps == 0, "mla_short_kernel: each warp holds kMlaShortMaxLen / warps rows");

// Dynamic shared memory: the head's kv_b rows as stored, the new cache row (bf16, 16-byte padded), then fp32: the
// warps' partial q̂ [warps][rank], q̂ [latent], o_lat [rank], the scores [kMlaShortMaxLen] and a block_sum scratch.
inline std::size_t mla_short_smem(MlaDims const& d, int elems) {
  std::size_t const w = std::size_t(d.nope + d.v) * std::size_t(d.rank / elems) * 16;
  std::size_t const row = (std::size_t(d.latent()) * 2 + 15) / 16 * 16;
  std::size_t const f = std::size_t(kMlaShortWarps) * d.rank + d.latent() + d.rank + kMlaShortMaxLen + 32;
  return w + row + f * 4;
}
inline bool mla_short_fits(MlaDecodeArgs const& a) {
  int const e = mla_chunk_elems(a.kv_b.format);
  return mla_kvb_vectorizable(a) && mla_can_implement(a.d).is_ok() && a.d.rank / e <= 32 &&
         a.d.nope <= kMlaShortRowsPerWarp * kMlaShortWarps && a.d.v <= kMlaShortRowsPerWarp * kMlaShortWarps &&
         a.d.latent() <= kMlaShortRowChunks * 32 * 8 && reinterpret_cast<std::uintptr_t>(a.cache) % 16 == 0 &&
         mla_short_smem(a.d, e) <= std::size_t(current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
}

template <MatFormat F>
__global__ void __launch_bounds__(kMlaShortThreads, 1)
    mla_short_kernel(MlaDecodeArgs a, float const* gate, int gate_mode, float* out) {
  using D = MlaChunk<F>;
  constexpr int E = D::kElems, NW = kMlaShortWarps, RW = kMlaShortRowsPerWarp, TW = kMlaShortMaxLen / NW,
                U = kMlaShortRowChunks;
  extern __shared__ __align__(16) unsigned char smraw[];
  MlaDims const d = a.d;
  int const h = int(blockIdx.x), tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  int const L = d.latent(), r = d.rank, nch = r / E, rows = d.nope + d.v, lch = L / 8;
  std::int64_t const rb = std::int64_t(nch) * 16, row0 = std::int64_t(h) * rows;
  unsigned char* const W = smraw;
  std::uint16_t* const crow = reinterpret_cast<std::uint16_t*>(smraw + std::int64_t(rows) * rb);
  float* const red =
      reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(crow) + (std::size_t(L) * 2 + 15) / 16 * 16);
  float* const qh = red + NW * r;
  float* const ol = qh + L;
  float* const p = ol + r;
  float* const scratch = p + kMlaShortMaxLen;
  ops::pdl_trigger();
  kernels::trace_mark(a.trace, 0);
  {  // the head's kv_b rows, W_UK then W_UV (one contiguous span): weights, requested before the wait
    char const* src = static_cast<char const*>(a.kv_b.data) + row0 * rb;
    std::int64_t const bytes = std::int64_t(rows) * rb;
    for (std::int64_t off = std::int64_t(tid) * 16; off < bytes; off += std::int64_t(kMlaShortThreads) * 16)
      kernels::cp_async16(W + off, src + off);
    kernels::cp_async_commit();
  }
  // the scales of this lane's chunk in the warp's rows (n = warp + NW·i of W_UK and of W_UV): weights too, so loaded
  // before the wait; after it every global load of a phase is issued before that phase's arithmetic (one latency per
  // phase, where a loop over rows or tokens would pay one per iteration)
  float suk[RW], suv[RW];
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    int const n = warp + NW * i;
    suk[i] = lane < nch && n < d.nope ? D::scale(a.kv_b.scales, a.kv_b.cols, row0 + n, lane) : 0.f;
    suv[i] = lane < nch && n < d.v ? D::scale(a.kv_b.scales, a.kv_b.cols, row0 + d.nope + n, lane) : 0.f;
  }
  ops::pdl_wait();
  kernels::trace_mark(a.trace, 1);
  std::int64_t const t = *a.position, len = t + 1;
  float const* q = a.q + std::int64_t(h) * d.qk();
  float qn[RW];  // q_nope at the warp's W_UK rows
#pragma unroll
  for (int i = 0; i < RW; ++i) qn[i] = warp + NW * i < d.nope ? q[warp + NW * i] : 0.f;
  // the cache rows of the warp's tokens j = warp + NW·k (lane = 8 columns; the new token's row later, from shared
  // memory); at most kMlaShortMaxLen tokens are read, whatever the position
  uint4 cr[TW][U];
#pragma unroll
  for (int k = 0; k < TW; ++k)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      std::int64_t const j = warp + NW * k;
      int const v = lane + 32 * u;
      cr[k][u] = j < len && j != t && v < lch ? *reinterpret_cast<uint4 const*>(a.cache + j * L + v * 8)
                                              : make_uint4(0u, 0u, 0u, 0u);
    }
  // the new cache row [RMSNorm(c) | RoPE(k_rope)] as mla_write_cache_row forms it; q̂'s rope part
  float const inv = mla_row_inv_rms(d, a.kv_a, tid, kMlaShortThreads, scratch);
  for (int i = tid; i < r; i += kMlaShortThreads) crow[i] = bf16_from_float(a.kv_norm[i] * (a.kv_a[i] * inv)).bits;
  mla_rope_parts(d, a.kv_a, q, t, crow, qh, r, tid, kMlaShortThreads);
  kernels::cp_async_wait(0);
  __syncthreads();  // the weights have landed; the new row and q̂'s rope part are in shared memory
  if (a.trace_mid == 0) kernels::trace_mark(a.trace, 2);
  if (h == 0)
    for (int i = tid; i < L; i += kMlaShortThreads) a.cache[t * L + i] = crow[i];
  // q̂ = W_UKᵀ q_nope: lane = one 16-byte chunk (E columns) of every row, warp w = rows w, w + NW, ...
  if (lane < nch) {
    float acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.f;
#pragma unroll
    for (int i = 0; i < RW; ++i) {
      int const n = warp + NW * i;
      if (n < d.nope) {
        float f[E];
        D::decode(*reinterpret_cast<uint4 const*>(W + std::int64_t(n) * rb + lane * 16), f);
        float const s = suk[i] * qn[i];
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = fmaf(f[e], s, acc[e]);
      }
    }
#pragma unroll
    for (int e = 0; e < E; ++e) red[warp * r + lane * E + e] = acc[e];
  }
  __syncthreads();
  for (int c = tid; c < L; c += kMlaShortThreads) {
    float v = 0.f;
    if (c < r) {
      for (int w = 0; w < NW; ++w) v += red[w * r + c];
      qh[c] = v;
    } else {
      v = qh[c];
    }
    a.q_hat[std::int64_t(h) * L + c] = v;
  }
  if (len > kMlaShortMaxLen) {  // the caller's contract broken: NaN outputs, not a partial attention (uniform)
    for (int i = tid; i < d.v; i += kMlaShortThreads) out[std::int64_t(h) * d.v + i] = __uint_as_float(0x7FC00000u);
    return;
  }
  __syncthreads();  // q̂ complete; red free again
  if (a.trace_mid == 1) kernels::trace_mark(a.trace, 2);
  // the scores of the warp's tokens, from the rows it holds
  float const qscale = rsqrtf(float(d.qk()));
  float sc[TW];
#pragma unroll
  for (int k = 0; k < TW; ++k) {
    int const j = warp + NW * k;
    float s = 0.f;
    if (j < len) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        int const v = lane + 32 * u;
        if (v < lch) {
          if (j == t) cr[k][u] = reinterpret_cast<uint4 const*>(crow)[v];
          float f[8];
          MlaChunk<MatFormat::kBf16>::decode(cr[k][u], f);
          float4 const qa = *reinterpret_cast<float4 const*>(qh + v * 8),
                       qb = *reinterpret_cast<float4 const*>(qh + v * 8 + 4);
          float const qv[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
          for (int e = 0; e < 8; ++e) s = fmaf(f[e], qv[e], s);
        }
      }
    }
    sc[k] = dev::warp_sum(s) * qscale;
    if (lane == 0 && j < len) p[j] = sc[k];
  }
  __syncthreads();
  if (a.trace_mid == 2) kernels::trace_mark(a.trace, 2);
  // every warp finds the softmax's max and denominator itself (the same sums in the same order in each)
  float m, l;
  mla_softmax_stats(p, len, lane, m, l);
  // the warp's share of o_lat (its tokens' rows weighted by their numerators), partials by warp into red
#pragma unroll
  for (int u = 0; u < U; ++u) {
    int const v = lane + 32 * u;
    if (v * 8 >= r) continue;
    float o[8];
    mla_weighted_chunks<TW, NW>([&](int k) { return cr[k][u]; }, [&](int k) { return sc[k]; }, warp, len, m, o);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (v * 8 + e < r) red[warp * r + v * 8 + e] = o[e];
  }
  __syncthreads();
  for (int c = tid; c < r; c += kMlaShortThreads) {  // o_lat: the warps' partials in warp order
    float acc = 0.f;
    for (int w = 0; w < NW; ++w) acc += red[w * r + c];
    ol[c] = acc / l;
  }
  __syncthreads();
  if (a.trace_mid == 3) kernels::trace_mark(a.trace, 2);
  // O = W_UV o_lat times the gate: lane = chunk, warp w = rows w, w + NW, ...
  float x[E];
#pragma unroll
  for (int e = 0; e < E; ++e) x[e] = lane < nch ? ol[lane * E + e] : 0.f;
  float g[RW];
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    std::int64_t const idx = std::int64_t(h) * d.v + warp + NW * i;
    g[i] = gate_mode == 1 ? gate[h] : gate_mode == 2 && warp + NW * i < d.v ? gate[idx] : 0.f;
  }
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    int const n = warp + NW * i;
    if (n >= d.v) break;
    float dot = 0.f;
    if (lane < nch) {
      float f[E];
      D::decode(*reinterpret_cast<uint4 const*>(W + std::int64_t(d.nope + n) * rb + lane * 16), f);
#pragma unroll
      for (int e = 0; e < E; ++e) dot = fmaf(f[e], x[e], dot);
      dot *= suv[i];
    }
    dot = dev::warp_sum(dot);
    if (lane == 0) out[std::int64_t(h) * d.v + n] = dot * (gate_mode == 0 ? 1.f : dev::sigmoidf_(g[i]));
  }
  kernels::trace_end(a.trace);
}

// ---- the chain in one launch, each head over a cluster of blocks (kMlaShortClusterKernel) --------------------------
// Session 40's timeline of mla_short_kernel (H100, medians over the 7 MLA layers, µs after its PDL wait): kv_b landed
// 5.5, q̂ 9.0, the scores 10.3, o_lat 12.2, the end 17.2. After the copy its 16 warps run every kv_b decode of the head
// on one SM (128 × 512 weights for q̂ and again for W_UV, ~8 instructions each), so issue, not bytes, sets its time.
// Here the head's kMlaCluster blocks split the latent columns: block c copies and decodes the rank columns
// [c·r/kMlaCluster, (c+1)·r/kMlaCluster) of its kv_b rows (a quarter of the bytes and instructions), holds that slice
// of q̂ and of o_lat, and block 0 also the rope part. Two exchanges go through distributed shared memory: the partial
// scores (each block adds the kMlaCluster partials in rank order, so all blocks hold the same scores), and the partial
// outputs of W_UV (block c sums rows [c·dv/kMlaCluster, ...) in rank order and stores them). fp32 throughout, as
// mla_short_kernel. Thread t of a block takes chunk q = t mod cpb of its slice (cpb = chunks per block) in rows
// t / cpb + (256 / cpb)·i; warp w holds the cache rows of tokens w, w + 8, ..., one 16-byte chunk per lane.
// Blocks of 256 threads (at most 128 registers), so two fit an SM and a cluster of 4 needs only 2 free SMs. Session 40
// measured blocks of 512 first (~116 registers: a whole SM each): an H100 then holds 30 clusters of 4 at once
// (cudaOccupancyMaxActiveClusters), so 2 of the 32 heads ran in a second wave and the launch took 18.9 µs alone
// against 14.1 for mla_short_kernel; with 256 threads it holds 62 and takes 10.3.
inline constexpr int kMlaCluster = 4, kMlaClusterThreads = 256,
                     kMlaClusterMaxRows = 8;  // rows of W_UK (and of W_UV) per thread at most

// The block's shape: chunks of kv_b per row in its slice, rank columns in it, 16-byte cache chunks of block 0 (its
// rank columns and the rope part).
struct MlaClusterShape {
  int cpb = 0, wn = 0, nlc0 = 0, groups = 0;
};
inline MlaClusterShape mla_cluster_shape(MlaDims const& d, int elems) {
  MlaClusterShape s;
  s.cpb = d.rank / elems / kMlaCluster;
  s.wn = s.cpb * elems;
  s.nlc0 = s.wn / 8 + d.rope / 8;
  s.groups = s.cpb > 0 ? kMlaClusterThreads / s.cpb : 0;
  return s;
}
// W slice [nope + v][cpb] chunks; 32 chunks of the new row; fp32: partials [warps][wn], q̂ [wn + rope], o_lat [wn],
// partial and full scores [kMlaShortMaxLen] each, partial outputs [v], a block_sum scratch.
inline std::size_t mla_short_cluster_smem(MlaDims const& d, int elems) {
  MlaClusterShape const s = mla_cluster_shape(d, elems);
  std::size_t const f =
      std::size_t(kMlaClusterThreads / 32) * s.wn + s.wn + d.rope + s.wn + 2 * kMlaShortMaxLen + d.v + 32;
  return std::size_t(d.nope + d.v) * s.cpb * 16 + 32 * 16 + f * 4;
}
// Whether the head's W_UK and W_UV rows fit `rows` per thread over the shape's row groups (the kernel's kR).
inline bool mla_cluster_rows_fit(MlaDims const& d, MlaClusterShape const& s, int rows) {
  return d.nope <= rows * s.groups && d.v <= rows * s.groups;
}
inline bool mla_short_cluster_fits(MlaDecodeArgs const& a) {
  int const e = mla_chunk_elems(a.kv_b.format);
  if (!mla_kvb_vectorizable(a) || !mla_can_implement(a.d).is_ok() || (a.d.rank / e) % kMlaCluster != 0) return false;
  MlaClusterShape const s = mla_cluster_shape(a.d, e);
  return s.cpb >= 1 && s.cpb <= 32 && 32 % s.cpb == 0 && s.wn % 8 == 0 && a.d.rope % 8 == 0 && s.nlc0 <= 32 &&
         mla_cluster_rows_fit(a.d, s, kMlaClusterMaxRows) && reinterpret_cast<std::uintptr_t>(a.cache) % 16 == 0 &&
         mla_short_cluster_smem(a.d, e) <=
             std::size_t(current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
}

// kR: rows of W_UK and of W_UV per thread at most (the launcher takes 4 where the shape allows: half the unrolled code
// of kMlaClusterMaxRows).
template <MatFormat F, int kR = kMlaClusterMaxRows>
__global__ void __launch_bounds__(kMlaClusterThreads, 2)
    mla_short_cluster_kernel(MlaDecodeArgs a, float const* gate, int gate_mode, float* out) {
  namespace cg = cooperative_groups;
  using D = MlaChunk<F>;
  constexpr int E = D::kElems, C = kMlaCluster, NT = kMlaClusterThreads, NW = NT / 32, R = kR,
                TW = kMlaShortMaxLen / NW;
  static_assert(kMlaShortMaxLen % NW == 0, "mla_short_cluster_kernel: each warp holds kMlaShortMaxLen / warps rows");
  extern __shared__ __align__(16) unsigned char smraw[];
  cg::cluster_group cluster = cg::this_cluster();
  MlaDims const d = a.d;
  int const c = int(cluster.block_rank()), h = int(blockIdx.x) / C, tid = int(threadIdx.x), lane = tid & 31,
            warp = tid >> 5;
  int const L = d.latent(), r = d.rank, nch = r / E, cpb = nch / C, G = NT / cpb, wn = cpb * E, rows = d.nope + d.v,
            q = tid % cpb, rg = tid / cpb, nlc = wn / 8 + (c == 0 ? d.rope / 8 : 0), col0 = c * wn;
  std::int64_t const rb = std::int64_t(nch) * 16, row0 = std::int64_t(h) * rows;
  unsigned char* const W = smraw;
  std::uint16_t* const crow = reinterpret_cast<std::uint16_t*>(smraw + std::int64_t(rows) * cpb * 16);
  float* const red = reinterpret_cast<float*>(crow + 32 * 8);
  float* const qh = red + NW * wn;  // [wn | rope]: the block's latent columns in its chunks' order
  float* const ol = qh + wn + d.rope;
  float* const ps = ol + wn;
  float* const pf = ps + kMlaShortMaxLen;
  float* const po = pf + kMlaShortMaxLen;
  float* const scratch = po + d.v;
  ops::pdl_trigger();
  kernels::trace_mark(a.trace, 0);
  {  // the block's slice of the head's kv_b rows (W_UK then W_UV): weights, requested before the wait
    char const* src = static_cast<char const*>(a.kv_b.data) + row0 * rb + std::int64_t(c) * cpb * 16;
    for (int i = tid; i < rows * cpb; i += NT)
      kernels::cp_async16(W + std::int64_t(i) * 16, src + std::int64_t(i / cpb) * rb + (i % cpb) * 16);
    kernels::cp_async_commit();
  }
  float suk[R], suv[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    int const n = rg + G * i;
    suk[i] = n < d.nope ? D::scale(a.kv_b.scales, a.kv_b.cols, row0 + n, c * cpb + q) : 0.f;
    suv[i] = n < d.v ? D::scale(a.kv_b.scales, a.kv_b.cols, row0 + d.nope + n, c * cpb + q) : 0.f;
  }
  // latent column of the block's chunk l: its rank columns, then (block 0) the rope part
  auto const lcol = [&](int l) { return l < wn / 8 ? col0 + 8 * l : r + 8 * (l - wn / 8); };
  // the position and the cached rows (before the wait where the caller allows it: MlaDecodeArgs::early)
  std::int64_t t = 0, len = 1;
  uint4 cr[TW];
  auto const load_cache = [&] {
    t = *a.position, len = t + 1;
#pragma unroll
    for (int k = 0; k < TW; ++k) {
      std::int64_t const j = warp + NW * k;
      cr[k] = j < len && j != t && lane < nlc ? *reinterpret_cast<uint4 const*>(a.cache + j * L + lcol(lane))
                                              : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  // block 0's RoPE: this thread's pair's cos / sin at the position, from the model's table (MlaDecodeArgs::rope_cs)
  // where there is one, read with the position. Computed here instead (rope_cs: a powf, double sin and cos), block 0
  // reached its kv_b mark ~2.4 µs after the cluster's other blocks, and every cluster barrier waited for it (H100,
  // session 59's per-block trace); computed before the wait, ~1.4 µs after them (session 60's).
  bool rpre = false;
  float2 rcs = make_float2(0.f, 0.f);
  auto const load_rope = [&] {
    rpre = a.rope_cs && c == 0 && d.use_rope && tid < d.rope / 2 && t < kMlaShortMaxLen;
    if (rpre) rcs = reinterpret_cast<float2 const*>(a.rope_cs)[t * (d.rope / 2) + tid];
  };
  if (a.early) load_cache(), load_rope();
  ops::pdl_wait();
  kernels::trace_mark(a.trace, 1);
  if (!a.early) load_cache(), load_rope();
  float const* qv = a.q + std::int64_t(h) * d.qk();
  float qn[R];
#pragma unroll
  for (int i = 0; i < R; ++i) qn[i] = rg + G * i < d.nope ? qv[rg + G * i] : 0.f;
  // the gate of this thread's first output row (block c: rows [c·vb, (c + 1)·vb)), with the first loads
  int const vb = (d.v + C - 1) / C, n0 = c * vb + tid;
  float const g0 = gate_mode == 1 ? gate[h]
                   : gate_mode == 2 && n0 < min(d.v, (c + 1) * vb) ? gate[std::int64_t(h) * d.v + n0]
                                                                    : 0.f;
  // the new cache row's chunks of this block [RMSNorm(c) | RoPE(k_rope)] and (block 0) q̂'s rope part
  float const inv = mla_row_inv_rms(d, a.kv_a, tid, NT, scratch);
  for (int i = tid; i < wn; i += NT) crow[i] = bf16_from_float(a.kv_norm[col0 + i] * (a.kv_a[col0 + i] * inv)).bits;
  if (c == 0) mla_rope_parts(d, a.kv_a, qv, t, crow, qh, wn, tid, NT, rpre, rcs);
  kernels::cp_async_wait(0);
  __syncthreads();  // the weights have landed; the new row's chunks and q̂'s rope part are in shared memory
  if (a.trace_mid == 0) kernels::trace_mark(a.trace, 2);
  if (h == 0)
    for (int i = tid; i < nlc * 8; i += NT) a.cache[t * L + lcol(i / 8) + i % 8] = crow[i];
  {  // q̂'s slice = W_UKᵀ q_nope over the block's columns: the thread's rows, then the warp's row groups (shuffles)
    float acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.f;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      int const n = rg + G * i;
      if (n < d.nope) {
        float f[E];
        D::decode(*reinterpret_cast<uint4 const*>(W + (std::int64_t(n) * cpb + q) * 16), f);
        float const s = suk[i] * qn[i];
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = fmaf(f[e], s, acc[e]);
      }
    }
    for (int o = cpb; o < 32; o <<= 1)
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], o);
    if (lane < cpb)
#pragma unroll
      for (int e = 0; e < E; ++e) red[warp * wn + q * E + e] = acc[e];
  }
  __syncthreads();
  for (int i = tid; i < wn; i += NT) {  // the warps' partials in warp order
    float v = 0.f;
    for (int w = 0; w < NW; ++w) v += red[w * wn + i];
    qh[i] = v;
    a.q_hat[std::int64_t(h) * L + col0 + i] = v;
  }
  if (c == 0)
    for (int i = tid; i < d.rope; i += NT) a.q_hat[std::int64_t(h) * L + r + i] = qh[wn + i];
  if (len > kMlaShortMaxLen) {  // the caller's contract broken (uniform over the cluster): NaN outputs
    for (int n = c * vb + tid; n < min(d.v, (c + 1) * vb); n += NT)
      out[std::int64_t(h) * d.v + n] = __uint_as_float(0x7FC00000u);
    return;
  }
  __syncthreads();  // q̂'s slice complete; red free again
  // the partial scores of the warp's tokens over the block's columns
  if (a.trace_mid == 1) kernels::trace_mark(a.trace, 2);
#pragma unroll
  for (int k = 0; k < TW; ++k) {
    int const j = warp + NW * k;
    float s = 0.f;
    if (j < len && lane < nlc) {
      if (j == t) cr[k] = reinterpret_cast<uint4 const*>(crow)[lane];
      float f[8];
      MlaChunk<MatFormat::kBf16>::decode(cr[k], f);
      float4 const qa = *reinterpret_cast<float4 const*>(qh + lane * 8),
                   qb = *reinterpret_cast<float4 const*>(qh + lane * 8 + 4);
      float const qq[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) s = fmaf(f[e], qq[e], s);
    }
    s = dev::warp_sum(s);
    if (lane == 0 && j < len) ps[j] = s;
  }
  cluster.sync();  // every block's partial scores
  float const qscale = rsqrtf(float(d.qk()));
  for (int j = tid; j < len; j += NT) {
    float v = 0.f;
    for (int b = 0; b < C; ++b) v += cluster.map_shared_rank(ps, b)[j];
    pf[j] = v * qscale;
  }
  __syncthreads();
  if (a.trace_mid == 2) kernels::trace_mark(a.trace, 2);
  float m, l;
  mla_softmax_stats(pf, len, lane, m, l);
  // the warp's share of o_lat's slice (its tokens' chunks weighted by their numerators), partials by warp into red
  if (lane < wn / 8) {
    float o[8];
    mla_weighted_chunks<TW, NW>([&](int k) { return cr[k]; }, [&](int k) { return pf[warp + NW * k]; }, warp, len, m,
                                o);
#pragma unroll
    for (int e = 0; e < 8; ++e) red[warp * wn + lane * 8 + e] = o[e];
  }
  __syncthreads();
  for (int i = tid; i < wn; i += NT) {
    float acc = 0.f;
    for (int w = 0; w < NW; ++w) acc += red[w * wn + i];
    ol[i] = acc / l;
  }
  __syncthreads();
  if (a.trace_mid == 3) kernels::trace_mark(a.trace, 2);
  {  // the partial outputs W_UV[n, slice] · o_lat[slice]: the thread's chunk of its rows, then the row's cpb lanes
    float x[E];
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = ol[q * E + e];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      int const n = rg + G * i;
      if (i * G >= d.v) break;  // uniform: no thread of the block has a row here
      float dot = 0.f;
      if (n < d.v) {
        float f[E];
        D::decode(*reinterpret_cast<uint4 const*>(W + (std::int64_t(d.nope + n) * cpb + q) * 16), f);
#pragma unroll
        for (int e = 0; e < E; ++e) dot = fmaf(f[e], x[e], dot);
        dot *= suv[i];
      }
      for (int o = 1; o < cpb; o <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if (q == 0 && n < d.v) po[n] = dot;
    }
  }
  if (a.trace_mid == 4) kernels::trace_mark(a.trace, 2);
  cluster.sync();  // every block's partial outputs
  if (a.trace_mid == 5) kernels::trace_mark(a.trace, 2);
  {  // block c: rows [c·vb, (c + 1)·vb), the blocks' partials in rank order, times the gate
    for (int n = n0; n < min(d.v, (c + 1) * vb); n += NT) {
      float v = 0.f;
      for (int b = 0; b < C; ++b) v += cluster.map_shared_rank(po, b)[n];
      std::int64_t const idx = std::int64_t(h) * d.v + n;
      float const g = gate_mode == 1 || n == n0 ? g0 : gate_mode == 2 ? gate[idx] : 0.f;
      out[idx] = v * (gate_mode == 0 ? 1.f : dev::sigmoidf_(g));
    }
  }
  cluster.sync();  // no block leaves while another still reads its shared memory
  kernels::trace_end(a.trace);
}

// The launches after the projections; out [H·dv] goes to the dense matvec. kernel kMlaShortKernel: the short-context
// chain in one launch (mla_short_kernel: the caller guarantees position + 1 ≤ kMlaShortMaxLen), where it fits.
inline void mla_decode(MlaDecodeArgs const& a, float const* gate, int gate_mode, float* out, cudaStream_t st = nullptr) {
  mla_can_implement(a.d).throw_if_error();
  if (a.kernel == kMlaShortClusterKernel && mla_short_cluster_fits(a)) {
    ops::dispatch_format(a.kv_b.format, [&](auto f) {
      constexpr MatFormat F = decltype(f)::value;
      std::size_t const smem = mla_short_cluster_smem(a.d, MlaChunk<F>::kElems);
      auto const go = [&](auto kern) {
        ops::allow_smem(kern, smem);
        check(kernels::launch_cluster_ex(kern, dim3(unsigned(a.d.heads * kMlaCluster)), dim3(kMlaClusterThreads),
                                         smem, st, unsigned(kMlaCluster), a, gate, gate_mode, out),
              "mla_short_cluster launch");
      };
      // 4 rows per thread where they suffice (LING_MLA_R4=0: always kMlaClusterMaxRows, for A/B)
      if (mla_cluster_rows_fit(a.d, mla_cluster_shape(a.d, MlaChunk<F>::kElems), 4) && !env_off("LING_MLA_R4"))
        go(mla_short_cluster_kernel<F, 4>);
      else
        go(mla_short_cluster_kernel<F>);
    });
    check_launch("mla_short_cluster");
    return;
  }
  if (a.kernel == kMlaShortKernel || a.kernel == kMlaShortClusterKernel) {
    require(
        mla_short_fits(a), ErrorCode::kUnsupported,
        "mla decode: the short-context kernel needs kv_b rows of at most 32 whole 16-byte chunks, qk_nope_head_dim "
        "and v_head_dim of at most 128, kv_lora_rank + qk_rope_head_dim of at most 768, a 16-byte aligned cache and " +
            std::to_string(mla_short_smem(a.d, std::max(1, mla_chunk_elems(a.kv_b.format)))) +
            " bytes of shared memory per block");
    ops::dispatch_format(a.kv_b.format, [&](auto f) {
      constexpr MatFormat F = decltype(f)::value;
      std::size_t const smem = mla_short_smem(a.d, MlaChunk<F>::kElems);
      ops::allow_smem(mla_short_kernel<F>, smem);
      ops::launch(mla_short_kernel<F>, unsigned(a.d.heads), kMlaShortThreads, smem, st, a, gate, gate_mode, out);
    });
    check_launch("mla_short");
    return;
  }
  bool const vec = mla_kvb_vectorizable(a);
  ops::dispatch_format(a.kv_b.format, [&](auto f) {
    constexpr MatFormat F = decltype(f)::value;
    if (vec) {
      int const cbs = mla_qhat_col_blocks(a.d, MlaChunk<F>::kElems);
      unsigned const blocks = unsigned(a.d.heads * cbs + 1 + mla_qhat_rope_blocks(a.d));
      ops::launch(mla_qhat_kernel<F>, blocks, kQhatThreads, 0, st, a, cbs);
    } else {
      ops::launch(mla_prepare_kernel<F>, dim3(unsigned(a.d.heads), unsigned((a.d.rank + 127) / 128)), 128, 0, st, a);
    }
  });
  check_launch("mla_prepare");
  bool const q16 = reinterpret_cast<std::uintptr_t>(a.q_hat) % 16 == 0;
  bool const mma = (a.kernel >= 2 && a.kernel <= 6) || (a.kernel == 0 && mla_mma_supported(a.d) && q16);
  require(!mma || mla_mma_supported(a.d), ErrorCode::kUnsupported,
          "mla decode: the tensor-core kernel needs 32 heads, kv_lora_rank 512 and qk_rope_head_dim a multiple of 16 up to 64");
  require(!mma || q16, ErrorCode::kInvalidArgument, "mla decode: the tensor-core kernel needs q_hat 16-byte aligned");
  MlaDecodeArgs b = a;  // the split size the attention and the combine agree on
  b.min_chunk = a.min_chunk > 0 ? a.min_chunk : mma ? kMlaMmaMinChunk : kMlaMinChunk;
  if (mma) {
    bool const swz = a.kernel != 2 && a.d.latent() % 64 == 0;  // the swizzled tiles (kernel 2: the padded ones)
    int const tp = swz && (a.kernel == 4 || a.kernel == 6) ? 2 : 1;  // kernels 4 and 6: two tiles per pass
    bool const qfirst = swz && a.kernel != 3 && a.kernel != 4;       // Q̂'s loads before the tile copies
    std::size_t smem = mla_mma_smem(a.d, tp);  // the padded tiles' size: an upper bound for the swizzled ones
    auto kernel = !swz                ? mla_attend_mma_kernel<false>
                  : tp == 2 && qfirst ? mla_attend_mma_kernel<true, 0, 2, true>
                  : tp == 2           ? mla_attend_mma_kernel<true, 0, 2>
                  : a.diag == 1       ? mla_attend_mma_kernel<true, 1>
                  : a.diag == 2       ? mla_attend_mma_kernel<true, 2>
                  : qfirst            ? mla_attend_mma_kernel<true, 0, 1, true>
                                      : mla_attend_mma_kernel<true>;
    ops::allow_smem(kernel, smem);
    ops::launch(kernel, unsigned(a.splits), 256, smem, st, b);
  } else {
    int const hpt = mla_heads_per_thread(a.d);
    int threads = (a.d.rank / 4) * (a.d.heads / hpt);
    threads = (threads + 31) / 32 * 32;
    std::size_t smem = mla_attend_smem(a.d);
    auto launch = [&](auto kernel) {
      ops::allow_smem(kernel, smem);
      ops::launch(kernel, unsigned(a.splits), unsigned(threads), smem, st, b);
    };
    switch (hpt) {
      case 1: launch(mla_attend_kernel<1>); break;
      case 2: launch(mla_attend_kernel<2>); break;
      case 4: launch(mla_attend_kernel<4>); break;
      case 8: launch(mla_attend_kernel<8>); break;
      default: launch(mla_attend_kernel<16>); break;
    }
  }
  check_launch("mla_attend");
  std::size_t const combine_smem = sizeof(float) * std::size_t(a.splits > 0 ? a.splits : 1);
  bool const wide = a.combine != 1 && a.d.rank % 32 == 0 && reinterpret_cast<std::uintptr_t>(a.part_o) % 16 == 0 &&
                    reinterpret_cast<std::uintptr_t>(a.o_lat) % 16 == 0;
  if (wide) {
    ops::allow_smem(mla_combine_wide_kernel, combine_smem);
    ops::launch(mla_combine_wide_kernel, dim3(unsigned(a.d.heads), unsigned(a.d.rank / 32)), 256, combine_smem, st, b);
  } else {
    ops::allow_smem(mla_combine_kernel, combine_smem);
    ops::launch(mla_combine_kernel, dim3(unsigned(a.d.heads), unsigned((a.d.rank + 127) / 128)), 128, combine_smem, st, b);
  }
  check_launch("mla_combine");
  bool const uv_vec = vec && reinterpret_cast<std::uintptr_t>(a.o_lat) % 16 == 0;
  ops::dispatch_format(a.kv_b.format, [&](auto f) {
    constexpr MatFormat F = decltype(f)::value;
    if (uv_vec && a.d.rank / MlaChunk<F>::kElems <= 32 * kUvMaxChunksPerLane) {
      unsigned const blocks = unsigned(a.d.heads * ((a.d.v + kUvRowsPerBlock - 1) / kUvRowsPerBlock));
      ops::launch(mla_uv_fast_kernel<F>, blocks, kUvWarps * 32, 0, st, a, gate, gate_mode, out);
    } else {
      ops::launch(mla_uv_kernel<F>, unsigned((std::int64_t(a.d.heads) * a.d.v + 7) / 8), 256, 0, st, a, gate, gate_mode, out);
    }
  });
  check_launch("mla_uv");
}

}  // namespace ling::cuda
