#pragma once
// Fused KDA decode step (see kda.hpp). One pass gives both S'ᵀk and S'ᵀq (S' = decayed S), since
// o = S''ᵀq = S'ᵀq + (k·q) δ with δ = β(v − S'ᵀk). Each block owns a K×C column slice of one head's state and
// recomputes the head's q, k, gates (cheap: 2K conv outputs) instead of synchronizing with the other slices.
//
// Fast path (kda_step_fast_kernel: V % 4 == 0, K <= 128, conv_kernel <= 4): slices of 16 columns, 128 threads; a
// thread holds 4 rows × 4 columns of the slice as float4 registers between the two passes. Every global load of the
// step (state slice, inputs, all ring slots) is issued right after the PDL wait, before any of them is used, so the
// step costs about one memory latency; the position only selects among the loaded ring slots. Two barriers: one
// publishes q, k, decay and the combined (Σq², Σk², Σqk) partials, one the per-warp S'ᵀk / S'ᵀq partials.
// Other shapes take the generic kernel (32-column slices staged in shared memory).
#include <cstdint>
#include <type_traits>

#include "ling/cuda/device_common.cuh"
#include "ling/cuda/kda.hpp"
#include "ling/cuda/model_ops.cuh"
#include "ling/cuda/runtime.hpp"

