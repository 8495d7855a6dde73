#pragma once
// MTP (NEXTN) layer (spec §2, DeepSeek-V3 style), stored at layer index num_hidden_layers:
//   x = W_eh [RMSNorm(emb(t_{j+1}); enorm) ; RMSNorm(h_j; hnorm)]
//   x = DecoderLayer<Mla, Moe>(x) at position j (its own MLA cache over the MTP stream)
//   logits = lm_head(RMSNorm(x; final_layernorm))   (embedding and head shared with the main model)
#include <cstdint>

#include "ling/layers/decoder_layer.hpp"
#include "ling/layers/linear.hpp"
#include "ling/layers/rms_norm.hpp"

namespace ling::layers {

template <class Block, class Policies, std::int64_t kHidden = dynamic>
struct MtpLayer {
  using State = typename Block::State;
  RmsNorm<kHidden> enorm, hnorm;
  Linear<Policies> eh_proj;  // [hidden, 2·hidden], input order [emb ; h]
  Block block;
  RmsNorm<kHidden> final_norm;

  State make_state() const { return block.make_state(); }
  std::int64_t state_bytes() const { return block.state_bytes(); }  // per token of the MTP stream
};

}  // namespace ling::layers
