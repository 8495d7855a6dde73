#pragma once
// The model's own matrix-vector paths (private to cuda/model.*): a policy-templated warp-per-row matvec over up to
// kMaxSegs matrices sharing one input (fused projections), with input prologues (RMSNorm, per-head gated RMSNorm,
// per-head gate) and a residual epilogue; router + grouped top-k; fused MoE gate/up and down+combine; LM head with
// argmax. Weights are read as stored (spec §3 formats), 16 bytes per lane per load, fp32 accumulation.
// helper "cuda-ops" owns the tuned versions (cuda/linear.hpp, moe.hpp, router.hpp, lm_head.hpp); these are the
// minimal ones the model needs to run end to end.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdlib>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "ling/cuda/device_common.cuh"
#include "ling/cuda/model_weights.hpp"
#include "ling/cuda/runtime.hpp"

namespace ling::cuda::ops {

// ---- formats: chunk = 16 bytes of storage --------------------------------------------------------
template <MatFormat F> struct Fmt;
template <> struct Fmt<MatFormat::kF32> {
  static constexpr int kElems = 4;
  __device__ static float chunk_dot(uint4 v, float const* x) {
    return __uint_as_float(v.x) * x[0] + __uint_as_float(v.y) * x[1] + __uint_as_float(v.z) * x[2] + __uint_as_float(v.w) * x[3];
  }
  __device__ static float scale(void const*, std::int64_t, std::int64_t, std::int64_t, std::int64_t) { return 1.f; }
  __device__ static float at(void const* w, void const*, std::int64_t, std::int64_t cols, std::int64_t r, std::int64_t c) {
    return static_cast<float const*>(w)[r * cols + c];
  }
};
template <> struct Fmt<MatFormat::kBf16> {
  static constexpr int kElems = 8;
  __device__ static float chunk_dot(uint4 v, float const* x) {
    std::uint32_t u[4] = {v.x, v.y, v.z, v.w};
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc += __uint_as_float(u[i] << 16) * x[2 * i] + __uint_as_float(u[i] & 0xFFFF0000u) * x[2 * i + 1];
    }
    return acc;
  }
  __device__ static float scale(void const*, std::int64_t, std::int64_t, std::int64_t, std::int64_t) { return 1.f; }
  __device__ static float at(void const* w, void const*, std::int64_t, std::int64_t cols, std::int64_t r, std::int64_t c) {
    return dev::bf16_to_float(static_cast<std::uint16_t const*>(w)[r * cols + c]);
  }
};
template <> struct Fmt<MatFormat::kFp8Block> {
  static constexpr int kElems = 16;
  __device__ static float chunk_dot(uint4 v, float const* x) {
    std::uint32_t u[4] = {v.x, v.y, v.z, v.w};
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float f[4];
      dev::e4m3x4_to_float(u[i], f);
      acc += f[0] * x[4 * i] + f[1] * x[4 * i + 1] + f[2] * x[4 * i + 2] + f[3] * x[4 * i + 3];
    }
    return acc;
  }
  // chunk c covers columns [16c, 16c+16): one 128-block
  __device__ static float scale(void const* s, std::int64_t, std::int64_t cols, std::int64_t r, std::int64_t c) {
    return static_cast<float const*>(s)[(r >> 7) * ((cols + 127) >> 7) + (c >> 3)];
  }
  __device__ static float at(void const* w, void const* s, std::int64_t, std::int64_t cols, std::int64_t r, std::int64_t c) {
    return to_float(static_cast<E4m3 const*>(w)[r * cols + c]) * static_cast<float const*>(s)[(r / 128) * ((cols + 127) / 128) + c / 128];
  }
};
template <> struct Fmt<MatFormat::kFp8Row> {
  static constexpr int kElems = 16;
  __device__ static float chunk_dot(uint4 v, float const* x) { return Fmt<MatFormat::kFp8Block>::chunk_dot(v, x); }
  __device__ static float scale(void const* s, std::int64_t, std::int64_t, std::int64_t r, std::int64_t) {
    return static_cast<float const*>(s)[r];
  }
  __device__ static float at(void const* w, void const* s, std::int64_t, std::int64_t cols, std::int64_t r, std::int64_t c) {
    return to_float(static_cast<E4m3 const*>(w)[r * cols + c]) * static_cast<float const*>(s)[r];
  }
};
template <> struct Fmt<MatFormat::kMxfp4> {
  static constexpr int kElems = 32;  // 16 bytes = one scale block
  __device__ static float chunk_dot(uint4 v, float const* x) {
    std::uint32_t u[4] = {v.x, v.y, v.z, v.w};
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float f[8];
      dev::e2m1x8_to_float_scaled(u[i], f);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc += f[j] * x[8 * i + j];
    }
    return acc;
  }
  __device__ static float scale(void const* s, std::int64_t, std::int64_t cols, std::int64_t r, std::int64_t c) {
    return dev::ue8m0_to_float(static_cast<std::uint8_t const*>(s)[r * (cols >> 5) + c]) * dev::kE2m1HalfFactor;
  }
  __device__ static float at(void const* w, void const* s, std::int64_t, std::int64_t cols, std::int64_t r, std::int64_t c) {
    std::uint8_t byte = static_cast<std::uint8_t const*>(w)[r * (cols / 2) + c / 2];
    std::uint8_t code = (c & 1) ? std::uint8_t(byte >> 4) : std::uint8_t(byte & 0xF);
    return e2m1_to_float(code) * dev::ue8m0_to_float(static_cast<std::uint8_t const*>(s)[r * (cols / 32) + c / 32]);
  }
};

