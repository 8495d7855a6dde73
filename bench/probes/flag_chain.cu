// Probe: the boundary between two dependent launches, as PDL's griddepcontrol.wait sees it, against a flag the
// producer's blocks raise themselves (docs/perf-log.md session 33, next steps). Every launch of the step waits for
// the launch before it with griddepcontrol.wait, which returns once the whole producer grid has completed and its
// memory is flushed: the step timeline puts that 1.1-2.3 µs after the producer's last block ended, for each of the
// ~230 boundaries of a token. Here a chain of launches, each block reading one value every block of the launch before
// wrote and writing its own, with the launch before's completion awaited by:
//   pdl wait      griddepcontrol.wait (as the model does)
//   flag          thread 0 polls a counter (relaxed loads, then one ld.acquire.gpu: an acquire invalidates the SM's L1)
//                 until every block of the launch before added to it (each block: its stores, a block barrier, then
//                 one release add by thread 0); no griddepcontrol.wait
//   flag + pdl    the flag, and griddepcontrol.wait at the block's end (keeps the grids' completion in order)
// Each launch is launched with PDL (its blocks become resident as the launch before's trigger at entry allows). µs per
// launch over chains of 200 (best of 7 × 10 graph replays; a memset at the graph's start zeroes the counters), with no
// bytes streamed and with `mb` MB of rows streamed per launch after the wait (the region's own work).
// Built as the target flag_chain (CUDA builds); `LING_NO_PDL` must be unset.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "ling/cuda/linear.cuh"
#include "probe_util.cuh"

namespace {

constexpr int kChain = 200;

__device__ __forceinline__ unsigned ld_acquire(unsigned const* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned ld_relaxed(unsigned const* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// kMode 0: pdl wait; 1: flag; 2: flag + pdl wait at the end. vals[i][b]: block b of launch i's value; flags[i]: the
// blocks of launch i done. rows: 2560-byte rows streamed per launch (warp w: rows w, w + W, ...), from p + i · rows.
template <int kMode>
__global__ void __launch_bounds__(256) link(int i, float* vals, unsigned* flags, uint4 const* p, std::size_t rows,
                                            unsigned* sink) {
  // the trigger first: launch i + 1 starts only once every block of launch i is resident, so a spinning block never
  // holds an SM that a block it waits for still needs (after the spin, the chain could deadlock)
  ling::cuda::kernels::pdl_trigger();
  int const G = int(gridDim.x), b = int(blockIdx.x);
  if (i > 0) {
    if constexpr (kMode == 0) {
      ling::cuda::kernels::pdl_wait();
    } else {
      if (threadIdx.x == 0) {  // relaxed polls, then one acquire (as session 34's launch A flag did)
        for (unsigned n = 0; ld_relaxed(flags + i - 1) < unsigned(G); ++n)
          if (n > (1u << 26)) __trap();  // never in a correct chain
        (void)ld_acquire(flags + i - 1);
      }
      __syncthreads();
    }
  }
  // the dependent read: every block of the launch before wrote one value
  float v = i > 0 ? __ldcg(vals + std::size_t(i - 1) * G + (b + threadIdx.x) % G) : 1.f;
  std::size_t const W = std::size_t(G) * (blockDim.x >> 5), w = (std::size_t(b) * blockDim.x + threadIdx.x) >> 5;
  uint4 a[probe::kRowU];
  std::uint32_t acc = probe::stream_rows(p + std::size_t(i) * rows * probe::kRowVecs, rows, w, W, a, false);
  v += float(acc & 1u);
  if (threadIdx.x == 0) vals[std::size_t(i) * G + b] = v;
  if (acc == probe::kMagic) *sink = acc;
  if constexpr (kMode != 0) {
    __syncthreads();
    if (threadIdx.x == 0) red_release(flags + i, 1u);
    if constexpr (kMode == 2) ling::cuda::kernels::pdl_wait();
  }
}

}  // namespace

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* vals = nullptr;
  unsigned *flags = nullptr, *sink = nullptr;
  CK(cudaMalloc(&vals, sizeof(float) * kChain * 4 * std::size_t(sms)));
  CK(cudaMalloc(&flags, sizeof(unsigned) * kChain));
  CK(cudaMalloc(&sink, 4));
  double const max_mb = 10.5;
  std::size_t const max_rows = std::size_t(max_mb * 1e6 / (16.0 * probe::kRowVecs)) + 1;
  uint4* pool = nullptr;
  CK(cudaMalloc(&pool, std::size_t(kChain) * max_rows * probe::kRowVecs * 16));
  CK(cudaMemset(pool, 0x11, std::size_t(kChain) * max_rows * probe::kRowVecs * 16));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::printf("SMs %d; µs per launch over chains of %d (blocks of 256 threads)\n", sms, kChain);
  std::printf("%-8s %8s %10s %10s %12s\n", "blocks", "MB", "pdl wait", "flag", "flag + pdl");
  for (int per_sm : {1, 2}) {
    for (double mb : {0.0, 2.6, 10.5}) {
      int const G = sms * per_sm;
      std::size_t const rows = std::size_t(mb * 1e6 / (16.0 * probe::kRowVecs));
      auto chain = [&](auto kern) {
        return probe::time_graph(st, kChain, [&] {
          CK(cudaMemsetAsync(flags, 0, sizeof(unsigned) * kChain, st));
          for (int i = 0; i < kChain; ++i)
            CK(ling::cuda::kernels::launch_ex(kern, dim3(unsigned(G)), dim3(256u), 0, st, i, vals, flags,
                                              static_cast<uint4 const*>(pool), rows, sink));
        });
      };
      float const a = chain(link<0>), f = chain(link<1>), fp = chain(link<2>);
      std::printf("%-8d %8.1f %10.2f %10.2f %12.2f\n", G, mb, a, f, fp);
    }
  }
  CK(cudaStreamSynchronize(st));
  return 0;
}
