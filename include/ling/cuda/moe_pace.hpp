#pragma once
// MoE launch A's pace (MoeArgs::pace, moe.cuh): the SM cycles between the routed tiles' copies of a block's successive
// warps, so that a block's tiles land one after another, in the order its warps decode them, instead of together at
// the end of the DRAM phase (docs/kernels.md "Launch A's routed tiles paced"). The device's pace is the interval at
// which the SM's share of the DRAM's peak rate delivers one tile: tile bytes × SMs × SM clock / peak bandwidth. It
// lands where each machine measured best: 848 cycles on an H100 (850-900 best there; in place 2.525 against 2.535
// ms/token at 700, session 50), and ~580 on an H200 by its 4.8-4.9 TB/s peak, where 550 and 700 measured alike (2.239
// and 2.237 ms/token, session 30; the derived pace not yet run there).
// Host arithmetic, so that a CPU test checks it (tests/core/test_moe_pace.cpp).
#include <cstdint>

namespace ling::cuda::moe_pace {

inline constexpr int kMaxCycles = 1 << 16;  // LING_MOE_PACE's bound too

// The DRAM's peak read rate in bytes per second, from the device's memory clock (kHz; double data rate) and bus width
// (bits): cudaDevAttrMemoryClockRate and cudaDevAttrGlobalMemoryBusWidth. H100 SXM: 2 619 000 kHz × 5120 bits, 3.35
// TB/s.
constexpr double peak_bandwidth(long long mem_khz, long long bus_bits) {
  return 2.0 * double(mem_khz) * 1e3 * double(bus_bits) / 8.0;
}

// The pace in SM cycles for tiles of tile_bytes on `sms` SMs clocked at sm_khz (cudaDevAttrClockRate), rounded to the
// nearest cycle and bounded by kMaxCycles; `fallback` when an attribute could not be read (0 or negative).
constexpr int cycles(std::int64_t tile_bytes, int sms, int sm_khz, int mem_khz, int bus_bits, int fallback) {
  if (tile_bytes <= 0 || sms <= 0 || sm_khz <= 0 || mem_khz <= 0 || bus_bits <= 0) return fallback;
  double const c = double(tile_bytes) * double(sms) * double(sm_khz) * 1e3 / peak_bandwidth(mem_khz, bus_bits);
  return c >= double(kMaxCycles) ? kMaxCycles : int(c + 0.5);
}

}  // namespace ling::cuda::moe_pace
