#pragma once
// Causal depthwise short convolution with a rolling window of raw inputs (spec §2 "KDA mixer":
// c_n = silu(sum_j w_n[:, j] * a_n(t-3+j)), the current token multiplies w[:, kernel-1]).
// The window holds the raw (pre-conv) inputs of the last kernel-1 tokens, oldest first, as [kernel-1, channels];
// a fresh stream starts with a zero window, which is exactly "positions before 0 are 0".
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ling::cpu {

enum class ConvActivation { kNone, kSilu };

inline float silu(float x) noexcept { return x / (1.0f + std::exp(-x)); }

// One token through the conv: y = act(sum_{j<kernel-1} w[:, j] * window[j] + w[:, kernel-1] * x), then the window
// drops its oldest row and appends x. weight: [channels, kernel] row-major. x and y may alias.
inline void short_conv_step(std::int64_t channels, std::int64_t kernel, float const* weight, float* window,
                            float const* x, float* y, ConvActivation act = ConvActivation::kSilu) {
  std::int64_t const hist = kernel - 1;
  for (std::int64_t c = 0; c < channels; ++c) {
    float const* w = weight + c * kernel;
    float const xc = x[c];
    float acc = 0.0f;  // oldest tap first, the same order as short_conv_forward
    for (std::int64_t j = 0; j < hist; ++j) acc += w[j] * window[j * channels + c];
    acc += w[hist] * xc;
    for (std::int64_t j = 0; j + 1 < hist; ++j) window[j * channels + c] = window[(j + 1) * channels + c];
    if (hist > 0) window[(hist - 1) * channels + c] = xc;
    y[c] = act == ConvActivation::kSilu ? silu(acc) : acc;
  }
}

// T tokens at once: x, y [T, channels] row-major (must not alias); the window is read as the history before
// token 0 and left holding the last kernel-1 inputs of [window; x], so T calls of short_conv_step give the same.
inline void short_conv_forward(std::int64_t channels, std::int64_t kernel, float const* weight, float* window,
                               std::int64_t tokens, float const* x, float* y,
                               ConvActivation act = ConvActivation::kSilu) {
  if (tokens <= 0) return;
  std::int64_t const hist = kernel - 1;
  // Row e of the extended sequence [window; x].
  auto row = [&](std::int64_t e) -> float const* { return e < hist ? window + e * channels : x + (e - hist) * channels; };
  // Taps as [kernel, channels] so that every step below runs over contiguous channels (Eigen arrays: vectorized).
  using Row = Eigen::Array<float, 1, Eigen::Dynamic>;
  Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> taps(kernel, channels);
  for (std::int64_t c = 0; c < channels; ++c)
    for (std::int64_t j = 0; j < kernel; ++j) taps(j, c) = weight[c * kernel + j];
  Row acc(channels);
  for (std::int64_t t = 0; t < tokens; ++t) {
    acc.setZero();
    for (std::int64_t j = 0; j < kernel; ++j)  // y[t] = sum_j w[:, j] * E[t + j]
      acc += taps.row(j) * Eigen::Map<Row const>(row(t + j), channels);
    Eigen::Map<Row> out(y + t * channels, channels);
    if (act == ConvActivation::kSilu)
      out = acc / (1.0f + (-acc).exp());
    else
      out = acc;
  }
  if (hist <= 0) return;
  // New window = rows tokens .. tokens+hist-1 of E; copy through a buffer since they may overlap the old window.
  std::vector<float> next(static_cast<std::size_t>(hist * channels));
  for (std::int64_t j = 0; j < hist; ++j)
    std::memcpy(next.data() + j * channels, row(tokens + j), sizeof(float) * static_cast<std::size_t>(channels));
  std::memcpy(window, next.data(), sizeof(float) * next.size());
}

}  // namespace ling::cpu
