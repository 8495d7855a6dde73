// Probe: how fast tensor-map copies (cp.async.bulk.tensor, TMA) stream a row-major FP8 matrix into shared memory in
// the 128-byte-swizzled K-major layout that wgmma reads, by box shape and by how many warps issue them.
//
// Why: a matvec on FP8 wgmma (A = the weights from shared memory) needs its rows in the swizzled layout, which a
// plain bulk copy of contiguous rows does not give. A 2D map over [rows][cols] with boxes of 128 bytes × R rows gives
// it, but ring_chain measured that copies of 4 KB cost ~300 cycles of issue each (one lane: ~3.5 TB/s at most).
// Bigger boxes need a 3D map whose k-block dimension (stride 128 bytes) sits outside the rows (stride ld): strides that
// do not nest, which the driver may refuse; the probe says whether it does, and the rates of both.
// Each block (one per SM) streams `units` of R rows × the whole row (2560 bytes: 20 k-blocks of 128), units dealt
// round robin, into S slots; nobody reads the slots.
// Built as the target tma_box (CUDA builds).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "ling/cuda/async_copy.cuh"
#include "ling/cuda/matvec_wg.cuh"
#include "probe_util.cuh"

namespace {

namespace k = ling::cuda::kernels;

// kDims 2: a stage is `kbs` boxes of 128 × R (one per k-block); 3: one box of 128 × R × kbs. Producer warps P: warp p
// issues the stages q ≡ p (mod P), lane 0 only.
template <int kDims>
__global__ void __launch_bounds__(128, 1) tma_stream(__grid_constant__ CUtensorMap const map, int rows, int nkb, int R,
                                                     int kbs, int S, int P, std::uint32_t* sink) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = k::smem_align1024(smem_raw);
  unsigned const stage = unsigned(R) * 128u * unsigned(kbs);
  auto* bar = reinterpret_cast<std::uint64_t*>(smem + std::size_t(S) * stage);
  int const warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) k::mbar_init(bar + s, 1);
    k::mbar_init_fence();
  }
  __syncthreads();
  if (warp >= P || lane != 0) return;
  int const units = (rows + R - 1) / R;
  unsigned q = 0, mine = 0;
  for (int u = int(blockIdx.x); u < units; u += int(gridDim.x))
    for (int kb = 0; kb < nkb; kb += kbs, ++q) {
      if (q % unsigned(P) != unsigned(warp)) continue;
      unsigned const s = q % unsigned(S), use = q / unsigned(S);
      if (use > 0) k::mbar_wait(bar + s, (use - 1) & 1u);
      k::mbar_arrive_expect(bar + s, stage);
      unsigned char* dst = smem + std::size_t(s) * stage;
      if (kDims == 3) {
        k::tma_load_3d(dst, &map, 0, u * R, kb, bar + s);
      } else {
        for (int j = 0; j < kbs; ++j)
          k::tma_load_2d(dst + std::size_t(j) * R * 128, &map, (kb + j) * 128, u * R, bar + s);
      }
      ++mine;
    }
  // the last copies land before the block ends
  for (unsigned r = q > unsigned(S) ? q - unsigned(S) : 0; r < q; ++r)
    if (r % unsigned(P) == unsigned(warp)) k::mbar_wait(bar + r % unsigned(S), (r / unsigned(S)) & 1u);
  if (mine == 0xFFFFFFFFu) sink[0] = mine;
}

