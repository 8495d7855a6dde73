#pragma once
// Composition (spec §2): a decoder layer is DecoderLayer<Mixer, Ffn>:
//   h = x + Mixer(RMSNorm(x; input_layernorm)),  y = h + Ffn(RMSNorm(h; post_attention_layernorm)).
// OneOf<A, B, ...> is a layer that is one of several at run time (a hybrid model's layer i is KDA or MLA, dense
// or MoE, as config.json says); it has the same vocabulary as its alternatives.
#include <cstdint>
#include <type_traits>
#include <variant>

#include "ling/core/error.hpp"
#include "ling/core/extents.hpp"
#include "ling/layers/rms_norm.hpp"

namespace ling::layers {

// A layer's State, or std::monostate when the layer keeps none.
template <class L>
struct StateOf {
  using type = std::monostate;
};
template <class L>
  requires requires { typename L::State; }
struct StateOf<L> {
  using type = typename L::State;
};
template <class L>
using state_of = typename StateOf<L>::type;

template <class... Ls>
struct OneOf {
  using State = std::variant<state_of<Ls>...>;
  std::variant<Ls...> layer;

  template <class L>
  bool is() const { return std::holds_alternative<L>(layer); }
  template <class L>
  L& as() { return std::get<L>(layer); }
  template <class L>
  L const& as() const { return std::get<L>(layer); }
  // The State that matches the alternative held (zeroed / empty).
  State make_state() const {
    return std::visit(
        [](auto const& l) -> State {
          using L = std::decay_t<decltype(l)>;
          if constexpr (requires { L::make_state(l.config); }) return State(std::in_place_type<state_of<L>>, L::make_state(l.config));
          else return State(std::in_place_type<state_of<L>>);
        },
        layer);
  }
  std::int64_t state_bytes() const {
    return std::visit([](auto const& l) -> std::int64_t { return std::decay_t<decltype(l)>::state_bytes(l.config); }, layer);
  }
};

template <class L>
state_of<L> make_state_for(L const& l) {
  if constexpr (requires { l.make_state(); }) return l.make_state();
  else if constexpr (requires { L::make_state(l.config); }) return L::make_state(l.config);
  else return state_of<L>{};
}

template <class Mixer, class Ffn, std::int64_t kHidden = dynamic>
struct DecoderLayer {
  using State = state_of<Mixer>;
  RmsNorm<kHidden> input_norm, post_norm;
  Mixer mixer;
  Ffn ffn;

  State make_state() const { return make_state_for(mixer); }
  // Cache bytes (a KDA layer's whole state; an MLA layer's per token of context).
  std::int64_t state_bytes() const {
    if constexpr (requires { mixer.state_bytes(); }) return mixer.state_bytes();
    else return Mixer::state_bytes(mixer.config);
  }
  Status can_implement() const {
    if (input_norm.config.dim() != post_norm.config.dim())
      return {ErrorCode::kConfig, "DecoderLayer: the two norms disagree on hidden_size"};
    if (auto s = RmsNorm<kHidden>::can_implement(input_norm.config); !s) return s;
    return Status::ok();
  }
};

}  // namespace ling::layers
