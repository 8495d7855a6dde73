#pragma once
// The caches of one token stream, as the runtime keeps them: a model's State (per layer: KDA S + conv windows,
// or the MLA latent cache; the MTP layer's own latent cache) and the MTP stream's position. A CacheSnapshot is a
// full copy; restore() puts it back (spec §2: KDA state cannot be rewound, so speculation keeps copies).
#include <any>
#include <cstdint>
#include <utility>

#include "ling/core/error.hpp"

namespace ling::runtime {

class CacheSnapshot {
 public:
  CacheSnapshot() = default;
  template <class State>
  CacheSnapshot(void const* owner, State state) : owner_(owner), state_(std::move(state)) {}
  bool empty() const noexcept { return !state_.has_value(); }

  template <class State>
  State const& get(void const* owner) const {
    if (owner != owner_) fail(ErrorCode::kInvalidArgument, "restore: the snapshot was taken from another session");
    auto const* s = std::any_cast<State>(&state_);
    if (!s) fail(ErrorCode::kInvalidArgument, "restore: the snapshot holds another model type's caches");
    return *s;
  }

 private:
  void const* owner_ = nullptr;
  std::any state_;
};

}  // namespace ling::runtime
