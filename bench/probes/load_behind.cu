// Probe: does a small load wait behind its SM's bulk copies in flight, or behind every SM's? (docs/perf-log.md,
// session 43: with MoE launch A's guessed tiles copied early, its selection ended ~6 µs later, about the early bytes'
// DRAM time; the grid barrier's poll and the selection's logit loads are small loads issued after the copies.)
//
// One launch of one block of 16 warps per SM. Warps 0 .. n − 1 of a copying block each issue one bulk copy of 11 008
// bytes (launch A's ring stage at Ling's shape) from fresh memory into shared memory; after a block barrier (every copy
// issued), warp 15 times a chain of 16 dependent 4-byte loads (ld.global.cg: L2, a 1 MB random cycle warmed first).
// Cases (n copying warps; which blocks copy):
//   quiet          no block copies: the chain's L2 latency alone
//   all, n = 4     every block copies 4 tiles (44 KB per SM, 5.8 MB in all)
//   all, n = 12    every block copies 12 tiles (132 KB per SM, 17.4 MB: launch A's routed tiles)
//   half, n = 12   even blocks copy 12 tiles, odd blocks none: the chain on a copying SM and on a quiet one, at once
//   7 of 8, n = 12 every eighth block copies nothing (launch A split into a few selecting blocks and many copying)
// Beside the chain, warp 14 copies one 5 KB row of fresh memory (a router row: a DRAM read) and times its landing.
// Printed per case (40 launches, fresh memory each), medians and 90th percentiles over the blocks: the chain's cycles
// per load, the row's landing in µs, and the copies' landing (warp 0's wait end) in µs after the block's issue. If a
// quiet SM's chain stays near "quiet" while the copying SMs' chains stretch, the waiting is the SM's own, and blocks
// that copy nothing could run launch A's selection while the others copy. Session 44's answer (H100, docs/kernels.md
// "Launch A split"): the chain waits as long on a quiet SM as on a copying one (902 against 882 cycles per load, 339
// with no copies), so the waiting is global; the DRAM row does wait behind its own SM's copies (1.37 against 5.06 µs).
// Built as the target load_behind (CUDA builds). It runs in about a second; it needs no model.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "ling/cuda/async_copy.cuh"
#include "probe_util.cuh"

namespace {

using namespace ling::cuda::kernels;

constexpr int kWarps = 16, kMaxCopyWarps = 12, kChain = 16;
constexpr std::uint32_t kTile = 11008, kRow = 5120;
constexpr std::size_t kPerBlock = std::size_t(kMaxCopyWarps) * kTile + kRow;
constexpr std::size_t kChase = 1 << 18;  // ints: 1 MB

// out[4 b]: the chain's cycles; out[4 b + 1]: warp 0's copies landed, cycles after the block's issue (0: none);
// out[4 b + 2]: whether the block copied; out[4 b + 3]: the row's landing, cycles after its issue
__global__ void __launch_bounds__(kWarps * 32, 1)
    load_behind(char const* fresh, int const* chase, int ncopy, int quiet_every, long long* out, int* sink) {
  extern __shared__ __align__(128) unsigned char tiles[];
  __shared__ std::uint64_t bars[kMaxCopyWarps + 1];
  __shared__ __align__(128) unsigned char row[kRow];
  int const warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), b = int(blockIdx.x);
  bool const copies = ncopy > 0 && (quiet_every == 0 || b % quiet_every != quiet_every - 1);
  if (lane == 0 && warp <= kMaxCopyWarps) mbar_init(bars + warp, 1);
  mbar_init_fence();
  __syncthreads();
  long long const t0 = clock64();
  if (copies && warp < ncopy && lane == 0) {
    std::uint64_t* const bar = bars + warp;
    mbar_arrive_expect(bar, kTile);
    bulk_copy(tiles + std::size_t(warp) * kTile, fresh + std::size_t(b) * kPerBlock + std::size_t(warp) * kTile, kTile,
              bar);
  }
  __syncthreads();  // every copy of the block issued
  if (warp == kWarps - 2 && lane == 0) {
    std::uint64_t* const bar = bars + kMaxCopyWarps;
    long long const s = clock64();
    mbar_arrive_expect(bar, kRow);
    bulk_copy(row, fresh + std::size_t(b) * kPerBlock + std::size_t(kMaxCopyWarps) * kTile, kRow, bar);
    mbar_wait(bar, 0u);
    out[4 * b + 3] = clock64() - s;
  }
  if (warp == kWarps - 1) {
    int i = int((std::uint32_t(b) * 2654435761u + std::uint32_t(lane) * 40503u) % kChase);
    long long const s = clock64();
#pragma unroll 1
    for (int k = 0; k < kChain; ++k) i = __ldcg(chase + i);
    long long const e = clock64();
    if (lane == 0) out[4 * b] = e - s;
    if (i == -1) *sink = i;  // never: keeps the chain
  }
  if (copies && warp < ncopy) mbar_wait(bars + warp, 0u);
  if (warp == 0 && lane == 0) {
    out[4 * b + 1] = copies ? clock64() - t0 : 0;
    out[4 * b + 2] = copies ? 1 : 0;
  }
}

