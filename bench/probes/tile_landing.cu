// Probe: when do MoE launch A's routed tiles land, and how long does their decode take once they have?
// (docs/perf-log.md, sessions 16-28: in launch A's step timeline the block's last tile lands ~10.3 µs after the last
// PDL wait exit and the block ends ~4 µs later; without the routed decode (LING_MOE_DIAG_A=2) the step is 0.153 ms
// shorter, 3.8 µs per MoE layer. Is that tail the decode's own time, or do the tiles land together at the end?)
//
// Launch A's routed tiles at Ling's shape without the rest of the launch: 132 blocks of 16 warps; 8 experts of
// 2 × 768 rows × 2560 MXFP4 columns (gate and up, with their scale bytes) per launch, fresh memory for each of 35
// launches (585 MB, so every launch reads from DRAM); tiles of 4 row pairs (10 880 bytes by four bulk copies on one
// mbarrier, as launch A); warp w ≥ 3 of block b takes routed tile b + (w − 3) · 132 (launch A's warps 0-2 hold the
// shared expert's tiles), so 12 tiles per block at most. The decode is launch A's (q8u_chunk on 16 lanes per row pair,
// two row pairs per pass; a replica of the loop in moe_gate_up_stream_kernel, the activations' limbs random).
// Modes:
//   land             the copies, issued by every warp at once, and their landing only
//   land+decode      the same, each warp decoding its tile as soon as it has landed (launch A's order)
//   one issuer       warp 3's lane 0 issues all 12 tiles' copies of its block in warp order (a strict request order);
//                    each warp waits for its own tile and decodes it
//   warm, 12         every tile landed and the block synchronized first, then the 12 warps decode together
//   warm, 1          the same, one warp per block decoding
//   idle issuer      as one issuer, by the last warp (which holds no tile)
//   unr.5            the decode's chunk loop unrolled by 5 (Ling: 5 chunks per lane)
//   paced N          each warp issues its own tile N SM cycles after the warp before it (clock64)
// Printed per mode, medians over the 35 × 132 blocks of µs after the launch's first issue: the block's first, median
// and last tile landed, the block's last decode done; the decode's time per warp (its end − its landing); and how
// often two tiles of a block land in the order their copies were issued.
// Measured (H200, 2026-12-04, docs/perf-log.md session 29): issued together, a block's tiles land together at the
// end (first 4.0, last 4.5 µs; in order 50%) and the decode ends at 7.8; issued in order (one issuer, or paced 300-600
// cycles apart) they land in order (94-99%) from 1.1-1.7 µs on, the last at the same 4.4-4.5, and the decode ends at
// 6.6 (6.3-6.4 unrolled). The decode of 12 tiles together takes 3.65 µs, of one tile alone 1.9: launch A's routed
// decode is bound by the SM's integer pipes, not by one warp's chain.
// Built as the target tile_landing (CUDA builds). It runs in a second or two; it needs no model.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "ling/cuda/moe.cuh"
#include "probe_util.cuh"

