// Probe: how fast does one launch read N bytes it requests all at once (the decode step's situation: every op is a
// short read that starts at a dependency), against a paced sweep? Graph of L back-to-back launches over rotating
// buffers (reuse distance past the L2), optional PDL (trigger at entry, wait before the loads). Prints µs/launch.
// Built as the target read_shot (CUDA builds); `LING_NO_PDL` must be unset for the PDL rows.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ling/cuda/linear.cuh"

#include "probe_util.cuh"

using probe::ldnc;

__device__ __forceinline__ void pre() {
  ling::cuda::kernels::pdl_trigger();
  ling::cuda::kernels::pdl_wait();
}
inline constexpr std::size_t kNone = ~std::size_t(0);
// K loads p[at(k)] (kNone: none) all issued before any is used, folded by xor so that they cannot be optimised away
template <int K, class At>
__device__ __forceinline__ std::uint32_t fold_loads(uint4 const* p, At at) {
  uint4 v[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    std::size_t const j = at(k);
    v[k] = j != kNone ? ldnc(p + j) : make_uint4(0, 0, 0, 0);
  }
  std::uint32_t acc = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  return acc;
}
__device__ __forceinline__ void sink_if(std::uint32_t acc, std::uint32_t* sink) {
  if (acc == 0x9E3779B9u) *sink = acc;
}
// every thread: K loads at i + k T (T = all threads)
template <int K>
__global__ void __launch_bounds__(256) flat(uint4 const* p, std::size_t n, std::uint32_t* sink) {
  pre();
  std::size_t const T = std::size_t(gridDim.x) * blockDim.x, i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  sink_if(fold_loads<K>(p, [&](int k) { return i + k * T < n ? i + k * T : kNone; }), sink);
}
// every warp: one row of r16 uint4 (lane l: l + 32 u; r16 <= 32 K)
template <int K>
__global__ void __launch_bounds__(256) rows(uint4 const* p, std::size_t n, int r16, std::uint32_t* sink) {
  pre();
  std::size_t const w = (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  int const lane = threadIdx.x & 31;
  sink_if(fold_loads<K>(p, [&](int k) {
            std::size_t const j = w * r16 + std::size_t(lane + 32 * k);
            return lane + 32 * k < r16 && j < n ? j : kNone;
          }),
          sink);
}
// persistent sweep: block b reads slice [b s, (b+1) s) with K loads in flight per thread
template <int K>
__global__ void __launch_bounds__(512) sweep(uint4 const* p, std::size_t n, std::uint32_t* sink) {
  pre();
  std::size_t const s = (n + gridDim.x - 1) / gridDim.x, b0 = blockIdx.x * s, b1 = b0 + s < n ? b0 + s : n;
  std::uint32_t acc = 0;
  for (std::size_t i = b0 + threadIdx.x; i < b1; i += K * blockDim.x)
    acc ^= fold_loads<K>(p, [&](int k) { return i + k * blockDim.x < b1 ? i + k * blockDim.x : kNone; });
  sink_if(acc, sink);
}
// grid-stride sweep (the bandwidth kernel's order), K in flight
template <int K>
__global__ void __launch_bounds__(512) gsweep(uint4 const* p, std::size_t n, std::uint32_t* sink) {
  pre();
  std::size_t const T = std::size_t(gridDim.x) * blockDim.x;
  std::uint32_t acc = 0;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += K * T)
    acc ^= fold_loads<K>(p, [&](int k) { return i + k * T < n ? i + k * T : kNone; });
  sink_if(acc, sink);
}
__global__ void empty_k(std::uint32_t* sink) {
  pre();
  if (threadIdx.x == 1023) *sink = 1;
}

// µs per launch of a graph of L launches (launch(l, pdl) enqueues launch l)
template <class F>
float time_graph(cudaStream_t st, int L, bool pdl, F launch) {
  return probe::time_graph(st, L, [&] {
    for (int l = 0; l < L; ++l) launch(l, pdl);
  });
}