namespace ling::cuda {

inline constexpr int kKdaThreads = 256;
inline constexpr int kKdaCols = 32;

__global__ void __launch_bounds__(kKdaThreads) kda_step_kernel(KdaStepArgs a) {
  extern __shared__ float sm[];
  int const K = a.head_dim, V = a.head_dim, P = a.heads * a.head_dim, R = a.conv_kernel;
  float* qs = sm;            // [K]
  float* ks = qs + K;        // [K]
  float* decay = ks + K;     // [K]
  float* vs = decay + K;     // [32]
  float* red = vs + kKdaCols;           // [2][nwarps][32]
  float* tile = red + 2 * (kKdaThreads / 32) * kKdaCols;  // [K][32]
  __shared__ float scratch[32];
  int const h = blockIdx.x, s = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int const nwarps = kKdaThreads / 32;
  int const v0 = s * kKdaCols;
  ops::pdl_trigger();
  ops::pdl_wait();
  std::int64_t const t = *a.position;
  int const slot = int(t % R);
  // Conv + SiLU for the head's q and k channels; the slice's v channels. Slice 0 records q/k inputs in the ring.
  auto conv = [&](int row, float x) {  // row in [0, 3P)
    float const* w = a.conv_w + std::int64_t(row) * R;
    float acc = w[R - 1] * x;
    for (int j = 1; j < R; ++j) {
      if (t - j < 0) break;
      int sl = int((t - j) % R);
      acc += w[R - 1 - j] * a.ring[std::int64_t(sl) * 3 * P + row];
    }
    return dev::siluf_(acc);
  };
  float ssq = 0.f, ssk = 0.f;
  for (int i = tid; i < 2 * K; i += kKdaThreads) {
    bool isk = i >= K;
    int c = h * K + (isk ? i - K : i);
    float x = isk ? a.x_k[c] : a.x_q[c];
    float y = conv(isk ? P + c : c, x);
    if (isk) { ks[i - K] = y; ssk += y * y; } else { qs[i] = y; ssq += y * y; }
  }
  if (tid < kKdaCols) {
    int v = v0 + tid;
    if (v < V) {
      int c = h * V + v;
      vs[tid] = conv(2 * P + c, a.x_v[c]);
    } else {
      vs[tid] = 0.f;
    }
  }
  for (int i = tid; i < K; i += kKdaThreads) {
    int c = h * K + i;
    float x = a.f[c] + a.dt_bias[c];
    float g = a.safe_gate ? a.lower_bound * dev::sigmoidf_(__expf(a.a_log[h]) * x) : -__expf(a.a_log[h]) * dev::softplusf_(x);
    decay[i] = __expf(g);
  }
  float const rq = rsqrtf(dev::block_sum(ssq, scratch) + 1e-6f) * rsqrtf(float(K));
  float const rk = rsqrtf(dev::block_sum(ssk, scratch) + 1e-6f);
  // block_sum ends with __syncthreads-protected reads; make qs/ks/decay/vs visible before use
  __syncthreads();
  for (int i = tid; i < K; i += kKdaThreads) {
    qs[i] *= rq;
    ks[i] *= rk;
  }
  __syncthreads();
  float const beta = dev::sigmoidf_(a.b[h]);
  // Ring writes after every block's reads of older slots: slot t mod R is never read for position t.
  if (s == 0)
    for (int i = tid; i < 2 * K; i += kKdaThreads) {
      bool isk = i >= K;
      int c = h * K + (isk ? i - K : i);
      a.ring[std::int64_t(slot) * 3 * P + (isk ? P + c : c)] = isk ? a.x_k[c] : a.x_q[c];
    }
  if (tid < kKdaCols && v0 + tid < V) {
    int c = h * V + v0 + tid;
    a.ring[std::int64_t(slot) * 3 * P + 2 * P + c] = a.x_v[c];
  }
  // Pass 1: S' = decay ⊙ S (rows), staged; partial S'ᵀk and S'ᵀq per warp.
  float* S = a.state + std::int64_t(h) * K * V;
  int const v = v0 + lane;
  bool const vok = v < V;
  float pk = 0.f, pq = 0.f, kq = 0.f;
#pragma unroll 16
  for (int k = warp; k < K; k += nwarps) {
    float x = vok ? S[std::int64_t(k) * V + v] * decay[k] : 0.f;
    tile[k * kKdaCols + lane] = x;
    pk += x * ks[k];
    pq += x * qs[k];
  }
  red[warp * kKdaCols + lane] = pk;
  red[(nwarps + warp) * kKdaCols + lane] = pq;
  for (int i = lane; i < K; i += 32) kq += ks[i] * qs[i];
  kq = dev::warp_sum(kq);
  __syncthreads();
  __shared__ float delta[kKdaCols];
  if (warp == 0) {
    float kv = 0.f, qv = 0.f;
    for (int w = 0; w < nwarps; ++w) {
      kv += red[w * kKdaCols + lane];
      qv += red[(nwarps + w) * kKdaCols + lane];
    }
    float d = beta * (vs[lane] - kv);
    delta[lane] = d;
    float const ov = qv + kq * d;
    if (vok) a.o[h * V + v] = a.out_gate && a.out_norm_w ? ov * a.out_norm_w[v] * kernels::gate_sigmoid(a.out_gate[h * V + v]) : ov;
    if (a.o_ss) {  // two partials of 16 columns per 32-column slice (KdaStepArgs::o_ss)
      static_assert(kKdaCols == 2 * kKdaSsCols);
      float ss = vok ? ov * ov : 0.f;
#pragma unroll
      for (int off = 1; off < kKdaSsCols; off <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
      int const part = int(blockIdx.y) * 2 + (lane >> 4);
      if ((lane & (kKdaSsCols - 1)) == 0 && part < kda_ss_parts(V)) a.o_ss[std::int64_t(h) * kda_ss_parts(V) + part] = ss;
    }
  }
  __syncthreads();
  // Pass 2: S'' = S' + k δᵀ
  float const d = delta[lane];
  if (vok)
#pragma unroll 16
    for (int k = warp; k < K; k += nwarps) {
      float const s = tile[k * kKdaCols + lane] + ks[k] * d;
      S[std::int64_t(k) * V + v] = s;
      if (a.state_copy) a.state_copy[(std::int64_t(h) * K + k) * V + v] = s;
    }
}

inline constexpr int kKdaFastThreads = 128;
inline constexpr int kKdaFastCols = 16;                                    // columns of a block's slice
inline constexpr int kKdaFastGroups = kKdaFastCols / 4;                    // float4 column groups per slice
inline constexpr int kKdaFastRowLanes = kKdaFastThreads / kKdaFastGroups;  // threads along the rows
inline constexpr int kKdaFastMaxK = 128;
inline constexpr int kKdaFastRows = kKdaFastMaxK / kKdaFastRowLanes;       // rows per thread
inline constexpr int kKdaFastWarps = kKdaFastThreads / 32;
static_assert(kKdaFastThreads >= kKdaFastMaxK && kKdaFastRowLanes % 32 == 0);

// SiLU(w[R-1]·x(t) + Σ_{j>=1, t-j>=0} w[R-1-j]·x(t-j)); ring[] holds every slot, x(t-j) sits in slot (t-j) mod R.
template <int R>
__device__ __forceinline__ float kda_conv(float const (&w)[R], float x, float const (&ring)[R], std::int64_t t, int slot) {
  float acc = w[R - 1] * x;
#pragma unroll
  for (int j = 1; j < R; ++j) {
    if (t - j < 0) break;
    int sl = slot - j;
    if (sl < 0) sl += R;
    float r = ring[0];
#pragma unroll
    for (int m = 1; m < R; ++m) r = sl == m ? ring[m] : r;
    acc += w[R - 1 - j] * r;
  }
  return dev::siluf_(acc);
}

// The look-ahead blocks (KdaStepArgs::ahead): thread t of look-ahead block y takes the 64 KB pieces y · threads + t,
// + stride, ... of the ranges laid end to end. No register waits for a prefetch, but the launch does not complete
// before its prefetches have landed (measured in session 42: ~0.33 TB/s of bulk prefetches from 8 blocks; line
// prefetches from 128 blocks at about the DRAM's rate), so the next launch waits for them. kda_prefetch_range: one
// range's pieces from the thread's place idx; returns its place in the next range. The range is widened to 16-byte
// bounds (the instruction's rule; allocations are 256-byte aligned).
__device__ __forceinline__ std::uint64_t kda_prefetch_range(void const* p, std::uint64_t bytes, std::uint64_t idx,
                                                            std::uint64_t stride, bool lines) {
  std::uint64_t const kPiece = lines ? 128 : 64 * 1024;  // KdaStepArgs::ahead_lines
  std::uintptr_t const b0 = reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t(15);
  std::uint64_t const n = (reinterpret_cast<std::uintptr_t>(p) + bytes + 15 - b0) & ~std::uint64_t(15);
  std::uint64_t const pieces = bytes ? (n + kPiece - 1) / kPiece : 0;
  for (; idx < pieces; idx += stride) {
    std::uint64_t const off = idx * kPiece, m = n - off < kPiece ? n - off : kPiece;
    if (lines)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(b0 + off) : "memory");
    else
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(b0 + off), "r"(std::uint32_t(m)) : "memory");
  }
  return idx - pieces;
}

