#pragma once
// The KDA mixer of one decode token in one launch per layer (up to o_proj): a head's q, k, v, f, g projection rows and
// its β row, then its KDA step, on kKdaFusedSplit blocks per head.
//
// Why: every KDA projection row belongs to one head (spec §2, full-rank f/g), and the step of head h needs only head
// h's rows. The usual step (kda.cuh) runs after the projections launch as a launch of its own, so each KDA layer waits
// twice for a whole grid (the projections' last row, the step's last block). Here the blocks of a head move on as soon
// as that head's rows are done.
//
// Block c of head h computes the rows of channels [c·CW, (c+1)·CW) of q, k, v, f and g (CW = K / split) and the
// head's β row (every block, one row), one row per warp task as the lane kernel does (linear.cuh matvec_lane_kernel:
// the same loads, decoder and sums, so the same projection bits), 24 warps on one SM. Its channel constants land in
// shared memory by cp.async before the PDL wait; its rows of the state (K × CW columns, fp32) and its conv ring slots
// after the input's staging, in flight with the rows (before the wait, KdaFusedArgs::early, the blocks left their
// wait up to 8 µs late on the H100: the copies queued behind the launch before). Then:
//   1. each block publishes its channels' q and k (after the conv and SiLU) and decay to global memory and counts
//      itself in on the head's counter (KdaFusedArgs::sync: it only grows, by `split` per step); once the head's four
//      are in, every block gathers the head's whole q, k and decay in block order, so all four compute the same norms;
//   2. block c updates its state columns (8 warps, lane = column) and writes o ⊙ o_norm ⊙ sigmoid(g) and the partial
//      Σ o² of its columns, as the usual step does (KdaStepArgs::out_gate, o_ss): o_proj scales each head
//      (PrologueKind::kHeadScale).
// The exchange spins, so the whole grid must be resident at once: one block per SM (768 threads at up to 80
// registers), heads · split blocks at most the SMs (kda_fused_fits_gpu). A first version exchanged through
// distributed shared memory in clusters of 4 blocks of 12 warps (2 per SM): its rows took 25 µs against the lane
// kernel's 15 (H100, docs/performance.md session 45). The exchange's counters and the step's state loops follow the
// acquire/release pattern and rolled loops (the code after the exchange runs cold once per launch).
//
// Where it runs (kda_fused_fits): block-FP8 projections whose rows are whole 16-byte chunks (Ling-3.0-flash's 2560
// columns, or up to 1024), head_dim 16, 32, 64 or 128, conv kernel 4. CudaModel's LING_KDA_FUSED selects it.
#include <cstdint>
#include <string>

#include "ling/cuda/kda.cuh"
#include "ling/cuda/linear.cuh"
#include "ling/cuda/model_ops.cuh"

