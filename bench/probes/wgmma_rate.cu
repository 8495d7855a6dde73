// Probe: the cost of one FP8 wgmma m64nNk32 with both operands in shared memory (K-major, 128-byte swizzle), by N,
// in SM cycles: a chain on one accumulator set, with at most two groups of four in flight (as matvec_wg runs them),
// and with each group awaited before the next (its latency). Why (docs/perf-log.md, session 31): matvec_wg's
// slots measured ~60 cycles per m64n8k32 and ~112 per m64n16k32, so a weight byte costs the tensor core far more
// than its share of the peak rate. With the weights as B (N = rows of W, m64nNk32, A = the input's limbs) one wgmma
// takes N × 32 bytes of weights instead of 64 × 32: worth it if the cost grows more slowly than N.
// One warpgroup per SM, every SM; the median over the SMs. Built as the target wgmma_rate (CUDA builds).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "ling/cuda/matvec_wg.cuh"
#include "probe_util.cuh"

namespace {

namespace k = ling::cuda::kernels;

template <int N>
__device__ __forceinline__ void mma_ss(float (&d)[N / 2], std::uint64_t da, std::uint64_t db, int acc);
template <>
__device__ __forceinline__ void mma_ss<8>(float (&d)[4], std::uint64_t da, std::uint64_t db, int acc) {
  k::wgmma_e4m3_ss_n8(d, da, db, acc);  // matvec_wg's
}
template <>
__device__ __forceinline__ void mma_ss<16>(float (&d)[8], std::uint64_t da, std::uint64_t db, int acc) {
  k::wgmma_e4m3_ss_n16(d, da, db, acc);  // matvec_wg's
}
// the wider shapes written out: inline PTX names each accumulator register
template <>
__device__ __forceinline__ void mma_ss<32>(float (&d)[16], std::uint64_t da, std::uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(acc));
}
template <>
__device__ __forceinline__ void mma_ss<64>(float (&d)[32], std::uint64_t da, std::uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, "
      "1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(acc));
}
template <>
__device__ __forceinline__ void mma_ss<128>(float (&d)[64], std::uint64_t da, std::uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, "
      "%35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, "
      "%57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(acc));
}
template <>
__device__ __forceinline__ void mma_ss<256>(float (&d)[128], std::uint64_t da, std::uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, "
      "%35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, "
      "%57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, "
      "%79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, "
      "%101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, "
      "%119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),
        "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
        "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(acc));
}

// A K-major operand of `rows` rows, 128-byte swizzle, at p (1024-aligned): the descriptor of matvec_wg.
// kChains accumulator sets, the four k-steps of an iteration spread over them (kChains 1: one dependent chain).
template <int N, int kWait, int kChains = 1>
__global__ void __launch_bounds__(128, 1) rate_kernel(int iters, long long* cycles, float* sink) {
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned char* const base = k::smem_align1024(raw);
  for (int i = int(threadIdx.x); i < (8192 + N * 128) / 16; i += 128)
    reinterpret_cast<uint4*>(base)[i] = make_uint4(0, 0, 0, 0);
  k::fence_proxy_async_smem();
  __syncthreads();
  int const one = iters > 0 ? 1 : 0;
  float d[kChains][N / 2];
#pragma unroll
  for (int c = 0; c < kChains; ++c)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) d[c][i] = 0.f;
  std::uint64_t const da = k::wgmma_desc_sw128(base), db = k::wgmma_desc_sw128(base + 8192);
  k::wgmma_fence();
  long long const t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    k::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      mma_ss<N>(d[kk % kChains], da + std::uint64_t(2 * kk), db + std::uint64_t(2 * kk), one);
    k::wgmma_commit();
    k::wgmma_wait<kWait>();
  }
  k::wgmma_wait<0>();
  long long const t1 = clock64();
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) {
    k::wgmma_fence_acc(d[c]);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) s += d[c][i];
  }
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  if (s == 1234.5f) sink[0] = s;
}

}  // namespace

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  long long* cyc;
  float* sink;
  CK(cudaMalloc(&cyc, sizeof(long long) * std::size_t(sms)));
  CK(cudaMalloc(&sink, 64));
  int const iters = 512;
  std::printf(
      "cycles per wgmma m64nNk32 (SS, FP8), median SM; one chain (2 groups in flight / each group awaited), 4\n"
      "chains; weight bytes per cycle with the weights as A (64 x 32 per wgmma) or as B (N x 32), 4 chains\n");
  std::printf("%5s %12s %12s %12s %16s %16s\n", "N", "1 chain", "latency", "4 chains", "W as A: B/cyc",
              "W as B: B/cyc");
  auto one = [&](auto kern1, auto kern0, auto kern4, int N) {
    double r[3];
    auto kerns = {kern1, kern0, kern4};
    int w = 0;
    for (auto kern : kerns) {
      std::size_t const smem = 8192 + std::size_t(N) * 128 + 1024;
      CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      kern<<<sms, 128, smem>>>(iters, cyc, sink);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      std::vector<long long> h(static_cast<std::size_t>(sms));
      CK(cudaMemcpy(h.data(), cyc, sizeof(long long) * h.size(), cudaMemcpyDeviceToHost));
      std::nth_element(h.begin(), h.begin() + h.size() / 2, h.end());  // the median SM
      r[w++] = double(h[h.size() / 2]) / double(4 * iters);
    }
    std::printf("%5d %12.1f %12.1f %12.1f %16.1f %16.1f\n", N, r[0], r[1], r[2], 2048.0 / r[2],
                double(N) * 32.0 / r[2]);
  };
  one(rate_kernel<8, 1>, rate_kernel<8, 0>, rate_kernel<8, 1, 4>, 8);
  one(rate_kernel<16, 1>, rate_kernel<16, 0>, rate_kernel<16, 1, 4>, 16);
  one(rate_kernel<32, 1>, rate_kernel<32, 0>, rate_kernel<32, 1, 4>, 32);
  one(rate_kernel<64, 1>, rate_kernel<64, 0>, rate_kernel<64, 1, 4>, 64);
  one(rate_kernel<128, 1>, rate_kernel<128, 0>, rate_kernel<128, 1, 2>, 128);
  one(rate_kernel<256, 1>, rate_kernel<256, 0>, rate_kernel<256, 1, 1>, 256);
  return 0;
}
