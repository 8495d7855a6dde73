// Probe: what a decode layer's chain of dependent regions costs as one launch per region (PDL, as the model runs it)
// against one persistent launch whose regions are separated by grid-wide barriers, at the bytes of a KDA layer.
//
// Why (docs/perf-log.md, session 19): every region of the step ends in a launch boundary of 1-3 µs and starts with
// a latency chain, and neither fewer instructions nor bytes requested before the PDL wait shortened the regions. A
// persistent launch per layer replaces each boundary by a grid barrier and lets a warp request the next region's
// weights as soon as its own part of this region is done. This probe measures that trade without the model's math:
// each region is a stream of 2560-byte rows (lane l reads 16 bytes at 16 l + 512 u, two rows in flight per warp, as
// matvec_lane_kernel does), over fresh memory (a 4 GiB pool: no L2 reuse between layers).
//
// Regions of one layer (MB; I: addresses known before the region, D: addresses from a value the previous region wrote,
// like the routed experts): projections 52.5 I, KDA state 4.4 I, o_proj 10.5 I, router 2.6 I, MoE gate/up 20.7 D,
// MoE down 10.4 D. Variants, µs per layer over 35 layers (best of 7 × 10 graph replays):
//   launch, after wait     one launch per region, PDL trigger at entry, every load after griddepcontrol.wait
//   launch, row first      the same, each warp's first row (I regions) loaded before the wait, as the model does
//   persistent, barrier    one launch per token, a grid barrier between regions (moe.cuh grid_barrier's protocol)
//   persistent, row first  the same, each warp's first row of the next I region loaded before it enters the barrier
//   persistent, no barrier the same loads with no barrier at all (the ceiling of this access pattern)
//   launch, row first, without R   the row-first chain without region R's launches: R's marginal cost in the chain
//                                   (the whole chain's time less this one), to hold against the model's timeline
// Built as the target region_chain (CUDA builds); `LING_NO_PDL` must be unset for the PDL rows.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "ling/cuda/moe.cuh"
#include "probe_util.cuh"

