// Probe: can FP8 wgmma decode MoE launch A's routed tiles faster than the SM's integer pipes do now?
// (docs/perf-log.md, session 29: a block's 12 routed tiles of 4 row pairs × 2560 MXFP4 columns take 3.65 µs to
// decode together, warm (bench/probes/tile_landing, "warm, 12 warps"): ~37 warp instructions per 512 weights, mostly
// the E2M1 lookups (PRMT) and the DP4As against the input's int8 limbs.)
//
// The candidate: each E2M1 code becomes an E4M3 byte by placing its bits (sign to bit 7, exponent and mantissa to bits
// 4-2: the E4M3 value is the E2M1 value · 2^-6, so no lookup). wgmma.mma_async.m64n{8,16}k32.f32.e4m3.e4m3, A (the
// weights) from registers, B (the input) by descriptor (K-major, no swizzle). A warp's 8 rows are its wgmma rows g;
// rows g + 8 are zeros, or (split) the same rows' second half of the columns. 12 warps (3 warpgroups) decode 12 tiles,
// as launch A's routed warps do. The codes come either
//   - repacked at load (word_index): one 32-bit word per lane and k-step holds a fragment register's 4 codes at the
//     E4M3 positions (one AND) and the other's at bits {6, 5, 1, 0} (a rotate, a shift and two masks); or
//   - (kStd) as the checkpoint stores them (a byte: code 2 j low, 2 j + 1 high), rows kPitch bytes apart, by ldmatrix
//     (lane 4 g + t receives bytes 4 t..4 t + 3 of row g): the low nibbles are wgmma's k = 4 t + b, the high ones
//     k = 16 + 4 t + b (B stored in that order), 7 operations per 8 codes.
// B: kLimbs E4M3 limbs per element (x · 2^-ex = Σ limbs, ex per 32-element block) in units of kLimbs columns, so
// that each group of G = N / (kLimbs · halves) k-steps leaves one block's limbs in each thread's two accumulator
// columns: one FFMA per group and thread by 2^(w − 127 + ex + 6) (an integer add of exponents).
//
// Measured here, 132 blocks of 16 warps (warps 4-15 decode; the tiles and B already in shared memory, as in
// tile_landing's warm modes), 19 launches after a warm-up: per block the decode's time (the latest warp's end − the
// start after the block barrier, global timer) and per warp its cycles (clock64); medians. And the outputs of every
// row of one launch against a double-precision reference on the host: the exact weights · the exact input, and the
// exact weights · the limbs' input (the second isolates the wgmma path: layout, fragment order, accumulation).
// Measured (H200, 2026-12-04; docs/kernels.md "Launch A's routed decode on FP8 wgmma"): 2.14 µs (repacked, split,
// 2 limbs, N 8, pipelined) and 2.56 µs (checkpoint nibbles, split, 4 limbs, N 16, pipelined) against 3.6 µs; error
// 6.8e-5 of Σ|w x| (the tensor core's accumulation), + 4.3e-4 with 2 limbs.
// Built as the target wgmma_decode (CUDA builds). It runs in a second or two; it needs no model.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "ling/cuda/async_copy.cuh"
#include "ling/cuda/linear.cuh"
#include "ling/cuda/wgmma.cuh"
#include "probe_util.cuh"

