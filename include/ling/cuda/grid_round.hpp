#pragma once
// The round arithmetic of the grid-wide barrier (moe.cuh grid_barrier), host and device, so that a CPU test checks it.
//
// One 64-bit counter, never reset. In every round each block of the grid adds its increment once: block 0 adds
// 2^32 - (grid - 1), every other block 1, so a round adds exactly 2^32 whatever the grid. A round starts with the
// counter at a multiple of 2^32 (0 at allocation); an arrival whose atomic returned `old` has not completed the round
// (the increments still missing are positive and sum to less than 2^32), so `old` lies in [base, base + 2^32) and the
// round ends when the counter reaches base + 2^32 = target(old). All in unsigned 64-bit arithmetic, compared by signed
// difference (reached): the round that ends at 2^64 (after 2^32 rounds: days of decoding at ~16 000 MoE layers per
// second) wraps to 0 and still compares right.
#include <cstdint>

#include "ling/core/config.hpp"

namespace ling::cuda::grid_round {

LING_HOST_DEVICE constexpr std::uint64_t increment(unsigned block, unsigned grid) {
  return block == 0 ? (std::uint64_t(1) << 32) - std::uint64_t(grid - 1) : std::uint64_t(1);
}
LING_HOST_DEVICE constexpr std::uint64_t target(std::uint64_t old) { return (old | 0xFFFFFFFFull) + 1ull; }
LING_HOST_DEVICE constexpr bool reached(std::uint64_t counter, std::uint64_t target) {
  return static_cast<std::int64_t>(counter - target) >= 0;
}

}  // namespace ling::cuda::grid_round