namespace {

using probe::kMagic;
using probe::kRowU;
using probe::kRowVecs;
using probe::row_load;
using probe::stream_rows;

struct Region {
  uint4 const* p;
  std::size_t rows;
  int dependent;  // rows at an offset read from the previous region's output (0 at run time)
};

// The region's row base: a dependent region's depends on the value the previous region left (0).
__device__ __forceinline__ uint4 const* region_base(Region const& g, std::uint32_t const* dep, int prev) {
  if (!g.dependent) return g.p;
  std::uint32_t const d = __ldcg(dep + prev);
  return g.p + (d == kMagic ? kRowVecs : 0);
}

template <bool kEarly>
__global__ void __launch_bounds__(256) region_launch(Region g, std::uint32_t* dep, int cur) {
  ling::cuda::kernels::pdl_trigger();
  std::size_t const W = std::size_t(gridDim.x) * (blockDim.x >> 5);
  std::size_t const w = (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  uint4 a[kRowU];
  bool loaded = false;
  if (kEarly && !g.dependent && w < g.rows) {
    row_load(a, g.p, w);
    loaded = true;
  }
  ling::cuda::kernels::pdl_wait();
  int const prev = cur > 0 ? cur - 1 : 0;
  std::uint32_t acc = __ldcg(dep + prev);  // the previous region's output (the staging)
  acc ^= stream_rows(region_base(g, dep, prev), g.rows, w, W, a, loaded);
  if (acc == kMagic) dep[cur] = acc;  // never at run time: keeps the loads
}

// kMode 0: barriers; 1: barriers, the next I region's first row loaded before each; 2: no barriers.
template <int kMode>
__global__ void __launch_bounds__(256) region_persist(Region const* gs, int n, std::uint32_t* dep, unsigned long long* bar) {
  std::size_t const W = std::size_t(gridDim.x) * (blockDim.x >> 5);
  std::size_t const w = (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  uint4 a[kRowU];
  bool loaded = false;
  std::uint32_t acc = 0;
  for (int i = 0; i < n; ++i) {
    Region const g = gs[i];
    acc ^= stream_rows(region_base(g, dep, i > 0 ? i - 1 : 0), g.rows, w, W, a, loaded);
    loaded = false;
    if (i + 1 < n && kMode != 2) {
      Region const nx = gs[i + 1];
      if (kMode == 1 && !nx.dependent && w < nx.rows) {
        row_load(a, nx.p, w);
        loaded = true;
      }
      ling::cuda::kernels::grid_barrier(bar);  // the streamed MoE launch A's barrier
      acc ^= __ldcg(dep + i);  // the region's output (the staging)
    }
  }
  if (acc == kMagic) dep[0] = acc;
}

}  // namespace

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr int kLayers = 35;
  struct Part {
    char const* name;
    double mb;
    int dependent;
  };
  Part const parts[] = {{"proj", 52.5, 0}, {"kstep", 4.4, 0}, {"oproj", 10.5, 0},
                        {"router", 2.6, 0}, {"moeA", 20.7, 1}, {"moeB", 10.4, 1}};
  int const R = int(sizeof(parts) / sizeof(parts[0]));
  double layer_bytes = 0;
  for (Part const& p : parts) layer_bytes += p.mb * 1e6;
  std::size_t const pool_bytes = std::size_t(4) << 30;
  uint4* pool;
  std::uint32_t* dep;
  unsigned long long* bar;
  Region* dgs;
  CK(cudaMalloc(&pool, pool_bytes));
  CK(cudaMemset(pool, 1, pool_bytes));
  CK(cudaMalloc(&dep, sizeof(std::uint32_t) * kLayers * R));
  CK(cudaMemset(dep, 0, sizeof(std::uint32_t) * kLayers * R));
  CK(cudaMalloc(&bar, sizeof(unsigned long long)));
  CK(cudaMemset(bar, 0, sizeof(unsigned long long)));
  std::vector<Region> gs;
  std::size_t at = 0;
  for (int l = 0; l < kLayers; ++l)
    for (Part const& p : parts) {
      std::size_t const rows = std::size_t(p.mb * 1e6 / (16.0 * kRowVecs));
      if ((at + rows + 1) * kRowVecs * 16 > pool_bytes) at = 0;  // never at these sizes (3.5 GB)
      gs.push_back(Region{pool + at * kRowVecs, rows, p.dependent});
      at += rows + 1;  // + 1: a dependent region may read one row further
    }
  CK(cudaMalloc(&dgs, sizeof(Region) * gs.size()));
  CK(cudaMemcpy(dgs, gs.data(), sizeof(Region) * gs.size(), cudaMemcpyHostToDevice));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, region_persist<0>, 256, 0));
  int const blocks = sms * (per_sm < 2 ? per_sm : 2);  // 16 warps per SM, all resident (the barrier needs it)
  std::printf("SMs %d, blocks %d x 256 threads, %d layers of %.1f MB (", sms, blocks, kLayers, layer_bytes / 1e6);
  for (Part const& p : parts) std::printf(" %s %.1f%s", p.name, p.mb, p.dependent ? "D" : "");
  std::printf(" )\n%-28s %10s %8s\n", "variant", "us/layer", "GB/s");
  auto report = [&](char const* name, float us) {
    std::printf("%-28s %10.2f %8.0f\n", name, us, layer_bytes / (us * 1e-6) / 1e9);
  };
  // the chain of region launches (skip: a region index whose launches are left out, or -1)
  auto chain = [&](bool early, int skip) {
    return probe::time_graph(st, kLayers, [&] {
      for (int i = 0; i < int(gs.size()); ++i) {
        if (i % R == skip) continue;
        auto kern = early ? region_launch<true> : region_launch<false>;
        CK(ling::cuda::kernels::launch_ex(kern, dim3(unsigned(blocks)), dim3(256u), 0, st, gs[std::size_t(i)], dep, i));
      }
    });
  };
  report("launch, after wait", chain(false, -1));
  float const whole = chain(true, -1);
  report("launch, row first", whole);
  // each region's marginal cost in the chain (session 20): the "row first" chain without that region's launches, and
  // the difference to the whole chain
  std::printf("%-28s %10s %8s %10s\n", "launch, row first, without", "us/layer", "GB/s", "region us");
  for (int skip = 0; skip < R; ++skip) {
    float const us = chain(true, skip);
    std::printf("  %-26s %10.2f %8.0f %10.2f\n", parts[skip].name, us, (layer_bytes - parts[skip].mb * 1e6) / (us * 1e-6) / 1e9,
                whole - us);
  }
  auto persist = [&](auto kern, char const* name) {
    float const us = probe::time_graph(st, kLayers, [&] {
      kern<<<blocks, 256, 0, st>>>(dgs, int(gs.size()), dep, bar);
      CK(cudaGetLastError());
    });
    report(name, us);
  };
  persist(region_persist<0>, "persistent, barrier");
  persist(region_persist<1>, "persistent, row first");
  persist(region_persist<2>, "persistent, no barrier");
  CK(cudaStreamSynchronize(st));
  return 0;
}
