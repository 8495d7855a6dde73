#pragma once
// What a weight policy is (STYLE.md): a type that opts in with `policy_concept = weight_policy_tag` and says how a
// matrix [rows, cols] (PyTorch's [out, in]) is stored: element storage, a scale layout, and decode() of one element.
// The CPU backend and the generic CUDA kernel need nothing more; fast kernels are specializations.
#include <concepts>
#include <cstdint>
#include <string_view>

#include "ling/core/config.hpp"
#include "ling/core/dtypes.hpp"

namespace ling::quant {

struct weight_policy_tag {};
struct NoScale {};  // scale_type of the plain formats

template <class P>
concept weight_policy =
    std::same_as<typename P::policy_concept, weight_policy_tag> &&
    requires(typename P::storage_type const* w, typename P::scale_type const* s, std::int64_t n) {
      { P::name } -> std::convertible_to<std::string_view>;
      { P::storage_count(n, n) } -> std::same_as<std::int64_t>;  // elements of storage_type
      { P::scale_count(n, n) } -> std::same_as<std::int64_t>;    // elements of scale_type
      { P::decode(w, s, n, n, n, n) } -> std::same_as<float>;     // (w, s, rows, cols, r, c)
    };

// A non-owning view of one quantized matrix.
template <weight_policy P>
struct MatrixView {
  using policy = P;
  typename P::storage_type const* data = nullptr;
  typename P::scale_type const* scales = nullptr;
  std::int64_t rows = 0, cols = 0;

  LING_HOST_DEVICE float at(std::int64_t r, std::int64_t c) const { return P::decode(data, scales, rows, cols, r, c); }
  // Dequantizes row r into out[0..cols).
  void row(std::int64_t r, float* out) const {
    if constexpr (requires { P::dequantize_row(data, scales, rows, cols, r, out); })
      P::dequantize_row(data, scales, rows, cols, r, out);
    else
      for (std::int64_t c = 0; c < cols; ++c) out[c] = at(r, c);
  }
};

template <weight_policy P>
constexpr std::int64_t storage_bytes(std::int64_t rows, std::int64_t cols) {
  std::int64_t b = P::storage_count(rows, cols) * std::int64_t(sizeof(typename P::storage_type));
  if constexpr (!std::same_as<typename P::scale_type, NoScale>)
    b += P::scale_count(rows, cols) * std::int64_t(sizeof(typename P::scale_type));
  return b;
}

// A list of policies: the set a model type accepts for its weights. Tests add their own.
template <class... Ps>
struct PolicyList {
  static constexpr std::size_t size = sizeof...(Ps);
};

template <class List, class P> struct Append;
template <class... Ps, class P> struct Append<PolicyList<Ps...>, P> { using type = PolicyList<Ps..., P>; };

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace ling::quant
