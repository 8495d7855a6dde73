#pragma once
// Host wrappers around CudaModel (model.cuh, nvcc only) for test_model.cpp, which the host compiler builds.
#include <cstdint>
#include <string>
#include <vector>

namespace ling::test_gpu {

// What flash_random_steps returns: each step's logits and greedy pick.
struct FlashSteps {
  std::vector<std::vector<float>> logits;
  std::vector<std::int32_t> picks;
};

// Ling-3.0-flash's widths (config_json: tests/data/ling3-flash-config) cut to `layers` layers, random weights on the
// GPU from `seed`: `steps` decode steps from position 0, the first on `token`, step s > 0 on feed[s - 1] when feed is
// given, else on the previous step's greedy pick. graph, mla_short: CudaModelOptions::use_graph and ::mla_short.
FlashSteps flash_random_steps(std::string const& config_json, int layers, std::uint64_t seed, bool graph, int mla_short,
                              int steps, std::int32_t token, std::vector<std::int32_t> const* feed = nullptr);

}  // namespace ling::test_gpu
