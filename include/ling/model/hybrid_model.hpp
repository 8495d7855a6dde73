#pragma once
// HybridModel<Spec, Policies>: the model as a type (DESIGN.md decision 1, spec §2), composed from the layer
// templates, never by inheritance:
//   Layer = DecoderLayer< OneOf<KdaMixer, GatedMla>, OneOf<SwiGlu (dense), Moe> >   × num_hidden_layers
//   Mtp   = MtpLayer< DecoderLayer<GatedMla, Moe> >                                  (optional)
// Every dimension comes from Spec (static or ling::dynamic); every weight is a Linear over `Policies`.
// load() binds the tensors of a checkpoint (views into its mapped files, no copies of matrices).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ling/core/error.hpp"
#include "ling/io/model_config.hpp"
#include "ling/io/weights.hpp"
#include "ling/layers/decoder_layer.hpp"
#include "ling/layers/gated_mla.hpp"
#include "ling/layers/kda_mixer.hpp"
#include "ling/layers/linear.hpp"
#include "ling/layers/mlp.hpp"
#include "ling/layers/moe.hpp"
#include "ling/layers/mtp.hpp"
#include "ling/layers/rms_norm.hpp"
#include "ling/model/spec.hpp"
#include "ling/quant/policies.hpp"

namespace ling::model {

template <class Spec, class Policies = quant::DefaultPolicies>
class HybridModel {
 public:
  using spec_type = Spec;
  using policies = Policies;
  static constexpr std::int64_t kHidden = Spec::hidden_size;
  using Linear = layers::Linear<Policies>;
  using Norm = layers::RmsNorm<kHidden>;
  using Kda = layers::KdaMixer<kHidden, Spec::num_attention_heads, Spec::head_dim, Policies>;
  using Mla = layers::GatedMla<kHidden, Spec::mla_num_heads, Spec::kv_lora_rank, Spec::qk_nope_head_dim,
                               Spec::qk_rope_head_dim, Spec::v_head_dim, Policies>;
  using DenseMlp = layers::SwiGlu<kHidden, Spec::intermediate_size, Policies>;
  using Moe = layers::Moe<kHidden, Spec::num_experts, Spec::moe_intermediate_size, Spec::shared_width, Policies>;
  using Mixer = layers::OneOf<Kda, Mla>;
  using Ffn = layers::OneOf<DenseMlp, Moe>;
  using Layer = layers::DecoderLayer<Mixer, Ffn, kHidden>;
  using Mtp = layers::MtpLayer<layers::DecoderLayer<Mla, Moe, kHidden>, Policies, kHidden>;

  // Every cache of one token stream: per layer (KDA state + conv windows, or the MLA latent cache) and the MTP
  // layer's own latent cache. Copying a State is a snapshot.
  struct State {
    std::vector<typename Layer::State> layers;
    std::optional<typename Mtp::State> mtp;
    std::int64_t position = 0;  // tokens the main stream has seen
  };

  ModelConfig config;
  Dims<Spec> dims;
  Linear embedding;  // [vocab, hidden], rows looked up
  Linear lm_head;    // [vocab, hidden] (the embedding when tied)
  Norm final_norm;
  std::vector<Layer> layers;
  std::optional<Mtp> mtp;

  std::int64_t vocab_size() const { return dims.vocab(); }
  std::int64_t hidden_size() const { return dims.hidden(); }
  bool has_mtp() const { return mtp.has_value(); }

  State make_state() const {
    State s;
    s.layers.reserve(layers.size());
    for (auto const& l : layers) s.layers.push_back(l.make_state());
    if (mtp) s.mtp = mtp->make_state();
    return s;
  }
  // Bytes of cache: the fixed part (KDA states) and the part per token of context (MLA latents, incl. MTP's).
  std::int64_t fixed_state_bytes() const {
    std::int64_t b = 0;
    for (auto const& l : layers)
      if (l.mixer.template is<Kda>()) b += l.mixer.state_bytes();
    return b;
  }
  std::int64_t state_bytes_per_token() const {
    std::int64_t b = 0;
    for (auto const& l : layers)
      if (l.mixer.template is<Mla>()) b += l.mixer.state_bytes();
    if (mtp) b += Mla::state_bytes(mtp->block.mixer.config);
    return b;
  }

