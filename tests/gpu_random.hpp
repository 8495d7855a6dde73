#pragma once
// Shared by the GPU tests (tests/cuda_ops, tests/cuda_model): fresh random inputs every run with the seed printed
// (so a failure can be replayed), and the relative L2 error that fails on NaN or inf. Include after doctest.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace ling::test_common {

inline std::mt19937_64& rng() {
  static std::mt19937_64 g = [] {
    std::uint64_t seed = (std::uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
    MESSAGE("GPU test seed: " << seed);
    return std::mt19937_64{seed};
  }();
  return g;
}
inline std::vector<float> randn(std::size_t n, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng());
  return v;
}

// Relative L2 error of a against ref; any NaN/inf in a counts as failure (1e30).
inline double rel_l2(std::vector<float> const& a, std::vector<double> const& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(a[i])) return 1e30;
    double d = double(a[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / (den > 1e-300 ? den : 1e-300));
}
inline double rel_l2(std::vector<float> const& a, std::vector<float> const& ref) {
  return rel_l2(a, std::vector<double>(ref.begin(), ref.end()));
}

}  // namespace ling::test_common
