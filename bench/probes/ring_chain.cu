// Probe: whether weight streams that run ahead of a decode layer's dependences pass the chain of PDL launches
// (docs/kernels.md "A persistent step with a shared-memory weight ring"; docs/perf-log.md, session 31).
//
// Why (docs/perf-log.md, sessions 6 and 20): a step of dependent launches stops at ~77% of the roofline even with
// ideal kernels, because each launch starts its reads only once the one before it ends (region_chain: 29.7 µs per KDA
// layer's 101 MB as PDL launches, 22.4 with no dependences at all). The weights do not depend on the region before
// them, so they can stream across the dependence if something holds them: here, rings of shared memory. Printed:
//   - the copy engines alone (copy_only): bulk copies, cp.async and register loads over 2 GiB, by bytes in flight;
//   - one persistent launch (ring_persist): one producer lane per SM requests its part of every region into a ring of
//     S slots, waiting only for a free slot (and, for the routed regions, for the router region's grid flag); the
//     consumer warps wait for the previous region's grid flag, fold each slot (the math left out) and hand it back.
//     Variants: the deal (slices or chunks interleaved over the blocks), pieces per slot, slots freed before the fold,
//     the consumers left out, spinning waits, the flag's fence, a signalling warp, cp.async producers;
//   - one PDL launch per region (region_tma): a ring per launch small enough that the next launch's block sits beside
//     it and requests its slots before its PDL wait.
//
// Regions of one layer (MB; D: addresses from the output of the region `back` before): projections 52.5, KDA state 4.4,
// o_proj 10.5, router 2.6, MoE gate/up 20.7 D (router), MoE down 10.4 D (router), rows of 2560 bytes. µs per layer over
// 35 layers (best of 7 × 10 graph replays; a memset node before each replay zeroes the grid flags). The last columns of
// the persistent rows: the median block's and the last block's end (µs after the first block's start) and the share of
// their time the consumers' thread 0 and the producer spent waiting for slots. Built as the target ring_chain (CUDA
// builds).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <utility>
#include <vector>

#include "ling/cuda/async_copy.cuh"
#include "ling/cuda/linear.cuh"
#include "ling/cuda/wgmma.cuh"
#include "probe_util.cuh"

namespace {

namespace k = ling::cuda::kernels;

constexpr int kRowBytes = 2560;
static_assert(kRowBytes == 16 * probe::kRowVecs, "region_regs streams the rows of probe::stream_rows");
constexpr std::uint32_t kMagic = probe::kMagic;

struct Region {
  char const* p;
  std::uint64_t rows;
  int back;      // 0: addresses known before the launch; b > 0: from the output of the region b before (routed experts)
  unsigned rot;  // interleaved parts: the block that takes the region's first chunk (the blocks take turns in the step)
};

__device__ __forceinline__ unsigned ld_acquire(unsigned const* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void wait_flag(unsigned const* f, unsigned target) {
  for (unsigned n = 0; ld_acquire(f) < target; ++n)
    if (n > (1u << 26)) __trap();  // seconds: never in a correct launch
}
// spin: mbarrier.test_wait in a loop (the thread never sleeps) instead of try_wait (which may suspend the thread).
__device__ __forceinline__ void bar_wait(std::uint64_t* bar, unsigned parity, int spin) {
  if (!spin) return k::mbar_wait(bar, parity);
  std::uint32_t done = 0;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(k::smem_u32(bar)), "r"(parity)
                 : "memory");
  } while (!done);
}

// A consumer warp's share of a landed slot of nb bytes, folded into acc, then the slot handed back (one arrival per
// warp on `empty`). fold 2: into registers first, the slot freed before the math (at most 8 · 16 bytes per thread); 1:
// read in place, freed after; 0: not read. kM > 0: decode-like math on every 16 bytes (probe::decode_like; xs: 64
// words of shared memory). kAll: fold 2 reads the whole slot, 8 · 16 bytes per thread at a time, and frees it once the
// last batch is in registers (the math rows; the other rows read at most 8 · 16 bytes per thread of each slot).
template <int kM = 0, bool kAll = false>
__device__ __forceinline__ void consume_slot(unsigned char const* slot, unsigned nb, int threads, int fold,
                                             std::uint64_t* empty, std::uint32_t& acc,
                                             std::uint32_t const* xs = nullptr) {
  uint4 const* v = reinterpret_cast<uint4 const*>(slot);
  bool const lane0 = (threadIdx.x & 31) == 0;
  if (fold == 2) {  // batches of 8 · 16 bytes per thread (without kAll only the first); the slot freed after the last
    unsigned const n16 = nb / 16u, per = 8u * unsigned(threads), end = kAll ? n16 : (n16 < per ? n16 : per);
    unsigned b0 = 0;
    do {
      uint4 x[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        unsigned const j = b0 + threadIdx.x + unsigned(u * threads);
        x[u] = j < end ? v[j] : make_uint4(0, 0, 0, 0);
      }
      if (b0 + per >= end) {
        __syncwarp();
        if (lane0) k::mbar_arrive(empty);
      }
      int4 a = make_int4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < 8; ++u) probe::decode_like<kM>(x[u], xs, a, u);
      acc ^= probe::fold_sums(a);
      b0 += per;
    } while (b0 < end);
    return;
  }
  for (unsigned j = threadIdx.x; fold && j < nb / 16u; j += unsigned(threads)) {
    int4 a = make_int4(0, 0, 0, 0);
    probe::decode_like<kM>(v[j], xs, a);
    acc ^= probe::fold_sums(a);
  }
  __syncwarp();
  if (lane0) k::mbar_arrive(empty);
}

// Block b's part of region g, in chunks of `stage` bytes: kMode 0, the contiguous rows [R b / B, R (b + 1) / B) cut
// into chunks; 1, the region's chunks j ≡ b − rot (mod B) (the whole GPU sweeps the region in address order; the
// first chunk's block turns so that no block takes the extra chunk of every region).
struct Part {
  std::uint64_t first, step, end;  // byte offsets of this block's chunks: first, first + step, ... < end
};
__device__ __forceinline__ Part part_of(Region const& g, int mode, unsigned stage) {
  std::uint64_t const B = gridDim.x, b = blockIdx.x, total = g.rows * kRowBytes;
  if (mode == 0) {
    std::uint64_t const lo = g.rows * b / B, hi = g.rows * (b + 1) / B;
    return Part{lo * kRowBytes, stage, hi * kRowBytes};
  }
  return Part{((b + B - g.rot % B) % B) * stage, B * stage, total};
}
__device__ __forceinline__ unsigned chunk_bytes(Part const& p, std::uint64_t c, unsigned stage) {
  std::uint64_t const e = p.step == stage ? p.end : (c + stage < p.end ? c + stage : p.end);
  return unsigned(e - c < stage ? e - c : stage);
}

