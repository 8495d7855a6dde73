// Probe: do some SMs get their bytes later than others? (docs/perf-log.md, session 18's item 2: the KDA projections'
// blocks end over ~5 µs, and neither a dynamic nor a warp-major row order shortened that.)
//
// One launch of 3 blocks × 8 warps per SM streams 52.5 MB of 2560-byte rows (the projections' bytes and access pattern:
// lane l reads 16 bytes at 16 l + 512 u, two rows in flight per warp, rows dealt round robin over the warps) from
// fresh memory. Every block records its SM (%smid) and its end (%globaltimer, ns). Repeated 20 times: per SM, the
// median over the runs of (its last block's end − the run's first block end); printed sorted, with the SMs that were
// among the 10 latest in at least half of the runs. Equal rows per SM, so a persistent order of late SMs would be
// DRAM service (or the SM's position), not work. Built as the target sm_service (CUDA builds).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_util.cuh"

namespace {

using probe::kRowVecs;

__device__ __forceinline__ std::uint64_t now_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

// rows w, w + W, ... of the calling warp (probe::stream_rows); block b writes {smid, end ns} to out[b]
__global__ void __launch_bounds__(256) stream(uint4 const* p, std::size_t rows, std::uint32_t* sink, ulonglong2* out) {
  std::size_t const W = std::size_t(gridDim.x) * (blockDim.x >> 5);
  std::size_t const w = (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  uint4 a[probe::kRowU];
  std::uint32_t const acc = probe::stream_rows(p, rows, w, W, a, false);
  if (acc == probe::kMagic) *sink = acc;
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = make_ulonglong2(smid(), now_ns());
}

}  // namespace

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int const blocks = 3 * sms, runs = 20;
  std::size_t const bytes = std::size_t(52.5e6), rows = bytes / (16 * kRowVecs);
  std::size_t const pool_bytes = std::size_t(2) << 30, slots = pool_bytes / (rows * kRowVecs * 16);
  uint4* pool;
  std::uint32_t* sink;
  ulonglong2* dout;
  CK(cudaMalloc(&pool, pool_bytes));
  CK(cudaMemset(pool, 1, pool_bytes));
  CK(cudaMalloc(&sink, 64));
  CK(cudaMalloc(&dout, sizeof(ulonglong2) * blocks));
  std::vector<std::vector<double>> late(static_cast<std::size_t>(sms));  // per SM: its last block's end after the first end, per run
  std::vector<int> top10(static_cast<std::size_t>(sms), 0);
  std::vector<double> spread;
  for (int r = 0; r < runs + 1; ++r) {  // run 0 warms up
    stream<<<blocks, 256>>>(pool + std::size_t(r % int(slots)) * rows * kRowVecs, rows, sink, dout);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    if (r == 0) continue;
    std::vector<ulonglong2> h(static_cast<std::size_t>(blocks));
    CK(cudaMemcpy(h.data(), dout, sizeof(ulonglong2) * h.size(), cudaMemcpyDeviceToHost));
    std::uint64_t first = ~0ull, last = 0;
    std::vector<std::uint64_t> end(static_cast<std::size_t>(sms), 0);
    for (auto const& e : h) {
      first = std::min<std::uint64_t>(first, e.y);
      last = std::max<std::uint64_t>(last, e.y);
      if (e.x < std::uint64_t(sms)) end[e.x] = std::max<std::uint64_t>(end[e.x], e.y);
    }
    spread.push_back(double(last - first) / 1e3);
    std::vector<int> order(static_cast<std::size_t>(sms));
    for (int s = 0; s < sms; ++s) {
      order[std::size_t(s)] = s;
      late[std::size_t(s)].push_back(end[std::size_t(s)] ? double(end[std::size_t(s)] - first) / 1e3 : -1.0);
    }
    std::sort(order.begin(), order.end(), [&](int x, int y) { return end[std::size_t(x)] > end[std::size_t(y)]; });
    for (int k = 0; k < 10 && k < sms; ++k) ++top10[std::size_t(order[std::size_t(k)])];
  }
  auto median = [](std::vector<double> const& v) { return probe::quantile(v, 0.5); };
  std::printf("SMs %d, %d blocks x 256 threads, %.1f MB of 2560-byte rows, %d runs; block-end spread (us): median %.2f\n",
              sms, blocks, double(bytes) / 1e6, runs, median(spread));
  std::vector<std::pair<double, int>> m;
  for (int s = 0; s < sms; ++s) m.push_back({median(late[std::size_t(s)]), s});
  std::sort(m.begin(), m.end());
  std::printf("per SM, median over runs of its last block's end after the run's first block end (us), earliest first:\n");
  for (std::size_t k = 0; k < m.size(); ++k)
    std::printf("  sm %3d %6.2f%s", m[k].second, m[k].first, (k % 6 == 5 || k + 1 == m.size()) ? "\n" : "");
  std::printf("SMs among the 10 latest in at least half of the runs:");
  int n = 0;
  for (int s = 0; s < sms; ++s)
    if (2 * top10[std::size_t(s)] >= runs) {
      std::printf(" %d (%d/%d)", s, top10[std::size_t(s)], runs);
      ++n;
    }
  std::printf("%s\n", n ? "" : " none (late SMs change from run to run)");
  return 0;
}
