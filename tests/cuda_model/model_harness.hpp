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

// LING_PREDICT (read when the model is built: set it first): the predicted experts against the router's picks.
struct PredictCount {
  std::int64_t hits = 0, picks = 0;
};
// Ling-3.0-flash's widths cut to `layers` layers (as flash_random_steps): one step on `token`, then `steps` recording
// steps (CudaModel::predict_step).
PredictCount flash_predict_count(std::string const& config_json, int layers, std::uint64_t seed, std::int32_t token,
                                 int steps);
// A checkpoint: the prompt (CudaSession::prefill), then `steps` recording steps.
PredictCount checkpoint_predict_count(std::string const& dir, std::vector<std::int32_t> const& prompt, int steps);

// build_route_predictor (route_predict.cuh) against the host: a random BF16 router [rows, cols] and RMSNorm weights
// with zeros, the predictor in block FP8, BF16 and F32; returns the values that differ from the host's P bit for bit
// (block FP8: the tile scales and the E4M3 codes) over the three formats.
std::int64_t route_predictor_mismatches(std::int64_t rows, std::int64_t cols, std::uint64_t seed);

}  // namespace ling::test_gpu
