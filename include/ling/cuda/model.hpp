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
  // The router's logits split over the launch before the MoE (o_proj, or the MLA dense): each of its blocks adds its
  // rows' share of Σ_i W_r[e, i] g_i h_i in 64-bit fixed point, and MoE launch A only scales the sums by its own
  // 1 / rms(h), so no router rows and no grid barrier stand before the selection (linear.hpp RouteSplit). Takes the
  // layers whose attention output runs the one-row block-FP8 kernel (4096 columns) with a BF16 router of at most 512
  // experts, when at least two layers qualify; the others keep router_in_moe. Holds a transposed copy of each such
  // router (2 bytes per hidden size × experts). The sums are zeroed by the step itself, so a step that throws midway
  // (a launch refused) can leave some behind, as it leaves the caches half-updated: reset() zeroes both. Off: measured
  // slower on the H200 (2.326 against 2.249 ms/token: o_proj's atomics cost more than launch A gains; docs/kernels.md).
  // LING_ROUTER_OPROJ=1 / 0 overrides it.
  bool router_in_oproj = false;
  // With router_in_oproj: MoE launch A awaits a flag that the split's blocks raise after their sums (a release add
  // each, one acquire poll per block of launch A) instead of PDL's wait for the whole launch before, which the step
  // timeline puts 1.1-2.3 µs after that launch's last block (linear.hpp RouteSplit::done); launch B awaits launch A's
  // flag the same way. Off: measured slower (PDL's wait is the faster handoff); LING_ROUTE_FLAG=1 / 0 overrides it.
  bool router_flag = false;
};

// What one decode step reads and writes in device memory (spec §4), in bytes.
struct StepBytes {
  double weights = 0;            // every weight byte the step reads (routed experts: top-k of them)
  double state = 0;              // KDA state read + write, conv ring, scratch-free
  double cache_per_token = 0;    // MLA latent cache bytes read per token of context
  double at(std::int64_t context) const { return weights + state + cache_per_token * double(context + 1); }
};

}  // namespace ling::cuda
