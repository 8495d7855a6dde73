#pragma once
// Fused KDA decode step (see kda.hpp). Grid: heads × ceil(V/32) blocks of 256 threads; block (h, s) owns V columns
// [32s, 32s+32) of head h: it reads and writes that K×32 slice of S exactly once (staged in shared memory between the
// two passes), recomputing the head's q, k, gates (cheap: 2K conv outputs) instead of synchronizing with the other
// slices. One pass gives both S'ᵀk and S'ᵀq (S' = decayed S), since o = S''ᵀq = S'ᵀq + (k·q) δ with δ = β(v − S'ᵀk).
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
    if (vok) a.o[h * V + v] = qv + kq * d;
  }
  __syncthreads();
  // Pass 2: S'' = S' + k δᵀ
  float const d = delta[lane];
  if (vok)
#pragma unroll 16
    for (int k = warp; k < K; k += nwarps) S[std::int64_t(k) * V + v] = tile[k * kKdaCols + lane] + ks[k] * d;
}

inline std::size_t kda_step_smem(int head_dim) {
  return sizeof(float) * (std::size_t(3 * head_dim) + kKdaCols + 2 * (kKdaThreads / 32) * kKdaCols +
                          std::size_t(head_dim) * kKdaCols);
}

inline void kda_step(KdaStepArgs const& a, cudaStream_t st = nullptr) {
  require(a.heads > 0 && a.head_dim > 0 && a.conv_kernel >= 1, ErrorCode::kInvalidArgument, "kda_step: bad dims");
  std::size_t smem = kda_step_smem(a.head_dim);
  ops::allow_smem(kda_step_kernel, smem);
  dim3 grid(unsigned(a.heads), unsigned((a.head_dim + kKdaCols - 1) / kKdaCols));
  ops::launch(kda_step_kernel, grid, kKdaThreads, smem, st, a);
  check_launch("kda_step");
}

}  // namespace ling::cuda
