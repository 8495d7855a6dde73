#pragma once
// LM head (spec §2 "Logits", §4): the online FP8 head (quant::Fp8Row semantics: scale = amax/448 per row, made on
// the GPU at load from the BF16 matrix, halving the bytes per token) or the BF16 one; logits = W x and, for greedy
// decode, the argmax on the device (ties to the lower id) in the same launch. Kernels in lm_head.cuh.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ling/cuda/linear.hpp"
#include "ling/cuda/runtime.hpp"

namespace ling::cuda {

// Quantizes a device BF16 (or F16/F32) matrix into FP8-row on the GPU; bit-identical to quant::Fp8Row::quantize.
template <quant::weight_policy Src>
DeviceMatrix<quant::Fp8Row> quantize_fp8_rows(DeviceMatrix<Src> const& src, cudaStream_t stream);

// Scratch of the fused argmax: a 64-bit best key and a block counter, both re-zeroed by each launch.
class ArgmaxWorkspace {
 public:
  ArgmaxWorkspace() : buf_(256, "argmax workspace") { check(cudaMemset(buf_.data(), 0, 256), "argmax workspace: memset"); }
  unsigned long long* key() const { return buf_.data<unsigned long long>(); }
  unsigned int* counter() const { return reinterpret_cast<unsigned int*>(buf_.data<char>() + 64); }

 private:
  DeviceBuffer buf_;
};

// logits[V] = W x (fp32); argmax (optional: null, or with its workspace) receives the id of the largest logit.
template <quant::weight_policy P>
cudaError_t launch_lm_head(DeviceMatrix<P> const& w, float const* x, float* logits, int* argmax,
                           ArgmaxWorkspace const* ws, cudaStream_t stream);

}  // namespace ling::cuda
