#pragma once
// The CUDA model for batch-1 decode (DESIGN.md decision 4): device weights (uploaded from a checkpoint as stored, or
// generated on the GPU from a seed in the -fp4 layout), device caches preallocated for the maximum context, and one
// decode step captured once as a CUDA graph and replayed per token. Plain C++ declarations; the class is in model.cuh.
#include <cstdint>
#include <string>

namespace ling::cuda {

struct CudaModelOptions {
  std::int64_t max_context = 4096;  // positions the caches hold (clamped to max_position_embeddings when that is set)
  bool lm_head_fp8 = true;          // online FP8-row LM head (else the head as stored, BF16)
  bool use_graph = true;            // capture the step once and replay it (false: launch eagerly, for debugging)
  // The router's rows computed inside MoE launch A (one launch fewer per MoE layer). It needs launch A's blocks (one
  // per SM) resident at once, which the launcher checks against the device's SM count; turn it off where the process
  // gets fewer SMs than the device has (MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, green contexts), else the step fails
  // with a launch error after seconds (the barrier is bounded; it never hangs).
  bool router_in_moe = true;
  // Steps at positions below this run each MLA layer's attention chain (q̂, attention, combine, W_UV) as one launch of
  // a block per head (mla.cuh mla_short_kernel: its kv_b rows requested before its PDL wait), in a graph of their own;
  // the others run the usual launches. At most 64 (kMlaShortMaxLen); 0: never. The default since session 39, which
  // measured it 0.01-0.02 ms per token faster at context 0 (docs/kernels.md "The MLA chain in one launch at short
  // contexts"); LING_MLA_SHORT=n overrides it.
  int mla_short = 64;
  // That launch with each head over a cluster of 4 blocks, each a quarter of the latent columns (mla.cuh
  // mla_short_cluster_kernel), where the shape fits (else a block per head). The default since session 40: 0.03 ms per
  // token faster at context 0 on an H100 (docs/kernels.md); LING_MLA_SHORT_CLUSTER=0|1 overrides it.
  bool mla_short_cluster = true;
};

// What one decode step reads and writes in device memory (spec §4), in bytes.
struct StepBytes {
  double weights = 0;            // every weight byte the step reads (routed experts: top-k of them)
  double state = 0;              // KDA state read + write, conv ring, scratch-free
  double cache_per_token = 0;    // MLA latent cache bytes read per token of context
  double at(std::int64_t context) const { return weights + state + cache_per_token * double(context + 1); }
};

}  // namespace ling::cuda
