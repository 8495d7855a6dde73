#pragma once
// Definitions of cuda/session.hpp. Include in exactly one .cu file of a program (they are not inline, so that plain
// C++ files can call them through session.hpp).
#include <algorithm>
#include <string>

#include "ling/cuda/model.cuh"
#include "ling/cuda/session.hpp"
#include "ling/io/checkpoint.hpp"
#include "ling/io/weights.hpp"

namespace ling::cuda {

struct CudaSession::Impl {
  std::unique_ptr<CudaModel> model;
  std::vector<float> logits, all;
  void check_prompt(std::span<std::int32_t const> tokens) const {
    require(!tokens.empty(), ErrorCode::kInvalidArgument, "prefill: no tokens");
    for (auto t : tokens)
      require(t >= 0 && t < model->vocab_size(), ErrorCode::kInvalidArgument,
              "token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(model->vocab_size()) + ")");
    require(model->position() + std::int64_t(tokens.size()) <= model->max_context(), ErrorCode::kOutOfRange,
            "context overflow: " + std::to_string(model->position()) + " tokens + " + std::to_string(tokens.size()) +
                " new exceed the maximum context of " + std::to_string(model->max_context()));
  }
};

CudaSession::CudaSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaSession::CudaSession(CudaSession&&) noexcept = default;
CudaSession& CudaSession::operator=(CudaSession&&) noexcept = default;
CudaSession::~CudaSession() = default;

CudaSession CudaSession::open(std::filesystem::path const& dir, CudaModelOptions const& options) {
  require(device_available(), ErrorCode::kUnsupported, "no CUDA device is available");
  io::Checkpoint ckpt = io::Checkpoint::open(dir);
  io::CheckpointWeights w = io::CheckpointWeights::load(ckpt);
  auto impl = std::make_unique<Impl>();
  impl->model = CudaModel::from_checkpoint(w, ckpt.config(), options);
  impl->logits.resize(std::size_t(ckpt.config().vocab_size));
  return CudaSession(std::move(impl));
}

std::span<float const> CudaSession::prefill(std::span<std::int32_t const> tokens) {
  impl_->check_prompt(tokens);
  CudaModel& m = *impl_->model;
  for (std::size_t i = 0; i < tokens.size();) {
    std::size_t const n = m.takes_tokens() ? std::min<std::size_t>(CudaModel::kMaxTokens, tokens.size() - i) : 1;
    m.step_tokens(tokens.subspan(i, n));
    m.synchronize();  // the pinned token slots are reused by the next pass
    i += n;
  }
  m.download_last_logits(impl_->logits.data());
  return impl_->logits;
}

std::span<float const> CudaSession::prefill_all(std::span<std::int32_t const> tokens) {
  impl_->check_prompt(tokens);
  CudaModel& m = *impl_->model;
  std::size_t const V = std::size_t(m.vocab_size());
  impl_->all.resize(tokens.size() * V);
  for (std::size_t i = 0; i < tokens.size();) {
    std::size_t const n = m.takes_tokens() ? std::min<std::size_t>(CudaModel::kMaxTokens, tokens.size() - i) : 1;
    m.step_tokens(tokens.subspan(i, n));
    m.download_logits(impl_->all.data() + i * V, int(n));
    i += n;
  }
  return impl_->all;
}

std::span<float const> CudaSession::mtp_after(std::span<std::int32_t const>) {
  fail(ErrorCode::kUnsupported, "the CUDA session does not run the MTP layer yet");
}

std::span<float const> CudaSession::decode(std::int32_t token) {
  CudaModel& m = *impl_->model;
  m.step(token);
  m.download_logits(impl_->logits.data());
  return impl_->logits;
}

void CudaSession::reset() { impl_->model->reset(); }
std::int64_t CudaSession::position() const { return impl_->model->position(); }
std::int64_t CudaSession::vocab_size() const { return impl_->model->vocab_size(); }
CudaModel& CudaSession::model() { return *impl_->model; }

runtime::AnySession make_cuda_session(std::filesystem::path const& dir, CudaModelOptions const& options) {
  return runtime::AnySession(CudaSession::open(dir, options), "cuda");
}

}  // namespace ling::cuda
