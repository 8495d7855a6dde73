#pragma once
// Helpers of the cuda-ops GPU tests: a per-run random seed (printed), host matrices in every policy, device vectors
// poisoned with NaN, relative L2 error that fails on NaN.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../gpu_random.hpp"
#include "int8_row_policy.hpp"
#include "ling/cuda/linear.hpp"
#include "ling/cuda/moe.hpp"
#include "ling/cuda/runtime.hpp"
#include "ling/quant/policies.hpp"

namespace ling::test_ops {

using test_common::randn;
using test_common::rel_l2;
using test_common::rng;

// A host matrix of policy P made from random normal values (quantized by the policy's own quantizer).
template <class P>
struct HostMatrix {
  std::vector<typename P::storage_type> data;
  std::vector<typename P::scale_type> scales;
  std::int64_t rows = 0, cols = 0;
  quant::MatrixView<P> view() const { return {data.data(), scales.empty() ? nullptr : scales.data(), rows, cols}; }
  // fp64 row r
  std::vector<double> row(std::int64_t r) const {
    std::vector<float> f(static_cast<std::size_t>(cols));
    view().row(r, f.data());
    return std::vector<double>(f.begin(), f.end());
  }
};

template <class P>
HostMatrix<P> random_matrix(std::int64_t rows, std::int64_t cols, float scale = 1.f) {
  HostMatrix<P> m;
  m.rows = rows;
  m.cols = cols;
  m.data.resize(std::size_t(P::storage_count(rows, cols)));
  if constexpr (!std::is_same_v<typename P::scale_type, quant::NoScale>) m.scales.resize(std::size_t(P::scale_count(rows, cols)));
  std::vector<float> x = randn(std::size_t(rows * cols), scale);
  if constexpr (std::is_same_v<P, quant::Bf16>) {
    for (std::size_t i = 0; i < x.size(); ++i) m.data[i] = bf16_from_float(x[i]);
  } else if constexpr (std::is_same_v<P, quant::F16>) {
    for (std::size_t i = 0; i < x.size(); ++i) m.data[i] = half_from_float(x[i]);
  } else if constexpr (std::is_same_v<P, quant::F32>) {
    m.data = x;
  } else if constexpr (std::is_same_v<P, quant::Fp8Block>) {
    P::quantize(x.data(), rows, cols, m.data.data(), m.scales.data(), /*ue8m0=*/(rng()() & 1) != 0);
  } else if constexpr (std::is_same_v<P, quant::Fp8Row>) {
    P::quantize([&](std::int64_t r, std::int64_t c) { return x[std::size_t(r * cols + c)]; }, rows, cols, m.data.data(),
                m.scales.data());
  } else if constexpr (std::is_base_of_v<quant::Mxfp4, P>) {
    P::quantize(x.data(), rows, cols, m.data.data(), m.scales.data());
  } else if constexpr (std::is_same_v<P, test::Int8Row>) {
    std::uniform_int_distribution<int> d(-127, 127);
    for (auto& w : m.data) w = std::int8_t(d(rng()));
    std::uniform_real_distribution<float> s(0.001f, 0.02f);
    for (auto& v : m.scales) v = s(rng()) * scale;
  }
  return m;
}

// Columns a policy can hold: MXFP4 needs a multiple of 32 (128 in the tensor-core layout).
template <class P>
std::int64_t fit_cols(std::int64_t cols) {
  if constexpr (std::is_base_of_v<quant::Mxfp4, P>) {
    constexpr std::int64_t k = cuda::DeviceLayout<P>::kColsMultiple;
    return cols < k ? k : cols / k * k;
  } else {
    return cols;
  }
}

// A device float vector.
struct DeviceVec {
  cuda::DeviceBuffer buf;
  std::size_t n = 0;
  DeviceVec() = default;
  explicit DeviceVec(std::size_t count) : buf(count * sizeof(float) + 16, "test vector"), n(count) { poison(); }
  explicit DeviceVec(std::vector<float> const& v) : DeviceVec(v.size()) { buf.upload(v.data(), v.size() * sizeof(float)); }
  float* data() const { return buf.data<float>(); }
  void poison() { cuda::check(cudaMemset(buf.data(), 0xFF, buf.bytes()), "poison"); }  // 0xFFFFFFFF is a NaN
  std::vector<float> get() const {
    std::vector<float> v(n);
    buf.download(v.data(), n * sizeof(float));
    return v;
  }
};

inline void device_sync() { cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

// ||y - ref|| relative to the larger of ||ref|| and the size of the products (per row sqrt(cols · Σ_c (w_rc x_c)²),
// ≈ Σ_c |w_rc x_c|): GPU and CPU both sum in fp32, in different orders, so a row whose sum cancels (one row of 64
// columns: |Σ| can be far below its terms) differs by more than 1e-5 of itself without either being wrong (seen once
// in ~10 runs, 2.5e-5; the LM head's single 40-column row, 2e-5).
template <class P>
double rel_err(std::vector<float> const& y, std::vector<double> const& ref, HostMatrix<P> const& m, std::vector<float> const& x) {
  double num = 0, den = 0, terms = 0;
  for (std::int64_t r = 0; r < m.rows; ++r) {
    double const yr = y[static_cast<std::size_t>(r)], rr = ref[static_cast<std::size_t>(r)];
    if (!std::isfinite(yr)) return 1e30;
    num += (yr - rr) * (yr - rr);
    den += rr * rr;
    auto row = m.row(r);
    double t2 = 0;
    for (std::int64_t c = 0; c < m.cols; ++c) {
      double const t = double(row[static_cast<std::size_t>(c)]) * x[static_cast<std::size_t>(c)];
      t2 += t * t;
    }
    terms += double(m.cols) * t2;
  }
  return std::sqrt(num / std::max({den, terms, 1e-300}));
}

}  // namespace ling::test_ops

#define LING_REQUIRE_GPU()                                  \
  do {                                                      \
    if (!::ling::cuda::device_available()) {                \
      MESSAGE("skipped: no GPU");                           \
      return;                                               \
    }                                                       \
  } while (0)
