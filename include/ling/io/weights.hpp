#pragma once
// Every tensor of the plan (model/tensor_plan.hpp) bound to its bytes in a Checkpoint and to a storage format,
// decided (spec §3) by the safetensors dtype and the presence of a `<name>_scale_inv` sibling:
//   BF16 / F16 / F32, no sibling                                   -> plain
//   F8_E4M3 [out,in] + F32 scale_inv [ceil(out/128), ceil(in/128)] -> block FP8
//   I8 or U8 [out,in/2] + U8 scale_inv [out,in/32]                 -> MXFP4 (E2M1 pairs, UE8M0 scales)
// Missing, unexpected (not in the plan) and mis-shaped tensors or scales are errors that name them.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ling/core/error.hpp"
#include "ling/io/checkpoint.hpp"
#include "ling/model/tensor_plan.hpp"
#include "ling/quant/policies.hpp"

namespace ling::io {

enum class StorageFormat { kBf16, kF16, kF32, kFp8Block, kMxfp4 };

constexpr std::string_view to_string(StorageFormat f) noexcept {
  switch (f) {
    case StorageFormat::kBf16: return "bf16";
    case StorageFormat::kF16: return "f16";
    case StorageFormat::kF32: return "f32";
    case StorageFormat::kFp8Block: return "fp8-block";
    case StorageFormat::kMxfp4: return "mxfp4";
  }
  return "?";
}

// The policy of each stored format, and back.
using StoragePolicies = quant::PolicyList<quant::Bf16, quant::F16, quant::F32, quant::Fp8Block, quant::Mxfp4>;
template <class P> inline constexpr bool kIsStoragePolicy = false;
template <class P> inline constexpr StorageFormat kStorageFormatOf = StorageFormat::kBf16;
template <> inline constexpr bool kIsStoragePolicy<quant::Bf16> = true;
template <> inline constexpr bool kIsStoragePolicy<quant::F16> = true;
template <> inline constexpr bool kIsStoragePolicy<quant::F32> = true;
template <> inline constexpr bool kIsStoragePolicy<quant::Fp8Block> = true;
template <> inline constexpr bool kIsStoragePolicy<quant::Mxfp4> = true;
template <> inline constexpr StorageFormat kStorageFormatOf<quant::F16> = StorageFormat::kF16;
template <> inline constexpr StorageFormat kStorageFormatOf<quant::F32> = StorageFormat::kF32;
template <> inline constexpr StorageFormat kStorageFormatOf<quant::Fp8Block> = StorageFormat::kFp8Block;
template <> inline constexpr StorageFormat kStorageFormatOf<quant::Mxfp4> = StorageFormat::kMxfp4;

namespace detail::weights {
template <class P, class... Rest, class F>
decltype(auto) visit(StorageFormat f, F&& fn) {
  if constexpr (sizeof...(Rest) == 0) {
    if (f != kStorageFormatOf<P>) fail(ErrorCode::kInternal, "visit_policy: unknown storage format");
    return std::forward<F>(fn).template operator()<P>();
  } else {
    if (f == kStorageFormatOf<P>) return std::forward<F>(fn).template operator()<P>();
    return visit<Rest...>(f, std::forward<F>(fn));
  }
}
template <class... Ps, class F>
decltype(auto) visit_list(quant::PolicyList<Ps...>, StorageFormat f, F&& fn) {
  return visit<Ps...>(f, std::forward<F>(fn));
}
}  // namespace detail::weights

// Calls fn.template operator()<Policy>() for the policy of `f` (STYLE.md: one template lambda over the type list):
//   visit_policy(ref.format, [&]<class P>() { use(quant::MatrixView<P>{...}); });
// Every branch must return the same type.
template <class F>
decltype(auto) visit_policy(StorageFormat f, F&& fn) {
  return detail::weights::visit_list(StoragePolicies{}, f, std::forward<F>(fn));
}

struct WeightRef {
  std::string name;  // the plan's name (an alias found in the checkpoint is mapped to it)
  StorageFormat format = StorageFormat::kBf16;
  std::vector<std::int64_t> shape;  // logical
  std::int64_t rows = 0, cols = 0;  // matrices [out, in]; conv [P, K]; vectors rows = 1
  void const* data = nullptr;
  void const* scales = nullptr;     // nullptr if plain
  // Added beyond the brief's contract: what the plan says and what the bytes cost.
  model::TensorRole role = model::TensorRole::kMatrix;
  model::TensorGroup group = model::TensorGroup::kNorm;
  std::int64_t layer = -1;
  std::int64_t bytes = 0;           // stored bytes, data + scales
  std::string stored_name;          // name in the checkpoint (differs when an alias was found)

  template <quant::weight_policy P>
  quant::MatrixView<P> view() const {
    if (kStorageFormatOf<P> != format || !kIsStoragePolicy<P>)
      fail(ErrorCode::kInternal, name + ": stored as " + std::string(to_string(format)) + ", viewed as " + std::string(P::name));
    return {static_cast<typename P::storage_type const*>(data), static_cast<typename P::scale_type const*>(scales), rows, cols};
  }
};

class CheckpointWeights {
 public:
  static CheckpointWeights load(Checkpoint const& ckpt) {
    CheckpointWeights w;
    w.plan_ = model::plan_tensors(ckpt.config());
    std::string const dir = ckpt.dir().string();
    std::unordered_set<std::string> consumed;
    w.refs_.reserve(w.plan_.size());
    for (model::PlannedTensor const& t : w.plan_.tensors()) {
      TensorInfo const* ti = ckpt.find(t.name);
      for (std::size_t a = 0; !ti && a < t.aliases.size(); ++a) ti = ckpt.find(t.aliases[a]);
      if (!ti) {
        if (t.optional) continue;
        fail(ErrorCode::kMissingTensor, dir + ": tensor '" + t.name + "' " + shape_to_string(t.shape) +
                                            " is missing from the checkpoint");
      }
      consumed.insert(ti->name);
      TensorInfo const* scale = ckpt.find(ti->name + "_scale_inv");
      if (scale) consumed.insert(scale->name);
      w.refs_.push_back(bind(t, *ti, scale));
    }
    for (auto const& n : ckpt.names())
      if (!consumed.count(n))
        fail(ErrorCode::kUnexpectedTensor, dir + ": tensor '" + n + "' (" + ckpt.find(n)->file +
                                               ") is not one the model uses (config: " + ckpt.config().source + ")");
    for (std::size_t i = 0; i < w.refs_.size(); ++i) {
      w.index_.emplace(w.refs_[i].name, i);
      if (w.refs_[i].stored_name != w.refs_[i].name) w.index_.emplace(w.refs_[i].stored_name, i);
    }
    return w;
  }