__device__ __forceinline__ uint4 load_stream(void const* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// ---- programmatic dependent launch (PDL) ------------------------------------------------------------
// Every kernel of the step triggers its dependents at entry (so the next kernel's blocks are scheduled as soon as all
// of this grid's blocks are resident), prefetches into L2 the weights it is about to stream (they depend on no earlier
// kernel), and only then waits for the previous kernel's results. Launched without the PDL attribute (tests, the
// default stream, LING_NO_PDL=1) both instructions are no-ops.
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void prefetch_l2(void const* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
// One warp prefetches `bytes` from p, one 128-byte line per lane per step.
__device__ __forceinline__ void warp_prefetch(void const* p, std::int64_t bytes) {
  for (std::int64_t off = std::int64_t(threadIdx.x & 31) * 128; off < bytes; off += 32 * 128)
    prefetch_l2(static_cast<char const*>(p) + off);
}

inline bool pdl_enabled() {
  static bool const on = [] {
    char const* e = std::getenv("LING_NO_PDL");
    return !(e && *e && *e != '0');
  }();
  return on;
}

// Launches `kernel` on `st`, with programmatic stream serialization when PDL is enabled and the stream is not the
// legacy default stream.
template <class... KArgs, class... Args>
inline void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t st, Args const&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = (pdl_enabled() && st != nullptr) ? 1 : 0;
  check(cudaLaunchKernelEx(&cfg, kernel, KArgs(args)...), "kernel launch");
}

// N dot products (one warp): dot(W_n[row_n, :], x_n) for n < count, all in format F with `cols` columns.
// The loads of all N rows are issued before any arithmetic (memory-level parallelism). Result in every lane.
template <MatFormat F, int N>
__device__ __forceinline__ void warp_dots(void const* const (&w)[N], void const* const (&s)[N], std::int64_t const (&rows)[N],
                                          std::int64_t const (&row)[N], float const* const (&x)[N], int count,
                                          std::int64_t cols, float (&out)[N]) {
  using T = Fmt<F>;
  int const lane = threadIdx.x & 31;
  float acc[N];
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n] = 0.f;
  if (cols % T::kElems == 0) {
    std::int64_t const nchunks = cols / T::kElems;
    std::int64_t const row_bytes = matrix_storage_bytes(F, 1, cols);
    for (std::int64_t c0 = 0; c0 < nchunks; c0 += 64) {
      uint4 v[N][2];
#pragma unroll
      for (int n = 0; n < N; ++n)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          std::int64_t c = c0 + lane + 32 * u;
          if (n < count && c < nchunks)
            v[n][u] = load_stream(static_cast<char const*>(w[n]) + row[n] * row_bytes + c * 16);
        }
#pragma unroll
      for (int n = 0; n < N; ++n)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          std::int64_t c = c0 + lane + 32 * u;
          if (n < count && c < nchunks)
            acc[n] += T::chunk_dot(v[n][u], x[n] + c * T::kElems) * T::scale(s[n], rows[n], cols, row[n], c);
        }
    }
  } else {
#pragma unroll
    for (int n = 0; n < N; ++n)
      if (n < count)
        for (std::int64_t c = lane; c < cols; c += 32) acc[n] += T::at(w[n], s[n], rows[n], cols, row[n], c) * x[n][c];
  }
#pragma unroll
  for (int n = 0; n < N; ++n) out[n] = dev::warp_sum(acc[n]);
}

// ---- input prologues -------------------------------------------------------------------------------
enum class Prologue : int { kPlain = 0, kRmsNorm, kGatedHeadNorm, kHeadGate };
struct PrologueArgs {
  Prologue kind = Prologue::kPlain;
  float const* norm_w = nullptr;  // kRmsNorm: [cols]; kGatedHeadNorm: [head]
  float const* gate = nullptr;    // kGatedHeadNorm: [cols] (sigmoid per channel); kHeadGate: [cols/head]
  int head = 0;
  float eps = 1e-6f;
};

// Fills xs[0..cols) (shared) from x (global) through the prologue. Whole block participates. The loads are
// 16 bytes wide and unrolled so that many are in flight (a plain loop waits one L2 round trip per 256 floats).
__device__ __forceinline__ bool aligned16(void const* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0; }