// The predicted experts (KdaStepArgs::predict): every look-ahead block selects them itself (the router's selection,
// router_select_block, on the predicted logits), then the blocks share their rows' pieces as above. Out of line: its
// registers and code stay out of the step's own blocks.
__device__ __noinline__ void kda_predict_ahead(KdaPredict const p, std::uint64_t idx, std::uint64_t stride,
                                               bool lines) {
  __shared__ __align__(16) float s_score[kRouterMaxExperts], s_sel[kRouterMaxExperts];
  __shared__ int s_idx[kMoeMaxTopK];
  __shared__ float s_w[kMoeMaxTopK];
  kernels::RouteSel rs;
  rs.logits = p.logits, rs.bias = p.bias, rs.experts = p.experts, rs.top_k = p.top_k;
  rs.n_group = p.n_group, rs.topk_group = p.topk_group;
  kernels::router_select_block(rs, s_score, s_sel, s_idx, s_w);
  __syncthreads();
  if (p.record && blockIdx.y == 0 && blockIdx.x + 1 == gridDim.x && int(threadIdx.x) < p.top_k)
    p.record[threadIdx.x] = s_idx[threadIdx.x];
  // per pick: gate, its scales, up, its scales[, down, its scales]
  void const* const base[6] = {p.g_w, p.g_s, p.u_w, p.u_s, p.d_w, p.d_s};
  std::int64_t const bytes[6] = {p.gu_sw, p.gu_ss, p.gu_sw, p.gu_ss, p.d_sw, p.d_ss};
  int const per = p.down ? 6 : 4;
  for (int i = 0; i < p.top_k * per; ++i) {
    std::int64_t const e = s_idx[i / per];
    int const k = i % per;
    if (!base[k] || bytes[k] <= 0 || e < 0 || e >= p.experts) continue;
    idx = kda_prefetch_range(static_cast<char const*>(base[k]) + e * bytes[k], std::uint64_t(bytes[k]), idx, stride,
                             lines);
  }
}