// kWait 1: the consumers wait for the previous region's flag (the real step's dependences); 0: no waits (the ceiling).
// Threads: kConsumers warps, then one producer warp. Shared memory: S stages of `stage` bytes, then 2 S mbarriers.
// kCopy 0: bulk copies (cp.async.bulk) from the producer's lane 0, `pieces` per stage; > 0: kCopy producer warps, each
// lane copying 16-byte pieces (cp.async.cg) of every kCopy-th stage, whose mbarrier counts the warp's 32 lanes
// (cp.async.mbarrier.arrive.noinc).
template <int kConsumers, bool kWait, int kCopy = 0>
__global__ void __launch_bounds__(32 * (kConsumers + 2), 1)
    ring_persist(Region const* gs, int n, unsigned* flags, int S, unsigned stage, int mode, int pieces, int fold,
                 std::uint32_t* sink, int cons, int spin, int fence, int sig, unsigned long long* times) {
  extern __shared__ __align__(128) unsigned char smem[];
  auto* full = reinterpret_cast<std::uint64_t*>(smem + std::size_t(S) * stage);
  std::uint64_t* empty = full + S;
  std::uint64_t* done = empty + S;  // the consumers' arrivals at each region's end, for the signaling warp (sig)
  auto* rs = reinterpret_cast<Region*>(done + 1);  // the regions, copied once
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) rs[i] = gs[i];
  gs = rs;
  int const warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      k::mbar_init(full + s, kCopy ? 32 : 1);
      k::mbar_init(empty + s, cons == 2 ? 1 : kConsumers);
    }
    k::mbar_init(done, kConsumers);
    k::mbar_init_fence();
  }
  __syncthreads();
  unsigned const B = gridDim.x;
  if (threadIdx.x == 0) times[2 * blockIdx.x] = k::global_ns();
  if (sig && warp == kConsumers + 1) {  // the signaling warp: publishes each region's end once the consumers are done
    if (lane == 0)
      for (int i = 0; i < n; ++i) {
        k::mbar_wait(done, unsigned(i) & 1u);
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(flags + i) : "memory");
      }
    return;
  }
  if (warp >= kConsumers) {  // the producer
    if (!kCopy && lane != 0) return;
    unsigned const pw = unsigned(warp - kConsumers), P = kCopy ? unsigned(kCopy) : 1u;
    long long pwait = 0, pstart = clock64();
    unsigned q = 0;  // chunks issued so far (stage q % S, its use q / S)
    for (int i = 0; i < n; ++i) {
      Region const g = gs[i];
      char const* base = g.p;
      if (g.back > 0 && i >= g.back) {  // the routed experts: their ids come from region i - back's output
        wait_flag(flags + (i - g.back), B);
        if (*reinterpret_cast<std::uint32_t const volatile*>(sink) == kMagic) base += kRowBytes;  // never
      }
      Part const pt = part_of(g, mode, stage);
      for (std::uint64_t c = pt.first; c < pt.end; c += pt.step, ++q) {
        unsigned const s = q % unsigned(S), use = q / unsigned(S);
        if (q % P != pw) continue;
        long long const t0 = clock64();
        if (use > 0) bar_wait(cons == 1 ? full + s : empty + s, (use - 1) & 1u, spin & 1);
        pwait += clock64() - t0;
        unsigned const nb = chunk_bytes(pt, c, stage);
        if (kCopy) {
          char* dst = reinterpret_cast<char*>(smem) + std::size_t(s) * stage;
          for (unsigned o = unsigned(lane) * 16u; o < nb; o += 512u) k::cp_async16(dst + o, base + c + o);
          asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(k::smem_u32(full + s)) : "memory");
          continue;
        }
        k::mbar_arrive_expect(full + s, nb);
        unsigned const piece = (nb / unsigned(pieces) + 15u) & ~15u;
        for (unsigned o = 0; o < nb; o += piece)
          k::bulk_copy(smem + std::size_t(s) * stage + o, base + c + o, nb - o < piece ? nb - o : piece, full + s);
      }
    }
    if (pw == 0) {
      times[4 * gridDim.x + 2 * blockIdx.x] = (unsigned long long)pwait;
      times[4 * gridDim.x + 2 * blockIdx.x + 1] = (unsigned long long)(clock64() - pstart);
    }
    if (cons == 1 && pw == 0)  // nobody else waits for the last copies: they land before the block ends
      for (unsigned r = q > unsigned(S) ? q - unsigned(S) : 0; r < q; ++r)
        k::mbar_wait(full + r % unsigned(S), (r / unsigned(S)) & 1u);
    return;
  }
  // the consumers
  int const threads = 32 * kConsumers;
  long long cwait = 0, cstart = clock64();
  std::uint32_t acc = 0;
  unsigned q = 0;
  for (int i = 0; i < n; ++i) {
    if (kWait && i > 0) {
      if (threadIdx.x == 0) wait_flag(flags + (i - 1), B);
      k::named_sync(1, threads);
      acc ^= __ldcg(sink + 1);  // the region's input (an L2 read after the flag, as the staging)
    }
    Part const pt = part_of(gs[i], mode, stage);
    for (std::uint64_t c = pt.first; c < pt.end && cons != 1 && (cons != 2 || warp == 0); c += pt.step, ++q) {
      unsigned const s = q % unsigned(S), use = q / unsigned(S);
      unsigned const nb = chunk_bytes(pt, c, stage);
      long long const t0 = clock64();
      bar_wait(full + s, use & 1u, spin & 2);
      cwait += clock64() - t0;
      consume_slot(smem + std::size_t(s) * stage, nb, threads, fold, empty + s, acc);
    }
    if (sig) {
      __syncwarp();
      if (lane == 0) k::mbar_arrive(done);
      continue;
    }
    k::named_sync(1, threads);  // every consumer warp is done with region i in this block
    if (threadIdx.x == 0) {
      if (fence == 0) {  // the grid barrier's way (moe.cuh grid_barrier): fence.sc, then a relaxed add
        __threadfence();
        atomicAdd(flags + i, 1u);
      } else if (fence == 1) {  // a release add: orders this thread's (and, by the named barrier, the block's) writes
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(flags + i) : "memory");
      } else {  // relaxed (measurement only: orders nothing)
        asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(flags + i) : "memory");
      }
    }
  }
  if (acc == kMagic) sink[0] = acc;  // never at run time: keeps the loads
  k::named_sync(1, threads);
  if (threadIdx.x == 0) {
    times[2 * blockIdx.x + 1] = k::global_ns();
    times[2 * gridDim.x + 2 * blockIdx.x] = (unsigned long long)cwait;
    times[2 * gridDim.x + 2 * blockIdx.x + 1] = (unsigned long long)(clock64() - cstart);
  }
}

// A ring launch's set-up and producer (region_tma, region_wg): thread 0 initializes the S slots' barriers (`full`: the
// producer's arrival and the copy's bytes; `empty`: one arrival per consumer warp), then the producer warp's lane 0
// requests the block's chunks of g into the slots, each once its slot is handed back. A routed region (back > 0)
// requests nothing before the PDL wait. Returns true on the producer warp (which is then done), false on the consumers.
__device__ __forceinline__ void ring_init(std::uint64_t* full, std::uint64_t* empty, int S, int consumers) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      k::mbar_init(full + s, 1);
      k::mbar_init(empty + s, unsigned(consumers));
    }
    k::mbar_init_fence();
  }
  __syncthreads();
}
__device__ __forceinline__ bool ring_produce(Region const& g, Part const& pt, unsigned char* smem, int S,
                                             unsigned stage, std::uint64_t* full, std::uint64_t* empty,
                                             int producer_warp, std::uint32_t const* sink) {
  if (int(threadIdx.x >> 5) != producer_warp) return false;
  if ((threadIdx.x & 31) != 0) return true;
  char const* base = g.p;
  if (g.back > 0) {
    ling::cuda::kernels::pdl_wait();
    if (*reinterpret_cast<std::uint32_t const volatile*>(sink) == kMagic) base += kRowBytes;  // never
  }
  unsigned q = 0;
  for (std::uint64_t c = pt.first; c < pt.end; c += pt.step, ++q) {
    unsigned const s = q % unsigned(S), use = q / unsigned(S);
    if (use > 0) k::mbar_wait(empty + s, (use - 1) & 1u);
    unsigned const nb = chunk_bytes(pt, c, stage);
    k::mbar_arrive_expect(full + s, nb);
    k::bulk_copy(smem + std::size_t(s) * stage, base + c, nb, full + s);
  }
  return true;
}