namespace {

using namespace ling::cuda::kernels;

inline constexpr int kGrid = 132, kBlockThreads = 512, kTiles = 12, kFirstWarp = 4, kLaunches = 20;
inline constexpr int kCols = 2560, kSteps = kCols / 32, kRows = 8;         // a tile: 4 gate + 4 up rows
inline constexpr int kCodeBytes = kSteps * 32 * 4;                         // one word per lane and k-step
inline constexpr int kPitch = kCols / 2 + 16;  // kStd: a row's 1280 code bytes + 16, so ldmatrix's 8 rows miss no bank
inline constexpr int kCodeRegion = kRows * kPitch;                         // >= kCodeBytes
inline constexpr int kTileBytes = kCodeRegion + kRows * kSteps;            // + the scale bytes, [row][block]
inline constexpr int kBBytes = kSteps * 512;                               // B: up to 16 columns × 32 E4M3 per k-step
inline constexpr int kSmem = kTiles * kTileBytes + kBBytes + kSteps * 4 + 128;
static_assert(kTiles * kTileBytes % 128 == 0 && kCodeRegion >= kCodeBytes, "B on a 128-byte boundary; words fit");

// a word's 8 codes as the E4M3 bytes of registers a0 (bits 7, 4-2 of each byte) and a2 (the others)
__device__ __forceinline__ void e2m1_word_e4m3(std::uint32_t w, std::uint32_t& a0, std::uint32_t& a2) {
  a0 = w & 0x9C9C9C9Cu;
  a2 = (__funnelshift_r(w, w, 2) & 0x98989898u) | ((w << 2) & 0x04040404u);
}

// Where lane `lane`'s code word for k-step s (0 .. kSteps - 1) of its rows lies in a tile (32-bit words).
// Unsplit: [s / 4][lane][s % 4]. Split (kSplit): the rows' second half of the columns, k-steps s + kSteps / 2, are
// the wgmma rows g + 8 (registers a1, a3) beside the first half's rows g, so a k-step holds both: [s' / 2][lane][s' % 2]
// [half] for s' = s mod kSteps / 2, half = s / (kSteps / 2).
template <bool kSplit>
__host__ __device__ constexpr int word_index(int s, int lane) {
  if constexpr (kSplit) {
    int const h = s / (kSteps / 2), q = s % (kSteps / 2);
    return ((q >> 1) * 32 + lane) * 4 + (q & 1) * 2 + h;
  } else {
    return ((s >> 2) * 32 + lane) * 4 + (s & 3);
  }
}

// The decode of this warp's tile (kRows rows of kCols codes at `tile`) against B: lane 4 g of the warp returns row g's
// dot product (the value of the E2M1 codes · scales · x). B's kN columns per k-step: units of kLimbs columns, unit
// u = H q + h for the q-th k-step of a group and the half h (unsplit: H = 1, h = 0); thread t's accumulator columns
// 8 c + 2 t, + 1 are in unit (8 c + 2 t) / kLimbs, so each finds one block's limbs in d[4 c] + d[4 c + 1] (half 0) or
// d[4 c + 2] + d[4 c + 3] (half 1: rows g + 8).
// kPipe 1: a group's wgmmas are waited for (wgmma.wait_group 0) before its epilogue; 2: the next group's wgmmas go out
// first (two accumulator sets, wait_group 1, the group loop fully unrolled: unrolled by 2 only, ptxas serialized every
// wgmma, C7514). The first wgmma of a group starts from zero by its scale-d predicate, from a run-time value
// (`one` - 1): with a constant zero ptxas gave A and D the same registers and serialized the wgmmas.
template <int kLimbs, bool kSplit, int kN, int kPipe, bool kStd>
__device__ float decode_wgmma(unsigned char const* tile, unsigned char const* sb, int const* s_ex, int one) {
  constexpr int H = kSplit ? 2 : 1;                                    // halves per k-step
  constexpr int G = kN / (kLimbs * H), S = kSteps / H, NG = S / G;     // k-steps per group, k-steps, groups
  constexpr int C = kN / 8, R = kN / 2, KB = kN * 32;                  // column chunks, accumulators, B bytes per k-step
  static_assert(G >= 1 && S % G == 0 && (G * H) % 2 == 0, "B's columns hold G k-steps of H halves of kLimbs limbs");
  int const lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  std::uint32_t const* codes = reinterpret_cast<std::uint32_t const*>(tile);
  unsigned char const* sc = tile + kCodeRegion + g * kSteps;
  std::uint64_t const desc0 = wgmma_desc_kmajor(sb);
  float acc[2][R] = {};
  float tot = 0.f;
  auto epilogue = [&](float (&d)[R], int p) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      int const u = (8 * c + 2 * t) / kLimbs, q = u / H, h = u % H;
      int const blk = G * p + q + h * S;
      float const f = __int_as_float((int(sc[blk]) << 23) + s_ex[blk]);
      tot = fmaf(f, h ? d[4 * c + 2] + d[4 * c + 3] : d[4 * c] + d[4 * c + 1], tot);
    }
  };
