#pragma once
// Hopper warpgroup MMA (wgmma, sm_90a) on FP8 E4M3: with A from registers, the primitives of the MXFP4 decode on tensor
// cores (MoE launch A's LING_MOE_DIAG_A=9 instance; bench/probes/wgmma_decode; docs/kernels.md "Launch A's routed
// decode on FP8 wgmma"); with both operands in shared memory, those of the FP8 matvec (matvec_wg.cuh). nvcc only,
// sm_90a.
//
// An E2M1 code becomes an E4M3 byte by placing its bits (sign to bit 7, exponent and mantissa to bits 4-2), with no
// lookup: the E4M3 value is the E2M1 value · 2^-6, subnormals included. A warp's 8 weight rows are its wgmma rows g
// (registers a0, a2) and the same rows' second half of the columns its rows g + 8 (a1, a3), read by ldmatrix
// (lane 4 g + t receives bytes 4 t .. 4 t + 3 of row g: the A fragment's order), so within a k-step wgmma's k = 4 t + b
// holds the low nibble of byte 4 t + b (element 8 t + 2 b) and k = 16 + 4 t + b the high one (element 8 t + 2 b + 1).
#include <cuda_runtime.h>

#include <cstdint>

#include "ling/cuda/async_copy.cuh"

namespace ling::cuda::kernels {

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// The accumulators are written by the asynchronous wgmma: no read of them moves above the wait before this.
template <int R>
__device__ __forceinline__ void wgmma_fence_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// D (+)= A · B for one k-step of 32: A's 64 × 32 E4M3 from registers (the calling warp's rows 16 w .. 16 w + 15), B's
// 32 × N E4M3 by its descriptor. D's fragment: d[4 c + {0, 1}] row g, columns 8 c + 2 t + {0, 1}; d[4 c + {2, 3}] row
// g + 8 (c < N / 8). `accumulate` 0 starts from zero. It should be a run-time value: with a constant 0, ptxas gave A and
// D the same registers and serialized the wgmmas (C7514).
template <int N>
__device__ __forceinline__ void wgmma_e4m3_rs(float (&d)[N / 2], std::uint32_t const (&a)[4], std::uint64_t desc,
                                              int accumulate) {
  if constexpr (N == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
  } else {
    static_assert(N == 16, "8 or 16 columns");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, "
        "p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
  }
}
// A shared-memory matrix descriptor (16-byte aligned): K-major, no swizzle, core matrices of 8 rows (B's columns) × 16
// bytes; the two core matrices of a k-step (k 0-15, 16-31) 128 bytes apart (leading byte offset), 8-column groups 256
// apart (stride). B's k-step of N columns then takes N · 32 bytes.
__device__ __forceinline__ std::uint64_t wgmma_desc_kmajor(void const* p) {
  return std::uint64_t((smem_u32(p) & 0x3FFFFu) >> 4) | (std::uint64_t(128 >> 4) << 16) | (std::uint64_t(256 >> 4) << 32);
}
// A's descriptor: K-major, 128-byte swizzle (8-row atoms of 1024 bytes, the layout the tensor map lands), at p (a k-step
// inside the atom: p advanced by 32 bytes per k-step of 32 E4M3).
__device__ __forceinline__ std::uint64_t wgmma_desc_sw128(void const* p) {
  return std::uint64_t((smem_u32(p) & 0x3FFFFu) >> 4) | (std::uint64_t(1) << 16) | (std::uint64_t(1024 >> 4) << 32) |
         (std::uint64_t(1) << 62);
}
// D (+)= A · B, one k-step of 32, both from shared memory (m64n8k32). `accumulate`: a run-time value (above).
__device__ __forceinline__ void wgmma_e4m3_ss_n8(float (&d)[4], std::uint64_t da, std::uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(da), "l"(db), "r"(accumulate));
}
// The same, m64n16k32.
__device__ __forceinline__ void wgmma_e4m3_ss_n16(float (&d)[8], std::uint64_t da, std::uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(da), "l"(db), "r"(accumulate));
}
// Byte of B (N columns per k-step, the layout of wgmma_desc_kmajor) holding column n, row k of k-step s.
__host__ __device__ constexpr int wgmma_b_offset(int N, int s, int n, int k) {
  return s * N * 32 + (n >> 3) * 256 + (k >> 4) * 128 + (n & 7) * 16 + (k & 15);
}
// ldmatrix: matrix j's 8 rows of 16 bytes at the addresses of lanes 8 j .. 8 j + 7; lane 4 g + t receives bytes
// 4 t .. 4 t + 3 of row g of each matrix.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], void const* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
// The checkpoint's E2M1 nibbles (element 2 j in the low nibble of byte j) as E4M3 bytes, each the code's value · 2^-6:
// the low nibbles into lo, the high ones into hi (7 operations for 8 codes).
__device__ __forceinline__ void e2m1_nibbles_e4m3(std::uint32_t w, std::uint32_t& lo, std::uint32_t& hi) {
  lo = ((w << 4) & 0x80808080u) | ((w << 2) & 0x1C1C1C1Cu);
  hi = (w & 0x80808080u) | ((w >> 2) & 0x1C1C1C1Cu);
}
// Element e (0..31) of a block: its row k in a k-step of B (the inverse of the nibble order above).
__host__ __device__ constexpr int e2m1_wgmma_k(int e) { return 16 * (e & 1) + 4 * (e >> 3) + ((e >> 1) & 3); }

}  // namespace ling::cuda::kernels