__device__ inline float stage_input(float const* __restrict__ x, int cols, float* xs) {  // returns this thread's Σx²
  float ss = 0.f;
  if ((cols & 3) == 0 && aligned16(x)) {
    float4 const* x4 = reinterpret_cast<float4 const*>(x);
    float4* s4 = reinterpret_cast<float4*>(xs);
#pragma unroll 4
    for (int i = threadIdx.x; i < cols / 4; i += blockDim.x) {
      float4 v = x4[i];
      s4[i] = v;
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
#pragma unroll 8
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
      float v = x[i];
      xs[i] = v;
      ss += v * v;
    }
  }
  return ss;
}

__device__ inline void load_input(float const* __restrict__ x, int cols, PrologueArgs const& pa, float* xs, float* scratch) {
  switch (pa.kind) {
    case Prologue::kPlain:
      stage_input(x, cols, xs);
      break;
    case Prologue::kRmsNorm: {
      float ss = stage_input(x, cols, xs);
      float inv = rsqrtf(dev::block_sum(ss, scratch) / float(cols) + pa.eps);
#pragma unroll 4
      for (int i = threadIdx.x; i < cols; i += blockDim.x) xs[i] = xs[i] * inv * pa.norm_w[i];
      break;
    }
    case Prologue::kGatedHeadNorm: {  // spec §2 KDA: RMSNorm_V(o_h; o_norm) ⊙ sigmoid(W_g u), per head
      int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
      int const heads = cols / pa.head;
      stage_input(x, cols, xs);
      __syncthreads();
      for (int h = warp; h < heads; h += nwarps) {
        float* xh = xs + h * pa.head;
        float ss = 0.f;
#pragma unroll 4
        for (int i = lane; i < pa.head; i += 32) ss += xh[i] * xh[i];
        float inv = rsqrtf(dev::warp_sum(ss) / float(pa.head) + pa.eps);
#pragma unroll 4
        for (int i = lane; i < pa.head; i += 32) {
          int c = h * pa.head + i;
          xh[i] = xh[i] * inv * pa.norm_w[i] * dev::sigmoidf_(pa.gate[c]);
        }
      }
      break;
    }
    case Prologue::kHeadGate:
      stage_input(x, cols, xs);
      __syncthreads();
#pragma unroll 4
      for (int i = threadIdx.x; i < cols; i += blockDim.x) xs[i] = xs[i] * dev::sigmoidf_(pa.gate[i / pa.head]);
      break;
  }
  __syncthreads();
}

// ---- fused matvec over segments ------------------------------------------------------------------
inline constexpr int kMaxSegs = 6;
inline constexpr int kMatvecThreads = 256;
inline constexpr int kRowsPerWarp = 2;
inline constexpr int kRowsPerBlock = (kMatvecThreads / 32) * kRowsPerWarp;

struct Segment {
  void const* w = nullptr;
  void const* s = nullptr;
  std::int64_t rows = 0;
  float* out = nullptr;
  float const* residual = nullptr;  // may equal out (in-place residual add)
};
struct Segments {
  Segment seg[kMaxSegs];
  int first_block[kMaxSegs + 1] = {};
  int count = 0;
};

template <MatFormat F>
__global__ void __launch_bounds__(kMatvecThreads) matvec_kernel(float const* __restrict__ x, int cols, PrologueArgs pa,
                                                                Segments segs) {
  extern __shared__ float xs[];
  __shared__ float scratch[32];
  pdl_trigger();
  int si = 0;
  while (si + 1 < segs.count && int(blockIdx.x) >= segs.first_block[si + 1]) ++si;
  Segment const& sg = segs.seg[si];
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  std::int64_t const r0 = std::int64_t(int(blockIdx.x) - segs.first_block[si]) * kRowsPerBlock + warp * kRowsPerWarp;
  {
    std::int64_t const rb = matrix_storage_bytes(F, 1, cols);
    std::int64_t const nr = sg.rows - r0 < kRowsPerWarp ? sg.rows - r0 : kRowsPerWarp;
    if (nr > 0) warp_prefetch(static_cast<char const*>(sg.w) + r0 * rb, nr * rb);
  }
  pdl_wait();
  load_input(x, cols, pa, xs, scratch);
  void const* w[kRowsPerWarp];
  void const* s[kRowsPerWarp];
  std::int64_t rows[kRowsPerWarp], row[kRowsPerWarp];
  float const* xp[kRowsPerWarp];
#pragma unroll
  for (int n = 0; n < kRowsPerWarp; ++n) {
    w[n] = sg.w;
    s[n] = sg.s;
    rows[n] = sg.rows;
    row[n] = r0 + n;
    xp[n] = xs;
  }
  int count = int(sg.rows - r0 < kRowsPerWarp ? sg.rows - r0 : kRowsPerWarp);
  if (count <= 0) return;
  float out[kRowsPerWarp];
  warp_dots<F, kRowsPerWarp>(w, s, rows, row, xp, count, cols, out);
  if (lane < count) {
    float v = 0.f;
#pragma unroll
    for (int n = 0; n < kRowsPerWarp; ++n)
      if (n == lane) v = out[n];
    std::int64_t r = r0 + lane;
    if (sg.residual) v += sg.residual[r];
    sg.out[r] = v;
  }
}

