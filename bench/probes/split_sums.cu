// Probe: what split sums cost in a chain of dependent launches (the router split of sessions 33-35, measured slower
// and removed in session 36; docs/perf-log.md sessions 33-35). A producer launch's G blocks each add N 64-bit
// fixed-point partial sums, one RED per value, to N accumulators `stride` 8-byte words apart (block 0 also zeroes the
// other buffer), and the next launch reads all N right after its PDL wait, as launch A read the router's sums. µs per
// producer + consumer pair, 40 pairs per graph (best of 7 × 10 replays):
//   no sums          the same two launches without any sums (their boundaries only)
//   plain stores     each block stores its N partials to its own slice (no reduction: what the stores cost)
//   RED, stride S    the split sums at 1, 4 and 16 words apart (S = 16: each sum in its own 128-byte line)
//   RED, K copies    (session 35) block b adds into copy b % K of the sums, so K times fewer REDs meet at one address;
//                    the consumer adds up the K copies of each sum. "[c][e]": copy-major (a copy's sums adjacent);
//                    "[e][c]": expert-major (a sum's K copies adjacent)
//   cluster C, K     (session 35, router shape) the producer's blocks in clusters of C: each block's partials in its
//                    shared memory, a cluster barrier, then block r of a cluster adds up sums [r n / C, (r + 1) n / C)
//                    over the C blocks (distributed shared memory) and adds each with one RED into copy (cluster % K):
//                    C times fewer REDs; a second barrier keeps the blocks' shared memory alive until all have read it
// Shapes: the router split (256 blocks of 320 threads, 512 sums: o_proj's one-row blocks) and launch B's output split
// over launch A (132 blocks of 512 threads, 2560 sums: next step 2 of session 33).
// Built as the target split_sums (CUDA builds); `LING_NO_PDL` must be unset.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "ling/cuda/linear.cuh"
#include "probe_util.cuh"

namespace {

// Where sum e's copy c lives: stride words between sums (copy-major: n · stride words between copies), or, expert-major
// (stride < 0), the K copies of a sum adjacent.
__device__ __forceinline__ std::size_t slot(int e, int c, int n, int stride, int copies) {
  return stride > 0 ? std::size_t(c) * std::size_t(n) * std::size_t(stride) + std::size_t(e) * std::size_t(stride)
                    : std::size_t(e) * std::size_t(copies) + std::size_t(c);
}
// kMode 0: no sums; 1: plain stores into the block's slice of part; 2: REDs into copy blockIdx % copies of acc
// (blocks c < copies zero copy c of other).
template <int kMode>
__global__ void produce(unsigned long long* acc, unsigned long long* other, unsigned long long* part, int n, int stride,
                        int copies) {
  ling::cuda::kernels::pdl_trigger();
  ling::cuda::kernels::pdl_wait();
  int const c = int(blockIdx.x) % copies;
  for (int e = int(threadIdx.x); e < n; e += int(blockDim.x)) {
    unsigned long long const v = (unsigned long long)(e * 2654435761u + blockIdx.x) & 0xFFFFFull;
    if constexpr (kMode == 1) part[std::size_t(blockIdx.x) * std::size_t(n) + std::size_t(e)] = v;
    if constexpr (kMode == 2) {
      atomicAdd(acc + slot(e, c, n, stride, copies), v);
      if (int(blockIdx.x) < copies) other[slot(e, c, n, stride, copies)] = 0ull;
    }
  }
}
// The cluster reduction (n <= 512).
__global__ void produce_cluster(unsigned long long* acc, unsigned long long* other, unsigned long long* part, int n,
                                int stride, int copies) {
  namespace cg = cooperative_groups;
  __shared__ unsigned long long s_part[512];
  ling::cuda::kernels::pdl_trigger();
  ling::cuda::kernels::pdl_wait();
  cg::cluster_group cl = cg::this_cluster();
  int const C = int(cl.num_blocks()), r = int(cl.block_rank());
  for (int e = int(threadIdx.x); e < n; e += int(blockDim.x))
    s_part[e] = (unsigned long long)(e * 2654435761u + blockIdx.x) & 0xFFFFFull;
  cl.sync();
  int const per = (n + C - 1) / C, cidx = int(blockIdx.x) / C, c = cidx % copies;
  int const end = min(n, (r + 1) * per);
  for (int e = r * per + int(threadIdx.x); e < end; e += int(blockDim.x)) {
    unsigned long long t = 0;
    for (int q = 0; q < C; ++q) t += cl.map_shared_rank(s_part, q)[e];
    atomicAdd(acc + slot(e, c, n, stride, copies), t);
    if (cidx < copies) other[slot(e, c, n, stride, copies)] = 0ull;
  }
  cl.sync();
  (void)part;
}
cudaError_t launch_cluster(int cluster, dim3 grid, dim3 block, cudaStream_t st, unsigned long long* a,
                           unsigned long long* o, unsigned long long* part, int n, int stride, int copies) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = unsigned(cluster);
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  return cudaLaunchKernelEx(&cfg, produce_cluster, a, o, part, n, stride, copies);
}

