#pragma once
// Asynchronous global -> shared copies (cp.async, sm_80+), 16 bytes per lane, tracked per thread by commit groups.
// nvcc only.
//
// Why: a batch-1 weight stream needs ~34 KB in flight per SM to reach the HBM roofline (4.5 TB/s × ~1 µs of loaded
// latency / 132 SMs). Loads into registers cap that at what the warps can hold, and each warp's next loads wait on
// its math; cp.async lands the bytes in shared memory with no register cost, so a warp can have all of its next
// tiles in flight while it decodes the current one.
//
// Measured and not kept (H200, 2026-11-30): the Hopper bulk copy (cp.async.bulk + mbarrier, one producer warp per
// block, one copy per piece of a tile) issued one copy per ~180 cycles (ncu: the producer's copy loop, a waterfall
// over lanes because the instruction takes uniform registers, stalled on each copy), so the consumers waited ~13 µs
// at the block barrier for the producer of MoE launch B (160 copies per SM of 48-768 bytes): launch A 16.0 µs and
// B 23.0 µs against 14.4 and 11.5 for the register kernels. Since 2026-12-02 MoE launch A's tiles arrive by bulk copies
// that each warp issues for itself (four per tile, a few KB each), which measured faster than cp.async there
// (docs/kernels.md, session 15).
#include <cuda_runtime.h>

#include <cstdint>

namespace ling::cuda::kernels {

__device__ __forceinline__ std::uint32_t smem_u32(void const* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
// p advanced to the next 1024-byte boundary of the shared window (the 128-byte swizzle's atoms, the tensor maps'
// destinations): dynamic shared memory carries no such alignment, so its users allocate 1 KB of slack.
__device__ __forceinline__ unsigned char* smem_align1024(unsigned char* p) {
  return p + ((1024u - (smem_u32(p) & 1023u)) & 1023u);
}
// 16 bytes, bypassing L1 (each weight byte is used once per token).
__device__ __forceinline__ void cp_async16(void* dst, void const* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
// 4 bytes, through L1 (cp.async.ca: the only form for fewer than 16 bytes).
__device__ __forceinline__ void cp_async4(void* dst, void const* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most n of this thread's committed groups are pending (n clamped to 0..3).
__device__ __forceinline__ void cp_async_wait(int n) {
  if (n <= 0) asm volatile("cp.async.wait_group 0;" ::: "memory");
  else if (n == 1) asm volatile("cp.async.wait_group 1;" ::: "memory");
  else if (n == 2) asm volatile("cp.async.wait_group 2;" ::: "memory");
  else asm volatile("cp.async.wait_group 3;" ::: "memory");
}

// Bytes [p, p + n) of global memory widened to 16-byte bounds so that they can be copied in 16-byte pieces: copy
// `bytes` from `src`; the wanted bytes then sit at offset `skew` of the copy. Reading up to 15 bytes either side stays
// inside the allocation when, as for every weight array here (DeviceMatrix buffers, the model's arena), allocations
// start 256-byte aligned and end on a 256-byte bound or before slack.
struct Span16 {
  char const* src;
  std::uint32_t bytes, skew;
};
__device__ __forceinline__ Span16 span16(void const* p, std::int64_t n) {
  std::uintptr_t const a = reinterpret_cast<std::uintptr_t>(p), s = a & ~std::uintptr_t(15);
  std::uintptr_t const e = (a + std::uintptr_t(n) + 15) & ~std::uintptr_t(15);
  return Span16{reinterpret_cast<char const*>(s), std::uint32_t(e - s), std::uint32_t(a - s)};
}
// The most bytes span16 returns for n wanted bytes.
__host__ __device__ constexpr std::int64_t span16_cap(std::int64_t n) { return (n + 15) / 16 * 16 + 16; }

// The calling warp copies a span to dst (16-byte aligned), lane l taking the 16-byte pieces l, l + 32, ...
__device__ __forceinline__ void warp_copy(void* dst, Span16 const& s) {
  for (std::uint32_t off = (threadIdx.x & 31) * 16u; off < s.bytes; off += 512u)
    cp_async16(static_cast<char*>(dst) + off, s.src + off);
}

// Named barrier `id` (1-15; 0 is __syncthreads') over the first `threads` threads that reach it (a multiple of 32):
// a warpgroup's barrier while another warp of the block streams on.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Arrives on named barrier `id` without waiting (bar.arrive): a warp that only produces for the barrier's waiters.
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- Hopper bulk copies (cp.async.bulk, sm_90) completing on an mbarrier ----------------------------------------
// One instruction copies a whole contiguous span (16-byte aligned source and destination, a multiple of 16 bytes);
// the barrier's phase completes when its expected bytes have landed. Used by one lane per copy: unlike cp.async, the
// copy's cost does not grow with its size, which matters where a warp requests kilobytes at once (MoE launch A).
__device__ __forceinline__ void mbar_init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes mbarrier initializations visible to the async proxy (the bulk copies' completions); then synchronize the
// threads that use the barriers.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// Orders this thread's earlier generic-proxy accesses to shared memory before later bulk copies into it.
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// The arrival of the barrier's one expected thread, announcing `bytes` of copies that complete on it.
__device__ __forceinline__ void mbar_arrive_expect(std::uint64_t* bar, std::uint32_t bytes) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
// One arrival on the barrier (no bytes announced); it releases the caller's earlier writes to the barrier's waiters.
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(smem_u32(bar)) : "memory");
}
// Copies `bytes` (a multiple of 16) from global src to shared dst (both 16-byte aligned), completing on bar.
__device__ __forceinline__ void bulk_copy(void* dst, void const* src, std::uint32_t bytes, std::uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
// Waits until the barrier's phase of the given parity has completed. The phase completes once its one arrival and all
// the bytes it announced are in; callers announce exactly the bytes of the copies they issue on it, so the wait ends
// (a copy that faults aborts the kernel with an error instead).
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, unsigned parity) {
  std::uint32_t done = 0;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
  } while (!done);
}

}  // namespace ling::cuda::kernels
