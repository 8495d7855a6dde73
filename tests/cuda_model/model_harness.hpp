#pragma once
// Host wrappers around CudaModel (model.cuh, nvcc only) for test_model.cpp, which the host compiler builds.
#include <cstdint>
#include <string>
#include <vector>

namespace ling::test_gpu {

// What flash_random_steps returns: how many layers split the router's logits over their attention output
// (CudaModelOptions::router_in_oproj), each step's logits and greedy pick.
struct FlashSteps {
  int split_layers = 0;
  bool flag = false;  // launch A awaited the split's flag (CudaModelOptions::router_flag)
  std::vector<std::vector<float>> logits;
  std::vector<std::int32_t> picks;
};

// How flash_random_steps runs: CudaModelOptions::router_in_oproj and ::router_flag, graph replay (else eager
// launches), and the routed experts' count (0: the config's 512; else a multiple of the config's 8 groups).
struct FlashRun {
  bool router_in_oproj = false;
  bool router_flag = false;
  bool graph = true;
  int experts = 0;
};

// Ling-3.0-flash's widths (config_json: tests/data/ling3-flash-config) cut to `layers` layers, random weights on the
// GPU from `seed`: `steps` decode steps, the first on `token`, step s > 0 on feed[s - 1] when feed is given, else on
// the previous step's greedy pick.
FlashSteps flash_random_steps(std::string const& config_json, int layers, std::uint64_t seed, FlashRun const& run,
                              int steps, std::int32_t token, std::vector<std::int32_t> const* feed = nullptr);

}  // namespace ling::test_gpu