namespace {

using namespace ling::cuda::kernels;

inline constexpr int kW = 16, kSharedWarps = 3, kGrid = 132, kLayers = 35;
inline constexpr int kCols = 2560, kNblk = kCols / 32, kInter = 768, kTopK = 8, kR = 4;
inline constexpr std::int64_t kRb = kCols / 2;                         // code bytes per row
inline constexpr std::int64_t kCodeBytes = kInter * kRb;               // one matrix's codes
inline constexpr std::int64_t kScaleBytes = std::int64_t(kInter) * kNblk;
inline constexpr std::int64_t kExpertBytes = 2 * kCodeBytes + 2 * kScaleBytes;  // gate codes, up codes, gate, up scales
inline constexpr std::int64_t kLayerBytes = kTopK * kExpertBytes;
inline constexpr int kTilesPerSlot = kInter / kR, kTiles = kTopK * kTilesPerSlot;  // 192, 1536
inline constexpr int kScap = 384;                                                  // round128(span16_cap(4 · 80))
inline constexpr int kStage = int(2 * kR * kRb) + 2 * kScap;                       // 11 008 bytes per warp
inline constexpr int kQBytes = 9 * kNblk * 8, kSxBytes = kNblk * 4;
inline constexpr std::size_t kSmem = std::size_t(kW) * kStage + kQBytes + kSxBytes + 128;

enum Mode { kLand, kLandDecode, kOneIssuer, kWarm12, kWarm1, kIdleIssuer, kIdleIssuerU5, kWarm1U5, kWarm12U5, kPaced,
            kPacedU5, kModes };
char const* const kNames[kModes] = {"land", "land+decode", "one issuer", "warm, 12 warps", "warm, 1 warp",
                                    "idle issuer", "idle iss., unr.5", "warm, 1, unr.5", "warm, 12, unr.5", "paced",
                                    "paced, unr.5"};

// the copies of routed tile t of the layer at `layer` into dst, on bar (launch A's issue for a routed tile)
__device__ void issue_tile(unsigned char* dst, unsigned char const* layer, int t, std::uint64_t* bar) {
  int const s = t / kTilesPerSlot;
  std::int64_t const r0 = std::int64_t(t - s * kTilesPerSlot) * kR;
  unsigned char const* e = layer + std::int64_t(s) * kExpertBytes;
  Span16 const c0 = span16(e + r0 * kRb, kR * kRb), c1 = span16(e + kCodeBytes + r0 * kRb, kR * kRb);
  Span16 const c2 = span16(e + 2 * kCodeBytes + r0 * kNblk, kR * kNblk);
  Span16 const c3 = span16(e + 2 * kCodeBytes + kScaleBytes + r0 * kNblk, kR * kNblk);
  mbar_arrive_expect(bar, c0.bytes + c1.bytes + c2.bytes + c3.bytes);
  bulk_copy(dst, c0.src, c0.bytes, bar);
  bulk_copy(dst + kR * kRb, c1.src, c1.bytes, bar);
  bulk_copy(dst + 2 * kR * kRb, c2.src, c2.bytes, bar);
  bulk_copy(dst + 2 * kR * kRb + kScap, c3.src, c3.bytes, bar);
}

// launch A's routed decode of one tile (moe_gate_up_stream_kernel, kBiased, L = 16): returns a fold of the outputs.
// kUnroll: the chunk loop unrolled (1: as launch A)
template <int kUnroll>
__device__ float decode_tile(unsigned char const* base, int2 const* q, float const* sx, std::uint32_t pos_lo,
                             std::uint32_t neg_lo) {
  int const lane = int(threadIdx.x & 31), L = 16, sub = lane / L, sl = lane % L;
  std::uint8_t const* gsc = base + 2 * kR * kRb;
  std::uint8_t const* usc = gsc + kScap;
  float fold = 0.f;
  for (int i0 = 0; i0 < kR; i0 += 32 / L) {
    int const i = i0 + sub;
    float ag = 0.f, au = 0.f;
    uint4 const* gr = reinterpret_cast<uint4 const*>(base + i * kRb);
    uint4 const* ur = reinterpret_cast<uint4 const*>(base + (kR + i) * kRb);
#pragma unroll kUnroll
    for (int j = sl; j < kNblk; j += L) {
      float const xsc = sx[j];
      uint4 const v[2] = {gr[j], ur[j]};
      int2 d[2];
      q8u_chunk<2>(v, q + 9 * j, pos_lo, neg_lo, d);
      ag = fmaf(fmaf(float(d[0].y), kQ8LimbScale, float(d[0].x)), ue8m0_float_sel(gsc[i * kNblk + j]) * xsc, ag);
      au = fmaf(fmaf(float(d[1].y), kQ8LimbScale, float(d[1].x)), ue8m0_float_sel(usc[i * kNblk + j]) * xsc, au);
    }
    for (int o = L >> 1; o > 0; o >>= 1) {
      ag += __shfl_xor_sync(0xffffffffu, ag, o);
      au += __shfl_xor_sync(0xffffffffu, au, o);
    }
    fold += swiglu(ag, au, 7.f);
  }
  return fold;
}

// rec[(block · kW + warp) · 3 + {0, 1, 2}]: the warp's issue, landing and decode-done times (ns); 0 for no tile
__global__ void __launch_bounds__(kW * 32, 1)
    tile_kernel(unsigned char const* layer, int mode, int pace, unsigned long long* rec, float* sink) {
  extern __shared__ float4 smem_f4[];
  __shared__ std::uint64_t s_bar[kW];
  __shared__ __align__(8) std::uint32_t s_tab[2];
  unsigned char* const sm = reinterpret_cast<unsigned char*>(smem_f4);
  unsigned char* const ring0 = sm + ((0u - smem_u32(sm)) & 127u);
  int2* const q = reinterpret_cast<int2*>(ring0 + std::size_t(kW) * kStage);
  float* const sx = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(q) + kQBytes);
  int const warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), b = int(blockIdx.x);
  for (int i = int(threadIdx.x); i < 9 * kNblk; i += kW * 32) {  // random limbs in [-127, 127], bias slots included
    unsigned const h0 = (unsigned(i) + 1u) * 2654435761u, h1 = h0 * 2246822519u;
    q[i] = make_int2(int(h0 & 0x7F7F7F7Fu), int(h1 & 0x7F7F7F7Fu));
  }
  for (int i = int(threadIdx.x); i < kNblk; i += kW * 32) sx[i] = 1e-3f;
  e2m1_tables_store(s_tab);
  if (lane == 0) {
    mbar_init(s_bar + warp, 1);
    mbar_init_fence();
  }
  __syncthreads();
  std::uint32_t pos_lo = 0, neg_lo = 0;
  e2m1_tables_load(s_tab, pos_lo, neg_lo);
  auto tile_of = [&](int w) { return w >= kSharedWarps ? b + (w - kSharedWarps) * kGrid : kTiles; };
  int const t = tile_of(warp);
  bool const mine = t < kTiles;
  unsigned char* const buf = ring0 + std::size_t(warp) * kStage;
  unsigned long long* const r = rec + (std::size_t(b) * kW + warp) * 3;
  unsigned long long t_issue = 0, t_land = 0, t_end = 0;
  t_issue = global_ns();
  if (mode == kOneIssuer || mode == kIdleIssuer || mode == kIdleIssuerU5) {
    if (warp == (mode == kOneIssuer ? kSharedWarps : kW - 1) && lane == 0)
      for (int w = kSharedWarps; w < kW; ++w)
        if (tile_of(w) < kTiles) issue_tile(ring0 + std::size_t(w) * kStage, layer, tile_of(w), s_bar + w);
  } else if (mine && lane == 0) {
    if (mode == kPaced || mode == kPacedU5) {  // routed tile k of the block issued `pace` cycles after tile k - 1
      long long const until = clock64() + static_cast<long long>(pace) * (warp - kSharedWarps);
      while (clock64() < until) __nanosleep(20);
    }
    issue_tile(buf, layer, t, s_bar + warp);
  }
  float fold = 0.f;
  if (mine) {
    mbar_wait(s_bar + warp, 0);
    t_land = global_ns();
  }
  if (mode == kWarm12 || mode == kWarm1 || mode == kWarm1U5 || mode == kWarm12U5) {
    __syncthreads();
    t_land = mine ? global_ns() : 0;  // the decode's start
  }
  bool const decode = mine && mode != kLand && !((mode == kWarm1 || mode == kWarm1U5) && warp != kSharedWarps);
  if (decode) {
    bool const u5 = mode == kIdleIssuerU5 || mode == kWarm1U5 || mode == kWarm12U5 || mode == kPacedU5;
    fold = u5 ? decode_tile<5>(buf, q, sx, pos_lo, neg_lo) : decode_tile<1>(buf, q, sx, pos_lo, neg_lo);
    t_end = global_ns();
  }
  if (lane == 0) {
    r[0] = mine ? t_issue : 0;
    r[1] = mine ? t_land : 0;
    r[2] = decode ? t_end : 0;
  }
  if (fold == 1.2345f) sink[threadIdx.x] = fold;  // keeps the decode
}