inline std::size_t input_smem(int cols) { return std::size_t(cols) * sizeof(float); }

// Raises a kernel's dynamic shared-memory limit once (host call, outside graph capture after the first step).
template <class Kernel>
inline void allow_smem(Kernel k, std::size_t bytes) {
  if (bytes <= 48 * 1024) return;
  static std::unordered_map<void const*, std::size_t> raised;  // per kernel: the limit set so far
  std::size_t& cur = raised[reinterpret_cast<void const*>(k)];
  if (cur >= bytes) return;
  check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)), "smem attribute");
  cur = bytes;
}

struct MatvecOut {
  ModelMatrix const* m;
  float* out;
  float const* residual = nullptr;
};

// out_i = W_i · prologue(x) (+ residual_i) for every matrix sharing cols: one launch per distinct format
// (one launch in all when the projections share a format, as in the -fp8/-fp4 checkpoints).
inline void matvec(cudaStream_t st, float const* x, PrologueArgs const& pa, std::initializer_list<MatvecOut> list) {
  std::int64_t const cols = list.begin()->m->cols;
  bool done[kMaxSegs * 2] = {};
  require(list.size() <= kMaxSegs * 2, ErrorCode::kInternal, "matvec: too many matrices");
  std::size_t i0 = 0;
  for (auto const& first : list) {
    if (done[i0++] || first.m->rows == 0) continue;
    MatFormat const f = first.m->format;
    Segments segs;
    int blocks = 0;
    std::size_t i = 0;
    for (auto const& o : list) {
      std::size_t k = i++;
      if (done[k] || o.m->rows == 0 || o.m->format != f) continue;
      require(o.m->cols == cols, ErrorCode::kInternal, "matvec: matrices differ in cols");
      if (segs.count == kMaxSegs) break;
      done[k] = true;
      segs.seg[segs.count] = Segment{o.m->data, o.m->scales, o.m->rows, o.out, o.residual};
      segs.first_block[segs.count] = blocks;
      blocks += int((o.m->rows + kRowsPerBlock - 1) / kRowsPerBlock);
      ++segs.count;
    }
    segs.first_block[segs.count] = blocks;
    std::size_t smem = input_smem(int(cols));
    switch (f) {
#define LING_MATVEC_CASE(FMT)                                                                      \
  case FMT:                                                                                        \
    allow_smem(matvec_kernel<FMT>, smem);                                                          \
    launch(matvec_kernel<FMT>, blocks, kMatvecThreads, smem, st, x, int(cols), pa, segs);          \
    break;
      LING_MATVEC_CASE(MatFormat::kF32)
      LING_MATVEC_CASE(MatFormat::kBf16)
      LING_MATVEC_CASE(MatFormat::kFp8Block)
      LING_MATVEC_CASE(MatFormat::kFp8Row)
      LING_MATVEC_CASE(MatFormat::kMxfp4)
#undef LING_MATVEC_CASE
    }
    check_launch("matvec");
  }
}

// ---- router: logits (matvec with RMSNorm prologue) + grouped top-k by the last block ----------------
struct RouterArgs {
  float* logits;             // [E]
  float const* bias;         // [E] expert_bias (selection only), may be null
  int experts, n_group, topk_group, top_k;
  bool norm_topk_prob;
  float scaling;
  int* sel_idx;              // [top_k]
  float* sel_w;              // [top_k]
  unsigned int* counter;     // zero at rest; the last block resets it
};

// Spec §2 MoE selection, run by one block of kMatvecThreads threads. Ties go to the lower index.
__device__ inline void router_select(RouterArgs const& ra) {
  extern __shared__ float sm[];  // reuses the input area: >= 2E + n_group floats (checked at launch)
  float* sv = sm;                // s
  float* sb = sm + ra.experts;   // s + bias, then -inf once taken / outside kept groups
  float* gscore = sb + ra.experts;
  __shared__ int kept[64];
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int e = threadIdx.x; e < ra.experts; e += blockDim.x) {
    float s = dev::sigmoidf_(__ldcg(ra.logits + e));
    sv[e] = s;
    sb[e] = s + (ra.bias ? ra.bias[e] : 0.f);
  }
  __syncthreads();
  int const gsize = ra.experts / ra.n_group;
  if (ra.n_group > 1) {
    for (int g = warp; g < ra.n_group; g += nwarps) {  // top-2 sum per group
      float b1 = -FLT_MAX, b2 = -FLT_MAX;
      for (int i = lane; i < gsize; i += 32) {
        float v = sb[g * gsize + i];
        if (v > b1) { b2 = b1; b1 = v; } else if (v > b2) b2 = v;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        float o1 = __shfl_xor_sync(0xffffffffu, b1, o), o2 = __shfl_xor_sync(0xffffffffu, b2, o);
        float n1 = fmaxf(b1, o1), n2 = fmaxf(fminf(b1, o1), fmaxf(b2, o2));
        b1 = n1;
        b2 = n2;
      }
      if (lane == 0) gscore[g] = b1 + (gsize > 1 ? b2 : 0.f);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int g = 0; g < ra.n_group; ++g) kept[g] = 0;
      for (int t = 0; t < ra.topk_group; ++t) {
        int best = -1;
        for (int g = 0; g < ra.n_group; ++g)
          if (!kept[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
        kept[best] = 1;
      }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < ra.experts; e += blockDim.x)
      if (!kept[e / gsize]) sb[e] = -FLT_MAX;
    __syncthreads();
  }
  if (warp == 0) {
    float total = 0.f;
    for (int t = 0; t < ra.top_k; ++t) {
      float best = -INFINITY;
      int bi = 0x7fffffff;
      for (int e = lane; e < ra.experts; e += 32) {
        float v = sb[e];
        if (v > best) { best = v; bi = e; }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
      }
      if (lane == 0) {
        ra.sel_idx[t] = bi;
        ra.sel_w[t] = sv[bi];
        sb[bi] = -INFINITY;
      }
      total += sv[bi];
      __syncwarp();
    }
    if (lane == 0) {
      for (int t = 0; t < ra.top_k; ++t) {
        float w = ra.sel_w[t];
        if (ra.norm_topk_prob) w = w / (total + 1e-20f);
        ra.sel_w[t] = w * ra.scaling;
      }
    }
  }
}

