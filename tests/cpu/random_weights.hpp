#pragma once
// Random layer weights made in memory, for the layer tests (no checkpoint needed).
#include <random>
#include <vector>

#include "ling/cpu/backend.hpp"
#include "ling/layers/linear.hpp"
#include "ling/quant/policies.hpp"

namespace ling::test {

struct Rng {
  std::mt19937 gen{1234};
  float normal(float sd = 1.f) { return std::normal_distribution<float>(0.f, sd)(gen); }
  std::vector<float> vec(std::int64_t n, float sd = 1.f, float mean = 0.f) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = mean + normal(sd);
    return v;
  }
  cpu::Matrix mat(std::int64_t r, std::int64_t c, float sd = 1.f) {
    cpu::Matrix m(r, c);
    for (std::int64_t i = 0; i < m.size(); ++i) m.data()[i] = normal(sd);
    return m;
  }
  template <class Policies = quant::DefaultPolicies>
  layers::Linear<Policies> linear(std::int64_t rows, std::int64_t cols) {
    return layers::make_f32_linear<Policies>(vec(rows * cols, 1.0f / std::sqrt(float(cols))), rows, cols);
  }
};

inline double rel_l2(cpu::ConstMatrixRef a, cpu::ConstMatrixRef b) {
  return double((a - b).norm()) / std::max(double(b.norm()), 1e-30);
}

}  // namespace ling::test
