#pragma once
// The device's streaming-read bandwidth (DESIGN.md "How speed is established"): a read-only kernel with 16-byte
// loads over >= 4 GiB, best of several timed runs; the roofline's denominator. Kernel in bandwidth.cuh.
#include <cstddef>
#include <cstdint>

namespace ling::cuda {

struct BandwidthResult {
  double gb_per_s = 0;  // 1e9 bytes per second, best run
  double best_ms = 0;
  std::size_t bytes = 0;
};

// Reads `bytes` (rounded down to 16 B) `reps` times after a warm-up. Throws ling::Error on a CUDA failure.
template <int kVecBytes = 16>
BandwidthResult measure_read_bandwidth(std::size_t bytes = std::size_t(4) << 30, int reps = 10);

}  // namespace ling::cuda
