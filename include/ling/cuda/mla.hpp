#pragma once
// Gated MLA decode on the GPU in the absorbed form (spec §2 "Gated MLA mixer"), over a latent cache of
// [c | k_rope] rows (r + dr values per token, bf16). Three launches after the fused q/kv_a/g projection:
//  1. mla_prepare: c = RMSNorm(c), RoPE(k_rope) -> cache[t]; q_rope = RoPE(q_rope); q̂_h = W_UK,hᵀ q_nope,h.
//  2. mla_attend (split over the context, flash-decoding): per split, all heads at once (MQA: one read of the
//     cache serves every head), partial softmax statistics and the partial latent output.
//  3. mla_combine: merges the splits into o_lat [H, r]; then the W_UV matvec with the head gate gives O [H·dv].
// The cache length (t + 1) is read from device memory, so one captured graph serves every position.
#include <cstdint>

#include "ling/core/config.hpp"
#include "ling/cuda/model_weights.hpp"

namespace ling::cuda {

struct MlaDims {
  int heads = 0, nope = 0, rope = 0, v = 0, rank = 0;  // H, dn, dr, dv, r
  bool use_rope = true;
  double rope_theta = 10000.0;
  float eps = 1e-6f;
  LING_HOST_DEVICE int latent() const { return rank + rope; }
  LING_HOST_DEVICE int qk() const { return nope + rope; }
};

struct MlaDecodeArgs {
  MlaDims d;
  float const* q = nullptr;        // [H·(dn+dr)] q_proj output
  float const* kv_a = nullptr;     // [r+dr] kv_a_proj_with_mqa output
  float const* kv_norm = nullptr;  // [r] kv_a_layernorm
  ModelMatrix kv_b;                // [H·(dn+dv), r]
  std::uint16_t* cache = nullptr;  // [max_ctx, r+dr] bf16 bits
  std::int64_t max_ctx = 0;
  std::int32_t const* position = nullptr;  // device: t (cache length after this step is t+1)
  // scratch
  float* q_hat = nullptr;     // [H, r+dr]
  int splits = 0;             // number of context splits (blocks of mla_attend)
  float* part_o = nullptr;    // [splits, H, r]
  float* part_ml = nullptr;   // [splits, H, 2] (running max, sum)
  float* o_lat = nullptr;     // [H, r]
  int kernel = 0;             // attention kernel: 0 auto (tensor cores when the shape allows; when the latent is a
                              // multiple of 64, swizzled tiles with Q̂'s loads before the tile copies, as 5), 1 CUDA
                              // cores, 2 tensor cores with padded cache tiles, 3 tensor cores with swizzled cache tiles
                              // (latent a multiple of 64, else as 2), 4 as 3 with two tiles per pass, 5 as 3 with Q̂'s
                              // loads before the tile copies, 6 as 4 with them; 7 (kMlaShortKernel, mla.cuh) the
                              // whole chain in one launch of a block per head, for position + 1 <= 64 only; 8
                              // (kMlaShortClusterKernel) that chain with a cluster of blocks per head
  int min_chunk = 0;          // tokens per split at least (0: the kernel's default; mla_decode sets it for the combine)
  int diag = 0;               // measurements only (wrong outputs), swizzled tensor-core kernel: 1 copies only, 2 math only
  int combine = 0;            // the splits' combine: 0 auto (the partial outputs in one round trip, mla_combine_wide_kernel,
                              // when the rank is a multiple of 32 and part_o, o_lat 16-byte aligned; else as 1), 1 a
                              // thread per column (mla_combine_kernel)
  // Measurements only (CudaModel's LING_TRACE): the one-launch kernels' per-block timeline (entry, wait exit,
  // midpoint, end; the other kernels ignore it), and where that midpoint is taken: 0 kv_b landed, 1 q̂ complete,
  // 2 scores, 3 o_lat (LING_TRACE_MLA_MID); the cluster chain also 4, its partial outputs, and 5, their cluster
  // barrier passed.
  unsigned long long* trace = nullptr;
  int trace_mid = 0;
  // The cluster chain (kMlaShortClusterKernel) reads the position and the cached rows before its PDL wait: set by the
  // model for the replayed graph only, where no launch this one may overlap writes them (the previous step's, which
  // wrote them, is complete before the graph starts; an eager step's launches may overlap the previous step's).
  bool early = false;
  // The cluster chain's RoPE cos / sin per position below kMlaShortMaxLen and pair: [kMlaShortMaxLen, rope / 2] (cos,
  // sin) pairs, 8-byte aligned (mla.cuh mla_rope_table; null: the kernel computes them).
  float const* rope_cs = nullptr;
};

// MlaDecodeArgs::kernel for the whole chain in one launch at short contexts (mla.cuh mla_short_kernel), which takes
// contexts (position + 1) of at most kMlaShortMaxLen tokens.
inline constexpr int kMlaShortKernel = 7;
// The same chain with each head over a cluster of blocks (mla.cuh mla_short_cluster_kernel: each block a quarter of the
// latent columns); where that shape does not fit, kMlaShortKernel's one block per head runs instead.
inline constexpr int kMlaShortClusterKernel = 8;
inline constexpr int kMlaShortMaxLen = 64;

// Split-context layout shared by the attention kernels and the combine: each split takes `mla_chunk` tokens
// (at least `min_chunk`, a multiple of the 32-token tile); splits past the end do nothing.
inline constexpr int kMlaTile = 32;          // tokens per shared-memory tile
inline constexpr int kMlaMinChunk = 256;     // CUDA-core kernel: tokens per split at least
inline constexpr int kMlaMmaMinChunk = 64;   // pipelined tensor-core kernel: short contexts still spread over the SMs
LING_HOST_DEVICE inline std::int64_t mla_chunk(std::int64_t len, int splits, int min_chunk) {
  std::int64_t c = (len + splits - 1) / splits;
  if (c < min_chunk) c = min_chunk;
  return (c + kMlaTile - 1) / kMlaTile * kMlaTile;
}

}  // namespace ling::cuda