__device__ __forceinline__ void kda_ahead(KdaStepArgs const& a) {
  ops::pdl_trigger();
  if (!a.ahead_before_wait) ops::pdl_wait();
  // look-ahead block la of n_la (KdaStepArgs::ahead_cols columns past the heads)
  std::uint64_t const la = std::uint64_t(blockIdx.x - a.heads) * gridDim.y + blockIdx.y;
  std::uint64_t const stride = std::uint64_t(gridDim.x - a.heads) * gridDim.y * blockDim.x;
  std::uint64_t idx = la * blockDim.x + threadIdx.x;
  for (int i = 0; i < a.n_ahead; ++i)
    idx = kda_prefetch_range(a.ahead[i].p, a.ahead[i].bytes, idx, stride, a.ahead_lines);
  if (a.predict.logits) {
    if (a.ahead_before_wait) ops::pdl_wait();  // the logits come from the projections launch
    kda_predict_ahead(a.predict, idx, stride, a.ahead_lines);
  }
}

// kAhead: the grid has one more column of blocks (blockIdx.x == heads), which only run kda_ahead.
template <int R, bool kAhead = false>
__global__ void __launch_bounds__(kKdaFastThreads) kda_step_fast_kernel(KdaStepArgs a) {
  if constexpr (kAhead) {
    if (int(blockIdx.x) >= a.heads) {
      kda_ahead(a);
      return;
    }
  }
  __shared__ float qs[kKdaFastMaxK], ks[kKdaFastMaxK], dec[kKdaFastMaxK], vs[kKdaFastCols];
  __shared__ float sums[3][kKdaFastWarps];
  __shared__ __align__(16) float red[2][kKdaFastWarps][kKdaFastCols];
  int const K = a.head_dim, V = a.head_dim, P = a.heads * a.head_dim;
  int const h = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int const v0 = int(blockIdx.y) * kKdaFastCols;
  int const cg = tid % kKdaFastGroups, rl = tid / kKdaFastGroups;
  int const vc = v0 + 4 * cg;  // this thread's columns [vc, vc + 4)
  bool const colok = vc < V;   // V % 4 == 0: a group lies wholly inside or outside
  bool const qk = tid < K;     // thread tid makes q[tid], k[tid], decay[tid]
  int const c = h * K + (qk ? tid : 0);
  bool const vv = tid < kKdaFastCols && v0 + tid < V;  // thread tid < 16 makes v[v0 + tid]
  int const cv = h * V + (vv ? v0 + tid : 0);
  ops::pdl_trigger();
  ops::trace_mark(a.trace, 0);
  // Weights only before the wait (no earlier kernel writes them).
  float wq[R], wk[R], wv[R];
#pragma unroll
  for (int j = 0; j < R; ++j) {
    wq[j] = qk ? a.conv_w[std::int64_t(c) * R + j] : 0.f;
    wk[j] = qk ? a.conv_w[std::int64_t(P + c) * R + j] : 0.f;
    wv[j] = vv ? a.conv_w[std::int64_t(2 * P + cv) * R + j] : 0.f;
  }
  float const dtb = qk ? a.dt_bias[c] : 0.f;
  float const alog = a.a_log[h];
  // the output's element-wise factors (KdaStepArgs::out_gate): threads tid < kKdaFastGroups write columns [vc, vc + 4)
  bool const og = a.out_gate && a.out_norm_w && tid < kKdaFastGroups && colok;
  float ow[4] = {1.f, 1.f, 1.f, 1.f}, ogt[4] = {0.f, 0.f, 0.f, 0.f};
  if (og)
#pragma unroll
    for (int m = 0; m < 4; ++m) ow[m] = a.out_norm_w[vc + m];
  // The state, the conv ring and the position: before the wait when the caller says no launch this one may overlap
  // writes them (KdaStepArgs::state_before_wait), else after it. Every such load in flight at once.
  float* S = a.state + std::int64_t(h) * K * V;
  float4 st[kKdaFastRows];
  float rq_[R], rk_[R], rv_[R];  // all R slots (the one of position t holds a stale value that is never selected)
  std::int64_t t = 0;
  auto load_state = [&] {
#pragma unroll
    for (int j = 0; j < kKdaFastRows; ++j) {
      int const r = rl + kKdaFastRowLanes * j;
      st[j] = colok && r < K ? *reinterpret_cast<float4 const*>(S + std::int64_t(r) * V + vc) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    t = *a.position;
#pragma unroll
    for (int j = 0; j < R; ++j) {
      float const* slot_p = a.ring + std::int64_t(j) * 3 * P;
      rq_[j] = qk ? slot_p[c] : 0.f;
      rk_[j] = qk ? slot_p[P + c] : 0.f;
      rv_[j] = vv ? slot_p[2 * P + cv] : 0.f;
    }
  };
  if (a.state_before_wait) load_state();
  ops::pdl_wait();
  ops::trace_mark(a.trace, 1);
  if (!a.state_before_wait) load_state();
  float const xq = qk ? a.x_q[c] : 0.f, xk = qk ? a.x_k[c] : 0.f, fx = qk ? a.f[c] : 0.f, xv = vv ? a.x_v[cv] : 0.f;
  if (og)
#pragma unroll
    for (int m = 0; m < 4; ++m) ogt[m] = a.out_gate[std::int64_t(h) * V + vc + m];
  float const bh = a.b[h];
  int const slot = int(t % R);
  float q = 0.f, k = 0.f, dk = 0.f;
  if (qk) {
    q = kda_conv<R>(wq, xq, rq_, t, slot);
    k = kda_conv<R>(wk, xk, rk_, t, slot);
    float const x = fx + dtb;
    float const g = a.safe_gate ? a.lower_bound * dev::sigmoidf_(__expf(alog) * x) : -__expf(alog) * dev::softplusf_(x);
    dk = __expf(g);
  }
  qs[tid] = q;  // rows >= K read as 0 below
  ks[tid] = k;
  dec[tid] = dk;
  if (tid < kKdaFastCols) vs[tid] = vv ? kda_conv<R>(wv, xv, rv_, t, slot) : 0.f;
  float const pqq = dev::warp_sum(q * q), pkk = dev::warp_sum(k * k), pkq = dev::warp_sum(k * q);
  if (lane == 0) {
    sums[0][warp] = pqq;
    sums[1][warp] = pkk;
    sums[2][warp] = pkq;
  }
  // Ring: slot t mod R gets the raw inputs; no block uses that slot's old value for position t.
  float* ring_t = a.ring + std::int64_t(slot) * 3 * P;
  if (blockIdx.y == 0 && qk) {
    ring_t[c] = xq;
    ring_t[P + c] = xk;
  }
  if (vv) ring_t[2 * P + cv] = xv;
  __syncthreads();
  float ssq = 0.f, ssk = 0.f, skq = 0.f;
#pragma unroll
  for (int w = 0; w < kKdaFastWarps; ++w) {
    ssq += sums[0][w];
    ssk += sums[1][w];
    skq += sums[2][w];
  }
  float const rq = rsqrtf(ssq + 1e-6f) * rsqrtf(float(K));
  float const rk = rsqrtf(ssk + 1e-6f);
  float const kq = skq * rq * rk;  // (k̂·q̂)
  float const beta = dev::sigmoidf_(bh);
  // Pass 1: S' = decay ⊙ S (rows), kept in registers; partial S'ᵀk̂ and S'ᵀq̂ over this thread's rows.
  float pk[4] = {0.f, 0.f, 0.f, 0.f}, pq[4] = {0.f, 0.f, 0.f, 0.f}, kn[kKdaFastRows];
#pragma unroll
  for (int j = 0; j < kKdaFastRows; ++j) {
    int const r = rl + kKdaFastRowLanes * j;  // < kKdaFastMaxK; rows >= K hold zeros everywhere
    float const dr = dec[r], qn = qs[r] * rq;
    kn[j] = ks[r] * rk;
    st[j].x *= dr;
    st[j].y *= dr;
    st[j].z *= dr;
    st[j].w *= dr;
    pk[0] += st[j].x * kn[j];
    pk[1] += st[j].y * kn[j];
    pk[2] += st[j].z * kn[j];
    pk[3] += st[j].w * kn[j];
    pq[0] += st[j].x * qn;
    pq[1] += st[j].y * qn;
    pq[2] += st[j].z * qn;
    pq[3] += st[j].w * qn;
  }
  // Lanes of one column group differ in the lane bits >= log2(kKdaFastGroups).
#pragma unroll
  for (int off = kKdaFastGroups; off < 32; off <<= 1)
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      pk[m] += __shfl_xor_sync(0xffffffffu, pk[m], off);
      pq[m] += __shfl_xor_sync(0xffffffffu, pq[m], off);
    }
  if (lane < kKdaFastGroups) {  // cg == lane
    *reinterpret_cast<float4*>(&red[0][warp][4 * cg]) = make_float4(pk[0], pk[1], pk[2], pk[3]);
    *reinterpret_cast<float4*>(&red[1][warp][4 * cg]) = make_float4(pq[0], pq[1], pq[2], pq[3]);
  }
  __syncthreads();
  float kv[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int w = 0; w < kKdaFastWarps; ++w) {
    float4 const x = *reinterpret_cast<float4 const*>(&red[0][w][4 * cg]);
    kv[0] += x.x;
    kv[1] += x.y;
    kv[2] += x.z;
    kv[3] += x.w;
  }
  float dl[4];
#pragma unroll
  for (int m = 0; m < 4; ++m) dl[m] = beta * (vs[4 * cg + m] - kv[m]);
  float oss = 0.f;                      // Σ o² of this thread's 4 columns (KdaStepArgs::o_ss)
  if (tid < kKdaFastGroups && colok) {  // o = S'ᵀq̂ + (k̂·q̂) δ
    float qv[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < kKdaFastWarps; ++w) {
      float4 const x = *reinterpret_cast<float4 const*>(&red[1][w][4 * cg]);
      qv[0] += x.x;
      qv[1] += x.y;
      qv[2] += x.z;
      qv[3] += x.w;
    }
    float* o = a.o + std::int64_t(h) * V + vc;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      float const om = qv[m] + kq * dl[m];
      o[m] = og ? om * ow[m] * kernels::gate_sigmoid(ogt[m]) : om;
      oss = fmaf(om, om, oss);
    }
  }
  static_assert(kKdaFastCols == kKdaSsCols && kKdaFastGroups <= 32, "one partial per slice, from lanes of warp 0");
  if (a.o_ss && warp == 0) {  // the slice's partial: lanes 0 .. kKdaFastGroups - 1 hold its column groups
#pragma unroll
    for (int off = 1; off < kKdaFastGroups; off <<= 1) oss += __shfl_xor_sync(0xffffffffu, oss, off);
    if (lane == 0) a.o_ss[std::int64_t(h) * gridDim.y + blockIdx.y] = oss;
  }
  // Pass 2: S'' = S' + k̂ δᵀ