  static HybridModel load(io::CheckpointWeights const& w, ModelConfig const& c) {
    HybridModel m;
    m.config = c;
    m.dims = Dims<Spec>::bind(c);
    Loader ld{w, c, m.dims};
    bool const kimi = c.family == Family::kKimiLinear;
    m.embedding = ld.linear(kimi ? "model.embed_tokens.weight" : "model.word_embeddings.weight");
    m.lm_head = c.tie_word_embeddings ? m.embedding : ld.linear("lm_head.weight");
    m.final_norm = ld.norm("model.norm.weight");
    for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) m.layers.push_back(ld.layer(i));
    if (c.num_nextn_predict_layers > 1)
      fail(ErrorCode::kUnsupported, c.source + ": num_nextn_predict_layers = " +
                                        std::to_string(c.num_nextn_predict_layers) + " (this library runs at most 1)");
    if (c.num_nextn_predict_layers == 1) m.mtp = ld.mtp(c.num_hidden_layers);
    return m;
  }

 private:
  struct Loader {
    io::CheckpointWeights const& w;
    ModelConfig const& c;
    Dims<Spec> const& d;

    bool kimi() const { return c.family == Family::kKimiLinear; }
    std::string prefix(std::int64_t i) const { return "model.layers." + std::to_string(i) + "."; }

    Linear linear(std::string const& name) const {
      io::WeightRef const& r = w.get(name);
      return io::visit_policy(r.format, [&]<class P>() -> Linear {
        if constexpr (layers::list_contains<Policies, P>) return Linear::view(r.template view<P>());
        else
          fail(ErrorCode::kUnsupported, r.stored_name + ": stored as " + std::string(P::name) +
                                            ", which this model type's policy list does not accept");
      });
    }
    // Any stored format, decoded to floats in row-major order (norms, conv kernels, A_log, dt_bias, biases).
    std::vector<float> floats(std::string const& name) const {
      io::WeightRef const& r = w.get(name);
      return io::visit_policy(r.format, [&]<class P>() -> std::vector<float> {
        auto v = r.template view<P>();
        std::vector<float> out(std::size_t(r.rows * r.cols));
        for (std::int64_t i = 0; i < r.rows; ++i)
          for (std::int64_t j = 0; j < r.cols; ++j) out[std::size_t(i * r.cols + j)] = v.at(i, j);
        return out;
      });
    }
    Norm norm(std::string const& name) const {
      Norm n;
      n.config.dim = d.hidden;
      n.config.eps = float(c.rms_norm_eps);
      n.weights.weight = floats(name);
      return n;
    }