// One region as one PDL launch of a block per SM that fills at most half of the SM, so that the next region's launch
// is resident beside it: its producer lane requests the region's first S chunks (S · stage bytes) before the PDL wait,
// while the launch before it still runs; the consumers wait (griddepcontrol.wait: the previous launches are done) and
// then use the stages as the ring above. Routed regions (back > 0) request nothing before the wait.
// kM: decode-like math per 16 bytes (probe::decode_like), for the comparison with region_regs at the same math.
// kAll (the math rows): the registers bounded so that a second launch's blocks fit beside this one's (8 consumer warps:
// 2 blocks per SM; 4 consumer warps: 4, for two blocks per SM of each launch).
template <int kConsumers, int kM = 0, bool kAll = false>
__global__ void __launch_bounds__(32 * (kConsumers + 1), kAll ? (kConsumers == 8 ? 2 : 4) : 1)
    region_tma(Region g, int S, unsigned stage, int fold, std::uint32_t* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(16) std::uint32_t xs[64];  // x's stand-in for the math
  if (threadIdx.x < 64) xs[threadIdx.x] = threadIdx.x * 0x01010101u;
  auto* full = reinterpret_cast<std::uint64_t*>(smem + std::size_t(S) * stage);
  std::uint64_t* empty = full + S;
  ling::cuda::kernels::pdl_trigger();
  ring_init(full, empty, S, kConsumers);
  Part const pt = part_of(g, 1, stage);
  if (ring_produce(g, pt, smem, S, stage, full, empty, kConsumers, sink)) return;
  ling::cuda::kernels::pdl_wait();
  std::uint32_t acc = __ldcg(sink + 1);  // the region's input
  int const threads = 32 * kConsumers;
  unsigned q = 0;
  for (std::uint64_t c = pt.first; c < pt.end; c += pt.step, ++q) {
    unsigned const s = q % unsigned(S), use = q / unsigned(S);
    unsigned const nb = chunk_bytes(pt, c, stage);
    k::mbar_wait(full + s, use & 1u);
    consume_slot<kM, kAll>(smem + std::size_t(s) * stage, nb, threads, fold, empty + s, acc, xs);
  }
  if (acc == kMagic) sink[0] = acc;
}

// The ring launch with tensor-core consumers (session 55's question: region_tma's consumers pay ~8.5 kM instructions
// per 16 bytes on the CUDA cores, and at the model's kM = 8 the rings lost; FP8 `wgmma` reads the weights from shared
// memory itself). The same producer lane and ring as region_tma; the consumers are one warpgroup that reads each landed
// slot as tiles of 64 rows × 128 bytes in the 128-byte-swizzled K-major layout the tensor maps land (a layout the rows
// would be repacked to at load), 4 `wgmma.m64n8k32` E4M3 k-steps per tile against B, each tile's sum into its own
// accumulators, then one FFMA per accumulator with a block scale (the model's 128 × 128 block-FP8 epilogue). B: 20
// k-steps of 8 columns (5 KB), the footprint of 2560 inputs as two E4M3 limbs with 4 column slices packed into the 8
// columns (session 30's split); the probe takes a tile's k-steps modulo 20. The slot is handed back once its wgmmas are
// done. After the PDL wait the warpgroup stages B from the region's input (one L2 round trip, 160 bytes of stores per
// thread, a fence to the async proxy and a named barrier), as a matvec stages its input. The bytes are whatever the
// pool holds (0x01: small E4M3 subnormals); only the time counts. Dynamic shared memory: 1 KB of alignment slack, S
// slots, 2 S mbarriers.
constexpr int kWgTile = 8192, kWgKSteps = 20, kWgBBytes = kWgKSteps * 8 * 32;
// kStageAfter false: B is written before the PDL wait from constants, as region_tma's and region_regs' xs (the
// reference rows stage no input after their wait), and the input is one L2 load after it, as theirs.
// B's stores (region_wg, region_wgx): the consumer warpgroup writes the 20 KB of limbs that 2560 inputs at N = 8 would
// take, as E4M3 bytes near 1.0 (0x38) with the input's low bits folded in, into the kB bytes of bsm (each byte at most
// once when kB is 20 KB), then fences them to the async proxy and meets at named barrier 1.
template <int kB>
__device__ __forceinline__ void stage_b_limbs(unsigned char* bsm, std::uint32_t in) {
  uint4 const v = make_uint4(0x38383838u ^ (in & 0x01010101u), 0x38383838u, 0x38383838u, 0x38383838u);
  for (int o = int(threadIdx.x) * 16; o < 4 * kWgBBytes; o += 128 * 16) *reinterpret_cast<uint4*>(bsm + (o % kB)) = v;
  k::fence_proxy_async_smem();
  k::named_sync(1, 128);
}
template <bool kScale = true, bool kStageAfter = true>
__global__ void __launch_bounds__(32 * 5, 2) region_wg(Region g, int S, unsigned stage, int fold, std::uint32_t* sink) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ __align__(1024) unsigned char bsm[kWgBBytes];  // B: the input's limbs, N = 8 columns per k-step
  unsigned char* smem = k::smem_align1024(smem_raw);
  auto* full = reinterpret_cast<std::uint64_t*>(smem + std::size_t(S) * stage);
  std::uint64_t* empty = full + S;
  int const lane = int(threadIdx.x & 31);
  ling::cuda::kernels::pdl_trigger();
  ring_init(full, empty, S, 4);
  Part const pt = part_of(g, 1, stage);
  if (ring_produce(g, pt, smem, S, stage, full, empty, 4, sink)) return;
  if (!kStageAfter) stage_b_limbs<kWgBBytes>(bsm, 0u);
  ling::cuda::kernels::pdl_wait();
  std::uint32_t const in = __ldcg(sink + 1);  // the region's input
  if (kStageAfter) stage_b_limbs<kWgBBytes>(bsm, in);
  int const zero = fold == 99 ? 1 : 0, one = 1 - zero;  // run-time values (wgmma.cuh: a constant 0 serializes)
  float accf = 0.f;
  unsigned q = 0;
  for (std::uint64_t c = pt.first; c < pt.end; c += pt.step, ++q) {
    unsigned const s = q % unsigned(S), use = q / unsigned(S);
    unsigned const nb = chunk_bytes(pt, c, stage);
    bool const whole = nb == 3u * kWgTile;  // a region's one ragged chunk is copied, not multiplied (a probe)
    k::mbar_wait(full + s, use & 1u);
    unsigned char const* slot = smem + std::size_t(s) * stage;
    float d[3][4];  // defined by the first k-step of each tile (scale-d 0): no other instruction may define them
    if (whole) {
      k::wgmma_fence();
#pragma unroll
      for (int t = 0; t < 3; ++t) {
        int const ks = int(((c / kWgTile) + unsigned(t)) % (kWgKSteps / 4)) * 4;  // the tile's k-steps in B
#pragma unroll
        for (int j = 0; j < 4; ++j)
          k::wgmma_e4m3_ss_n8(d[t], k::wgmma_desc_sw128(slot + t * kWgTile + 32 * j),
                              k::wgmma_desc_kmajor(bsm + (ks + j) * 256), j ? one : zero);
      }
      k::wgmma_commit();
      k::wgmma_wait<0>();
#pragma unroll
      for (int t = 0; t < 3; ++t) k::wgmma_fence_acc(d[t]);
    }
    __syncwarp();
    if (lane == 0) k::mbar_arrive(empty + s);
    if (whole)
#pragma unroll
      for (int t = 0; t < 3; ++t) {
        float const sc = kScale ? __uint_as_float(0x3F800000u + (unsigned(t) << 20)) : 1.f;  // a block scale per tile
#pragma unroll
        for (int i = 0; i < 4; ++i) accf = fmaf(sc, d[t][i], accf);
      }
  }
  std::uint32_t const acc = __float_as_uint(accf) ^ in;
  if (acc == kMagic) sink[0] = acc;
}