namespace ling::cuda {

inline constexpr int kKdaFusedSplit = 4;
inline constexpr int kKdaFusedWarps = 24;
inline constexpr int kKdaFusedThreads = 32 * kKdaFusedWarps;
inline constexpr int kKdaFusedStateWarps = 8;  // the step's warps: lane = column, warp w takes rows w + 8 j
inline constexpr int kKdaFusedMaxK = 128;
inline constexpr int kKdaFusedConv = 4;
inline constexpr int kKdaFusedSyncStride = 32;  // unsigned counters per head: one 128-byte line each

struct KdaFusedArgs {
  MatrixArgs m[6];                      // q, k, v, f, g ([P, cols]) and b ([H, cols]): block FP8, one ld
  float const* x = nullptr;             // the residual stream [cols]
  InputPrologue pro;                    // its RMSNorm (input_layernorm)
  KdaStepArgs s;                        // dims, gate, conv_w, a_log, dt_bias, ring, state, position, state_before_wait;
                                        // s.out_norm_w (o_norm.weight [K]); s.o: the output [P] (o ⊙ o_norm ⊙
                                        // sigmoid(g)); s.o_ss: [H, kda_fused_ss_parts(K)] the Σ o² partials
  unsigned* sync = nullptr;  // [H, kKdaFusedSyncStride] the heads' counters (zero at start; each step adds split)
  // measurements (CudaModel's LING_KDA_FUSED_EARLY, _MID): early, the state's copies before the PDL wait (with
  // s.state_before_wait) instead of after the staging; mid, the trace's midpoint: 0 the exchange done, 1 the head's
  // q, k, decay loaded, 2 the state's partials summed
  int early = 0, mid = 0;
  float* xch = nullptr;                 // [H, 3K] the exchange: q, k, decay of the head, each block its channels
  unsigned long long* trace = nullptr;  // step timeline region (measurements), or null
};

// Shared memory of one block, in floats from the dynamic base (every piece 16-byte aligned).
struct KdaFusedSmem {
  int xs, st, ring, cw, dtb, onw, res, full, vs, og, red, total;
  __host__ __device__ static constexpr int up4(int n) { return (n + 3) & ~3; }
  __host__ __device__ static KdaFusedSmem make(int staged_floats, int K) {
    int const CW = K / kKdaFusedSplit;
    KdaFusedSmem s{};
    int o = 0;
    s.xs = o, o += up4(staged_floats);
    s.st = o, o += K * CW;
    s.ring = o, o += kKdaFusedConv * 3 * CW;
    s.cw = o, o += 3 * CW * kKdaFusedConv;
    s.dtb = o, o += up4(CW);
    s.onw = o, o += up4(CW);
    s.res = o, o += up4(5 * CW + 1);
    s.full = o, o += 3 * K;           // the head's q, k, decay
    s.vs = o, o += up4(CW);
    s.og = o, o += up4(CW);
    s.red = o, o += 2 * kKdaFusedStateWarps * 32;
    s.total = o;
    return s;
  }
};

// Σ o² partials per head of the fused launch: 16-column parts, or one per block where a block has fewer columns.
__host__ __device__ constexpr int kda_fused_ss_parts(int head_dim) {
  return head_dim / kKdaFusedSplit < kKdaSsCols ? kKdaFusedSplit : head_dim / kKdaSsCols;
}

namespace kernels {

__device__ __forceinline__ unsigned atom_add_release_gpu(unsigned* p, unsigned v) {
  unsigned old;
  asm volatile("atom.add.release.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

__device__ __forceinline__ unsigned ld_acquire_gpu(unsigned const* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Row of the block's task t (t < 5 CW: matrix t / CW, channel c·CW + t mod CW of head h; t = 5 CW: b's row h).
__device__ __forceinline__ int kda_fused_row(int t, int CW, int K, int h, int c, std::int64_t& row) {
  int const n = t / CW;
  row = n < 5 ? std::int64_t(h) * K + std::int64_t(c) * CW + (t - n * CW) : h;
  return n;
}

// Matrix n's arguments without indexing the parameter array by a register (which puts the whole parameter block on
// the stack): the pointers by selects; the matrices share rows' layout (kda_fused_fits).
__device__ __forceinline__ MatrixArgs kda_fused_matrix(KdaFusedArgs const& a, int n) {
  MatrixArgs m = a.m[0];
#pragma unroll
  for (int j = 1; j < 6; ++j)
    if (n == j) m.data = a.m[j].data, m.scales = a.m[j].scales;
  return m;
}

template <int kU, bool kFull>
__global__ void __launch_bounds__(kKdaFusedThreads, 1) kda_fused_kernel(KdaFusedArgs a) {
  using P = quant::Fp8Block;
  constexpr int R = kKdaFusedConv, C = kKdaFusedSplit, NW = kKdaFusedWarps;
  extern __shared__ float4 smem_f4[];
  float* const sm = reinterpret_cast<float*>(smem_f4);
  KdaStepArgs const& s = a.s;
  int const K = s.head_dim, V = K, CW = K / C, H = s.heads;
  std::int64_t const Pw = std::int64_t(H) * K;
  int const tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  int const c = int(blockIdx.x) % C, h = int(blockIdx.x) / C;  // head h: blocks C h .. C h + C - 1
  KdaFusedSmem const L = KdaFusedSmem::make(xs_floats(staged_elems<P>(a.m[0])), K);
  float* const xs = sm + L.xs;
  float* const res = sm + L.res;
  int const n_tasks = 5 * CW + 1;
  int const nchunks = int(a.m[0].ld / 16);
  int const row_lines = int((a.m[0].ld + 127) / 128);
  pdl_trigger();
  trace_mark(a.trace, 0);

  // The first row into registers, the second and third into L2: weights, written by no earlier launch.
  LaneRow<kU> r0, r1;
  int n0 = 0;
  std::int64_t row0 = 0;
  auto l2_row = [&](int t) {
    if (t >= n_tasks) return;
    std::int64_t row;
    int const n = kda_fused_row(t, CW, K, h, c, row);
    if (lane < row_lines)
      prefetch_l2(static_cast<char const*>(kda_fused_matrix(a, n).data) + row * a.m[0].ld + 128 * lane);
  };
  if (warp < n_tasks) {
    n0 = kda_fused_row(warp, CW, K, h, c, row0);
    lane_row_load<P, kU, kFull>(r0, kda_fused_matrix(a, n0), row0, lane, nchunks);
  }
  l2_row(warp + NW);
  l2_row(warp + 2 * NW);

  // Channel constants (weights) now; the state, the ring slots and the position where the caller allows it.
  std::int64_t const ch0 = std::int64_t(h) * K + std::int64_t(c) * CW;  // this block's first channel in [0, P)
  int const cq = CW / 4;                                                // 16-byte pieces per channel span
  for (int i = tid; i < 3 * cq * R; i += kKdaFusedThreads) {            // conv_w rows of q, k, v: CW · R floats each
    int const n = i / (cq * R), j = i - n * cq * R;
    cp_async16(sm + L.cw + n * CW * R + 4 * j, s.conv_w + (n * Pw + ch0) * R + 4 * j);
  }
  if (tid < cq)
    cp_async16(sm + L.dtb + 4 * tid, s.dt_bias + ch0 + 4 * tid);
  else if (tid < 2 * cq)
    cp_async16(sm + L.onw + 4 * (tid - cq), s.out_norm_w + c * CW + 4 * (tid - cq));
  float const alog = s.a_log[h];
  float* const S = s.state + std::int64_t(h) * K * V + std::int64_t(c) * CW;
  auto load_state = [&] {
    for (int i = tid; i < K * cq; i += kKdaFusedThreads) {
      int const k = i / cq, j = i - k * cq;
      cp_async16(sm + L.st + k * CW + 4 * j, S + std::int64_t(k) * V + 4 * j);
    }
    for (int i = tid; i < R * 3 * cq; i += kKdaFusedThreads) {  // slot j, matrix n: CW floats
      int const sl = i / (3 * cq), n = (i / cq) % 3, j = i % cq;
      cp_async16(sm + L.ring + (sl * 3 + n) * CW + 4 * j, s.ring + std::int64_t(sl) * 3 * Pw + n * Pw + ch0 + 4 * j);
    }
  };
  std::int64_t pos = 0;
  bool const early = s.state_before_wait && a.early;
  if (early) load_state();
  if (s.state_before_wait) pos = *s.position;
  cp_async_commit();
  prologue_prefetch(a.pro, a.m[0].cols);
  pdl_wait();
  trace_mark(a.trace, 1);
  if (!s.state_before_wait) pos = *s.position;
  // a copy: stage_input's out-of-line path takes the prologue by reference, which would put the whole parameter block
  // on the stack
  InputPrologue const pro = a.pro;
  stage_input(xs, a.x, a.m[0].cols, staged_elems<P>(a.m[0]), pro);
  __syncthreads();
  if (!early) {  // the state's copies in flight with the rows
    load_state();
    cp_async_commit();
  }

  // The rows: two register sets in turn, the row after next into L2.
  float const* const xl = xs + xpad(16 * lane);
  auto load = [&](int t, LaneRow<kU>& Lr) {
    std::int64_t row;
    int const n = kda_fused_row(t, CW, K, h, c, row);
    lane_row_load<P, kU, kFull>(Lr, kda_fused_matrix(a, n), row, lane, nchunks);
    l2_row(t + 2 * NW);
  };
  auto finish = [&](int t, LaneRow<kU> const& Lr) {
    float acc = 0.f;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (kFull || lane + 32 * u < nchunks) {
        uint4 const vv[1] = {Lr.v[u]};
        float d[1];
        FastOps<P>::template dot<1>(vv, xl + 576 * u, d);
        acc = fmaf(Lr.sc[u], d[0], acc);
      }
    }
    float const v = warp_sum(acc) * FastOps<P>::kPost;
    if (lane == 0) res[t] = v;
  };
  for (int t = warp; t < n_tasks;) {
    int tn = t + NW;
    if (tn < n_tasks) load(tn, r1);
    finish(t, r0);
    t = tn;
    if (t >= n_tasks) break;
    tn = t + NW;
    if (tn < n_tasks) load(tn, r0);
    finish(t, r1);
    t = tn;
  }
  cp_async_wait(0);
  __syncthreads();  // the rows' outputs and every copy, visible to the block

  // Conv + SiLU of this block's q, k, v channels (raw inputs into the ring), decay from f, the output gate from g.
  float* const pub = a.xch + std::int64_t(h) * 3 * K;  // [3][K]: q, k, decay of the head, each block its CW
  int const slot = int(pos % R);
  if (tid < 3 * CW) {
    int const n = tid / CW, i = tid - n * CW;
    float w[R], rg[R];
#pragma unroll
    for (int j = 0; j < R; ++j) {
      w[j] = sm[L.cw + (n * CW + i) * R + j];
      rg[j] = sm[L.ring + (j * 3 + n) * CW + i];
    }
    float const xr = res[n * CW + i];
    float const y = kda_conv<R>(w, xr, rg, pos, slot);
    if (n < 2)
      pub[n * K + c * CW + i] = y;
    else
      sm[L.vs + i] = y;
    s.ring[std::int64_t(slot) * 3 * Pw + n * Pw + ch0 + i] = xr;  // slot t mod R: not read for position t
  } else if (tid < 4 * CW) {
    int const i = tid - 3 * CW;
    float const x = res[3 * CW + i] + sm[L.dtb + i];
    float const g = s.safe_gate ? s.lower_bound * dev::sigmoidf_(__expf(alog) * x) : -__expf(alog) * dev::softplusf_(x);
    pub[2 * K + c * CW + i] = __expf(g);
  } else if (tid < 5 * CW) {
    int const i = tid - 4 * CW;
    sm[L.og + i] = gate_sigmoid(res[4 * CW + i]);
  }
  float const beta = dev::sigmoidf_(res[5 * CW]);
  // The exchange: this block's stores, then its count on the head's counter (a release: the barrier orders every
  // thread's stores before it); then the head's other blocks' counts (an acquire, then the barrier for the block).
  __syncthreads();
  if (tid == 0) {
    unsigned* const cnt = a.sync + std::int64_t(h) * kKdaFusedSyncStride;
    unsigned const old = atom_add_release_gpu(cnt, 1u);
    unsigned const target = (old - old % unsigned(C)) + unsigned(C);
    while (int(ld_acquire_gpu(cnt) - target) < 0) {
    }
  }
  __syncthreads();
  if (a.mid == 0) trace_mark_max(a.trace, 2);
  float* const full = sm + L.full;  // [3][K]: q, k, decay of the head
  for (int i = tid; i < 3 * K; i += kKdaFusedThreads) full[i] = __ldcg(pub + i);
  __syncthreads();
  if (a.mid == 1) trace_mark_max(a.trace, 2);

  // Σq², Σk², Σqk of the head in one fixed order (every warp, every block: the same values).
  float sq = 0.f, sk = 0.f, skq = 0.f;
  for (int k = lane; k < K; k += 32) {
    float const q = full[k], kk = full[K + k];
    sq = fmaf(q, q, sq);
    sk = fmaf(kk, kk, sk);
    skq = fmaf(kk, q, skq);
  }
  sq = warp_sum(sq), sk = warp_sum(sk), skq = warp_sum(skq);
  float const rq = rsqrtf(sq + 1e-6f) * rsqrtf(float(K));
  float const rk = rsqrtf(sk + 1e-6f);
  float const kq = skq * rq * rk;

  // Pass 1: S' = decay ⊙ S (rows), back into shared memory; partial S'ᵀk̂ and S'ᵀq̂ of this warp's rows. Rolled
  // loops: this code runs cold once per launch, so its size is its fetch time.
  bool const colw = warp < kKdaFusedStateWarps && lane < CW;
  float* const st = sm + L.st;
  float pk = 0.f, pq = 0.f;
  if (colw) {
#pragma unroll 4
    for (int k = warp; k < K; k += kKdaFusedStateWarps) {
      float const v = st[k * CW + lane] * full[2 * K + k];
      st[k * CW + lane] = v;
      pk = fmaf(v, full[K + k] * rk, pk);
      pq = fmaf(v, full[k] * rq, pq);
    }
  }
  float* const red = sm + L.red;
  if (warp < kKdaFusedStateWarps) {
    red[warp * 32 + lane] = pk;
    red[(kKdaFusedStateWarps + warp) * 32 + lane] = pq;
  }
  __syncthreads();
  // Every state warp adds the partials itself (the same order): δ for its pass 2 without another barrier.
  if (warp < kKdaFusedStateWarps) {
    float kv = 0.f, qv = 0.f;
#pragma unroll
    for (int w = 0; w < kKdaFusedStateWarps; ++w) {
      kv += red[w * 32 + lane];
      qv += red[(kKdaFusedStateWarps + w) * 32 + lane];
    }
    float const d = lane < CW ? beta * (sm[L.vs + lane] - kv) : 0.f;
    if (warp == 0) {  // o = S'ᵀq̂ + (k̂·q̂) δ, its gated factors, and the Σ o² partials
      if (a.mid == 2) trace_mark_max(a.trace, 2);
      float const o = lane < CW ? qv + kq * d : 0.f;
      if (lane < CW) s.o[ch0 + lane] = o * sm[L.onw + lane] * sm[L.og + lane];
      int const ps = CW < kKdaSsCols ? CW : kKdaSsCols;  // columns per partial (a power of two)
      float ss = o * o;
      for (int off = 1; off < ps; off <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
      if (lane < CW && lane % ps == 0) s.o_ss[std::int64_t(h) * kda_fused_ss_parts(K) + (c * CW + lane) / ps] = ss;
    }
    // Pass 2: S'' = S' + k̂ δᵀ
    if (colw) {
#pragma unroll 4
      for (int k = warp; k < K; k += kKdaFusedStateWarps)
        S[std::int64_t(k) * V + lane] = fmaf(full[K + k] * rk, d, st[k * CW + lane]);
    }
  }
  trace_end(a.trace);
}

}  // namespace kernels

// Chunks per lane of the instance for rows of `nchunks` 16-byte chunks (0: none).
inline int kda_fused_ku(std::int64_t nchunks) { return nchunks == 160 ? 5 : nchunks <= 64 ? 2 : 0; }

// Whether the fused launch takes this layer's shapes and buffers (else the model runs the projections, the step and
// o_proj's prologue).
inline bool kda_fused_fits(KdaFusedArgs const& a) {
  KdaStepArgs const& s = a.s;
  int const K = s.head_dim;
  if (s.heads <= 0 || !(K == 16 || K == 32 || K == 64 || K == 128)) return false;
  if (s.conv_kernel != kKdaFusedConv || !s.out_norm_w || !s.o || !s.o_ss || !s.state || !s.ring || !s.position ||
      !a.sync || !a.xch)
    return false;
  if (reinterpret_cast<std::uintptr_t>(s.state) % 16 || reinterpret_cast<std::uintptr_t>(s.ring) % 16 ||
      reinterpret_cast<std::uintptr_t>(s.conv_w) % 16 || reinterpret_cast<std::uintptr_t>(s.dt_bias) % 16 ||
      reinterpret_cast<std::uintptr_t>(s.out_norm_w) % 16)
    return false;
  std::int64_t const P = std::int64_t(s.heads) * K;
  for (int i = 0; i < 6; ++i) {
    MatrixArgs const& m = a.m[i];
    if (!m.data || !m.scales || m.cols != a.m[0].cols || m.ld != a.m[0].ld || m.ld != m.cols || m.ld % 16) return false;
    if (m.rows != (i < 5 ? P : s.heads)) return false;
  }
  return kda_fused_ku(a.m[0].ld / 16) > 0;
}

inline std::size_t kda_fused_smem(KdaFusedArgs const& a) {
  return sizeof(float) *
         std::size_t(
             KdaFusedSmem::make(kernels::xs_floats(kernels::staged_elems<quant::Fp8Block>(a.m[0])), a.s.head_dim)
                 .total);
}

template <class F>
inline void kda_fused_instance(KdaFusedArgs const& a, F&& f) {
  if (kda_fused_ku(a.m[0].ld / 16) == 5)
    f(kernels::kda_fused_kernel<5, true>);
  else
    f(kernels::kda_fused_kernel<2, false>);
}

// Blocks of the fused launch this GPU holds at once (occupancy × SMs). The blocks of a head wait for each other, so
// the launch needs heads · split of them resident together.
inline int kda_fused_resident(KdaFusedArgs const& a) {
  std::size_t const smem = kda_fused_smem(a);
  int per_sm = 0;
  kda_fused_instance(a, [&](auto kern) {
    ops::allow_smem(kern, smem);
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, kKdaFusedThreads, smem) != cudaSuccess) {
      (void)cudaGetLastError();
      per_sm = 0;
    }
  });
  return per_sm * kernels::sm_count();
}

// Whether the whole grid fits this GPU at once (kda_fused_fits too: the model's test before it launches).
inline bool kda_fused_fits_gpu(KdaFusedArgs const& a) {
  return kda_fused_fits(a) && a.s.heads * kKdaFusedSplit <= kda_fused_resident(a);
}

// Launches the fused mixer (kda_fused_fits_gpu must hold; ling::Error otherwise).
inline void kda_fused(KdaFusedArgs const& a, cudaStream_t st) {
  require(kda_fused_fits(a), ErrorCode::kInvalidArgument, "kda_fused: the layer does not fit the fused launch");
  require(a.s.heads * kKdaFusedSplit <= kda_fused_resident(a), ErrorCode::kUnsupported,
          "kda_fused: " + std::to_string(a.s.heads * kKdaFusedSplit) + " blocks do not fit this GPU at once");
  std::size_t const smem = kda_fused_smem(a);
  kda_fused_instance(a, [&](auto kern) {
    ops::allow_smem(kern, smem);
    check(kernels::launch_ex(kern, dim3(unsigned(a.s.heads * kKdaFusedSplit)), dim3(kKdaFusedThreads), smem, st, a),
          "kda_fused launch");
  });
  check_launch("kda_fused");
}

}  // namespace ling::cuda
