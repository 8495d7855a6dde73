#pragma once
// A CUDA session with the CPU session's interface (runtime::LogitSession): prefill(tokens) -> last logits,
// decode(token) -> logits, reset(), position(), vocab_size(). Plain C++ (pimpl): the definitions are in
// session.cuh, which exactly one .cu file of a program includes (in the `ling` CLI: examples/ling/cmd_bench.cu).
//
// Prefill is correct for any length but simple: it replays the decode pass over two prompt tokens at a time
// (CudaModel::step_tokens: the matvecs read each weight once for both; KDA strictly sequential, MLA filling the latent
// cache), downloading logits only for the last token. Its logits are the bits of one decode step per token.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "ling/cuda/model.hpp"
#include "ling/cuda/runtime.hpp"
#include "ling/runtime/any_session.hpp"

namespace ling::cuda {

class CudaModel;

class CudaSession {
 public:
  // Loads the checkpoint in `dir` (config.json + safetensors) onto the GPU.
  static CudaSession open(std::filesystem::path const& dir, CudaModelOptions const& options = {});
  CudaSession(CudaSession&&) noexcept;
  CudaSession& operator=(CudaSession&&) noexcept;
  ~CudaSession();

  std::span<float const> prefill(std::span<std::int32_t const> tokens);
  std::span<float const> prefill_all(std::span<std::int32_t const> tokens);  // [T·vocab]
  std::span<float const> decode(std::int32_t token);
  // Speculative decoding (runtime::SpeculativeSession): the tokens decoded in passes of two ([T·vocab] logits); with
  // `rewindable`, at most two, and rewind(1) then takes the second back (CudaModel::rewind).
  std::span<float const> decode_all(std::span<std::int32_t const> tokens, bool rewindable = false);
  void rewind(std::int64_t n);
  // The MTP layer on the GPU (CudaModel::mtp_after): entries for the first next.size() positions of the last call
  // (prefill, decode, decode_all), each with the token after it; the last entry's logits [vocab].
  bool has_mtp() const;
  std::span<float const> mtp_after(std::span<std::int32_t const> next);
  std::int64_t mtp_position() const;
  void reset();
  std::int64_t position() const;
  std::int64_t vocab_size() const;
  CudaModel& model();

 private:
  struct Impl;
  explicit CudaSession(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// For the command line (`--backend cuda`): the session wrapped for runtime::Generator.
runtime::AnySession make_cuda_session(std::filesystem::path const& dir, CudaModelOptions const& options = {});

}  // namespace ling::cuda