template <MatFormat F>
__global__ void __launch_bounds__(kMatvecThreads) router_kernel(float const* __restrict__ x, int cols, PrologueArgs pa,
                                                                void const* w, void const* s, RouterArgs ra) {
  extern __shared__ float xs[];
  __shared__ float scratch[32];
  __shared__ bool last;
  pdl_trigger();
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  std::int64_t const r0 = std::int64_t(blockIdx.x) * kRowsPerBlock + warp * kRowsPerWarp;
  int count = int(ra.experts - r0 < kRowsPerWarp ? ra.experts - r0 : kRowsPerWarp);
  if (count > 0) warp_prefetch(static_cast<char const*>(w) + r0 * matrix_storage_bytes(F, 1, cols), count * matrix_storage_bytes(F, 1, cols));
  pdl_wait();
  load_input(x, cols, pa, xs, scratch);
  if (count > 0) {
    void const* wp[kRowsPerWarp];
    void const* sp[kRowsPerWarp];
    std::int64_t rows[kRowsPerWarp], row[kRowsPerWarp];
    float const* xp[kRowsPerWarp];
#pragma unroll
    for (int n = 0; n < kRowsPerWarp; ++n) {
      wp[n] = w;
      sp[n] = s;
      rows[n] = ra.experts;
      row[n] = r0 + n;
      xp[n] = xs;
    }
    float out[kRowsPerWarp];
    warp_dots<F, kRowsPerWarp>(wp, sp, rows, row, xp, count, cols, out);
#pragma unroll
    for (int n = 0; n < kRowsPerWarp; ++n)
      if (lane == n && n < count) ra.logits[r0 + n] = out[n];
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(ra.counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  router_select(ra);
  if (threadIdx.x == 0) *ra.counter = 0;
}

inline void router(cudaStream_t st, float const* x, PrologueArgs const& pa, ModelMatrix const& w, RouterArgs const& ra) {
  int blocks = int((w.rows + kRowsPerBlock - 1) / kRowsPerBlock);
  std::size_t smem = std::max(input_smem(int(w.cols)), std::size_t(2 * ra.experts + ra.n_group) * sizeof(float));
  require(ra.n_group <= 64 && ra.top_k <= 64, ErrorCode::kUnsupported, "router: n_group and top_k must be <= 64");
  switch (w.format) {
#define LING_ROUTER_CASE(FMT)                                                                           \
  case FMT:                                                                                             \
    allow_smem(router_kernel<FMT>, smem);                                                               \
    launch(router_kernel<FMT>, blocks, kMatvecThreads, smem, st, x, int(w.cols), pa, w.data, w.scales, ra); \
    break;
    LING_ROUTER_CASE(MatFormat::kF32)
    LING_ROUTER_CASE(MatFormat::kBf16)
    LING_ROUTER_CASE(MatFormat::kFp8Block)
    LING_ROUTER_CASE(MatFormat::kFp8Row)
    LING_ROUTER_CASE(MatFormat::kMxfp4)
#undef LING_ROUTER_CASE
  }
  check_launch("router");
}

// ---- fused MoE ------------------------------------------------------------------------------------
// Experts of one layer live in stacked arrays: gate [E][I, hidden], up [E][I, hidden], down [E][hidden, I];
// expert e's matrix starts at e * (its bytes). The shared expert (or the dense MLP) is a separate gate / up / down
// triple, possibly in another format.
inline constexpr int kMaxTopK = 16;
struct MoeArgs {
  // routed (stacked)
  void const* g_w = nullptr; void const* g_s = nullptr;
  void const* u_w = nullptr; void const* u_s = nullptr;
  void const* dn_w = nullptr; void const* dn_s = nullptr;
  std::int64_t gu_stride_w = 0, gu_stride_s = 0, dn_stride_w = 0, dn_stride_s = 0;  // bytes per expert
  int top_k = 0, inter = 0;                                   // routed I
  int const* sel_idx = nullptr; float const* sel_w = nullptr;
  float limit = 0.f;                                          // routed SwiGLU clamp (0 = none)
  // shared / dense
  void const* sg_w = nullptr; void const* sg_s = nullptr;
  void const* su_w = nullptr; void const* su_s = nullptr;
  void const* sdn_w = nullptr; void const* sdn_s = nullptr;
  int shared_inter = 0;                                       // 0 = no shared expert
  float shared_limit = 0.f;
  int hidden = 0;
  float* act = nullptr;   // [top_k * inter + shared_inter]
};

__device__ __forceinline__ float swiglu(float a, float b, float limit) {
  float s = dev::siluf_(a);
  if (limit > 0.f) {
    s = fminf(s, limit);
    b = fminf(fmaxf(b, -limit), limit);
  }
  return s * b;
}

inline constexpr int kMoeRowsPerWarp = 1;  // a warp does one gate row and its up row: 2 dots in flight

template <MatFormat FR, MatFormat FS>
__global__ void __launch_bounds__(kMatvecThreads) moe_gate_up_kernel(float const* __restrict__ x, PrologueArgs pa, MoeArgs a,
                                                                     int routed_blocks) {
  extern __shared__ float xs[];
  __shared__ float scratch[32];
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wpb = kMatvecThreads / 32;
  bool const routed = int(blockIdx.x) < routed_blocks;
  pdl_trigger();
  if (!routed) {  // the shared expert's rows are known before the router finishes
    std::int64_t const rr = std::int64_t(int(blockIdx.x) - routed_blocks) * wpb + warp;
    std::int64_t const rb = matrix_storage_bytes(FS, 1, a.hidden);
    if (rr < a.shared_inter) {
      warp_prefetch(static_cast<char const*>(a.sg_w) + rr * rb, rb);
      warp_prefetch(static_cast<char const*>(a.su_w) + rr * rb, rb);
    }
  }
  pdl_wait();
  load_input(x, a.hidden, pa, xs, scratch);
  float dots[2];
  std::int64_t r;
  float* dst;
  float limit;
  if (routed) {
    int const bpe = (a.inter + wpb - 1) / wpb;  // blocks per expert slot
    int const slot = int(blockIdx.x) / bpe;
    r = std::int64_t(int(blockIdx.x) % bpe) * wpb + warp;
    if (r >= a.inter) return;
    int const e = a.sel_idx[slot];
    void const* w[2] = {static_cast<char const*>(a.g_w) + e * a.gu_stride_w, static_cast<char const*>(a.u_w) + e * a.gu_stride_w};
    void const* s[2] = {static_cast<char const*>(a.g_s) + e * a.gu_stride_s, static_cast<char const*>(a.u_s) + e * a.gu_stride_s};
    std::int64_t rows[2] = {a.inter, a.inter}, row[2] = {r, r};
    float const* xp[2] = {xs, xs};
    warp_dots<FR, 2>(w, s, rows, row, xp, 2, a.hidden, dots);
    dst = a.act + std::int64_t(slot) * a.inter;
    limit = a.limit;
  } else {
    r = std::int64_t(int(blockIdx.x) - routed_blocks) * wpb + warp;
    if (r >= a.shared_inter) return;
    void const* w[2] = {a.sg_w, a.su_w};
    void const* s[2] = {a.sg_s, a.su_s};
    std::int64_t rows[2] = {a.shared_inter, a.shared_inter}, row[2] = {r, r};
    float const* xp[2] = {xs, xs};
    warp_dots<FS, 2>(w, s, rows, row, xp, 2, a.hidden, dots);
    dst = a.act + std::int64_t(a.top_k) * a.inter;
    limit = a.shared_limit;
  }
  if (lane == 0) dst[r] = swiglu(dots[0], dots[1], limit);
}

// out[r] = residual[r] + Σ_j w_j · down_{e_j}[r] · act_j + down_shared[r] · act_shared
template <MatFormat FR, MatFormat FS>
__global__ void __launch_bounds__(kMatvecThreads) moe_down_kernel(MoeArgs a, float const* residual, float* out) {
  extern __shared__ float acts[];
  pdl_trigger();
  {
    std::int64_t const rr = std::int64_t(blockIdx.x) * (kMatvecThreads / 32) + (threadIdx.x >> 5);
    std::int64_t const rb = matrix_storage_bytes(FS, 1, a.shared_inter);
    if (a.shared_inter > 0 && rr < a.hidden) warp_prefetch(static_cast<char const*>(a.sdn_w) + rr * rb, rb);
  }
  pdl_wait();
  int const total = a.top_k * a.inter + a.shared_inter;
  stage_input(a.act, total, acts);
  __syncthreads();
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  std::int64_t const r = std::int64_t(blockIdx.x) * (kMatvecThreads / 32) + warp;
  if (r >= a.hidden) return;
  float acc = 0.f;
  if (a.top_k > 0) {
    void const* w[kMaxTopK / 2];
    void const* s[kMaxTopK / 2];
    std::int64_t rows[kMaxTopK / 2], row[kMaxTopK / 2];
    float const* xp[kMaxTopK / 2];
    for (int j0 = 0; j0 < a.top_k; j0 += kMaxTopK / 2) {
      int cnt = a.top_k - j0 < kMaxTopK / 2 ? a.top_k - j0 : kMaxTopK / 2;
#pragma unroll
      for (int n = 0; n < kMaxTopK / 2; ++n) {
        int j = j0 + (n < cnt ? n : 0);
        int e = a.sel_idx[j];
        w[n] = static_cast<char const*>(a.dn_w) + e * a.dn_stride_w;
        s[n] = static_cast<char const*>(a.dn_s) + e * a.dn_stride_s;
        rows[n] = a.hidden;
        row[n] = r;
        xp[n] = acts + std::int64_t(j) * a.inter;
      }
      float d[kMaxTopK / 2];
      warp_dots<FR, kMaxTopK / 2>(w, s, rows, row, xp, cnt, a.inter, d);
#pragma unroll
      for (int n = 0; n < kMaxTopK / 2; ++n)
        if (n < cnt) acc += a.sel_w[j0 + n] * d[n];
    }
  }
  if (a.shared_inter > 0) {
    void const* w[1] = {a.sdn_w};
    void const* s[1] = {a.sdn_s};
    std::int64_t rows[1] = {a.hidden}, row[1] = {r};
    float const* xp[1] = {acts + std::int64_t(a.top_k) * a.inter};
    float d[1];
    warp_dots<FS, 1>(w, s, rows, row, xp, 1, a.shared_inter, d);
    acc += d[0];
  }
  if (lane == 0) out[r] = (residual ? residual[r] : 0.f) + acc;
}

template <MatFormat FR, MatFormat FS>
inline void moe_launch(cudaStream_t st, float const* x, PrologueArgs const& pa, MoeArgs const& a, float const* residual, float* out) {
  int const wpb = kMatvecThreads / 32;
  int routed_blocks = a.top_k > 0 ? a.top_k * ((a.inter + wpb - 1) / wpb) : 0;
  int shared_blocks = a.shared_inter > 0 ? (a.shared_inter + wpb - 1) / wpb : 0;
  std::size_t smem1 = input_smem(a.hidden);
  allow_smem(moe_gate_up_kernel<FR, FS>, smem1);
  launch(moe_gate_up_kernel<FR, FS>, routed_blocks + shared_blocks, kMatvecThreads, smem1, st, x, pa, a, routed_blocks);
  check_launch("moe gate/up");
  std::size_t smem2 = std::size_t(a.top_k * a.inter + a.shared_inter) * sizeof(float);
  allow_smem(moe_down_kernel<FR, FS>, smem2);
  launch(moe_down_kernel<FR, FS>, (a.hidden + wpb - 1) / wpb, kMatvecThreads, smem2, st, a, residual, out);
  check_launch("moe down");
}

template <class F>
inline void dispatch_format(MatFormat f, F&& fn) {
  switch (f) {
    case MatFormat::kF32: fn(std::integral_constant<MatFormat, MatFormat::kF32>{}); break;
    case MatFormat::kBf16: fn(std::integral_constant<MatFormat, MatFormat::kBf16>{}); break;
    case MatFormat::kFp8Block: fn(std::integral_constant<MatFormat, MatFormat::kFp8Block>{}); break;
    case MatFormat::kFp8Row: fn(std::integral_constant<MatFormat, MatFormat::kFp8Row>{}); break;
    case MatFormat::kMxfp4: fn(std::integral_constant<MatFormat, MatFormat::kMxfp4>{}); break;
  }
}

// Routed experts in BF16, block FP8 or MXFP4; shared expert / dense MLP in BF16 or block FP8 (the formats of the
// checkpoints; fewer kernel instantiations). Without routed experts (dense MLP) the routed format is irrelevant.
inline void moe(cudaStream_t st, float const* x, PrologueArgs const& pa, MoeArgs const& a, MatFormat routed, MatFormat shared,
                float const* residual, float* out) {
  require(a.top_k <= kMaxTopK, ErrorCode::kUnsupported, "moe: top_k > 16");
  if (a.top_k == 0) routed = MatFormat::kMxfp4;
  if (a.shared_inter == 0) shared = MatFormat::kFp8Block;
  require(routed == MatFormat::kBf16 || routed == MatFormat::kFp8Block || routed == MatFormat::kMxfp4, ErrorCode::kUnsupported,
          "moe: routed experts in " + std::string(to_string(routed)) + " (supported: bf16, fp8-block, mxfp4)");
  require(shared == MatFormat::kBf16 || shared == MatFormat::kFp8Block, ErrorCode::kUnsupported,
          "moe: shared expert / dense MLP in " + std::string(to_string(shared)) + " (supported: bf16, fp8-block)");
  auto with_shared = [&](auto fr) {
    if (shared == MatFormat::kBf16) moe_launch<decltype(fr)::value, MatFormat::kBf16>(st, x, pa, a, residual, out);
    else moe_launch<decltype(fr)::value, MatFormat::kFp8Block>(st, x, pa, a, residual, out);
  };
  if (routed == MatFormat::kBf16) with_shared(std::integral_constant<MatFormat, MatFormat::kBf16>{});
  else if (routed == MatFormat::kFp8Block) with_shared(std::integral_constant<MatFormat, MatFormat::kFp8Block>{});
  else with_shared(std::integral_constant<MatFormat, MatFormat::kMxfp4>{});
}

// ---- LM head + argmax -------------------------------------------------------------------------------
struct ArgmaxArgs {
  float* block_best;      // [blocks]
  int* block_idx;         // [blocks]
  int* out_token;         // argmax written here (next step's input when greedy)
  unsigned int* counter;  // zero at rest
  std::int32_t* position = nullptr;  // when set, the last block advances it: the step's final write
};

template <MatFormat F>
__global__ void __launch_bounds__(kMatvecThreads) head_kernel(float const* __restrict__ x, int cols, PrologueArgs pa,
                                                              void const* w, void const* s, std::int64_t vocab,
                                                              float* logits, ArgmaxArgs aa) {
  extern __shared__ float xs[];
  __shared__ float scratch[32];
  __shared__ float wbest[32];
  __shared__ int widx[32];
  __shared__ bool last;
  pdl_trigger();
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  std::int64_t const r0 = std::int64_t(blockIdx.x) * kRowsPerBlock + warp * kRowsPerWarp;
  int count = int(vocab - r0 < kRowsPerWarp ? vocab - r0 : kRowsPerWarp);
  if (count > 0) warp_prefetch(static_cast<char const*>(w) + r0 * matrix_storage_bytes(F, 1, cols), count * matrix_storage_bytes(F, 1, cols));
  pdl_wait();
  load_input(x, cols, pa, xs, scratch);
  float best = -INFINITY;
  int bi = 0x7fffffff;
  if (count > 0) {
    void const* wp[kRowsPerWarp];
    void const* sp[kRowsPerWarp];
    std::int64_t rows[kRowsPerWarp], row[kRowsPerWarp];
    float const* xp[kRowsPerWarp];
#pragma unroll
    for (int n = 0; n < kRowsPerWarp; ++n) {
      wp[n] = w;
      sp[n] = s;
      rows[n] = vocab;
      row[n] = r0 + n;
      xp[n] = xs;
    }
    float out[kRowsPerWarp];
    warp_dots<F, kRowsPerWarp>(wp, sp, rows, row, xp, count, cols, out);
#pragma unroll
    for (int n = 0; n < kRowsPerWarp; ++n)
      if (n < count) {
        if (lane == n) logits[r0 + n] = out[n];
        if (out[n] > best) { best = out[n]; bi = int(r0 + n); }
      }
  }
  if (lane == 0) { wbest[warp] = best; widx[warp] = bi; }
  __syncthreads();
  if (threadIdx.x == 0) {
    float b = -INFINITY;
    int i = 0x7fffffff;
    for (int k = 0; k < nwarps; ++k)
      if (wbest[k] > b || (wbest[k] == b && widx[k] < i)) { b = wbest[k]; i = widx[k]; }
    aa.block_best[blockIdx.x] = b;
    aa.block_idx[blockIdx.x] = i;
    __threadfence();
    last = atomicAdd(aa.counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  float b = -INFINITY;
  int i = 0x7fffffff;
  for (int k = threadIdx.x; k < int(gridDim.x); k += blockDim.x) {
    float v = __ldcg(aa.block_best + k);
    int vi = __ldcg(aa.block_idx + k);
    if (v > b || (v == b && vi < i)) { b = v; i = vi; }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, b, o);
    int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > b || (ov == b && oi < i)) { b = ov; i = oi; }
  }
  if (lane == 0) { wbest[warp] = b; widx[warp] = i; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 0; k < nwarps; ++k)
      if (wbest[k] > b || (wbest[k] == b && widx[k] < i)) { b = wbest[k]; i = widx[k]; }
    *aa.out_token = i;
    *aa.counter = 0;
    if (aa.position) *aa.position += 1;
  }
}

inline int head_blocks(std::int64_t vocab) { return int((vocab + kRowsPerBlock - 1) / kRowsPerBlock); }

inline void head(cudaStream_t st, float const* x, PrologueArgs const& pa, ModelMatrix const& w, float* logits, ArgmaxArgs const& aa) {
  std::size_t smem = input_smem(int(w.cols));
  dispatch_format(w.format, [&](auto f) {
    constexpr MatFormat F = decltype(f)::value;
    allow_smem(head_kernel<F>, smem);
    launch(head_kernel<F>, head_blocks(w.rows), kMatvecThreads, smem, st, x, int(w.cols), pa, w.data, w.scales, w.rows, logits, aa);
  });
  check_launch("lm head");
}

}  // namespace ling::cuda::ops