#pragma unroll(kPipe == 1 ? 2 : NG)
  for (int p = 0; p < NG; ++p) {
    constexpr int W = G * H;  // the group's words: 8- or 16-byte loads
    std::uint32_t wv[W];
    if constexpr (kStd) {  // the checkpoint's rows (pitch kPitch): word i H + h is k-step G p + i, half h, by ldmatrix
      static_assert(kSplit && W % 4 == 0, "kStd: split, whole ldmatrix.x4");
#pragma unroll
      for (int j = 0; j < W; j += 4) {
        int const jj = j + (lane >> 3), ks = G * p + jj / H + (jj % H) * S;
        std::uint32_t r[4];
        ldmatrix_x4(r, tile + (lane & 7) * kPitch + 16 * ks);
        wv[j] = r[0], wv[j + 1] = r[1], wv[j + 2] = r[2], wv[j + 3] = r[3];
      }
    } else {
#pragma unroll
      for (int j = 0; j < W; j += 2) {  // words j, j + 1: k-step G p + j / H (split) or G p + j (unsplit)
        int const s0 = G * p + (kSplit ? j / 2 : j);
        std::uint32_t const* wp = codes + word_index<kSplit>(s0, lane);
        uint2 const v = *reinterpret_cast<uint2 const*>(wp);
        wv[j] = v.x, wv[j + 1] = v.y;
      }
    }
    auto cvt = [](std::uint32_t w, std::uint32_t& x, std::uint32_t& y) {
      if constexpr (kStd) e2m1_nibbles_e4m3(w, x, y); else e2m1_word_e4m3(w, x, y);
    };
    std::uint32_t a[G][4];
#pragma unroll
    for (int i = 0; i < G; ++i) {
      cvt(wv[i * H], a[i][0], a[i][2]);
      if constexpr (kSplit) {
        cvt(wv[i * H + 1], a[i][1], a[i][3]);
      } else {
        a[i][1] = 0u;
        a[i][3] = 0u;
      }
    }
    float (&d)[R] = acc[p & 1];
    wgmma_fence();
#pragma unroll
    for (int i = 0; i < G; ++i)
      wgmma_e4m3_rs<kN>(d, a[i], desc0 + std::uint64_t((G * p + i) * (KB >> 4)), i > 0 ? 1 : one - 1);
    wgmma_commit();
    if constexpr (kPipe == 1) {
      wgmma_wait<0>();
      wgmma_fence_acc(d);
      epilogue(d, p);
    } else {
      if (p > 0) {
        wgmma_wait<1>();
        wgmma_fence_acc(acc[(p - 1) & 1]);
        epilogue(acc[(p - 1) & 1], p - 1);
      }
    }
  }
  if constexpr (kPipe != 1) {
    wgmma_wait<0>();
    wgmma_fence_acc(acc[(NG - 1) & 1]);
    epilogue(acc[(NG - 1) & 1], NG - 1);
  }
  tot += __shfl_xor_sync(0xffffffffu, tot, 1);
  tot += __shfl_xor_sync(0xffffffffu, tot, 2);
  return tot;
}

