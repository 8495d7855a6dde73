#pragma once
// Shared helpers of the GPU tests: random data, host matrices in every format, relative L2 error.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "../gpu_random.hpp"
#include "harness.hpp"
#include "ling/quant/policies.hpp"

namespace ling::test_gpu {

using test_common::randn;
using test_common::rel_l2;
using test_common::rng;

template <class T>
std::vector<unsigned char> bytes_of(std::vector<T> const& v) {
  std::vector<unsigned char> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Quantizes x [rows, cols] into `format`; also returns the dequantized matrix (the reference's weights).
inline HostMatrix make_matrix(cuda::MatFormat f, std::vector<float> const& x, std::int64_t rows, std::int64_t cols,
                              std::vector<float>* deq = nullptr) {
  HostMatrix m{f, rows, cols, {}, {}};
  std::vector<float> d(std::size_t(rows * cols));
  switch (f) {
    case cuda::MatFormat::kF32:
      m.data = bytes_of(x);
      d = x;
      break;
    case cuda::MatFormat::kBf16: {
      std::vector<Bfloat16> w(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) w[i] = bf16_from_float(x[i]), d[i] = to_float(w[i]);
      m.data = bytes_of(w);
      break;
    }
    case cuda::MatFormat::kFp8Block: {
      std::vector<E4m3> w(std::size_t(quant::Fp8Block::storage_count(rows, cols)));
      std::vector<float> s(std::size_t(quant::Fp8Block::scale_count(rows, cols)));
      quant::Fp8Block::quantize(x.data(), rows, cols, w.data(), s.data(), true);
      quant::MatrixView<quant::Fp8Block> v{w.data(), s.data(), rows, cols};
      for (std::int64_t r = 0; r < rows; ++r) v.row(r, d.data() + r * cols);
      m.data = bytes_of(w), m.scales = bytes_of(s);
      break;
    }
    case cuda::MatFormat::kFp8Row: {
      std::vector<E4m3> w(std::size_t(rows * cols));
      std::vector<float> s(static_cast<std::size_t>(rows));
      quant::Fp8Row::quantize([&](std::int64_t r, std::int64_t c) { return x[std::size_t(r * cols + c)]; }, rows, cols, w.data(), s.data());
      quant::MatrixView<quant::Fp8Row> v{w.data(), s.data(), rows, cols};
      for (std::int64_t r = 0; r < rows; ++r) v.row(r, d.data() + r * cols);
      m.data = bytes_of(w), m.scales = bytes_of(s);
      break;
    }
    case cuda::MatFormat::kMxfp4: {
      std::vector<std::uint8_t> w(std::size_t(quant::Mxfp4::storage_count(rows, cols)));
      std::vector<Ue8m0> s(std::size_t(quant::Mxfp4::scale_count(rows, cols)));
      quant::Mxfp4::quantize(x.data(), rows, cols, w.data(), s.data());
      quant::MatrixView<quant::Mxfp4> v{w.data(), s.data(), rows, cols};
      for (std::int64_t r = 0; r < rows; ++r) v.row(r, d.data() + r * cols);
      m.data = bytes_of(w), m.scales = bytes_of(s);
      break;
    }
  }
  if (deq) *deq = std::move(d);
  return m;
}

inline std::vector<double> ref_matvec(std::vector<float> const& w, std::int64_t rows, std::int64_t cols, std::vector<double> const& x) {
  std::vector<double> y(std::size_t(rows), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (std::int64_t c = 0; c < cols; ++c) acc += double(w[std::size_t(r * cols + c)]) * x[std::size_t(c)];
    y[std::size_t(r)] = acc;
  }
  return y;
}

}  // namespace ling::test_gpu