  WeightRef const* find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    if (it != index_.end()) return &refs_[it->second];
    if (auto const* t = plan_.find(name)) {  // another alias of a bound tensor
      auto j = index_.find(t->name);
      if (j != index_.end()) return &refs_[j->second];
    }
    return nullptr;
  }
  WeightRef const& get(std::string_view name) const {
    if (auto const* r = find(name)) return *r;
    fail(ErrorCode::kMissingTensor, "weights: tensor '" + std::string(name) + "' is not loaded");
  }
  std::vector<WeightRef> const& weights() const noexcept { return refs_; }
  model::TensorPlan const& plan() const noexcept { return plan_; }

 private:
  static WeightRef bind(model::PlannedTensor const& t, TensorInfo const& ti, TensorInfo const* scale) {
    WeightRef r;
    r.name = t.name;
    r.stored_name = ti.name;
    r.shape = t.shape;
    r.role = t.role;
    r.group = t.group;
    r.layer = t.layer;
    r.data = ti.data;
    r.rows = t.is_matrix() || t.role == model::TensorRole::kConv ? t.shape[0] : 1;
    r.cols = t.is_matrix() ? t.shape[1] : t.role == model::TensorRole::kConv ? t.shape[2] : t.numel();
    std::string const what = ti.file + ": tensor '" + ti.name + "'";
    std::string const stored = std::string(dtype_name(ti.dtype)) + " " + shape_to_string(ti.shape);
    auto expect_scale = [&](DType dtype, std::vector<std::int64_t> const& shape) {
      if (!scale)
        fail(ErrorCode::kMissingTensor, what + " is " + std::string(dtype_name(ti.dtype)) + " but '" + ti.name +
                                            "_scale_inv' is missing");
      if (scale->dtype != dtype || !std::equal(scale->shape.begin(), scale->shape.end(), shape.begin(), shape.end()))
        fail(ErrorCode::kShape, scale->file + ": tensor '" + scale->name + "' is " + std::string(dtype_name(scale->dtype)) +
                                    " " + shape_to_string(scale->shape) + ", expected " + std::string(dtype_name(dtype)) +
                                    " " + shape_to_string(shape));
      r.scales = scale->data;
    };
    switch (ti.dtype) {
      case DType::kBF16: case DType::kF16: case DType::kF32:
        r.format = ti.dtype == DType::kBF16 ? StorageFormat::kBf16
                   : ti.dtype == DType::kF16 ? StorageFormat::kF16 : StorageFormat::kF32;
        if (scale)
          fail(ErrorCode::kShape, what + " is " + stored + " (plain) but has a scale sibling '" + scale->name + "'");
        if (!t.accepts_shape(ti.shape))
          fail(ErrorCode::kShape, what + " is " + stored + ", expected shape " + shape_to_string(t.shape));
        break;
      case DType::kF8E4M3: {
        r.format = StorageFormat::kFp8Block;
        if (!t.is_matrix()) fail(ErrorCode::kShape, what + " is " + stored + ": only matrices may be block FP8");
        if (!t.accepts_shape(ti.shape))
          fail(ErrorCode::kShape, what + " is " + stored + ", expected shape " + shape_to_string(t.shape));
        auto const B = quant::Fp8Block::kBlock;
        expect_scale(DType::kF32, {quant::ceil_div(t.shape[0], B), quant::ceil_div(t.shape[1], B)});
        break;
      }
      case DType::kI8: case DType::kU8: {
        r.format = StorageFormat::kMxfp4;
        if (!t.is_matrix()) fail(ErrorCode::kShape, what + " is " + stored + ": only matrices may be MXFP4");
        auto const B = quant::Mxfp4::kBlock;
        if (t.shape[1] % B != 0)
          fail(ErrorCode::kShape, what + " is " + stored + ": MXFP4 needs in = " + std::to_string(t.shape[1]) +
                                      " divisible by " + std::to_string(B));
        std::vector<std::int64_t> packed{t.shape[0], t.shape[1] / 2};
        if (ti.shape != packed)
          fail(ErrorCode::kShape, what + " is " + stored + ", expected MXFP4 [out, in/2] = " + shape_to_string(packed) +
                                      " for logical " + shape_to_string(t.shape));
        expect_scale(DType::kU8, {t.shape[0], t.shape[1] / B});
        break;
      }
      default:
        fail(ErrorCode::kShape, what + " has dtype " + std::string(dtype_name(ti.dtype)) +
                                    ", which is no storage format (BF16, F16, F32, F8_E4M3 + scale, I8/U8 + scale)");
    }
    r.bytes = std::int64_t(ti.size + (scale ? scale->size : 0));
    return r;
  }

  model::TensorPlan plan_;
  std::vector<WeightRef> refs_;
  std::unordered_map<std::string, std::size_t> index_;
};

}  // namespace ling::io
