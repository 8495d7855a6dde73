#pragma once
// What the probes share (bench/probes/*.cu: plain CUDA programs that measure one property of the machine): the error
// check, the streaming load, rows streamed the way matvec_lane_kernel reads them, the timing of a captured graph, and a
// quantile of measurements.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } \
  } while (0)

namespace probe {

// 16 bytes that no later load reuses (bypasses L1).
__device__ __forceinline__ uint4 ldnc(uint4 const* p) {
  uint4 a;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a.x), "=r"(a.y), "=r"(a.z), "=r"(a.w) : "l"(p));
  return a;
}

// Rows of 2560 bytes (the KDA projections' FP8 rows): lane l reads 16 bytes at 16 l + 512 u, u < kRowU.
inline constexpr int kRowU = 5;
inline constexpr std::size_t kRowVecs = 32 * kRowU;  // uint4 per row
inline constexpr std::uint32_t kMagic = 0x9E3779B9u;   // a fold never equals it at run time (writes that keep loads)

__device__ __forceinline__ void row_load(uint4 (&v)[kRowU], uint4 const* p, std::size_t r) {
  int const lane = int(threadIdx.x & 31);
#pragma unroll
  for (int u = 0; u < kRowU; ++u) v[u] = ldnc(p + r * kRowVecs + lane + 32 * u);
}
// Decode-like work on 16 bytes of weights (kM > 0): kM rounds of, per 32-bit word, one PRMT and one DP4A into the
// running sums a, against words of x read from shared memory, one LDS.128 every second round (~8.5 kM instructions and
// 8 kM bytes of x per 16 bytes of weights). The model's kernels spend ~56 (MXFP4 biased lookup, ~1.75 per weight) to
// ~68 (FP8 lane dot, ~4.3 per weight) instructions and read 64-72 bytes of x (fp32 values or int8 limbs) per 16-byte
// chunk and lane, so kM = 8 is about their cost. xs: 64 words of shared memory (any values); `salt` picks the x words
// (x's chunk follows the weights' chunk). kM = 0: the plain fold into a.x.
template <int kM>
__device__ __forceinline__ void decode_like(uint4 v, std::uint32_t const* xs, int4& a, int salt = 0) {
  if constexpr (kM == 0) {
    a.x ^= int(v.x ^ v.y ^ v.z ^ v.w);
  } else {
    uint4 x;
#pragma unroll
    for (int r = 0; r < kM; ++r) {
      if (r % 2 == 0) x = reinterpret_cast<uint4 const*>(xs)[(int(threadIdx.x & 31) + 3 * salt + 5 * r) & 15];
      unsigned const sel = 0x3210u + 0x1111u * unsigned(r & 3);
      a.x = __dp4a(int(__byte_perm(v.x, 0x0C080604u, sel)), int(x.x), a.x);
      a.y = __dp4a(int(__byte_perm(v.y, 0x0C080604u, sel)), int(x.y), a.y);
      a.z = __dp4a(int(__byte_perm(v.z, 0x0C080604u, sel)), int(x.z), a.z);
      a.w = __dp4a(int(__byte_perm(v.w, 0x0C080604u, sel)), int(x.w), a.w);
    }
  }
}
__device__ __forceinline__ std::uint32_t fold_sums(int4 a) { return std::uint32_t(a.x + a.y + a.z + a.w); }
template <int kM = 0>
__device__ __forceinline__ std::uint32_t fold(uint4 const (&v)[kRowU], std::uint32_t const* xs = nullptr) {
  int4 a = make_int4(0, 0, 0, 0);
#pragma unroll
  for (int u = 0; u < kRowU; ++u) decode_like<kM>(v[u], xs, a, u);
  return fold_sums(a);
}
// The calling warp's rows w, w + W, ... of p, two in flight (two register sets in turn); `a` holds row w already
// when `loaded`. Returns the fold of everything read (decode_like<kM> on every 16 bytes; xs as there).
template <int kM = 0>
__device__ inline std::uint32_t stream_rows(uint4 const* p, std::size_t rows, std::size_t w, std::size_t W,
                                            uint4 (&a)[kRowU], bool loaded, std::uint32_t const* xs = nullptr) {
  if (w >= rows) return 0;
  uint4 b[kRowU];
  std::uint32_t acc = 0;
  if (!loaded) row_load(a, p, w);
  for (std::size_t r = w;;) {
    std::size_t rn = r + W;
    if (rn < rows) row_load(b, p, rn);
    acc ^= fold<kM>(a, xs);
    if (rn >= rows) break;
    r = rn;
    rn = r + W;
    if (rn < rows) row_load(a, p, rn);
    acc ^= fold<kM>(b, xs);
    if (rn >= rows) break;
    r = rn;
  }
  return acc;
}

// µs per `per` units of one captured graph (what `enqueue` puts on st): best of 7 × 10 replays, after one warm-up.
template <class F>
float time_graph(cudaStream_t st, int per, F enqueue) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  enqueue();
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaGraphLaunch(ge, st));
  CK(cudaStreamSynchronize(st));
  float best = 1e30f;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(e0, st));
    for (int k = 0; k < 10; ++k) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    best = ms < best ? ms : best;
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return best * 1000.f / float(10 * per);
}

// The p-quantile of v (0.5: the median; v[⌊p · n⌋] of the sorted values, capped at the largest); 0 for none.
inline double quantile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, std::size_t(p * double(v.size())))];
}

}  // namespace probe