// Every line of the chase array read once, so that the chains hit L2 (the copies stream 17 MB per launch past it).
__global__ void warm(int const* chase, int* sink) {
  int acc = 0;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < kChase;
       i += std::size_t(gridDim.x) * blockDim.x)
    acc ^= __ldcg(chase + i);
  if (acc == 0x7fffffff) *sink = acc;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::size_t(q * double(v.size() - 1))];
}

}  // namespace

int main() {
  int sms = 0, khz = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  int const runs = 40;
  std::size_t const per_run = std::size_t(sms) * kPerBlock;
  char* fresh = nullptr;
  CK(cudaMalloc(&fresh, per_run * runs));
  CK(cudaMemset(fresh, 1, per_run * runs));
  std::vector<int> cyc(kChase);  // one random cycle through all of the array
  std::vector<int> order(kChase);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  for (std::size_t k = 0; k < kChase; ++k) cyc[std::size_t(order[k])] = order[(k + 1) % kChase];
  int *chase = nullptr, *sink = nullptr;
  long long* out = nullptr;
  CK(cudaMalloc(&chase, kChase * sizeof(int)));
  CK(cudaMemcpy(chase, cyc.data(), kChase * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMalloc(&sink, sizeof(int)));
  CK(cudaMalloc(&out, std::size_t(4 * sms) * sizeof(long long)));
  std::size_t const smem = std::size_t(kMaxCopyWarps) * kTile;
  CK(cudaFuncSetAttribute(load_behind, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));

  struct Case {
    char const* name;
    int ncopy, quiet_every;
  };
  std::printf(
      "SM clock %.0f MHz (attribute); cycles per chained 4-byte L2 load; a 5 KB row's and the copies' landing in us "
      "after issue\n",
      khz / 1e3);
  std::printf("%-16s %-8s %10s %10s %10s %10s %12s %12s\n", "case", "blocks", "load p50", "load p90", "row p50",
              "row p90", "landed p50", "landed p90");
  for (Case const c : {Case{"quiet", 0, 0}, Case{"all, n = 4", 4, 0}, Case{"all, n = 12", 12, 0},
                       Case{"half, n = 12", 12, 2}, Case{"7 of 8, n = 12", 12, 8}}) {
    std::vector<double> load[2], rowt[2], land;
    std::vector<long long> h(std::size_t(4 * sms));
    for (int r = 0; r < runs; ++r) {
      warm<<<sms, 256>>>(chase, sink);
      load_behind<<<sms, kWarps * 32, smem>>>(fresh + per_run * std::size_t(r), chase, c.ncopy, c.quiet_every, out,
                                              sink);
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(h.data(), out, h.size() * sizeof(long long), cudaMemcpyDeviceToHost));
      for (int b = 0; b < sms; ++b) {
        int const cp = int(h[std::size_t(4 * b + 2)]);
        load[cp].push_back(double(h[std::size_t(4 * b)]) / kChain);
        rowt[cp].push_back(double(h[std::size_t(4 * b + 3)]) / (khz / 1e3));
        if (cp) land.push_back(double(h[std::size_t(4 * b + 1)]) / (khz / 1e3));
      }
    }
    for (int cp = 0; cp < 2; ++cp) {
      if (load[cp].empty()) continue;
      std::printf("%-16s %-8s %10.0f %10.0f %10.2f %10.2f", c.name, cp ? "copying" : "quiet", quantile(load[cp], 0.5),
                  quantile(load[cp], 0.9), quantile(rowt[cp], 0.5), quantile(rowt[cp], 0.9));
      if (cp) std::printf(" %12.2f %12.2f", quantile(land, 0.5), quantile(land, 0.9));
      std::printf("\n");
    }
  }
  CK(cudaFree(fresh));
  CK(cudaFree(chase));
  CK(cudaFree(sink));
  CK(cudaFree(out));
  return 0;
}
