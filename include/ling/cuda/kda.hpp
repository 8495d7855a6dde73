#pragma once
// The fused KDA decode step on the GPU (spec §2 "KDA mixer"), one launch per layer after the projections:
// conv window update + SiLU, q/k l2norm (q · K^-1/2), gate, β, delta-rule update of the fp32 state, o = Sᵀq.
// The gated RMSNorm of o (o_norm ⊙ sigmoid(W_g u)) is completed by the o_proj matvec's input prologue, which needs
// the whole head (the step splits a head's V columns over blocks; KdaStepArgs::out_gate). Launcher in kda.cuh.
//
// Device layouts: state S [H, K, V] fp32 (as cpu::KdaState::s). The conv history is a ring of conv_kernel slots
// [conv_kernel, 3P] (q channels, then k, then v): slot (t mod conv_kernel) holds the raw input a(t); a zero ring is a
// fresh stream. (cpu::KdaState keeps [conv_kernel-1, P] per q/k/v, oldest first: kda_ring_from_windows converts.)
#include <cstdint>
#include <vector>

namespace ling::cuda {

inline constexpr int kKdaSsCols = 16;  // columns per partial Σ o² (KdaStepArgs::o_ss)
inline constexpr int kda_ss_parts(int head_dim) { return (head_dim + kKdaSsCols - 1) / kKdaSsCols; }

// A byte range for the KDA step's look-ahead (KdaStepArgs::ahead): 16-byte aligned, a multiple of 16 bytes.
struct AheadRange {
  void const* p = nullptr;
  std::uint64_t bytes = 0;
};

// The look-ahead's predicted experts (a probe: CudaModel's LING_PREDICT). The look-ahead blocks select top_k experts
// from `logits` (the layer's router folded onto its attention input, computed by the projections launch:
// route_predict.cuh) with the router's grouped selection, then request those experts' gate and up rows (and their
// down rows when `down`) into L2. The MoE launches read whatever the router really picks, so a wrong guess costs
// bandwidth, never a value.
struct KdaPredict {
  float const* logits = nullptr;  // [experts], written by the launch before the step (null: no prediction)
  float const* bias = nullptr;    // [experts] the selection bias (expert_bias), or null
  int experts = 0, top_k = 0, n_group = 1, topk_group = 1;
  // expert e's gate rows at g_w + e · gu_sw bytes, their scales at g_s + e · gu_ss (null or 0: none); up, down alike
  void const *g_w = nullptr, *g_s = nullptr, *u_w = nullptr, *u_s = nullptr, *d_w = nullptr, *d_s = nullptr;
  std::int64_t gu_sw = 0, gu_ss = 0, d_sw = 0, d_ss = 0;
  bool down = false;
  int* record = nullptr;  // [top_k]: the predicted picks, in order (measurements: the hit rate), or null
};

struct KdaStepArgs {
  int heads = 0, head_dim = 0, conv_kernel = 4;
  bool safe_gate = true;
  float lower_bound = -5.0f;
  float const* x_q = nullptr;  // [P] projection outputs (before conv)
  float const* x_k = nullptr;
  float const* x_v = nullptr;
  float const* f = nullptr;    // [P]
  float const* b = nullptr;    // [H]
  float const* conv_w = nullptr;  // [3P, conv_kernel] fp32: q rows, k rows, v rows
  float const* a_log = nullptr;   // [H]
  float const* dt_bias = nullptr; // [P]
  float* ring = nullptr;          // [conv_kernel, 3P]
  float* state = nullptr;         // [H, K, V]
  // Optional: the new state written here as well ([H, K, V]; CudaModel::step_tokens keeps the state after a pass's
  // first token there, for a rewind)
  float* state_copy = nullptr;
  float* o = nullptr;             // [P] o = Sᵀq per head (before the gated norm)
  // [H, ceil(head_dim / kKdaSsCols)] or null: Σ o² over each head's columns [16 s, 16 s + 16), for the gated head norm
  // of the next launch (o_proj's prologue reads these partials instead of reducing the head itself)
  float* o_ss = nullptr;
  // Both set: o holds o ⊙ out_norm_w ⊙ sigmoid(out_gate) (per head, out_norm_w [head_dim], out_gate [P]): the gated
  // head norm's element-wise factors, applied once here instead of by every block of o_proj, which then scales each
  // head from o_ss (PrologueKind::kHeadScale; o_ss stays the Σ of the raw o²). The same products in the same order as
  // o_proj's kGatedHeadNorm staging, so o_proj's input has the same bits either way.
  float const* out_gate = nullptr;
  float const* out_norm_w = nullptr;
  std::int32_t const* position = nullptr;  // device: the token's position t
  // true: the fast kernel loads the state, the conv ring and the position before its PDL wait, while the launch in
  // front of it still runs. Only for a caller that guarantees no launch this one may overlap writes them (the model's
  // decode graph: the previous step of this layer is in an earlier graph launch, which completes before this one
  // starts). Consecutive steps launched back to back on one stream must leave it false.
  bool state_before_wait = false;
  unsigned long long* trace = nullptr;     // step timeline region (measurements), or null
  // Look-ahead (a probe: CudaModel's LING_AHEAD; measured slower in session 42, docs/kernels.md): n_ahead ranges (a
  // device array) that ahead_cols extra columns of blocks request into L2 by bulk prefetches, in pieces of 64 KB (or
  // by line prefetches, ahead_lines), after their PDL wait (ahead_before_wait: without waiting), so that later
  // launches of the layer (MoE launch A, B) find those weights in L2. The step's own blocks are unchanged, and a
  // prefetch changes no value. Fast kernel only; n_ahead 0 and no prediction: the usual grid.
  AheadRange const* ahead = nullptr;
  int n_ahead = 0;
  bool ahead_before_wait = false;
  // true: the look-ahead requests go out as one prefetch.global.L2 per 128-byte line instead of 64 KB bulk prefetches
  // (a bulk prefetch keeps its block, and so the launch, alive until its bytes have landed; measured in session 42)
  bool ahead_lines = false;
  int ahead_cols = 1;  // columns of look-ahead blocks (head_dim / 16 blocks each), sharing the requests
  // predict.logits set: the look-ahead blocks also run the prediction (after their PDL wait, after the ranges).
  KdaPredict predict;
};

// Host-side conversion between the CPU windows (oldest first, `pos` tokens seen) and the device ring.
inline std::vector<float> kda_ring_from_windows(std::int64_t p, int conv_kernel, std::int64_t pos, float const* wq,
                                                float const* wk, float const* wv) {
  std::vector<float> ring(std::size_t(conv_kernel) * std::size_t(3 * p), 0.f);
  int const hist = conv_kernel - 1;
  for (int j = 0; j < hist; ++j) {  // window row j holds a(pos - hist + j)
    std::int64_t t = pos - hist + j;
    if (t < 0) continue;
    std::int64_t slot = t % conv_kernel;
    float const* src[3] = {wq, wk, wv};
    for (int n = 0; n < 3; ++n)
      for (std::int64_t c = 0; c < p; ++c) ring[std::size_t(slot * 3 * p + n * p + c)] = src[n][j * p + c];
  }
  return ring;
}

}  // namespace ling::cuda
