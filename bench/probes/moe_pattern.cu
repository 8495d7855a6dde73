// Probe: does MoE launch B's access pattern cost DRAM time by itself? (docs/perf-log.md, session 20: launch B takes
// ~5 µs from its staged input to its end for ~8 MB of routed rows requested at once, where region_chain streams 10.4 MB
// of contiguous rows with the same dependence at a marginal 3.5 µs.)
//
// A chain of 35 PDL launches (one per layer, fresh memory each, as region_chain), 132 blocks of 20 warps, each launch
// reading one layer's routed down rows in one of these patterns:
//   contiguous     the same bytes as contiguous 2560-byte rows (probe::stream_rows; two rows in flight per warp)
//   B codes        launch B's: warp w computes output row w of 2560; lane l reads chunk q = l + 32 u (u < 6) of the
//                  concatenation of the 8 picked experts' rows (24 chunks of 16 bytes each): 16 bytes at expert s's
//                  row w, chunk j (s = q / 24, j = q % 24); the experts are 8 of the layer's 1 MB matrices
//   B codes+scales the same with each chunk's scale byte (expert s's 24-byte scale row), as moe_down_lane_kernel
// and µs per launch for each. Equal times: the pattern is not what launch B waits on (its staging and its chain are).
// Built as the target moe_pattern (CUDA builds).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "ling/cuda/linear.cuh"
#include "probe_util.cuh"

namespace {

inline constexpr int kRows = 2560, kTopK = 8, kChunks = 24, kU = kTopK * kChunks / 32;  // Ling's down: 2560 × 768
inline constexpr std::size_t kRowBytes = 16 * kChunks;                                  // 384 bytes of MXFP4 codes
inline constexpr std::size_t kExpertBytes = std::size_t(kRows) * kRowBytes;             // 983 040
inline constexpr std::size_t kScaleBytes = std::size_t(kRows) * kChunks;                // 61 440

__device__ __forceinline__ void pdl_enter() {
  ling::cuda::kernels::pdl_trigger();
  ling::cuda::kernels::pdl_wait();
}

// kScales: also each chunk's scale byte. codes / scales: the layer's 8 experts, kExpertBytes / kScaleBytes apart.
template <bool kScales>
__global__ void __launch_bounds__(640) b_pattern(unsigned char const* codes, unsigned char const* scales, std::uint32_t* sink) {
  pdl_enter();
  int const lane = int(threadIdx.x & 31);
  int const r = int((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  if (r >= kRows) return;
  uint4 v[kU];
  std::uint32_t sc[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    int const q = lane + 32 * u, s = q / kChunks, j = q - s * kChunks;
    v[u] = probe::ldnc(reinterpret_cast<uint4 const*>(codes + std::size_t(s) * kExpertBytes + std::size_t(r) * kRowBytes) + j);
    sc[u] = kScales ? __ldg(scales + std::size_t(s) * kScaleBytes + std::size_t(r) * kChunks + j) : 0u;
  }
  std::uint32_t acc = 0;
#pragma unroll
  for (int u = 0; u < kU; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w ^ sc[u];
  if (acc == probe::kMagic) *sink = acc;  // never at run time: keeps the loads
}

__global__ void __launch_bounds__(640) contiguous(uint4 const* p, std::size_t rows, std::uint32_t* sink) {
  pdl_enter();
  std::size_t const W = std::size_t(gridDim.x) * (blockDim.x >> 5);
  std::size_t const w = (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  uint4 a[probe::kRowU];
  std::uint32_t const acc = probe::stream_rows(p, rows, w, W, a, false);
  if (acc == probe::kMagic) *sink = acc;
}

}  // namespace

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr int kLayers = 35;
  std::size_t const layer_codes = kTopK * kExpertBytes, layer_scales = kTopK * kScaleBytes;
  unsigned char *codes, *scales;
  std::uint32_t* sink;
  CK(cudaMalloc(&codes, layer_codes * kLayers));
  CK(cudaMalloc(&scales, layer_scales * kLayers));
  CK(cudaMalloc(&sink, 64));
  CK(cudaMemset(codes, 1, layer_codes * kLayers));
  CK(cudaMemset(scales, 1, layer_scales * kLayers));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int const warps = 20, blocks = (kRows + warps - 1) / warps;  // launch B's grid at Ling's shape: 128 blocks of 20 warps
  std::size_t const rows2560 = layer_codes / (16 * probe::kRowVecs);
  auto chain = [&](int mode) {
    return probe::time_graph(st, kLayers, [&] {
      for (int l = 0; l < kLayers; ++l) {
        unsigned char const* c = codes + std::size_t(l) * layer_codes;
        unsigned char const* s = scales + std::size_t(l) * layer_scales;
        if (mode == 0)
          CK(ling::cuda::kernels::launch_ex(contiguous, dim3(unsigned(blocks)), dim3(unsigned(warps * 32)), 0, st,
                                            reinterpret_cast<uint4 const*>(c), rows2560, sink));
        else if (mode == 1)
          CK(ling::cuda::kernels::launch_ex(b_pattern<false>, dim3(unsigned(blocks)), dim3(unsigned(warps * 32)), 0, st, c, s, sink));
        else
          CK(ling::cuda::kernels::launch_ex(b_pattern<true>, dim3(unsigned(blocks)), dim3(unsigned(warps * 32)), 0, st, c, s, sink));
      }
    });
  };
  std::printf("SMs %d, %d blocks x %d warps, %d layers; per layer %.2f MB of codes (8 experts of %d x %zu bytes), %.2f MB of "
              "scales\n%-16s %10s %8s\n",
              sms, blocks, warps, kLayers, layer_codes / 1e6, kRows, kRowBytes, layer_scales / 1e6, "pattern", "us/launch", "GB/s");
  char const* names[] = {"contiguous", "B codes", "B codes+scales"};
  for (int mode = 0; mode < 3; ++mode) {
    float const us = chain(mode);
    double const bytes = double(layer_codes) + (mode == 2 ? double(layer_scales) : 0.0);
    std::printf("%-16s %10.2f %8.0f\n", names[mode], us, bytes / (us * 1e-6) / 1e9);
  }
  return 0;
}
