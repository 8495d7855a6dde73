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

// CudaModel::step_tokens against one step per token: `feed` one token at a time, then again from a reset in passes of
// two tokens with a single step after every second pass (so that passes start at even and odd positions). compared:
// logits compared; differing: those whose bits differ; nan: NaNs among the passes' logits.
struct TokensCompare {
  std::int64_t compared = 0, differing = 0, nan = 0;
};
// A checkpoint in `dir`, with the LM head online FP8 (`fp8_head`) or as stored, as a graph or eagerly.
TokensCompare step_tokens_checkpoint(std::string const& dir, std::vector<std::int32_t> const& feed, int mla_short,
                                     bool fp8_head, bool graph);
// Ling-3.0-flash's widths cut to `layers` layers (as flash_random_steps).
TokensCompare step_tokens_flash(std::string const& config_json, int layers, std::uint64_t seed,
                                std::vector<std::int32_t> const& feed, int mla_short);
// CudaModel::rewind(1) after a pass of two (a rejected draft): 10 tokens fed as single steps and passes, two passes
// with a wrong second token taken back; every logits row of the kept tokens against one step per token.
TokensCompare rewind_checkpoint(std::string const& dir, int mla_short);
// The MTP layer on the GPU (CudaModel::mtp_after) on the checkpoint in `dir` (BF16 head as stored): `feed` through one
// step per token, each followed by its position's MTP entry with the next token (single[i]: entry i's MTP logits,
// draft[i] its argmax); then from a reset through passes of two tokens, each followed by both its entries (passes[j]:
// the logits of the pass's last entry, entry 2j + 1). has_mtp: the model built its MTP layer.
struct MtpRun {
  bool has_mtp = false;
  std::vector<std::vector<float>> single, passes;
  std::vector<std::int32_t> draft;
};
MtpRun mtp_checkpoint(std::string const& dir, std::vector<std::int32_t> const& feed);
// The refusals of step_tokens on the checkpoint in `dir` (max_context 8): the ling::Error codes of too many tokens, an
// id outside the vocabulary, a pass past the context, and of rewind(1) after a single step, rewind(2) after a pass,
// rewind(1) twice; then whether the model still decodes (a step after them).
struct TokensRefusals {
  int too_many = -1, bad_id = -1, overflow = -1, rewind_single = -1, rewind_two = -1, rewind_twice = -1;
  bool still_decodes = false;
};
TokensRefusals step_tokens_refusals(std::string const& dir);

}  // namespace ling::test_gpu