// region_wg with matvec_wg's consumer pieces added one at a time (session 57; session 56's item 1: in the model the
// wgmma matvec lost where region_wg's ring gains). B is written before the PDL wait in every form (the fair row).
//   kTiles: 8 KB tiles per slot (3: region_wg's 24 KB slots; 2: matvec_wg's 16 KB);
//   kDepth2: two slots' wgmmas in flight (matvec_wg's issue / retire: the next slot issued, then wgmma.wait_group 1
//     and the slot before it added up and handed back); otherwise each slot's wgmmas are awaited before the next;
//   kUnit: matvec_wg's bookkeeping: per slot the unit's log entry and a scale product per tile from shared tables
//     (wsc · xsc), the four limbs' column weights in the sums (two FMAs more per accumulator pair), and at each unit's
//     end (every 20 / kTiles slots, a 2560-column row of units) a lookup of the unit's matrix, the quad's shuffle and a
//     store of each row's sum;
//   kMode: the block's part of the region (part_of: 1 interleaved chunks, as region_wg; 0 a contiguous slice);
//   kB: B's bytes in shared memory (5 KB: the probe's two limbs; 20 KB: matvec_wg's four limbs in n8 at 2560 columns),
//     which only changes the block's footprint (the wgmmas read its first 5 KB).
// Unlike region_wg, a region's ragged chunk is multiplied too (stale bytes past its end; only the time counts): the
// wgmmas under no branch, which ptxas otherwise serializes (C7518).
constexpr int kWgxOut = 8192;  // the unit rows' stores land in sink[16 .. 16 + kWgxOut) words (the sink is 64 KB)
template <int kTiles, bool kDepth2, bool kUnit, int kMode = 1, int kB = kWgBBytes>
__global__ void __launch_bounds__(32 * 5, 2)
    region_wgx(Region g, int S, unsigned stage, int fold, std::uint32_t* sink) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ __align__(1024) unsigned char bsm[kB];
  __shared__ float tab[2][64];  // kUnit: a unit's weight scales and the input's limb scales
  __shared__ int ulog[8], ubegin[8];
  unsigned char* smem = k::smem_align1024(smem_raw);
  auto* full = reinterpret_cast<std::uint64_t*>(smem + std::size_t(S) * stage);
  std::uint64_t* empty = full + S;
  int const lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  ling::cuda::kernels::pdl_trigger();
  ring_init(full, empty, S, 4);
  Part const pt = part_of(g, kMode, stage);
  if (ring_produce(g, pt, smem, S, stage, full, empty, 4, sink)) return;
  if (threadIdx.x < 64) {
    tab[0][threadIdx.x] = 1.f + float(threadIdx.x) / 64.f;
    tab[1][threadIdx.x] = __uint_as_float(0x3F800000u - ((threadIdx.x & 7u) << 23));
  }
  if (threadIdx.x < 8)
    ulog[threadIdx.x] = int(blockIdx.x) + int(threadIdx.x), ubegin[threadIdx.x] = 40 * int(threadIdx.x);
  stage_b_limbs<kB>(bsm, 0u);  // B before the wait (region_wg<true, false>'s stores)
  ling::cuda::kernels::pdl_wait();
  std::uint32_t const in = __ldcg(sink + 1);  // the region's input
  int const zero = fold == 99 ? 1 : 0, one = 1 - zero;
  int const t = lane & 3, gq = lane >> 2;
  float const c0 = t == 0 ? 1.f : t == 1 ? 1.f / 256.f : 0.f, c1 = t == 0 ? 1.f / 16.f : t == 1 ? 1.f / 4096.f : 0.f;
  constexpr unsigned kSpu = (20 + kTiles - 1) / kTiles;  // slots per unit (2560 columns: 20 k-blocks)
  float accf = 0.f, tot0 = 0.f, tot1 = 0.f;
  float d[2][kTiles][4], fq[2][kTiles];
  unsigned q = 0, uslot = 0, units = 0;
  struct Slot {  // a landed chunk: its offset and ring slot
    std::uint64_t c;
    unsigned s;
  };
  auto issue = [&]<int p>(std::integral_constant<int, p>, Slot const& x) {
    k::mbar_wait(full + x.s, (q / unsigned(S)) & 1u);
    unsigned char const* slot = smem + std::size_t(x.s) * stage;
    if (kUnit) {
      int const u = ulog[q & 7u];
#pragma unroll
      for (int i = 0; i < kTiles; ++i) fq[p][i] = tab[0][(int(x.c / kWgTile) + i + u) & 63] * tab[1][(int(q) + i) & 63];
    }
    k::wgmma_fence();
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      int const ks = int(((x.c / kWgTile) + unsigned(i)) % (kWgKSteps / 4)) * 4;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        k::wgmma_e4m3_ss_n8(d[p][i], k::wgmma_desc_sw128(slot + i * kWgTile + 32 * j),
                            k::wgmma_desc_kmajor(bsm + (ks + j) * 256), j ? one : zero);
    }
    k::wgmma_commit();
  };
  auto retire = [&]<int p>(std::integral_constant<int, p>, Slot const& x) {
#pragma unroll
    for (int i = 0; i < kTiles; ++i) k::wgmma_fence_acc(d[p][i]);
    __syncwarp();
    if (lane == 0) k::mbar_arrive(empty + x.s);
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      if (kUnit) {
        float const f = fq[p][i];
        tot0 = fmaf(fmaf(d[p][i][0], c0, d[p][i][1] * c1), f, tot0);
        tot1 = fmaf(fmaf(d[p][i][2], c0, d[p][i][3] * c1), f, tot1);
      } else {
        float const sc = __uint_as_float(0x3F800000u + (unsigned(i) << 20));
#pragma unroll
        for (int r = 0; r < 4; ++r) accf = fmaf(sc, d[p][i][r], accf);
      }
    }
    if (kUnit && ++uslot == kSpu) {  // the unit's end: its matrix, the quad's sums, the rows' stores
      uslot = 0;
      int const u = ulog[units & 7u];
      int m = 0;
      while (m + 1 < 6 && u >= ubegin[m + 1]) ++m;
      float const s0 = tot0 + __shfl_xor_sync(0xffffffffu, tot0, 1), s1 = tot1 + __shfl_xor_sync(0xffffffffu, tot1, 1);
      if (t == 0) {
        unsigned const ra = unsigned(m * 4096 + u * 64 + 16 * warp + gq) & unsigned(kWgxOut - 1);
        reinterpret_cast<float*>(sink + 16)[ra] = s0;
        reinterpret_cast<float*>(sink + 16)[(ra + 8) & unsigned(kWgxOut - 1)] = s1;
      }
      tot0 = tot1 = 0.f;
      ++units;
    }
  };
  using P0 = std::integral_constant<int, 0>;
  using P1 = std::integral_constant<int, 1>;
  auto make = [&](std::uint64_t c) { return Slot{c, q % unsigned(S)}; };
  std::uint64_t c = pt.first;
  if constexpr (!kDepth2) {
    for (; c < pt.end; c += pt.step, ++q) {
      Slot const x = make(c);
      issue(P0{}, x);
      k::wgmma_wait<0>();
      retire(P0{}, x);
    }
  } else {
    // matvec_wg's order: the first slot issued, then per slot the next issued and the one before it retired. turn(p):
    // slot sl[p] in flight; the next chunk issued into sl[1 - p] (the other accumulator set), then sl[p] added up; false
    // once sl[p] was the last.
    if (c < pt.end) {
      Slot sl[2] = {make(c), {}};
      issue(P0{}, sl[0]);
      c += pt.step, ++q;
      auto turn = [&]<int p>(std::integral_constant<int, p> cur) {
        if (c >= pt.end) {
          k::wgmma_wait<0>();
          retire(cur, sl[p]);
          return false;
        }
        sl[1 - p] = make(c);
        issue(std::integral_constant<int, 1 - p>{}, sl[1 - p]);
        c += pt.step, ++q;
        k::wgmma_wait<1>();
        retire(cur, sl[p]);
        return true;
      };
      while (turn(P0{}) && turn(P1{})) {
      }
    }
  }
  std::uint32_t const acc = __float_as_uint(accf + tot0 + tot1) ^ in;
  if (acc == kMagic) sink[0] = acc;
}

