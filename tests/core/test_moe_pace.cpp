// MoE launch A's pace from the device's attributes (cuda/moe_pace.hpp), checked on the CPU: one routed tile at an SM's
// share of the DRAM's peak rate, in SM cycles, on the attributes an H100 SXM reports; the fallback when an attribute
// is missing, the bound, and the scaling with the tile and the bandwidth.
#include <doctest/doctest.h>

#include <cstdint>

#include "ling/cuda/moe_pace.hpp"

namespace mp = ling::cuda::moe_pace;

namespace {
// Ling-3.0-flash's routed tile in launch A: 4 gate and 4 up rows of 2560 MXFP4 codes (1280 bytes each) and their
// 80 scale bytes each
constexpr std::int64_t kLingTile = 2 * 4 * (1280 + 80);
}  // namespace

TEST_CASE("MoE launch A's pace: one routed tile at an SM's share of the peak DRAM rate") {
  CHECK(kLingTile == 10880);
  // H100 SXM: 132 SMs at 1 980 MHz, HBM3 at 2 619 MHz on 5120 bits (3.35 TB/s): 10880 × 132 × 1.98e9 / 3.352e12
  CHECK(mp::peak_bandwidth(2619000, 5120) == doctest::Approx(3.35232e12));
  CHECK(mp::cycles(kLingTile, 132, 1980000, 2619000, 5120, 700) == 848);
  // a faster memory (4.92 TB/s, an H200-class part) gives a shorter pace, in proportion
  int const fast = mp::cycles(kLingTile, 132, 1980000, 3201000, 6144, 700);
  CHECK(fast == 578);
  CHECK(double(fast) ==
        doctest::Approx(848.0 * mp::peak_bandwidth(2619000, 5120) / mp::peak_bandwidth(3201000, 6144)).epsilon(0.002));
  // twice the tile, twice the pace (within the rounding); a smaller grid shares the DRAM among fewer SMs
  CHECK(mp::cycles(2 * kLingTile, 132, 1980000, 2619000, 5120, 700) == 1696);
  CHECK(mp::cycles(kLingTile, 66, 1980000, 2619000, 5120, 700) == 424);
  // an attribute that could not be read (0) or a nonsensical one gives the fallback
  CHECK(mp::cycles(kLingTile, 132, 0, 2619000, 5120, 700) == 700);
  CHECK(mp::cycles(kLingTile, 132, 1980000, 0, 5120, 700) == 700);
  CHECK(mp::cycles(kLingTile, 132, 1980000, 2619000, 0, 700) == 700);
  CHECK(mp::cycles(kLingTile, 0, 1980000, 2619000, 5120, 700) == 700);
  CHECK(mp::cycles(kLingTile, -1, 1980000, 2619000, 5120, 700) == 700);
  CHECK(mp::cycles(0, 132, 1980000, 2619000, 5120, 700) == 700);
  // bounded, as LING_MOE_PACE is
  CHECK(mp::cycles(std::int64_t(1) << 40, 132, 1980000, 2619000, 5120, 700) == mp::kMaxCycles);
  CHECK(mp::cycles(1, 132, 1980000, 1, 1, 700) == mp::kMaxCycles);
  // a tiny tile rounds to the nearest cycle
  CHECK(mp::cycles(1, 1, 1000, 1000, 8, 7) == 1);  // 1 × 1 × 1e6 / 2e6 = 0.5 rounds up
  CHECK(mp::cycles(1, 1, 999, 1000, 8, 7) == 0);   // 0.4995 rounds down
}
