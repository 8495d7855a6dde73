#pragma once
// The model's bridge to the kernels of cuda/linear, moe and router: the model keeps each weight as the checkpoint
// stores it (ModelMatrix: a runtime format, spec §3 bytes) and these launchers map the format to its weight policy,
// then run the same kernels the cuda_ops tests and benchmarks measure (fused input prologue, PDL, persistent grids).
// A matrix whose rows are not whole 16-byte chunks runs the policy's generic (decode-per-element) kernel.
// Also here: the element and chunk decoders (Fmt) and warp dot products used by the embedding and MLA kernels.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdlib>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "ling/cuda/device_common.cuh"
#include "ling/cuda/linear.cuh"
#include "ling/cuda/matvec_wg.cuh"
#include "ling/cuda/moe.cuh"
#include "ling/cuda/router.cuh"
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

// ---- launches: PDL helpers shared with the cuda/linear kernels -------------------------------------------
using kernels::pdl_enabled;
using kernels::pdl_trigger;
using kernels::pdl_wait;
using kernels::prefetch_l2;
using kernels::warp_prefetch;
using kernels::trace_mark;
using kernels::trace_end;
using kernels::kTraceBlocks;
using kernels::kTracePhases;

// Step timeline (CudaModel's LING_TRACE; measurements only): the trace region the next matvec / router / KDA launch
// gets (MoE: launch A's; launch B's follows it), or null.
inline unsigned long long*& trace_next() {
  static thread_local unsigned long long* p = nullptr;
  return p;
}
inline constexpr std::int64_t kTraceRegion = std::int64_t(kTraceBlocks) * kTracePhases;

