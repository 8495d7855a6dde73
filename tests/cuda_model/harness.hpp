#pragma once
// Host wrappers around the CUDA model kernels for the doctest files (which g++ compiles): vectors in, vectors out.
// Each wrapper poisons its outputs (NaN) before the launch, so an unwritten element fails the comparison.
#include <cstdint>
#include <vector>

#include "ling/cuda/kda.hpp"
#include "ling/cuda/mla.hpp"
#include "ling/cuda/model_weights.hpp"

namespace ling::test_gpu {

bool device_ok();

std::vector<float> rms_norm(std::vector<float> const& x, std::vector<float> const& w, std::int64_t rows, float eps);

// A host matrix in a storage format: raw storage bytes and scale bytes as the policy lays them out.
struct HostMatrix {
  cuda::MatFormat format;
  std::int64_t rows = 0, cols = 0;
  std::vector<unsigned char> data, scales;
};
std::vector<float> embedding(HostMatrix const& table, std::vector<std::int32_t> const& tokens);

// prologue: 0 plain, 1 rms norm (norm_w [cols]), 2 gated head norm (norm_w [head], gate [cols]), 3 head scale (x already
// gated, head_ss required)
// head_ss (prologue 2 optional, 3 required): each head's Σ x² in ss_parts partials, as the KDA step writes them
// (KdaStepArgs::o_ss)
std::vector<float> matvec(HostMatrix const& m, std::vector<float> const& x, int prologue, std::vector<float> const& norm_w,
                          std::vector<float> const& gate, int head, float eps, std::vector<float> const* residual,
                          std::vector<float> const* head_ss = nullptr, int ss_parts = 0);

// KDA: runs T decode steps from a given state; returns o (raw Sᵀq) [T, P]; state and ring updated in place.
struct KdaHost {
  int heads, head_dim, conv_kernel;
  bool safe_gate;
  float lower_bound;
  std::vector<float> conv_w, a_log, dt_bias;  // [3P, kc], [H], [P]
  std::vector<float> state, ring;             // [H,K,V], [kc, 3P]
};
// o_ss (optional): the steps' partial Σ o² [T, H, ceil(head_dim / 16)] (KdaStepArgs::o_ss), poisoned before each step.
// out_gate [T, P] and out_norm_w [head_dim] (optional, both or neither): o then holds o ⊙ out_norm_w ⊙ sigmoid(gate)
// (KdaStepArgs::out_gate).
std::vector<float> kda_steps(KdaHost& k, std::int64_t start_pos, std::int64_t T, std::vector<float> const& xq,
                             std::vector<float> const& xk, std::vector<float> const& xv, std::vector<float> const& f,
                             std::vector<float> const& b, std::vector<float>* o_ss = nullptr,
                             std::vector<float> const* out_gate = nullptr, std::vector<float> const* out_norm_w = nullptr);

// MLA: cache rows [0, pos) given (bf16 bits), one decode at position pos; returns O [H·dv] (gated),
// the new cache row (as floats) and q̂ [H, r+dr]. model_args: as the model's replayed graph sets the one-launch chain
// (the RoPE table of mla_rope_table in MlaDecodeArgs::rope_cs, the position and rows read before the PDL wait).
struct MlaOut {
  std::vector<float> out, new_row, q_hat;
  bool cluster = false;  // kernel 8 asked and its cluster of blocks per head ran (mla_short_cluster_fits)
};
MlaOut mla_decode(cuda::MlaDims const& d, HostMatrix const& kv_b, std::vector<float> const& q,
                  std::vector<float> const& kv_a, std::vector<float> const& kv_norm,
                  std::vector<std::uint16_t> const& cache, std::int64_t pos, int splits, std::vector<float> const& gate,
                  int gate_mode, int kernel = 0, int min_chunk = 0, int combine = 0, bool model_args = false);

struct RouterOut {
  std::vector<int> idx;
  std::vector<float> w, logits;
};
// prologue (router and MoE): as matvec's, 1 (RMSNorm, the model's) by default
RouterOut router(HostMatrix const& w, std::vector<float> const& x, std::vector<float> const& norm_w, std::vector<float> const& bias,
                 int n_group, int topk_group, int top_k, bool norm_topk, float scaling, int prologue = 1);

// MoE: routed experts gate/up [I, hidden], down [hidden, I] (stacked on the device); shared[0..2] = gate, up, down or empty.
std::vector<float> moe(std::vector<HostMatrix> const& gate, std::vector<HostMatrix> const& up, std::vector<HostMatrix> const& down,
                       std::vector<HostMatrix> const& shared, std::vector<float> const& x, std::vector<float> const& norm_w,
                       std::vector<int> const& idx, std::vector<float> const& wts, float limit, float shared_limit,
                       std::vector<float> const& residual, int prologue = 1);

struct HeadOut {
  std::vector<float> logits;
  int argmax;
};
HeadOut head(HostMatrix const& w, std::vector<float> const& x, std::vector<float> const& norm_w);

}  // namespace ling::test_gpu