// With PDL: the library's launcher (ling::cuda::kernels::launch_ex, the decode step's own); without: a plain launch.
template <class... KArgs, class... A>
void launch_k(void (*kern)(KArgs...), int grid, int block, cudaStream_t st, bool pdl, A... args) {
  if (pdl) CK(ling::cuda::kernels::launch_ex(kern, dim3(unsigned(grid)), dim3(unsigned(block)), 0, st, args...));
  else {
    kern<<<grid, block, 0, st>>>(args...);
    CK(cudaGetLastError());
  }
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::size_t const pool_bytes = std::size_t(1) << 30;  // 1 GiB pool; buffers rotate through it
  uint4* pool;
  std::uint32_t* sink;
  CK(cudaMalloc(&pool, pool_bytes));
  CK(cudaMalloc(&sink, 64));
  CK(cudaMemset(pool, 1, pool_bytes));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int const L = 24;
  std::printf("SMs %d\n", sms);
  for (int pdl = 1; pdl >= 0; --pdl) {
    float const t0 = time_graph(st, L, pdl, [&](int, bool p) { launch_k(empty_k, sms * 2, 256, st, p, sink); });
    std::printf("pdl=%d empty launch: %.2f us\n", pdl, t0);
  }
  std::printf("%-26s %8s %8s %8s %8s %8s %8s\n", "variant (us/launch, GB/s)", "1.3MB", "2.6MB", "5.2MB", "10.5MB", "21MB", "52MB");
  double const sizes[6] = {1.3e6, 2.6e6, 5.2e6, 10.5e6, 21e6, 52.5e6};
  auto row = [&](char const* name, int pdl, auto launch_for) {
    std::printf("%-22s p%d ", name, pdl);
    for (double sz : sizes) {
      std::size_t const n = std::size_t(sz / 16);
      std::size_t const slots = pool_bytes / 16 / n;  // rotate over the pool
      float const us = time_graph(st, L, pdl, [&](int l, bool p) { launch_for(pool + (l % slots) * n, n, p); });
      std::printf(" %5.2f/%4.0f", us, sz / (us * 1e-6) / 1e9);
    }
    std::printf("\n");
  };
  for (int pdl = 1; pdl >= 0; --pdl) {
    row("flat K=8", pdl, [&](uint4 const* p, std::size_t n, bool pp) {
      std::size_t const thr = (n + 7) / 8;
      launch_k(flat<8>, int((thr + 255) / 256), 256, st, pp, p, n, sink);
    });
    row("flat K=2", pdl, [&](uint4 const* p, std::size_t n, bool pp) {
      std::size_t const thr = (n + 1) / 2;
      launch_k(flat<2>, int((thr + 255) / 256), 256, st, pp, p, n, sink);
    });
    row("rows 2560B", pdl, [&](uint4 const* p, std::size_t n, bool pp) {
      std::size_t const warps = (n + 159) / 160;
      launch_k(rows<5>, int((warps * 32 + 255) / 256), 256, st, pp, p, n, 160, sink);
    });
    row("rows 4096B", pdl, [&](uint4 const* p, std::size_t n, bool pp) {
      std::size_t const warps = (n + 255) / 256;
      launch_k(rows<8>, int((warps * 32 + 255) / 256), 256, st, pp, p, n, 256, sink);
    });
    row("sweep 1x512 K=8", pdl, [&](uint4 const* p, std::size_t n, bool pp) { launch_k(sweep<8>, sms, 512, st, pp, p, n, sink); });
    row("sweep 2x512 K=4", pdl, [&](uint4 const* p, std::size_t n, bool pp) { launch_k(sweep<4>, 2 * sms, 512, st, pp, p, n, sink); });
    row("sweep 4x512 K=4", pdl, [&](uint4 const* p, std::size_t n, bool pp) { launch_k(sweep<4>, 4 * sms, 512, st, pp, p, n, sink); });
    row("gsweep 4x512 K=4", pdl, [&](uint4 const* p, std::size_t n, bool pp) { launch_k(gsweep<4>, 4 * sms, 512, st, pp, p, n, sink); });
    row("gsweep 1x512 K=8", pdl, [&](uint4 const* p, std::size_t n, bool pp) { launch_k(gsweep<8>, sms, 512, st, pp, p, n, sink); });
  }
  return 0;
}