// rec[(block · 16 + warp) · 3 + {0, 1, 2}]: the decode's start and end (ns), its cycles; out[(block · 12 + tile) · 8 + row]
template <int kLimbs, bool kSplit, int kN, int kPipe, bool kStd>
__global__ void __launch_bounds__(kBlockThreads, 1) wg_kernel(unsigned char const* tiles, unsigned char const* bglob,
                                                              int const* exg, float* out, unsigned long long* rec, int one) {
  extern __shared__ uint4 smem4[];
  unsigned char* const sm = reinterpret_cast<unsigned char*>(smem4) + ((0u - smem_u32(smem4)) & 127u);
  unsigned char* const s_tiles = sm;
  unsigned char* const s_b = sm + kTiles * kTileBytes;
  int* const s_ex = reinterpret_cast<int*>(s_b + kBBytes);
  int const b = int(blockIdx.x), warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  uint4 const* src = reinterpret_cast<uint4 const*>(tiles + std::size_t(b) * kTiles * kTileBytes);
  for (int i = int(threadIdx.x); i < kTiles * kTileBytes / 16; i += kBlockThreads)
    reinterpret_cast<uint4*>(s_tiles)[i] = src[i];
  for (int i = int(threadIdx.x); i < kBBytes / 16; i += kBlockThreads)
    reinterpret_cast<uint4*>(s_b)[i] = reinterpret_cast<uint4 const*>(bglob)[i];
  for (int i = int(threadIdx.x); i < kSteps; i += kBlockThreads) s_ex[i] = exg[i];
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // B's generic writes before wgmma reads them
  __syncthreads();
  if (warp < kFirstWarp) return;  // warpgroup 0 idle (launch A's shared-expert warps)
  int const d = warp - kFirstWarp;
  unsigned long long const t0 = global_ns();
  long long const c0 = clock64();
  float const v = decode_wgmma<kLimbs, kSplit, kN, kPipe, kStd>(s_tiles + d * kTileBytes, s_b, s_ex, one);
  long long const c1 = clock64();
  unsigned long long const t1 = global_ns();
  if ((lane & 3) == 0) out[(std::size_t(b) * kTiles + d) * kRows + (lane >> 2)] = v;
  if (lane == 0) {
    unsigned long long* r = rec + (std::size_t(b) * 16 + warp) * 3;
    r[0] = t0;
    r[1] = t1;
    r[2] = static_cast<unsigned long long>(c1 - c0);
  }
}

// ---- host: E2M1 and E4M3 values, the layouts, the reference ----
float e2m1(int c) {
  static float const mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  return (c & 8) ? -mag[c & 7] : mag[c & 7];
}
float e4m3(int u) {
  int const e = (u >> 3) & 15, m = u & 7;
  float const v = e == 0 ? std::ldexp(float(m) / 8.f, -6) : std::ldexp(1.f + float(m) / 8.f, e - 7);
  return (u & 0x80) ? -v : v;
}
// the E4M3 byte nearest to v (|v| <= 448)
int e4m3_nearest(float v) {
  static std::vector<std::pair<float, int>> const pos = [] {
    std::vector<std::pair<float, int>> p;
    for (int u = 0; u < 127; ++u) p.push_back({e4m3(u), u});  // 0x7F is NaN
    return p;
  }();
  float const a = std::fabs(v);
  auto it = std::lower_bound(pos.begin(), pos.end(), std::make_pair(a, 0));
  int best = it == pos.end() ? pos.back().second : it->second;
  if (it != pos.begin() && (it == pos.end() || a - std::prev(it)->first < it->first - a)) best = std::prev(it)->second;
  return best | (v < 0.f && best ? 0x80 : 0);
}

struct Result {
  double ns_med, cyc_med, cyc_max, err_limbs, err_exact;
};