// After the 3D copies: the first 64 rows × 2 k-blocks of the matrix as they landed (unswizzled on the host).
__global__ void tma_check(__grid_constant__ CUtensorMap const map, unsigned char* out) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = k::smem_align1024(smem_raw);
  auto* bar = reinterpret_cast<std::uint64_t*>(smem + 64 * 128 * 2);
  if (threadIdx.x == 0) {
    k::mbar_init(bar, 1);
    k::mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    k::mbar_arrive_expect(bar, 64 * 128 * 2);
    k::tma_load_3d(smem, &map, 0, 0, 0, bar);
  }
  k::mbar_wait(bar, 0);
  for (int i = int(threadIdx.x); i < 64 * 128 * 2; i += int(blockDim.x)) out[i] = smem[i];
}

}  // namespace

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto const encode = k::tensor_map_encoder();
  if (!encode) {
    std::printf("no cuTensorMapEncodeTiled\n");
    return 1;
  }
  constexpr int kCols = 2560, kNkb = kCols / 128;
  std::uint64_t const bytes = std::uint64_t(2) << 30;
  int const rows = int(bytes / kCols);
  unsigned char* w;
  std::uint32_t* sink;
  CK(cudaMalloc(&w, bytes));
  CK(cudaMalloc(&sink, 64));
  std::vector<unsigned char> host(std::size_t(64) * kCols);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = (unsigned char)((i * 2654435761u) >> 13);
  CK(cudaMemset(w, 1, bytes));
  CK(cudaMemcpy(w, host.data(), host.size(), cudaMemcpyHostToDevice));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto make = [&](int dims, int R, int kbs, CUtensorMap& m) {
    cuuint32_t const es[3] = {1, 1, 1};
    if (dims == 2) {
      cuuint64_t const gd[2] = {kCols, cuuint64_t(rows)};
      cuuint64_t const gs[1] = {kCols};
      cuuint32_t const bd[2] = {128, cuuint32_t(R)};
      return encode(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, w, gd, gs, bd, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                    CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    }
    return k::encode_kblock_map(m, w, rows, kCols, kNkb, R, kbs);  // the matvec's map
  };
  // the 3D map: accepted? and does a box land as [kb][row][128 bytes, swizzled]?
  {
    CUtensorMap m;
    CUresult const r = make(3, 64, 2, m);
    std::printf("3D map with strides {%d, 128}: %s (%d)\n", kCols, r == CUDA_SUCCESS ? "accepted" : "refused", int(r));
    if (r == CUDA_SUCCESS) {
      unsigned char* out;
      CK(cudaMalloc(&out, 64 * 128 * 2));
      CK(cudaFuncSetAttribute(tma_check, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 128 * 2 + 2048));
      tma_check<<<1, 128, 64 * 128 * 2 + 2048, st>>>(m, out);
      CK(cudaStreamSynchronize(st));
      std::vector<unsigned char> got(64 * 128 * 2);
      CK(cudaMemcpy(got.data(), out, got.size(), cudaMemcpyDeviceToHost));
      int bad = 0;
      for (int kb = 0; kb < 2; ++kb)
        for (int r = 0; r < 64; ++r)
          for (int b = 0; b < 128; ++b) {
            // 128-byte swizzle: the 16-byte chunk c of row r (in its 1024-byte atom) sits at chunk c ^ (r % 8)
            int const at = kb * 64 * 128 + r * 128 + ((((b >> 4) ^ (r & 7)) << 4) | (b & 15));
            if (got[std::size_t(at)] != host[std::size_t(r) * kCols + std::size_t(kb) * 128 + std::size_t(b)]) ++bad;
          }
      std::printf("3D box [kb][row][128 B swizzled]: %d of %d bytes differ\n", bad, 64 * 128 * 2);
    }
  }
  std::printf("%-34s %10s %8s\n", "variant (R rows, k-blocks per stage)", "us / 2 GiB", "GB/s");
  auto run = [&](int dims, int R, int kbs, int S, int P) {
    CUtensorMap m;
    if (make(dims, R, kbs, m) != CUDA_SUCCESS) {
      std::printf("%dD R %d kbs %d: map refused\n", dims, R, kbs);
      return;
    }
    std::size_t const smem = std::size_t(S) * R * 128 * kbs + 8 * std::size_t(S) + 1024;
    auto kern = dims == 3 ? tma_stream<3> : tma_stream<2>;
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    float const us = probe::time_graph(st, 1, [&] {
      kern<<<sms, 128, smem, st>>>(m, rows, kNkb, R, kbs, S, P, sink);
      CK(cudaGetLastError());
    });
    char label[96];
    std::snprintf(label, sizeof label, "%dD, R %d, %d kb/stage (%d KB), %d x, %d warp%s", dims, R, kbs, R * kbs / 8, S,
                  P, P > 1 ? "s" : "");
    std::printf("%-44s %10.1f %8.0f\n", label, us, double(rows) * kCols / (us * 1e-6) / 1e9);
  };
  run(2, 32, 4, 12, 1);
  run(2, 32, 4, 12, 2);
  run(2, 32, 4, 12, 4);
  run(2, 64, 2, 12, 1);
  run(2, 64, 2, 12, 2);
  run(3, 32, 4, 12, 1);
  run(3, 32, 5, 10, 1);
  run(3, 64, 2, 12, 1);
  run(3, 16, 8, 12, 1);
  run(3, 32, 4, 6, 1);
  run(3, 32, 4, 6, 2);
  CK(cudaStreamSynchronize(st));
  return 0;
}
