// Probe: what split sums cost in a chain of dependent launches (linear.hpp RouteSplit, CudaModelOptions::
// router_in_oproj; docs/performance.md session 33). A producer launch's G blocks each add N 64-bit fixed-point partial
// sums, one RED per value, to N accumulators `stride` 8-byte words apart (block 0 also zeroes the other buffer), and the
// next launch reads all N right after its PDL wait, as launch A reads the router's sums. µs per producer + consumer
// pair, 40 pairs per graph (best of 7 × 10 replays):
//   no sums          the same two launches without any sums (their boundaries only)
//   plain stores     each block stores its N partials to its own slice (no reduction: what the stores cost)
//   RED, stride S    the split sums at 1, 4 and 16 words apart (S = 16: each sum in its own 128-byte line)
// Shapes: the router split (256 blocks of 320 threads, 512 sums: o_proj's one-row blocks) and launch B's output split
// over launch A (132 blocks of 512 threads, 2560 sums: next step 2 of session 33).
// Built as the target split_sums (CUDA builds); `LING_NO_PDL` must be unset.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "ling/cuda/linear.cuh"
#include "probe_util.cuh"

namespace {

// kMode 0: no sums; 1: plain stores into the block's slice of part; 2: REDs into acc (block 0 zeroes other).
template <int kMode>
__global__ void produce(unsigned long long* acc, unsigned long long* other, unsigned long long* part, int n, int stride) {
  ling::cuda::kernels::pdl_trigger();
  ling::cuda::kernels::pdl_wait();
  for (int e = int(threadIdx.x); e < n; e += int(blockDim.x)) {
    unsigned long long const v = (unsigned long long)(e * 2654435761u + blockIdx.x) & 0xFFFFFull;
    if constexpr (kMode == 1) part[std::size_t(blockIdx.x) * std::size_t(n) + std::size_t(e)] = v;
    if constexpr (kMode == 2) {
      atomicAdd(acc + std::size_t(e) * std::size_t(stride), v);
      if (blockIdx.x == 0) other[std::size_t(e) * std::size_t(stride)] = 0ull;
    }
  }
}
// Every block reads the n sums (as launch A's blocks do); a value that never occurs keeps the loads.
__global__ void consume(unsigned long long const* acc, unsigned long long* sink, int n, int stride) {
  ling::cuda::kernels::pdl_trigger();
  ling::cuda::kernels::pdl_wait();
  unsigned long long f = 0;
  for (int e = int(threadIdx.x); e < n; e += int(blockDim.x)) f ^= __ldcg(acc + std::size_t(e) * std::size_t(stride));
  if (f == 0x9E3779B97F4A7C15ull) *sink = f;
}

}  // namespace

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr int kPairs = 40, kMaxN = 2560, kMaxStride = 16, kMaxBlocks = 512;
  unsigned long long *acc = nullptr, *part = nullptr, *sink = nullptr;
  CK(cudaMalloc(&acc, 2ull * kMaxN * kMaxStride * 8));
  CK(cudaMemset(acc, 0, 2ull * kMaxN * kMaxStride * 8));
  CK(cudaMalloc(&part, std::size_t(kMaxBlocks) * kMaxN * 8));
  CK(cudaMalloc(&sink, 8));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  struct Shape {
    char const* name;
    int blocks, threads, n;
  };
  Shape const shapes[] = {{"router split (o_proj)", 256, 320, 512}, {"launch B over launch A", sms, 512, 2560}};
  std::printf("SMs %d; µs per producer + consumer pair (%d pairs per graph)\n", sms, kPairs);
  for (Shape const& s : shapes) {
    std::printf("%s: %d blocks x %d threads, %d sums\n", s.name, s.blocks, s.threads, s.n);
    auto chain = [&](auto kern, int stride) {
      std::size_t const slots = std::size_t(s.n) * std::size_t(stride);
      return probe::time_graph(st, kPairs, [&] {
        for (int i = 0; i < kPairs; ++i) {
          unsigned long long* const a = acc + std::size_t(i % 2) * slots;
          unsigned long long* const o = acc + std::size_t((i + 1) % 2) * slots;
          CK(ling::cuda::kernels::launch_ex(kern, dim3(unsigned(s.blocks)), dim3(unsigned(s.threads)), 0, st, a, o, part,
                                            s.n, stride));
          CK(ling::cuda::kernels::launch_ex(consume, dim3(unsigned(sms)), dim3(512u), 0, st,
                                            static_cast<unsigned long long const*>(a), sink, s.n, stride));
        }
      });
    };
    std::printf("  %-16s %8.2f\n", "no sums", chain(produce<0>, 1));
    std::printf("  %-16s %8.2f\n", "plain stores", chain(produce<1>, 1));
    for (int stride : {1, 4, 16}) std::printf("  RED, stride %-4d %8.2f\n", stride, chain(produce<2>, stride));
  }
  CK(cudaStreamSynchronize(st));
  return 0;
}