template <int kLimbs, bool kSplit, int kN, int kPipe, bool kStd = false>
Result run(std::vector<int> const& code, std::vector<int> const& wsc, std::vector<float> const& x) {
  constexpr int H = kSplit ? 2 : 1, G = kN / (kLimbs * H), S = kSteps / H;
  int const ntiles = kGrid * kTiles;
  // tiles: codes in the wgmma word layout, scale bytes [row][block]
  std::vector<unsigned char> th(std::size_t(ntiles) * kTileBytes);
  for (int T = 0; T < ntiles; ++T) {
    unsigned char* tp = th.data() + std::size_t(T) * kTileBytes;
    auto cd = [&](int r, int k) { return code[(std::size_t(T) * kRows + r) * kCols + k]; };
    for (int r = 0; r < kRows && kStd; ++r)  // the checkpoint's nibbles, rows kPitch apart
      for (int k = 0; k < kCols; k += 2) tp[r * kPitch + k / 2] = (unsigned char)(cd(r, k) | cd(r, k + 1) << 4);
    for (int s = 0; s < kSteps && !kStd; ++s)
      for (int lane = 0; lane < 32; ++lane) {
        int const gg = lane >> 2, tt = lane & 3;
        std::uint32_t w = 0;
        for (int by = 0; by < 4; ++by) {
          int const c0 = cd(gg, 32 * s + 4 * tt + by), c2 = cd(gg, 32 * s + 16 + 4 * tt + by);
          std::uint32_t byte = ((c0 >> 3) & 1u) << 7 | ((c0 >> 2) & 1u) << 4 | ((c0 >> 1) & 1u) << 3 | (c0 & 1u) << 2;
          byte |= ((c2 >> 2) & 1u) << 6 | ((c2 >> 1) & 1u) << 5 | (c2 & 1u);
          w |= byte << (8 * by);
          int const bn = (by + 1) & 3;  // c2's sign: bit 1 of the next byte (the rotate brings it to bit 7)
          w |= std::uint32_t((c2 >> 3) & 1) << (8 * bn + 1);
        }
        std::memcpy(tp + std::size_t(word_index<kSplit>(s, lane)) * 4, &w, 4);
      }
    for (int r = 0; r < kRows; ++r)
      for (int j = 0; j < kSteps; ++j)
        tp[kCodeRegion + r * kSteps + j] = (unsigned char)wsc[(std::size_t(T) * kRows + r) * kSteps + j];
  }
  // B: the input's limbs, and its blocks' exponents (+ 6: the E4M3 codes are the E2M1 values · 2^-6)
  std::vector<unsigned char> bh(kBBytes, 0);
  std::vector<int> ex(kSteps);
  std::vector<double> xl(kCols);  // the input the limbs represent
  for (int s = 0; s < kSteps; ++s) {
    float amax = 0.f;
    for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(x[32 * s + k]));
    int const e = amax > 0.f ? int(std::ceil(std::log2(amax / 448.0))) : 0;
    ex[s] = (e + 6) * (1 << 23);
    // block s is half h of B's k-step s mod S, the q-th of its group: unit 2 q + h (unsplit: q)
    int const sb = s % S, hh = s / S, q = sb % G, unit = q * H + hh;
    for (int el = 0; el < 32; ++el) {
      int const k = kStd ? e2m1_wgmma_k(el) : el;  // the checkpoint's nibble order (wgmma.cuh), or the repacked one
      float r = std::ldexp(x[32 * s + el], -e);
      double sum = 0;
      for (int l = 0; l < kLimbs; ++l) {
        int const u = e4m3_nearest(r);
        r -= e4m3(u);
        sum += e4m3(u);
        int const n = kLimbs * unit + l;
        bh[std::size_t(wgmma_b_offset(kN, sb, n, k))] = (unsigned char)u;
      }
      xl[32 * s + el] = std::ldexp(sum, e);
    }
  }
  unsigned char *dt = nullptr, *db = nullptr;
  int* dex = nullptr;
  float* dout = nullptr;
  unsigned long long* drec = nullptr;
  std::size_t const nout = std::size_t(ntiles) * kRows, nrec = std::size_t(kGrid) * 16 * 3;
  CK(cudaMalloc(&dt, th.size()));
  CK(cudaMalloc(&db, bh.size()));
  CK(cudaMalloc(&dex, ex.size() * 4));
  CK(cudaMalloc(&dout, nout * 4));
  CK(cudaMalloc(&drec, nrec * 8));
  CK(cudaMemcpy(dt, th.data(), th.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, bh.data(), bh.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dex, ex.data(), ex.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(dout, 0xFF, nout * 4));  // poisoned: NaN
  CK(cudaFuncSetAttribute(wg_kernel<kLimbs, kSplit, kN, kPipe, kStd>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  std::vector<double> ns, cyc;
  std::vector<unsigned long long> rec(nrec);
  for (int l = 0; l < kLaunches; ++l) {
    wg_kernel<kLimbs, kSplit, kN, kPipe, kStd><<<kGrid, kBlockThreads, kSmem>>>(dt, db, dex, dout, drec, 1);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(rec.data(), drec, nrec * 8, cudaMemcpyDeviceToHost));
    if (l == 0) continue;  // warm-up
    for (int b = 0; b < kGrid; ++b) {
      unsigned long long s0 = ~0ull, s1 = 0;
      for (int w = kFirstWarp; w < 16; ++w) {
        unsigned long long const* r = rec.data() + (std::size_t(b) * 16 + w) * 3;
        s0 = std::min(s0, r[0]);
        s1 = std::max(s1, r[1]);
        cyc.push_back(double(r[2]));
      }
      ns.push_back(double(s1 - s0));
    }
  }
  std::vector<float> out(nout);
  CK(cudaMemcpy(out.data(), dout, nout * 4, cudaMemcpyDeviceToHost));
  double el = 0, ee = 0;  // the largest error over rows, relative to the row's Σ |terms|
  for (int T = 0; T < ntiles; ++T)
    for (int r = 0; r < kRows; ++r) {
      double ref_l = 0, ref_x = 0, mag = 0;
      for (int k = 0; k < kCols; ++k) {
        double const w = double(e2m1(code[(std::size_t(T) * kRows + r) * kCols + k])) *
                         std::ldexp(1.0, wsc[(std::size_t(T) * kRows + r) * kSteps + k / 32] - 127);
        ref_l += w * xl[k];
        ref_x += w * double(x[k]);
        mag += std::fabs(w * double(x[k]));
      }
      double const v = out[std::size_t(T) * kRows + r];
      bool const fin = std::isfinite(v);
      double const dl = fin ? std::fabs(v - ref_l) / mag : 1e30, dx = fin ? std::fabs(v - ref_x) / mag : 1e30;
      el = std::max(el, dl);
      ee = std::max(ee, dx);
    }
  CK(cudaFree(dt));
  CK(cudaFree(db));
  CK(cudaFree(dex));
  CK(cudaFree(dout));
  CK(cudaFree(drec));
  return {probe::quantile(ns, 0.5) * 1e-3, probe::quantile(cyc, 0.5), probe::quantile(cyc, 1.0), el, ee};
}

}  // namespace

