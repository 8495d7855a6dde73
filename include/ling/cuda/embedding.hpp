#pragma once
// Embedding gather on the GPU: out[t, :] = dequantize(table[token_t, :]) in fp32. Launcher in embedding.cuh.
#include <cstdint>

#include "ling/cuda/model_weights.hpp"

namespace ling::cuda {
struct EmbeddingArgs {
  ModelMatrix table;               // [vocab, hidden], any MatFormat
  std::int32_t const* tokens = nullptr;  // [count] device; ids are checked on the host before they get here
  float* out = nullptr;            // [count, hidden]
  std::int64_t count = 0;
};
}  // namespace ling::cuda