__global__ void fill_kernel(std::uint32_t* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint32_t h = std::uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = h;
  }
}

double median(std::vector<double> const& v) { return probe::quantile(v, 0.5); }

}  // namespace

int main() {
  std::size_t const pool = std::size_t(kLayerBytes) * kLayers;
  unsigned char* dpool = nullptr;
  unsigned long long* drec = nullptr;
  float* dsink = nullptr;
  std::size_t const nrec = std::size_t(kLayers) * kGrid * kW * 3;
  CK(cudaMalloc(&dpool, pool + 256));
  CK(cudaMalloc(&drec, nrec * sizeof(unsigned long long)));
  CK(cudaMalloc(&dsink, kW * 32 * sizeof(float)));
  fill_kernel<<<1024, 256>>>(reinterpret_cast<std::uint32_t*>(dpool), pool / 4, 0x1234u);
  CK(cudaGetLastError());
  // scale bytes near 127 (2^0), so that the decode's values stay finite
  for (int l = 0; l < kLayers; ++l)
    for (int s = 0; s < kTopK; ++s)
      CK(cudaMemset(dpool + std::size_t(l) * kLayerBytes + std::size_t(s) * kExpertBytes + 2 * kCodeBytes, 127,
                    2 * kScaleBytes));
  CK(cudaFuncSetAttribute(tile_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  CK(cudaDeviceSynchronize());
  std::printf("tile_landing: %d blocks x %d warps, %d routed tiles of %d bytes per launch (%.1f MB), %d launches per mode\n",
              kGrid, kW, kTiles, int(2 * kR * kRb + 2 * kR * kNblk), double(kTiles) * double(2 * kR * kRb + 2 * kR * kNblk) / 1e6,
              kLayers);
  std::printf("µs after the launch's first issue, medians over blocks and launches:\n");
  std::printf("  %-22s %9s %9s %9s %9s %9s %10s %9s\n", "mode", "issued", "1st land", "med land", "last land", "last end",
              "dec/warp", "in order");
  std::vector<unsigned long long> rec(nrec);
  std::vector<std::pair<int, int>> runs;  // (mode, pace in cycles)
  for (int m = 0; m < kPaced; ++m) runs.push_back({m, 0});
  for (int pace : {300, 450, 600, 750}) runs.push_back({kPaced, pace});
  for (int pace : {450, 600}) runs.push_back({kPacedU5, pace});
  for (auto [m, pace] : runs) {
    for (int rep = 0; rep < 2; ++rep) {  // the second pass is reported
      for (int l = 0; l < kLayers; ++l)
        tile_kernel<<<kGrid, kW * 32, kSmem>>>(dpool + std::size_t(l) * kLayerBytes, m, pace,
                                              drec + std::size_t(l) * kGrid * kW * 3, dsink);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
    }
    CK(cudaMemcpy(rec.data(), drec, nrec * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    std::vector<double> issued, first, med, last, end, dec;
    long long pairs = 0, ordered = 0;
    for (int l = 0; l < kLayers; ++l) {
      unsigned long long const* R = rec.data() + std::size_t(l) * kGrid * kW * 3;
      unsigned long long t0 = ~0ull;
      for (int i = 0; i < kGrid * kW; ++i)
        if (R[3 * i]) t0 = std::min(t0, R[3 * i]);
      for (int b = 0; b < kGrid; ++b) {
        std::vector<double> land;
        double mi = 0, me = 0;
        std::vector<std::pair<unsigned long long, unsigned long long>> order;  // (issue rank key, landing)
        for (int w = 0; w < kW; ++w) {
          unsigned long long const* x = R + (std::size_t(b) * kW + w) * 3;
          if (!x[0]) continue;
          mi = std::max(mi, double(x[0] - t0) * 1e-3);
          land.push_back(double(x[1] - t0) * 1e-3);
          if (x[2]) {
            me = std::max(me, double(x[2] - t0) * 1e-3);
            dec.push_back(double(x[2] - x[1]) * 1e-3);
          }
          order.push_back({static_cast<unsigned long long>(w), x[1]});  // warps issue in warp order (one issuer: strictly)
        }
        if (land.empty()) continue;
        for (std::size_t i = 0; i < order.size(); ++i)
          for (std::size_t j = i + 1; j < order.size(); ++j) {
            ++pairs;
            ordered += order[i].second <= order[j].second;
          }
        issued.push_back(mi);
        first.push_back(*std::min_element(land.begin(), land.end()));
        med.push_back(median(land));
        last.push_back(*std::max_element(land.begin(), land.end()));
        if (me > 0) end.push_back(me);
      }
    }
    char name[64];
    std::snprintf(name, sizeof name, pace ? "%s %d" : "%s", kNames[m], pace);
    std::printf("  %-22s %9.2f %9.2f %9.2f %9.2f %9.2f %10.2f %8.0f%%\n", name, median(issued), median(first),
                median(med), median(last), median(end), median(dec),
                pairs ? 100.0 * double(ordered) / double(pairs) : 0.0);
    if (m == kLandDecode || m == kLand) {
      std::printf("  %-22s last land p10 %.2f p90 %.2f max %.2f; decode per warp p10 %.2f p90 %.2f\n", "",
                  probe::quantile(last, 0.1), probe::quantile(last, 0.9), probe::quantile(last, 1.0),
                  probe::quantile(dec, 0.1), probe::quantile(dec, 0.9));
    }
  }
  CK(cudaFree(dpool));
  CK(cudaFree(drec));
  CK(cudaFree(dsink));
  return 0;
}