// The register chain at the same math (region_chain's "launch, row first" on these regions): one region as one PDL
// launch of 8-warp blocks; warp w streams rows w, w + W, ... into registers (probe::stream_rows, two rows in flight),
// its first row requested before the PDL wait unless the region's addresses depend on an earlier region (back > 0).
// kPerSm: the blocks per SM the registers are bounded for (3: 80 registers, the model's lane matvec; the probe's math
// then spills a little, which the model's kernels do not).
template <int kM, int kPerSm>
__global__ void __launch_bounds__(256, kPerSm) region_regs(Region g, std::uint32_t* sink) {
  __shared__ __align__(16) std::uint32_t xs[64];
  if (threadIdx.x < 64) xs[threadIdx.x] = threadIdx.x * 0x01010101u;
  ling::cuda::kernels::pdl_trigger();
  std::size_t const W = std::size_t(gridDim.x) * (blockDim.x >> 5);
  std::size_t const w = (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  uint4 const* p = reinterpret_cast<uint4 const*>(g.p);
  uint4 a[probe::kRowU];
  bool loaded = false;
  if (g.back == 0 && w < g.rows) {
    probe::row_load(a, p, w);
    loaded = true;
  }
  __syncthreads();  // xs
  ling::cuda::kernels::pdl_wait();
  std::uint32_t acc = __ldcg(sink + 1);                   // the region's input
  if (g.back > 0 && acc == kMagic) p += probe::kRowVecs;  // never: the routed addresses depend on the input
  acc ^= probe::stream_rows<kM>(p, g.rows, w, W, a, loaded, xs);
  if (acc == kMagic) sink[0] = acc;
}

// The copy engines alone: each block streams `bytes_per_block` contiguous bytes (blocks interleaved by `chunk`) into
// S slots of shared memory, its lane 0 issuing bulk copies (kMode 0) or its warps copying 16 bytes per lane (kMode 1,
// each warp its own slots), waiting for a slot's previous copy before reusing it; nobody reads the slots. kMode 2:
// the warps load 16 bytes per lane into registers instead (kU per lane in flight), the reference.
template <int kMode, int kU = 4>
__global__ void __launch_bounds__(512, 1)
    copy_only(char const* src, std::uint64_t total, unsigned chunk, int S, std::uint32_t* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  int const warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), warps = int(blockDim.x >> 5);
  std::uint64_t const B = gridDim.x;
  std::uint32_t acc = 0;
  if (kMode == 0) {
    auto* bar = reinterpret_cast<std::uint64_t*>(smem + std::size_t(S) * chunk);
    if (threadIdx.x == 0) {
      for (int s = 0; s < S; ++s) k::mbar_init(bar + s, 1);
      k::mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    unsigned q = 0;
    for (std::uint64_t c = blockIdx.x * std::uint64_t(chunk); c < total; c += B * chunk, ++q) {
      unsigned const s = q % unsigned(S), use = q / unsigned(S);
      if (use > 0) k::mbar_wait(bar + s, (use - 1) & 1u);
      k::mbar_arrive_expect(bar + s, chunk);
      k::bulk_copy(smem + std::size_t(s) * chunk, src + c, chunk, bar + s);
    }
    for (unsigned r = q > unsigned(S) ? q - unsigned(S) : 0; r < q; ++r)
      k::mbar_wait(bar + r % unsigned(S), (r / unsigned(S)) & 1u);
    return;
  }
  if (kMode == 1) {  // warp w copies the chunks w, w + warps, ... of its block's chunks into its own S / warps slots
    int const per = S / warps > 0 ? S / warps : 1;
    unsigned char* mine = smem + std::size_t(warp) * per * chunk;
    unsigned q = 0;
    for (std::uint64_t c = (blockIdx.x * std::uint64_t(warps) + unsigned(warp)) * chunk; c < total;
         c += B * warps * chunk, ++q) {
      unsigned char* dst = mine + std::size_t(q % unsigned(per)) * chunk;
      for (unsigned o = unsigned(lane) * 16u; o < chunk; o += 512u) k::cp_async16(dst + o, src + c + o);
      k::cp_async_commit();
      k::cp_async_wait(per - 1 > 3 ? 3 : per - 1);
    }
    k::cp_async_wait(0);
    return;
  }
  // kMode 2: registers, warp-sized pieces of 512 bytes, kU in flight per lane
  std::uint64_t const W = B * unsigned(warps), w = blockIdx.x * std::uint64_t(warps) + unsigned(warp);
  for (std::uint64_t c = w * 512u * kU; c < total; c += W * 512u * kU) {
    uint4 v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u)
      v[u] = probe::ldnc(reinterpret_cast<uint4 const*>(src + c + 512u * unsigned(u)) + lane);
#pragma unroll
    for (int u = 0; u < kU; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == kMagic) sink[0] = acc;
}

}  // namespace

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr int kLayers = 35, kConsumers = 8;
  struct Kind {
    char const* name;
    double mb;
    int back;
  };
  Kind const parts[] = {{"proj", 52.5, 0},  {"kstep", 4.4, 0}, {"oproj", 10.5, 0},
                        {"router", 2.6, 0}, {"moeA", 20.7, 1}, {"moeB", 10.4, 2}};
  double layer_bytes = 0;
  for (Kind const& p : parts) layer_bytes += p.mb * 1e6;
  std::size_t const pool_bytes = std::size_t(4) << 30;
  char* pool;
  unsigned* flags;
  std::uint32_t* sink;
  unsigned long long* times;
  Region* dgs;
  CK(cudaMalloc(&pool, pool_bytes));
  CK(cudaMemset(pool, 1, pool_bytes));
  CK(cudaMalloc(&sink, 64 << 10));  // 64 KB: region_wgx's unit stores land past word 16
  CK(cudaMemset(sink, 0, 64 << 10));
  CK(cudaMalloc(&times, sizeof(unsigned long long) * 12 * std::size_t(sms)));
  // the regions (rot: for chunks of `stage` bytes)
  auto regions = [&](unsigned stage) {
    std::vector<Region> gs;
    std::size_t at = 0;
    unsigned rot = 0;
    for (int l = 0; l < kLayers; ++l)
      for (Kind const& p : parts) {
        std::uint64_t const rows = std::uint64_t(p.mb * 1e6 / kRowBytes);
        gs.push_back(Region{pool + at, rows, p.back, rot});
        rot = unsigned((rot + (rows * kRowBytes + stage - 1) / stage) % unsigned(sms));
        at += (rows + 1) * kRowBytes;  // + 1: a dependent region may read one row further
      }
    if (at > pool_bytes) {
      std::printf("pool too small\n");
      std::exit(1);
    }
    return gs;
  };
  std::vector<Region> gs = regions(24u << 10);
  int const n = int(gs.size());
  CK(cudaMalloc(&flags, sizeof(unsigned) * std::size_t(n)));
  CK(cudaMalloc(&dgs, sizeof(Region) * gs.size()));
  CK(cudaMemcpy(dgs, gs.data(), sizeof(Region) * gs.size(), cudaMemcpyHostToDevice));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::printf("SMs %d, one block of %d consumer warps + 1 producer per SM, %d layers of %.1f MB (", sms, kConsumers,
              kLayers, layer_bytes / 1e6);
  for (Kind const& p : parts) std::printf(" %s %.1f%s", p.name, p.mb, p.back ? "D" : "");
  std::printf(" )\n%-80s %10s %8s %10s %10s\n", "variant", "us/layer", "GB/s", "med end", "last end");
  std::printf(
      "(last two columns: the share of time the consumers' thread 0 and the producer spent waiting, medians)\n");
  // the blocks' spread in the last replay: the median and the last block's end, µs after the first block's start
  double cw = 0, pw = 0;  // the consumers' (thread 0) and the producer's share of their time spent waiting, medians
  auto spread = [&](double& med, double& last) {
    std::vector<unsigned long long> t(6 * std::size_t(sms));
    CK(cudaMemcpy(t.data(), times, sizeof(unsigned long long) * t.size(), cudaMemcpyDeviceToHost));
    unsigned long long t0 = ~0ull;
    for (int b = 0; b < sms; ++b) t0 = t[2 * b] < t0 ? t[2 * b] : t0;
    std::vector<double> ends;
    for (int b = 0; b < sms; ++b) ends.push_back(double(t[2 * b + 1] - t0) * 1e-3);
    med = probe::quantile(ends, 0.5);
    std::vector<double> c, p;
    for (int b = 0; b < sms; ++b) {
      c.push_back(double(t[2 * sms + 2 * b]) / double(t[2 * sms + 2 * b + 1] + 1));
      p.push_back(double(t[4 * sms + 2 * b]) / double(t[4 * sms + 2 * b + 1] + 1));
    }
    cw = probe::quantile(c, 0.5);
    pw = probe::quantile(p, 0.5);
    last = probe::quantile(ends, 1.0);
  };
  auto run = [&](auto kern, char const* name, int S, unsigned stage, int mode, int pieces, int fold = 1, int per_sm = 1,
                 int cons = 0, int spin = 0, int fence = 0, int sig = 0) {
    std::size_t const smem = std::size_t(S) * stage + 16 * std::size_t(S) + 8 + sizeof(Region) * std::size_t(n);
    gs = regions(stage);
    CK(cudaMemcpy(dgs, gs.data(), sizeof(Region) * gs.size(), cudaMemcpyHostToDevice));
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    float const us = probe::time_graph(st, kLayers, [&] {
      CK(cudaMemsetAsync(flags, 0, sizeof(unsigned) * std::size_t(n), st));
      kern<<<sms * per_sm, 32 * (kConsumers + 2), smem, st>>>(dgs, n, flags, S, stage, mode, pieces, fold, sink, cons,
                                                              spin, fence, sig, times);
      CK(cudaGetLastError());
    });
    double med, last;
    spread(med, last);
    char label[160];
    std::snprintf(label, sizeof label, "%s, %d x %u KB, %s, %d pc%s%s%s%s%s%s%s", name, S, stage / 1024,
                  mode ? "inter" : "slices", pieces, fold ? "" : ", no fold", per_sm > 1 ? ", 2 blocks/SM" : "",
                  cons == 1   ? ", no consumer"
                  : cons == 2 ? ", 1 consumer warp"
                              : "",
                  spin == 1   ? ", P spins"
                  : spin == 2 ? ", C spin"
                  : spin == 3 ? ", all spin"
                              : "",
                  fence == 1   ? ", release add"
                  : fence == 2 ? ", relaxed add"
                               : "",
                  fold == 2 ? ", early free" : "", sig ? ", signal warp" : "");
    std::printf("%-80s %10.2f %8.0f %10.1f %10.1f %6.2f %6.2f\n", label, us, layer_bytes / (us * 1e-6) / 1e9, med, last,
                cw, pw);
  };
  auto waits = ring_persist<kConsumers, true>;
  auto free_run = ring_persist<kConsumers, false>;
  // the copy engines alone over 2 GiB
  auto copy_run = [&](auto kern, char const* name, int per_sm, int threads, unsigned chunk, int S) {
    std::size_t const smem = kern == copy_only<2> ? 0 : std::size_t(S) * chunk + 16 * std::size_t(S);
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    std::uint64_t const total = std::uint64_t(2) << 30;
    float const us = probe::time_graph(st, 1, [&] {
      kern<<<sms * per_sm, threads, smem, st>>>(pool, total, chunk, S, sink);
      CK(cudaGetLastError());
    });
    std::printf("%-28s %d x %3d thr, %2d x %2u KB %10.1f us %8.0f GB/s\n", name, per_sm, threads, S, chunk / 1024, us,
                double(total) / (us * 1e-6) / 1e9);
  };
  // the co-resident launch chain: one launch per region
  // One region per PDL launch: a region whose bit is set in `ring_mask` (bit i: parts[i]) as a ring launch (`ring`:
  // `consumers` consumer warps + the producer, S slots of `stage` bytes, `fold`, ring_per_sm blocks per SM), the others
  // as register launches (`reg`: blocks of 8 warps, reg_per_sm per SM). rc.stage also lays out the regions, so the
  // register rows pass the ring rows' config (with ring_mask 0 nothing else of it is used). Prints the row; µs per
  // layer.
  struct RingCfg {
    int consumers, S;
    unsigned stage;
    int fold, per_sm;
    unsigned extra = 0;  // more dynamic shared memory (region_wg: its alignment slack)
  };
  auto timed_chain = [&](char const* label, auto ring, RingCfg rc, auto reg, int reg_per_sm, unsigned ring_mask) {
    std::vector<Region> const rg = regions(rc.stage);
    std::size_t const smem = std::size_t(rc.S) * rc.stage + 16 * std::size_t(rc.S) + rc.extra;
    if (ring_mask) CK(cudaFuncSetAttribute(ring, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    constexpr std::size_t kParts = sizeof(parts) / sizeof(parts[0]);
    float const us = probe::time_graph(st, kLayers, [&] {
      for (std::size_t i = 0; i < rg.size(); ++i) {
        if (ring_mask >> (i % kParts) & 1u)
          CK(ling::cuda::kernels::launch_ex(ring, dim3(unsigned(sms * rc.per_sm)),
                                            dim3(unsigned(32 * (rc.consumers + 1))), smem, st, rg[i], rc.S, rc.stage,
                                            rc.fold, sink));
        else
          CK(ling::cuda::kernels::launch_ex(reg, dim3(unsigned(sms * reg_per_sm)), dim3(256u), 0, st, rg[i], sink));
      }
    });
    std::printf("%-80s %10.2f %8.0f\n", label, us, layer_bytes / (us * 1e-6) / 1e9);
  };
  constexpr unsigned kAllRegions = 0x3Fu;
  auto chain = [&](int consumers, int S, unsigned stage, int fold, int per_sm) {
    char label[160];
    std::snprintf(label, sizeof label, "PDL chain, %d consumer warps, %d x %u KB, %d block%s/SM%s", consumers, S,
                  stage / 1024, per_sm, per_sm > 1 ? "s" : "", fold == 2 ? ", early free" : "");
    timed_chain(label, consumers == 4 ? region_tma<4> : region_tma<8>, RingCfg{consumers, S, stage, fold, per_sm},
                region_regs<0, 2>, 2, kAllRegions);
  };
  // With the model's math (session 53): both chains at the same decode-like work per 16 bytes (probe::decode_like, kM
  // rounds; kM = 8 is about the model's kernels), so that the ring chain's gain shows whether it survives the math.
  // RING_CHAIN_MATH=1 runs only these rows.
  auto math_rows = [&](auto km_tag) {
    constexpr int kM = decltype(km_tag)::value;
    char label[160];
    for (int per_sm : {2, 3}) {
      std::snprintf(label, sizeof label, "math %d: register chain, %d blocks of 8 warps/SM, row first", kM, per_sm);
      timed_chain(label, region_tma<8, kM, true>, RingCfg{8, 4, 24u << 10, 2, 1},
                  per_sm == 2 ? region_regs<kM, 2> : region_regs<kM, 3>, per_sm, 0u);
    }
    for (RingCfg const rc : {RingCfg{8, 4, 24u << 10, 2, 1}, RingCfg{4, 2, 24u << 10, 2, 2}}) {
      std::snprintf(label, sizeof label, "math %d: PDL ring chain, %d consumer warps, %d x 24 KB, %d block%s/SM", kM,
                    rc.consumers, rc.S, rc.per_sm, rc.per_sm > 1 ? "s" : "");
      timed_chain(label, rc.consumers == 8 ? region_tma<8, kM, true> : region_tma<4, kM, true>, rc, region_regs<kM, 2>,
                  2, kAllRegions);
    }
  };
  // Tensor-core consumers (session 55): RING_CHAIN_WG=1 runs only these rows. The register chain at kM = 0 and 8 and
  // the best CUDA-core ring at kM = 0 (session 53) as references in the same run, then region_wg's chain: 2 slots of
  // 24 KB at 2 blocks per SM, 2-4 slots at 1 block per SM (in each a launch's blocks sit beside the next's), without
  // the scale epilogue, with B written before the PDL wait, and mixed with register launches for the MoE regions (B
  // after the wait, then before it).
  // The consumer ladder (session 57, RING_CHAIN_WG=2: these rows only): region_wgx with matvec_wg's pieces added
  // one at a time (slot size, two slots in flight, the unit bookkeeping, contiguous slices), every region a ring with
  // B before the wait at 2 blocks per SM, beside the register chain at kM = 0 / 8 and region_wg's fair row.
  if (char const* e = std::getenv("RING_CHAIN_WG"); e && e[0] == '2') {
    for (int kM : {0, 8})
      timed_chain(kM ? "math 8: register chain, 2 blocks of 8 warps/SM, row first"
                     : "math 0: register chain, 2 blocks of 8 warps/SM, row first",
                  region_tma<4, 0, true>, RingCfg{4, 2, 24u << 10, 2, 2}, kM ? region_regs<8, 2> : region_regs<0, 2>, 2,
                  0u);
    auto wgx = [&](char const* label, auto kern, int S, unsigned stage) {
      timed_chain(label, kern, RingCfg{4, S, stage, 2, 2, 1024u}, region_regs<0, 2>, 2, kAllRegions);
    };
    wgx("wgmma: region_wg, 2 x 24 KB, B before the wait (session 56's fair row)", region_wg<true, false>, 2, 24u << 10);
    wgx("wgx: the same rewritten (3 tiles, depth 1, no units)", region_wgx<3, false, false>, 2, 24u << 10);
    wgx("wgx: 3 x 24 KB, depth 1", region_wgx<3, false, false>, 3, 24u << 10);
    wgx("wgx: 16 KB slots (2 tiles), 3 x 16 KB, depth 1", region_wgx<2, false, false>, 3, 16u << 10);
    wgx("wgx: 16 KB slots, 4 x 16 KB, depth 1", region_wgx<2, false, false>, 4, 16u << 10);
    wgx("wgx: depth 2, 3 x 24 KB", region_wgx<3, true, false>, 3, 24u << 10);
    wgx("wgx: depth 2, 4 x 24 KB", region_wgx<3, true, false>, 4, 24u << 10);
    wgx("wgx: units, 2 x 24 KB, depth 1", region_wgx<3, false, true>, 2, 24u << 10);
    wgx("wgx: units, 16 KB slots, depth 2, 4 x 16 KB (matvec_wg's consumer)", region_wgx<2, true, true>, 4, 16u << 10);
    wgx("wgx: units, 16 KB slots, depth 2, 6 x 16 KB", region_wgx<2, true, true>, 6, 16u << 10);
    wgx("wgx: contiguous slices, 2 x 24 KB, depth 1, no units", region_wgx<3, false, false, 0>, 2, 24u << 10);
    wgx("wgx: contiguous slices, units, 16 KB, depth 2, 4 x 16 KB", region_wgx<2, true, true, 0>, 4, 16u << 10);
    // second round (the footprint): smaller rings, depth 2 within 48 KB, 8 KB slots, B at matvec_wg's 20 KB
    wgx("wgx: 16 KB slots, 2 x 16 KB, depth 1", region_wgx<2, false, false>, 2, 16u << 10);
    wgx("wgx: 16 KB slots, 3 x 16 KB, depth 2", region_wgx<2, true, false>, 3, 16u << 10);
    wgx("wgx: 8 KB slots (1 tile), 6 x 8 KB, depth 1", region_wgx<1, false, false>, 6, 8u << 10);
    wgx("wgx: 8 KB slots, 6 x 8 KB, depth 2", region_wgx<1, true, false>, 6, 8u << 10);
    wgx("wgx: units, 16 KB slots, 3 x 16 KB, depth 1", region_wgx<2, false, true>, 3, 16u << 10);
    wgx("wgx: units, 16 KB slots, 3 x 16 KB, depth 2", region_wgx<2, true, true>, 3, 16u << 10);
    wgx("wgx: 16 KB slots, 3 x 16 KB, depth 1, B 20 KB", region_wgx<2, false, false, 1, 4 * kWgBBytes>, 3, 16u << 10);
    wgx("wgx: 16 KB slots, 2 x 16 KB, depth 1, B 20 KB", region_wgx<2, false, false, 1, 4 * kWgBBytes>, 2, 16u << 10);
    wgx("wgx: units, 16 KB slots, 2 x 16 KB, depth 1, B 20 KB", region_wgx<2, false, true, 1, 4 * kWgBBytes>, 2,
        16u << 10);
    // mixed (the MoE regions stay register launches at the model's math), against the register chain at math 8
    timed_chain("wgx: mixed, rings (16 KB, 3 x 16 KB, depth 1) for proj, kstep, oproj, router; register MoE at math 8",
                region_wgx<2, false, false>, RingCfg{4, 3, 16u << 10, 2, 2, 1024u}, region_regs<8, 2>, 2, 0x0Fu);
    timed_chain("wgx: the same mixed with units and B 20 KB, 2 x 16 KB", region_wgx<2, false, true, 1, 4 * kWgBBytes>,
                RingCfg{4, 2, 16u << 10, 2, 2, 1024u}, region_regs<8, 2>, 2, 0x0Fu);
    CK(cudaStreamSynchronize(st));
    return 0;
  }
  if (std::getenv("RING_CHAIN_WG")) {
    for (int kM : {0, 8}) {
      char label[160];
      std::snprintf(label, sizeof label, "math %d: register chain, 2 blocks of 8 warps/SM, row first", kM);
      timed_chain(label, region_tma<4, 0, true>, RingCfg{4, 2, 24u << 10, 2, 2},
                  kM == 0 ? region_regs<0, 2> : region_regs<8, 2>, 2, 0u);
    }
    timed_chain("math 0: PDL ring chain, 4 consumer warps, 2 x 24 KB, 2 blocks/SM", region_tma<4, 0, true>,
                RingCfg{4, 2, 24u << 10, 2, 2}, region_regs<0, 2>, 2, kAllRegions);
    for (auto const [S, per_sm] : {std::pair<int, int>{2, 2}, {2, 1}, {3, 1}, {4, 1}}) {
      char label[160];
      std::snprintf(label, sizeof label, "wgmma: PDL ring chain, 1 consumer warpgroup, %d x 24 KB, %d block%s/SM", S,
                    per_sm, per_sm > 1 ? "s" : "");
      timed_chain(label, region_wg<true>, RingCfg{4, S, 24u << 10, 2, per_sm, 1024u}, region_regs<0, 2>, 2,
                  kAllRegions);
    }
    RingCfg const wg2{4, 2, 24u << 10, 2, 2, 1024u};  // the wgmma ring of the rows below: 2 x 24 KB, 2 blocks/SM
    timed_chain("wgmma: the same, 2 x 24 KB, no scale epilogue", region_wg<false>, wg2, region_regs<0, 2>, 2,
                kAllRegions);
    timed_chain("wgmma: the same, 2 x 24 KB, B before the wait (as the reference rows' xs)", region_wg<true, false>,
                wg2, region_regs<0, 2>, 2, kAllRegions);
    timed_chain("wgmma: mixed, wgmma rings for proj, kstep, oproj, router; register MoE at math 8", region_wg<true>,
                wg2, region_regs<8, 2>, 2, 0x0Fu);
    timed_chain("wgmma: the same mixed, B before the wait", region_wg<true, false>, wg2, region_regs<8, 2>, 2, 0x0Fu);
    CK(cudaStreamSynchronize(st));
    return 0;
  }
  math_rows(std::integral_constant<int, 0>{});
  math_rows(std::integral_constant<int, 4>{});
  math_rows(std::integral_constant<int, 6>{});
  math_rows(std::integral_constant<int, 8>{});
  // Mixed chains at kM = 8: the regions whose bit is set as ring launches (8 consumer warps, 4 x 24 KB, one block per
  // SM), the others as register launches (2 blocks of 8 warps per SM, which fill the register file: nothing enters
  // beside them): which regions a partial rewrite would have to convert. The masks 0x3F and 0x00 repeat rows above (the
  // ring chain with 8 consumer warps, the register chain at 2 blocks/SM) as controls in the same run.
  for (auto const& [mask, what] : {std::pair<unsigned, char const*>{0x3Fu, "every region"},
                                   {0x38u, "router, moeA, moeB"},
                                   {0x3Cu, "oproj, router, moeA, moeB"},
                                   {0x06u, "kstep, oproj"},
                                   {0x01u, "proj"},
                                   {0x00u, "none"}}) {
    char label[160];
    std::snprintf(label, sizeof label, "math 8: mixed, rings for %s", what);
    timed_chain(label, region_tma<8, 8, true>, RingCfg{8, 4, 24u << 10, 2, 1}, region_regs<8, 2>, 2, mask);
  }
  if (std::getenv("RING_CHAIN_MATH")) {
    CK(cudaStreamSynchronize(st));
    return 0;
  }
  chain(4, 4, 24u << 10, 2, 1);
  chain(4, 4, 24u << 10, 1, 1);
  chain(8, 4, 24u << 10, 2, 1);
  chain(4, 3, 32u << 10, 2, 1);
  chain(4, 6, 16u << 10, 2, 1);
  chain(4, 2, 24u << 10, 2, 2);
  chain(4, 8, 24u << 10, 2, 1);
  // the copy engines alone (2 GiB)
  copy_run(copy_only<2>, "registers", 2, 256, 512, 1);
  copy_run(copy_only<0>, "bulk", 1, 32, 24u << 10, 8);
  copy_run(copy_only<0>, "bulk", 1, 32, 8u << 10, 24);
  copy_run(copy_only<0>, "bulk", 1, 32, 4u << 10, 48);
  copy_run(copy_only<1>, "cp.async", 1, 256, 6u << 10, 32);
  // one persistent launch: run(kernel, name, S, stage, mode, pieces, fold, per_sm, cons, spin, fence, sig)
  run(free_run, "bulk, no waits", 8, 24u << 10, 1, 1, 1, 1, 1);  // the consumers left out
  run(free_run, "bulk, no waits", 8, 24u << 10, 1, 1, 1, 1, 0, 0, 1);
  run(free_run, "bulk, no waits", 8, 24u << 10, 1, 1, 1, 1, 0, 0, 2);
  run(free_run, "bulk, no waits", 8, 24u << 10, 1, 1, 2, 1, 0, 0, 2);
  run(waits, "bulk, flags", 8, 24u << 10, 1, 1, 1, 1, 0, 0, 0);
  run(waits, "bulk, flags", 8, 24u << 10, 1, 1, 1, 1, 0, 0, 1);
  run(waits, "bulk, flags", 8, 24u << 10, 1, 1, 2, 1, 0, 0, 1);
  run(waits, "bulk, flags", 8, 24u << 10, 1, 1, 2, 1, 0, 0, 1, 1);
  run(waits, "bulk, flags", 8, 24u << 10, 1, 1, 2, 1, 0, 0, 2, 0);
  run(waits, "bulk, flags", 16, 12u << 10, 1, 1, 2, 1, 0, 0, 1, 1);
  run(waits, "bulk, flags", 8, 24u << 10, 0, 1, 2, 1, 0, 0, 1, 1);
  run(waits, "bulk, flags", 8, 24u << 10, 1, 6, 2, 1, 0, 3, 1, 1);
  run(ring_persist<kConsumers, true, 1>, "cp.async 1 warp, flags", 8, 24u << 10, 1, 1, 2, 1, 0, 0, 1, 1);
  CK(cudaStreamSynchronize(st));
  return 0;
}
