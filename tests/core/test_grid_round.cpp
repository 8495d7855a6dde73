// The grid-wide barrier's round arithmetic (cuda/grid_round.hpp, used by moe.cuh's grid_barrier), checked on the CPU:
// blocks arrive in random orders, round after round, for several grid sizes and starting counters (including the
// round that wraps the 64-bit counter); no block may see its round complete before the last arrival, and every block
// must see it complete after.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "ling/cuda/grid_round.hpp"

namespace gr = ling::cuda::grid_round;

TEST_CASE("grid barrier rounds: every round adds 2^32, completes exactly at its last arrival, and survives the wrap") {
  std::mt19937 rng{2026};
  constexpr std::uint64_t kRound = std::uint64_t(1) << 32;
  for (unsigned grid : {1u, 2u, 3u, 96u, 132u, 1000u}) {
    for (std::uint64_t start : {std::uint64_t(0), 7 * kRound, ~std::uint64_t(0) - kRound + 1 - 2 * kRound}) {
      CAPTURE(grid);
      CAPTURE(start);
      std::uint64_t counter = start;
      for (int round = 0; round < 4; ++round) {  // from the last start, the third round ends at 2^64 (wraps to 0)
        CAPTURE(round);
        std::vector<unsigned> order(grid);
        std::iota(order.begin(), order.end(), 0u);
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<std::uint64_t> targets;
        bool early = false;
        for (unsigned k = 0; k < grid; ++k) {
          std::uint64_t const old = counter;
          counter += gr::increment(order[k], grid);
          targets.push_back(gr::target(old));
          if (k + 1 < grid)
            for (std::uint64_t t : targets) early = early || gr::reached(counter, t);
        }
        CHECK_FALSE(early);
        CHECK(counter == start + std::uint64_t(round + 1) * kRound);  // modulo 2^64
        CHECK(std::all_of(targets.begin(), targets.end(), [&](std::uint64_t t) { return t == counter && gr::reached(counter, t); }));
        // a block polling late, after the next round began, still sees its own round complete
        CHECK(gr::reached(counter + gr::increment(1, grid), targets.front()));
      }
    }
  }
}