int main() {
  std::mt19937 rng(1234);
  int const ntiles = kGrid * kTiles;
  std::vector<int> code(std::size_t(ntiles) * kRows * kCols), wsc(std::size_t(ntiles) * kRows * kSteps);
  for (auto& c : code) c = int(rng() & 15u);
  for (auto& s : wsc) s = 124 + int(rng() % 7u);  // 2^-3 .. 2^3
  std::vector<float> x(kCols);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int k = 0; k < kCols; ++k) x[k] = nd(rng) * (k % 97 == 0 ? 30.f : 1.f);  // a few outlier channels
  std::printf("wgmma_decode: %d blocks x %d warps, %d tiles of %d rows x %d MXFP4 columns per block (warps %d-15), "
              "warm in shared memory, %d launches\n", kGrid, kBlockThreads / 32, kTiles, kRows, kCols, kFirstWarp, kLaunches - 1);
  std::printf("  %-16s %14s %14s %14s %16s %16s\n", "variant", "block µs (med)", "warp cyc (med)", "warp cyc (max)",
              "err vs limbs' x", "err vs exact x");
  auto show = [](char const* name, Result const& r) {
    std::printf("  %-16s %14.2f %14.0f %14.0f %16.2e %16.2e\n", name, r.ns_med, r.cyc_med, r.cyc_max, r.err_limbs, r.err_exact);
  };
  show("2 limbs", run<2, false, 8, 1>(code, wsc, x));
  show("2, split, pipe", run<2, true, 8, 2>(code, wsc, x));
  show("2, split, n16, p", run<2, true, 16, 2>(code, wsc, x));
  show("4, split, n16, p", run<4, true, 16, 2>(code, wsc, x));
  show("std 2, split, p", run<2, true, 8, 2, true>(code, wsc, x));
  show("std 2, s, n16, p", run<2, true, 16, 2, true>(code, wsc, x));
  show("std 4, s, n16, p", run<4, true, 16, 2, true>(code, wsc, x));
  std::printf("errors: max over rows of |out - ref| / Σ|w x| (double-precision reference on the host)\n");
  return 0;
}
