// The CUDA session's definitions for test_cuda_model (session.cuh is included by exactly one .cu of a program).
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ling/cuda/model.cuh"
#include "ling/cuda/session.cuh"
#include "model_harness.hpp"

namespace ling::test_gpu {

FlashSteps flash_random_steps(std::string const& config_json, int layers, std::uint64_t seed, bool graph, int mla_short,
                              int steps, std::int32_t token, std::vector<std::int32_t> const* feed) {
  std::ifstream f(config_json);
  require(bool(f), ErrorCode::kIo, config_json + ": cannot open");
  nlohmann::json j = nlohmann::json::parse(f);
  j["num_hidden_layers"] = layers;
  for (char const* k : {"expert_swiglu_limit_list", "share_expert_swiglu_limit_list"})
    if (j.contains(k) && j[k].is_array() && int(j[k].size()) > layers) j[k].erase(j[k].begin() + layers, j[k].end());
  ModelConfig const c = ModelConfig::from_json(j, config_json + " (cut to " + std::to_string(layers) + " layers)");
  cuda::CudaModelOptions o;
  o.max_context = 64;
  o.use_graph = graph;
  o.mla_short = mla_short;
  auto m = cuda::CudaModel::random(c, seed, o);
  FlashSteps out;
  std::vector<float> host(static_cast<std::size_t>(c.vocab_size));
  std::int32_t t = token;
  for (int s = 0; s < steps; ++s) {
    if (s > 0) t = feed ? (*feed)[static_cast<std::size_t>(s - 1)] : out.picks.back();
    m->step(t);
    m->download_logits(host.data());
    out.logits.push_back(host);
    out.picks.push_back(std::int32_t(std::max_element(host.begin(), host.end()) - host.begin()));
  }
  return out;
}

}  // namespace ling::test_gpu