// Launches `kernel` on `st` (PDL attribute when enabled); throws ling::Error on failure.
template <class... KArgs, class... Args>
inline void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t st, Args const&... args) {
  check(kernels::launch_ex(kernel, grid, block, smem, st, args...), "kernel launch");
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

// ---- input prologues ---------------------------------------------------------------------------------------
using PrologueArgs = InputPrologue;
using Prologue = PrologueKind;

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

// ---- format -> policy ---------------------------------------------------------------------------------------
// Storage elements per row in the checkpoint layout (MXFP4: bytes), and whether rows are whole 16-byte chunks.
inline std::int64_t storage_ld(MatFormat f, std::int64_t cols) { return f == MatFormat::kMxfp4 ? cols / 2 : cols; }
inline bool fast_rows(MatFormat f, std::int64_t cols) { return matrix_storage_bytes(f, 1, cols) % 16 == 0; }
inline bool fast_rows(ModelMatrix const& m) { return m.rows == 0 || fast_rows(m.format, m.cols); }

inline MatrixArgs matrix_args(ModelMatrix const& m, std::int64_t data_stride = 0, std::int64_t scale_stride = 0,
                              std::int32_t count = 1) {
  return MatrixArgs{m.data, m.scales, m.rows, m.cols, storage_ld(m.format, m.cols), data_stride, scale_stride, count};
}

// Calls fn(P{}) with the policy of format f: its fast kernel when `fast`, else Unaligned<P> (generic kernel).
template <class Fn>
inline void with_policy(MatFormat f, bool fast, Fn&& fn) {
  switch (f) {
    case MatFormat::kF32: fast ? fn(quant::F32{}) : fn(kernels::Unaligned<quant::F32>{}); break;
    case MatFormat::kBf16: fast ? fn(quant::Bf16{}) : fn(kernels::Unaligned<quant::Bf16>{}); break;
    case MatFormat::kFp8Block: fast ? fn(quant::Fp8Block{}) : fn(kernels::Unaligned<quant::Fp8Block>{}); break;
    case MatFormat::kFp8Row: fast ? fn(quant::Fp8Row{}) : fn(kernels::Unaligned<quant::Fp8Row>{}); break;
    case MatFormat::kMxfp4: fn(quant::Mxfp4{}); break;  // rows of 32-element blocks: always whole chunks
  }
}

// ---- fused matvec over matrices sharing one input ---------------------------------------------------------------
struct MatvecOut {
  ModelMatrix const* m;
  float* out;
  float const* residual = nullptr;  // may equal out (in-place residual add)
};

// LING_MATVEC_KERNEL=wg: FP8-block matvecs (cols a multiple of 512) on the wgmma kernel with tensor-map copies
// (matvec_wg.cuh); =wgproj: only the launches of 16384 rows or more (the KDA projections); =wgbig: the launches of
// 8 MB or more (also o_proj). A/B measurements.
inline int matvec_wg_mode() {
  static int const mode = [] {
    char const* e = std::getenv("LING_MATVEC_KERNEL");
    std::string const v = e ? e : "";
    return v == "wg" ? 1 : v == "wgproj" ? 2 : v == "wgbig" ? 3 : 0;
  }();
  return mode;
}

// LING_MATVEC_PRELOAD=1: matvecs whose rows fit (~112 KB per SM: o_proj and the MLA dense) on the kernel that copies
// its weights into shared memory before the PDL wait (linear.cuh; measured slower in session 7, so opt-in). Read at
// each enqueue (graph capture), so that one process can run both.
inline bool matvec_preload_enabled() { return env_on("LING_MATVEC_PRELOAD"); }

// The dynamic tail of a block-FP8 matvec (MultiArgs::tail, docs/kernels.md): the last `percent`% of its tasks (at
// most kernels::kMaxTailGroups groups of a block's warps) handed to blocks by tickets from `counter` in the order they
// get there. counter: 0 at rest (the model's; the launches of one stream may share it); percent 0: off. The model sets
// it from LING_MATVEC_TAIL (default 20).
struct MatvecTail {
  unsigned* counter = nullptr;
  int percent = 0;
};

// out_i = W_i · prologue(x) (+ residual_i) for every matrix sharing cols: one launch per distinct (format, layout)
// (one launch in all when the projections share a format, as in the -fp8/-fp4 checkpoints), with `tail` for the
// block-FP8 launches. tokens > 1: x [tokens][cols], out_i and residual_i [tokens][rows_i], the prologue's gate and
// head partials per token likewise (MultiArgs::tokens: each weight row read once for all tokens where the kernel
// takes them, token k's outputs the bits of a one-token call on its rows).
inline void matvec(cudaStream_t st, float const* x, PrologueArgs const& pa, std::initializer_list<MatvecOut> list,
                   MatvecTail const& tail = {}, int tokens = 1) {
  constexpr int kMax = kMaxMultiMatrices;
  require(list.size() <= std::size_t(kMax), ErrorCode::kInternal, "matvec: too many matrices");
  std::int64_t const cols = list.begin()->m->cols;
  require(pa.kind != Prologue::kHeadScale ||
              (pa.head_ss && pa.ss_parts >= 1 && pa.head > 0 && cols % pa.head == 0),
          ErrorCode::kInternal, "matvec: the head-scale prologue needs each head's partial sums");
  bool done[kMax] = {};
  std::size_t i0 = 0;
  for (auto const& first : list) {
    if (done[i0++] || first.m->rows == 0) continue;
    MatFormat const f = first.m->format;
    bool const fast = fast_rows(*first.m);
    with_policy(f, fast, [&](auto p) {
      using P = decltype(p);
      constexpr int NR = kernels::kMatvecRows<P>;
      kernels::MultiArgs a{};
      std::size_t k = 0;
      for (auto const& o : list) {
        std::size_t const idx = k++;
        if (done[idx] || o.m->rows == 0 || o.m->format != f || fast_rows(*o.m) != fast) continue;
        require(o.m->cols == cols, ErrorCode::kInternal, "matvec: matrices differ in cols");
        done[idx] = true;
        int const n = a.count++;
        a.m[n] = matrix_args(*o.m);
        a.out[n] = o.out;
        a.residual[n] = o.residual;
        a.task_begin[n + 1] = a.task_begin[n] + (o.m->rows + NR - 1) / NR;
        a.row_begin[n + 1] = a.row_begin[n] + o.m->rows;
        a.out_ld[n] = o.m->rows;
      }
      a.tokens = tokens;
      a.x_ld = cols;
      a.ss_ld = pa.head_ss && pa.head > 0 ? cols / pa.head * pa.ss_parts : 0;
      a.trace = trace_next();
      if constexpr (std::is_same_v<P, quant::Fp8Block>) {
        if (tail.counter && tail.percent > 0) {
          a.tail = tail.counter;
          a.tail_groups = int(a.task_begin[a.count] * tail.percent / 100 / kernels::kWarps);
        }
        std::int64_t const launch_bytes = a.row_begin[a.count] * cols;
        if (int const wg = matvec_wg_mode();
            wg == 1 || (wg == 2 && a.row_begin[a.count] >= 16384) || (wg == 3 && launch_bytes >= (8 << 20))) {
          cudaError_t const e = kernels::launch_matvec_wg_args<P>(a, x, pa, st);
          if (e != cudaErrorInvalidValue) {  // invalid value: not taken (matvec_wg_supported)
            check(e, "matvec (wgmma)");
            return;
          }
        }
      }
      if (matvec_preload_enabled()) {
        cudaError_t const e = kernels::launch_matvec_preload_args<P>(a, x, pa, st);
        if (e != cudaErrorInvalidValue) {  // invalid value: refused (the rows do not fit, or not a 16-byte row layout)
          check(e, "matvec (preloaded)");
          ++matvec_preload_launches();
          return;
        }
      }
      check(kernels::launch_matvec_args<P>(a, x, pa, {}, st), "matvec");
    });
  }
}

// ---- router: logits with the RMSNorm prologue + grouped top-k by the last block ---------------------------------
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

// logits_only: the launch stops at the logits (no counter); MoE launch A then selects (fused routing).
inline void router(cudaStream_t st, float const* x, PrologueArgs const& pa, ModelMatrix const& w, RouterArgs const& ra,
                   bool logits_only = false) {
  RouterParams p{ra.top_k, ra.n_group, ra.topk_group, ra.scaling, ra.norm_topk_prob};
  can_implement_router(w.rows, p).throw_if_error();
  require(pa.kind != Prologue::kHeadScale, ErrorCode::kUnsupported, "router: the head-scale prologue is not supported for the router input");
  require(w.format == MatFormat::kBf16 || w.format == MatFormat::kF32 || w.format == MatFormat::kFp8Block, ErrorCode::kUnsupported,
          "router: gate.weight in " + std::string(to_string(w.format)) + " (supported: bf16, f32, fp8-block)");
  bool const fast = fast_rows(w);
  with_policy(w.format, fast, [&](auto pol) {
    using P = decltype(pol);
    if constexpr (!(std::is_same_v<P, quant::Bf16> || std::is_same_v<P, quant::F32> || std::is_same_v<P, quant::Fp8Block> ||
                    std::is_same_v<P, kernels::Unaligned<quant::Bf16>> || std::is_same_v<P, kernels::Unaligned<quant::F32>> ||
                    std::is_same_v<P, kernels::Unaligned<quant::Fp8Block>>))
      return;
    else {
    kernels::RouterArgs a{matrix_args(w), ra.bias, ra.logits, logits_only ? nullptr : ra.counter, ra.sel_idx, ra.sel_w,
                          ra.top_k, ra.n_group, ra.topk_group, ra.scaling, ra.norm_topk_prob ? 1 : 0, trace_next()};
    check(kernels::launch_router_keyed(kernels::make_key<P>(), a, x, pa, st), "router");
    }
  });
}


// LING_FUSED_ROUTER=0 keeps the selection in the router launch's last block (A/B measurements).
inline bool fused_router_enabled() {
  static bool const on = !env_off("LING_FUSED_ROUTER");
  return on;
}
// LING_ROUTER_IN_A=0 keeps the router's rows in their own launch when the selection is fused into MoE launch A (A/B
// measurements; CudaModelOptions::router_in_moe is the API switch).
inline bool router_in_a_env() {
  static bool const on = !env_off("LING_ROUTER_IN_A");
  return on;
}

// ---- fused MoE ------------------------------------------------------------------------------------------------
// Experts of one layer live in stacked arrays: gate [E][I, hidden], up [E][I, hidden], down [E][hidden, I]; expert
// e's matrix starts at e * (its bytes). The shared expert (or the dense MLP) is a separate gate / up / down triple,
// possibly in another format.
inline constexpr int kMaxTopK = kMoeMaxTopK;
struct MoeArgs {
  // routed (stacked)
  void const* g_w = nullptr; void const* g_s = nullptr;
  void const* u_w = nullptr; void const* u_s = nullptr;
  void const* dn_w = nullptr; void const* dn_s = nullptr;
  std::int64_t gu_stride_w = 0, gu_stride_s = 0, dn_stride_w = 0, dn_stride_s = 0;  // bytes per expert
  int experts = 0;                                            // stacked experts (ids are checked against it)
  int top_k = 0, inter = 0;                                   // routed I
  int* sel_idx = nullptr; float* sel_w = nullptr;            // the picks: read by the launches, or written by A
  RouterArgs const* route = nullptr;                          // set: launch A selects from route->logits
  // set with route (BF16 rows of whole chunks): launch A computes route->logits itself from these router rows and the
  // MoE's own input (no router launch), meeting at a grid barrier on grid_bar (8 bytes holding zero or a multiple of 2^32
  // at first use: grid_round.hpp; the barrier leaves it at one)
  ModelMatrix const* router = nullptr;
  unsigned long long* grid_bar = nullptr;
  float limit = 0.f;  // routed SwiGLU clamp (0 = none)
  // shared / dense
  void const* sg_w = nullptr; void const* sg_s = nullptr;
  void const* su_w = nullptr; void const* su_s = nullptr;
  void const* sdn_w = nullptr; void const* sdn_s = nullptr;
  int shared_inter = 0;                                       // 0 = no shared expert
  float shared_limit = 0.f;
  int hidden = 0;
  float* act = nullptr;   // [top_k * inter + shared_inter]
  bool skip_a = false, skip_b = false;  // measurements only (CudaModel's LING_SKIP)
};

// Routed experts in BF16, block FP8 or MXFP4 (rows of whole 16-byte chunks); shared expert / dense MLP in BF16 or
// block FP8 (generic kernel when its rows are not whole chunks). Without routed experts (dense MLP) the routed
// format is irrelevant.
inline void moe(cudaStream_t st, float const* x, PrologueArgs const& pa, MoeArgs const& a, MatFormat routed, MatFormat shared,
                float const* residual, float* out) {
  require(a.top_k <= kMaxTopK, ErrorCode::kUnsupported, "moe: num_experts_per_tok > " + std::to_string(kMaxTopK));
  // the MoE kernels stage their input with stage_input<false>, which has no head-scale path (an attention output's)
  require(pa.kind != Prologue::kHeadScale, ErrorCode::kUnsupported, "moe: the head-scale prologue is not supported for the MoE input");
  require(a.top_k > 0 || a.shared_inter > 0, ErrorCode::kInternal, "moe: neither routed nor shared experts");
  if (a.top_k == 0) routed = MatFormat::kMxfp4;
  if (a.shared_inter == 0) shared = MatFormat::kFp8Block;
  require(routed == MatFormat::kBf16 || routed == MatFormat::kFp8Block || routed == MatFormat::kMxfp4, ErrorCode::kUnsupported,
          "moe: routed experts in " + std::string(to_string(routed)) + " (supported: bf16, fp8-block, mxfp4)");
  require(shared == MatFormat::kBf16 || shared == MatFormat::kFp8Block, ErrorCode::kUnsupported,
          "moe: shared expert / dense MLP in " + std::string(to_string(shared)) + " (supported: bf16, fp8-block)");
  require(a.top_k == 0 || (fast_rows(routed, a.hidden) && fast_rows(routed, a.inter)), ErrorCode::kUnsupported,
          "moe: routed expert rows must be whole 16-byte chunks (hidden " + std::to_string(a.hidden) + ", moe_intermediate_size " +
              std::to_string(a.inter) + " in " + std::string(to_string(routed)) + ")");
  bool const shared_fast = a.shared_inter == 0 || (fast_rows(shared, a.hidden) && fast_rows(shared, a.shared_inter));
  kernels::MoeArgs k{};
  if (a.top_k > 0) {
    k.gate = MatrixArgs{a.g_w, a.g_s, a.inter, a.hidden, storage_ld(routed, a.hidden), a.gu_stride_w, a.gu_stride_s, a.experts};
    k.up = MatrixArgs{a.u_w, a.u_s, a.inter, a.hidden, storage_ld(routed, a.hidden), a.gu_stride_w, a.gu_stride_s, a.experts};
    k.down = MatrixArgs{a.dn_w, a.dn_s, a.hidden, a.inter, storage_ld(routed, a.inter), a.dn_stride_w, a.dn_stride_s, a.experts};
  } else {  // dense MLP: no routed slots; the kernels take hidden from these shapes
    k.gate.cols = a.hidden;
    k.down.rows = a.hidden;
  }
  k.has_shared = a.shared_inter > 0 ? 1 : 0;
  if (k.has_shared) {
    k.sgate = MatrixArgs{a.sg_w, a.sg_s, a.shared_inter, a.hidden, storage_ld(shared, a.hidden), 0, 0, 1};
    k.sup = MatrixArgs{a.su_w, a.su_s, a.shared_inter, a.hidden, storage_ld(shared, a.hidden), 0, 0, 1};
    k.sdown = MatrixArgs{a.sdn_w, a.sdn_s, a.hidden, a.shared_inter, storage_ld(shared, a.shared_inter), 0, 0, 1};
  }
  k.idx = a.sel_idx;
  k.weights = a.sel_w;
  if (a.route && a.top_k > 0) {
    k.route = kernels::RouteSel{a.route->logits, a.route->bias, a.route->experts, a.route->top_k, a.route->n_group,
                                a.route->topk_group, a.route->norm_topk_prob ? 1 : 0, a.route->scaling};
    k.sel_idx = a.sel_idx;
    k.sel_w = a.sel_w;
    // LING_ROUTE_AHEAD=0: the selection loads its logits itself (A/B measurements)
    static bool const ahead = !env_off("LING_ROUTE_AHEAD");
    k.route_ahead = ahead ? 1 : 0;
    static bool const ranked = !env_off("LING_ROUTER_RANKED");  // 0: the two-stage selection (A/B measurements)
    k.route.ranked = ranked ? 1 : 0;
    if (a.router) {
      require(a.router->format == MatFormat::kBf16 && fast_rows(*a.router) && a.grid_bar && a.router->rows == a.route->experts,
              ErrorCode::kInternal, "moe: router rows in launch A need a BF16 router of whole 16-byte chunks and a barrier");
      k.router = matrix_args(*a.router);
      k.router_out = a.route->logits;
      k.grid_bar = a.grid_bar;
    }
  }
  k.top_k = a.top_k;
  k.routed_limit = a.limit;
  k.trace_a = trace_next();
  k.trace_b = k.trace_a ? k.trace_a + kTraceRegion : nullptr;
  if (k.trace_a) {  // LING_TRACE_MOEA=1..5: launch A's midpoint (MoeArgs::trace_mid)
    char const* e = std::getenv("LING_TRACE_MOEA");
    k.trace_mid = e ? std::atoi(e) : 0;
  }
  k.shared_limit = a.shared_limit;
  k.pace = kernels::moe_pace_a();
  auto run = [&](auto pe, auto ps) {
    auto const ke = kernels::make_key<decltype(pe)>();
    auto const ks = kernels::make_key<decltype(ps)>();
    if (!a.skip_a) check(kernels::launch_moe_gate_up_keyed(ke, ks, k, x, pa, a.act, st), "moe gate/up");
    if (!a.skip_b) check(kernels::launch_moe_down_keyed(ke, ks, k, a.act, residual, out, st), "moe down");
  };
  auto with_shared = [&](auto pe) {
    if (shared == MatFormat::kBf16) shared_fast ? run(pe, quant::Bf16{}) : run(pe, kernels::Unaligned<quant::Bf16>{});
    else shared_fast ? run(pe, quant::Fp8Block{}) : run(pe, kernels::Unaligned<quant::Fp8Block>{});
  };
  if (routed == MatFormat::kBf16) with_shared(quant::Bf16{});
  else if (routed == MatFormat::kFp8Block) with_shared(quant::Fp8Block{});
  else with_shared(quant::Mxfp4{});
}

// ---- LM head + argmax -------------------------------------------------------------------------------------------
struct ArgmaxArgs {
  unsigned long long* key;           // zero at rest
  unsigned int* counter;             // zero at rest
  int* out_token;                    // argmax written here (next step's input when greedy)
  std::int32_t* position = nullptr;  // when set, the last block advances it: the step's final write
};

inline void head(cudaStream_t st, float const* x, PrologueArgs const& pa, ModelMatrix const& w, float* logits, ArgmaxArgs const& aa) {
  bool const fast = fast_rows(w);
  with_policy(w.format, fast, [&](auto pol) {
    using P = decltype(pol);
    constexpr int NR = kernels::kMatvecRows<P>;
    kernels::MultiArgs a{};
    a.count = 1;
    a.m[0] = matrix_args(w);
    a.out[0] = logits;
    a.task_begin[1] = (w.rows + NR - 1) / NR;
    a.row_begin[1] = w.rows;
    check(kernels::launch_matvec_args<P>(a, x, pa, kernels::ArgmaxArgs{aa.key, aa.counter, aa.out_token, aa.position}, st),
          "lm head");
  });
}

}  // namespace ling::cuda::ops