// Every block reads the n sums, each the total of its copies (as launch A's blocks do); a value that never occurs keeps
// the loads.
__global__ void consume(unsigned long long const* acc, unsigned long long* sink, int n, int stride, int copies) {
  ling::cuda::kernels::pdl_trigger();
  ling::cuda::kernels::pdl_wait();
  unsigned long long f = 0;
  for (int e = int(threadIdx.x); e < n; e += int(blockDim.x)) {
    unsigned long long t = 0;
    for (int c = 0; c < copies; ++c) t += __ldcg(acc + slot(e, c, n, stride, copies));
    f ^= t;
  }
  if (f == 0x9E3779B97F4A7C15ull) *sink = f;
}

}  // namespace

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr int kPairs = 40, kMaxN = 2560, kMaxStride = 16, kMaxCopies = 64, kMaxBlocks = 512;
  constexpr std::size_t kWords = std::size_t(kMaxN) * kMaxStride * kMaxCopies;  // one buffer's words at most
  unsigned long long *acc = nullptr, *part = nullptr, *sink = nullptr;
  CK(cudaMalloc(&acc, 2ull * kWords * 8));
  CK(cudaMemset(acc, 0, 2ull * kWords * 8));
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
    // stride < 0: expert-major copies (slot); cluster > 0: produce_cluster in clusters of that many blocks
    auto chain = [&](auto kern, int stride, int copies, int cluster = 0) {
      return probe::time_graph(st, kPairs, [&] {
        for (int i = 0; i < kPairs; ++i) {
          unsigned long long* const a = acc + std::size_t(i % 2) * kWords;
          unsigned long long* const o = acc + std::size_t((i + 1) % 2) * kWords;
          if (cluster > 0)
            CK(launch_cluster(cluster, dim3(unsigned(s.blocks)), dim3(unsigned(s.threads)), st, a, o, part, s.n, stride,
                              copies));
          else
            CK(ling::cuda::kernels::launch_ex(kern, dim3(unsigned(s.blocks)), dim3(unsigned(s.threads)), 0, st, a, o,
                                              part, s.n, stride, copies));
          CK(ling::cuda::kernels::launch_ex(consume, dim3(unsigned(sms)), dim3(512u), 0, st,
                                            static_cast<unsigned long long const*>(a), sink, s.n, stride, copies));
        }
      });
    };
    std::printf("  %-22s %8.2f\n", "no sums", chain(produce<0>, 1, 1));
    std::printf("  %-22s %8.2f\n", "plain stores", chain(produce<1>, 1, 1));
    for (int stride : {1, 4, 16}) std::printf("  RED, stride %-10d %8.2f\n", stride, chain(produce<2>, stride, 1));
    for (int copies : {2, 4, 8, 16, 32, 64}) {
      std::printf("  RED, %2d copies [c][e] %8.2f\n", copies, chain(produce<2>, 1, copies));
      std::printf("  RED, %2d copies [e][c] %8.2f\n", copies, chain(produce<2>, -1, copies));
    }
    if (s.n <= 512 && s.blocks % 8 == 0)
      for (int cluster : {2, 4, 8})
        for (int copies : {1, 2, 4})
          std::printf("  cluster %d, %d copies   %8.2f\n", cluster, copies, chain(produce<2>, 1, copies, cluster));
  }
  CK(cudaStreamSynchronize(st));
  return 0;
}
