#pragma once
// Linear: one weight matrix [out, in] in any policy of a PolicyList. It holds a std::variant of
// quant::MatrixView<P> (a view into a mapped checkpoint, or into storage it owns), so a policy defined outside
// the library works as soon as it is in the list the model type was given (docs/adding-a-policy.md).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "ling/core/error.hpp"
#include "ling/quant/bf16.hpp"
#include "ling/quant/concept.hpp"

namespace ling::layers {

template <class List, class P>
inline constexpr bool list_contains = false;
template <class... Ps, class P>
inline constexpr bool list_contains<quant::PolicyList<Ps...>, P> = (std::is_same_v<Ps, P> || ...);

template <class Policies>
class Linear;

template <class... Ps>
class Linear<quant::PolicyList<Ps...>> {
 public:
  using Policies = quant::PolicyList<Ps...>;
  using Variant = std::variant<quant::MatrixView<Ps>...>;

  Linear() = default;

  // A view of storage that someone else keeps alive (a mapped checkpoint).
  template <quant::weight_policy P>
  static Linear view(quant::MatrixView<P> v) {
    static_assert(list_contains<Policies, P>, "this policy is not in the model's PolicyList: add it");
    Linear l;
    l.view_ = v;
    return l;
  }
  // Storage owned by the Linear (a quantization made at load, or weights made in memory).
  template <quant::weight_policy P>
  static Linear owned(std::vector<typename P::storage_type> data, std::vector<typename P::scale_type> scales,
                      std::int64_t rows, std::int64_t cols) {
    require(std::int64_t(data.size()) == P::storage_count(rows, cols), ErrorCode::kShape,
            std::string("Linear::owned: storage size does not match ") + std::string(P::name));
    if constexpr (!std::is_same_v<typename P::scale_type, quant::NoScale>)
      require(std::int64_t(scales.size()) == P::scale_count(rows, cols), ErrorCode::kShape,
              std::string("Linear::owned: scale count does not match ") + std::string(P::name));
    auto keep = std::make_shared<Owned<P>>(Owned<P>{std::move(data), std::move(scales)});
    quant::MatrixView<P> v{keep->data.data(), keep->scales.empty() ? nullptr : keep->scales.data(), rows, cols};
    Linear l = view(v);
    l.keep_ = std::move(keep);
    return l;
  }

  std::int64_t rows() const {
    return std::visit([](auto const& v) { return v.rows; }, view_);
  }
  std::int64_t cols() const {
    return std::visit([](auto const& v) { return v.cols; }, view_);
  }
  bool empty() const { return rows() == 0; }
  std::string_view policy_name() const {
    return std::visit([](auto const& v) -> std::string_view { return std::decay_t<decltype(v)>::policy::name; }, view_);
  }
  template <quant::weight_policy P>
  bool holds() const { return std::holds_alternative<quant::MatrixView<P>>(view_); }
  // Calls f(MatrixView<P> const&) with the policy this matrix is stored in.
  template <class F>
  decltype(auto) visit(F&& f) const { return std::visit(std::forward<F>(f), view_); }

  // Dequantizes row r into out[0..cols).
  void row(std::int64_t r, float* out) const {
    std::visit([&](auto const& v) { v.row(r, out); }, view_);
  }

 private:
  template <class P>
  struct Owned {
    std::vector<typename P::storage_type> data;
    std::vector<typename P::scale_type> scales;
  };
  Variant view_;
  std::shared_ptr<void const> keep_;
};

// A matrix of plain floats, owned (tests, and weights made at load).
template <class Policies>
Linear<Policies> make_f32_linear(std::vector<float> w, std::int64_t rows, std::int64_t cols) {
  return Linear<Policies>::template owned<quant::F32>(std::move(w), {}, rows, cols);
}

}  // namespace ling::layers