#pragma unroll
  for (int j = 0; j < kKdaFastRows; ++j) {
    int const r = rl + kKdaFastRowLanes * j;
    if (colok && r < K) {
      float4 x = st[j];
      x.x += kn[j] * dl[0];
      x.y += kn[j] * dl[1];
      x.z += kn[j] * dl[2];
      x.w += kn[j] * dl[3];
      *reinterpret_cast<float4*>(S + std::int64_t(r) * V + vc) = x;
      if (a.state_copy) *reinterpret_cast<float4*>(a.state_copy + (std::int64_t(h) * K + r) * V + vc) = x;
    }
  }
  ops::trace_end(a.trace);
}

inline std::size_t kda_step_smem(int head_dim) {
  return sizeof(float) * (std::size_t(3 * head_dim) + kKdaCols + 2 * (kKdaThreads / 32) * kKdaCols +
                          std::size_t(head_dim) * kKdaCols);
}

// Where the fast kernel runs (the only one with the look-ahead column: KdaStepArgs::ahead and ::predict); the state
// must also be 16-byte aligned.
inline bool kda_fast_fits(int head_dim, int conv_kernel) {
  return head_dim % 4 == 0 && head_dim <= kKdaFastMaxK && conv_kernel <= 4;
}

inline void kda_step(KdaStepArgs const& a, cudaStream_t st = nullptr) {
  require(a.heads > 0 && a.head_dim > 0 && a.conv_kernel >= 1, ErrorCode::kInvalidArgument, "kda_step: bad dims");
  bool const fast = kda_fast_fits(a.head_dim, a.conv_kernel) && reinterpret_cast<std::uintptr_t>(a.state) % 16 == 0 &&
                    reinterpret_cast<std::uintptr_t>(a.state_copy) % 16 == 0;
  require(a.n_ahead >= 0 && (a.n_ahead == 0 || a.ahead), ErrorCode::kInvalidArgument,
          "kda_step: bad look-ahead ranges");
  KdaPredict const& pr = a.predict;
  require(
      !pr.logits || (pr.experts > 0 && pr.experts <= kRouterMaxExperts && pr.top_k >= 1 && pr.top_k <= kMoeMaxTopK &&
                     pr.top_k <= pr.experts && pr.n_group >= 1 && pr.n_group <= kRouterMaxGroups &&
                     pr.experts % pr.n_group == 0 && pr.topk_group >= 1 && pr.topk_group <= pr.n_group),
      ErrorCode::kInvalidArgument, "kda_step: bad expert prediction settings");
  if (fast) {
    dim3 grid(unsigned(a.heads), unsigned((a.head_dim + kKdaFastCols - 1) / kKdaFastCols));
    // kAhead: the look-ahead column (KdaStepArgs::ahead)
    auto go = [&](auto ahead) {
      constexpr bool kAhead = decltype(ahead)::value;
      if (kAhead) grid.x += unsigned(a.ahead_cols < 1 ? 1 : a.ahead_cols);
      switch (a.conv_kernel) {
        case 1:
          ops::launch(kda_step_fast_kernel<1, kAhead>, grid, kKdaFastThreads, 0, st, a);
          break;
        case 2:
          ops::launch(kda_step_fast_kernel<2, kAhead>, grid, kKdaFastThreads, 0, st, a);
          break;
        case 3:
          ops::launch(kda_step_fast_kernel<3, kAhead>, grid, kKdaFastThreads, 0, st, a);
          break;
        default:
          ops::launch(kda_step_fast_kernel<4, kAhead>, grid, kKdaFastThreads, 0, st, a);
          break;
      }
    };
    if (a.n_ahead > 0 || a.predict.logits)
      go(std::true_type{});
    else
      go(std::false_type{});
  } else {
    std::size_t smem = kda_step_smem(a.head_dim);
    ops::allow_smem(kda_step_kernel, smem);
    dim3 grid(unsigned(a.heads), unsigned((a.head_dim + kKdaCols - 1) / kKdaCols));
    ops::launch(kda_step_kernel, grid, kKdaThreads, smem, st, a);
  }
  check_launch("kda_step");
}

}  // namespace ling::cuda