    Kda kda(std::string const& a) const {
      Kda l;
      auto& k = l.config;
      k.hidden = d.hidden;
      k.heads = d.kda_heads;
      k.head_dim = d.head_dim;
      k.conv_kernel = d.conv_kernel();
      k.low_rank_fg = !c.no_kda_lora;
      k.safe_gate = c.kda_safe_gate;
      k.lower_bound = float(c.kda_lower_bound);
      k.eps = float(c.rms_norm_eps);
      Kda::can_implement(k).throw_if_error();
      auto& x = l.weights;
      x.q_proj = linear(a + "q_proj.weight");
      x.k_proj = linear(a + "k_proj.weight");
      x.v_proj = linear(a + "v_proj.weight");
      if (k.low_rank_fg) {
        x.f_a_proj = linear(a + "f_a_proj.weight");
        x.f_b_proj = linear(a + "f_b_proj.weight");
        x.g_a_proj = linear(a + "g_a_proj.weight");
        x.g_b_proj = linear(a + "g_b_proj.weight");
      } else {
        x.f_proj = linear(a + "f_proj.weight");
        x.g_proj = linear(a + "g_proj.weight");
      }
      x.b_proj = linear(a + "b_proj.weight");
      x.q_conv = floats(a + "q_conv1d.weight");
      x.k_conv = floats(a + "k_conv1d.weight");
      x.v_conv = floats(a + "v_conv1d.weight");
      x.a_log = floats(a + "A_log");
      x.dt_bias = floats(a + "dt_bias");
      x.o_norm = floats(a + "o_norm.weight");
      x.o_proj = linear(a + "o_proj.weight");
      return l;
    }
    Mla mla(std::string const& a) const {
      Mla l;
      auto& k = l.config;
      k.hidden = d.hidden;
      k.heads = d.mla_heads;
      k.kv_rank = d.kv_rank;
      k.nope_dim = d.nope_dim;
      k.rope_dim = d.rope_dim;
      k.value_dim = d.value_dim;
      k.q_lora_rank = d.q_lora_rank();
      k.use_rope = c.mla_use_rope;
      k.rope_theta = c.rope_theta;
      k.gate = c.output_gate;
      k.eps = float(c.rms_norm_eps);
      Mla::can_implement(k).throw_if_error();
      auto& x = l.weights;
      if (k.q_lora_rank > 0) {
        x.q_a_proj = linear(a + "q_a_proj.weight");
        x.q_a_norm = floats(a + "q_a_layernorm.weight");
        x.q_b_proj = linear(a + "q_b_proj.weight");
      } else {
        x.q_proj = linear(a + "q_proj.weight");
      }
      x.kv_a_proj = linear(a + "kv_a_proj_with_mqa.weight");
      x.kv_a_norm = floats(a + "kv_a_layernorm.weight");
      x.kv_b_proj = linear(a + "kv_b_proj.weight");
      if (k.gate != OutputGate::kNone) x.g_proj = linear(a + "g_proj.weight");
      x.o_proj = linear(a + (kimi() ? "o_proj.weight" : "dense.weight"));
      return l;
    }
    template <class L>
    L swiglu(std::string const& a, char const* gate, char const* up, char const* down, typename L::Config cfg) const {
      L::can_implement(cfg).throw_if_error();
      L l;
      l.config = cfg;
      l.weights.gate = linear(a + gate);
      l.weights.up = linear(a + up);
      l.weights.down = linear(a + down);
      L::check(l.config, l.weights).throw_if_error();
      return l;
    }
    DenseMlp dense(std::string const& a) const {
      typename DenseMlp::Config cfg{d.hidden, d.intermediate, 0.f};
      return swiglu<DenseMlp>(a, "gate_proj.weight", "up_proj.weight", "down_proj.weight", cfg);
    }
    Moe moe(std::string const& a, std::int64_t layer) const {
      Moe l;
      auto& k = l.config;
      k.router.hidden = d.hidden;
      k.router.experts = d.experts;
      k.router.top_k = d.top_k();
      k.router.n_group = d.n_group();
      k.router.topk_group = d.topk_group();
      k.router.norm_topk_prob = c.norm_topk_prob;
      k.router.routed_scaling_factor = float(c.routed_scaling_factor);
      k.expert = {d.hidden, d.expert_width, float(c.expert_limit(layer))};
      k.shared = {d.hidden, d.shared_width, float(c.shared_limit(layer))};
      Moe::can_implement(k).throw_if_error();
      l.weights.router.gate = linear(a + "gate.weight");
      l.weights.router.expert_bias = floats(a + (kimi() ? "gate.e_score_correction_bias" : "gate.expert_bias"));
      for (std::int64_t e = 0; e < d.experts(); ++e) {
        std::string x = a + "experts." + std::to_string(e) + ".";
        if (kimi())
          l.weights.experts.push_back(swiglu<typename Moe::Expert>(x, "w1.weight", "w3.weight", "w2.weight", k.expert).weights);
        else
          l.weights.experts.push_back(
              swiglu<typename Moe::Expert>(x, "gate_proj.weight", "up_proj.weight", "down_proj.weight", k.expert).weights);
      }
      if (d.shared_width() > 0)
        l.weights.shared = swiglu<typename Moe::Shared>(a + "shared_experts.", "gate_proj.weight", "up_proj.weight",
                                                        "down_proj.weight", k.shared).weights;
      return l;
    }
    std::string attn(std::int64_t i) const { return prefix(i) + (kimi() ? "self_attn." : "attention."); }
    std::string ffn(std::int64_t i) const { return prefix(i) + (kimi() ? "block_sparse_moe." : "mlp."); }

    Layer layer(std::int64_t i) const {
      Layer l;
      l.input_norm = norm(prefix(i) + "input_layernorm.weight");
      l.post_norm = norm(prefix(i) + "post_attention_layernorm.weight");
      if (c.is_mla_layer(i)) l.mixer.layer = mla(attn(i));
      else l.mixer.layer = kda(attn(i));
      if (c.is_moe_layer(i)) l.ffn.layer = moe(ffn(i), i);
      else l.ffn.layer = dense(ffn(i));
      return l;
    }
    Mtp mtp(std::int64_t i) const {
      Mtp m;
      m.enorm = norm(prefix(i) + "enorm.weight");
      m.hnorm = norm(prefix(i) + "hnorm.weight");
      m.eh_proj = linear(prefix(i) + "eh_proj.weight");
      m.final_norm = norm(prefix(i) + "final_layernorm.weight");
      m.block.input_norm = norm(prefix(i) + "input_layernorm.weight");
      m.block.post_norm = norm(prefix(i) + "post_attention_layernorm.weight");
      m.block.mixer = mla(attn(i));
      m.block.ffn = moe(ffn(i), i);
      return m;
    }
  };
};

}  // namespace ling::model
