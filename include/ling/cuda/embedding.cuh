#pragma once
// Embedding gather: one block per token; the id is read from device memory so a captured graph can replay it.
// An id outside [0, vocab) writes NaN (the host refuses such ids first; NaN makes a slip visible, never a wild read).
#include "ling/cuda/embedding.hpp"
#include "ling/cuda/model_ops.cuh"

namespace ling::cuda {

template <MatFormat F>
__global__ void __launch_bounds__(256) embedding_kernel(EmbeddingArgs a) {
  ops::pdl_trigger();
  ops::pdl_wait();
  std::int64_t const t = blockIdx.x;
  std::int64_t const id = a.tokens[t];
  float* out = a.out + t * a.table.cols;
  bool ok = id >= 0 && id < a.table.rows;
  for (std::int64_t c = threadIdx.x; c < a.table.cols; c += blockDim.x)
    out[c] = ok ? ops::Fmt<F>::at(a.table.data, a.table.scales, a.table.rows, a.table.cols, id, c) : __int_as_float(0x7FC00000);
}

inline void embedding(EmbeddingArgs const& a, cudaStream_t st = nullptr) {
  if (a.count <= 0) return;
  ops::dispatch_format(a.table.format, [&](auto f) {
    ops::launch(embedding_kernel<decltype(f)::value>, unsigned(a.count), 256, 0, st, a);
  });
  check_launch("embedding");
}

}  // namespace ling::cuda
