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
  // With an MTP layer, a call of several passes (a prefill) keeps every pass's hidden rows here, in order, from
  // position rows_first, for mtp_after; rows_kept of them. A call of one pass (decode, a draft's verification) copies
  // nothing: its rows stay the model's own (CudaModel::hidden_device) until the next pass. rewindable: the last call
  // may be rewound.
  DeviceBuffer hidden;
  std::int64_t rows_first = 0, rows_kept = 0;
  bool rows_in_model = true, rewindable = false;
  void begin_call() {
    rows_first = model->position();
    rows_kept = 0;
    rows_in_model = true;
    rewindable = false;
  }
  // After a pass of a call of several: its hidden rows joined to the call's (only when the model has an MTP layer).
  void keep_rows() {
    if (!model->has_mtp()) return;
    rows_in_model = false;
    std::size_t const D = std::size_t(model->config().hidden_size), n = std::size_t(model->last_tokens());
    std::size_t const need = (std::size_t(rows_kept) + n) * D * sizeof(float);
    if (hidden.bytes() < need) {
      DeviceBuffer grown(std::max(need, 2 * hidden.bytes()), "CUDA session: hidden rows for the MTP layer");
      if (rows_kept > 0)
        check(cudaMemcpyAsync(grown.data(), hidden.data(), std::size_t(rows_kept) * D * sizeof(float),
                              cudaMemcpyDeviceToDevice, model->stream()),
              "hidden rows");
      model->synchronize();
      hidden = std::move(grown);
    }
    check(cudaMemcpyAsync(hidden.data<float>() + std::size_t(rows_kept) * D, model->hidden_device(),
                          n * D * sizeof(float), cudaMemcpyDeviceToDevice, model->stream()),
          "hidden rows");
    rows_kept += std::int64_t(n);
  }
  // tokens in passes of up to kMaxTokens (one token each with the probes that take no passes); all: every token's
  // logits into `all`, else the last token's into `logits`
  void run(std::span<std::int32_t const> tokens, bool all_rows) {
    CudaModel& m = *model;
    std::size_t const V = std::size_t(m.vocab_size());
    std::size_t const per_pass = m.takes_tokens() ? CudaModel::kMaxTokens : 1;
    bool const passes = tokens.size() > per_pass;
    begin_call();
    if (all_rows) all.resize(tokens.size() * V);
    for (std::size_t i = 0; i < tokens.size();) {
      std::size_t const n = std::min(per_pass, tokens.size() - i);
      m.step_tokens(tokens.subspan(i, n));
      if (passes) keep_rows();
      if (all_rows) m.download_logits(all.data() + i * V, int(n));
      else m.synchronize();  // the pinned token slots are reused by the next pass
      i += n;
    }
    if (!all_rows) m.download_last_logits(logits.data());
  }
  void check_prompt(std::span<std::int32_t const> tokens) const {
    require(!tokens.empty(), ErrorCode::kInvalidArgument, "prefill: no tokens");
    for (auto t : tokens) model->check_token(t);
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
  impl_->run(tokens, false);
  return impl_->logits;
}

std::span<float const> CudaSession::prefill_all(std::span<std::int32_t const> tokens) {
  impl_->check_prompt(tokens);
  impl_->run(tokens, true);
  return impl_->all;
}

std::span<float const> CudaSession::decode(std::int32_t token) {
  CudaModel& m = *impl_->model;
  impl_->begin_call();
  m.step(token);
  m.download_logits(impl_->logits.data());
  return impl_->logits;
}

std::span<float const> CudaSession::decode_all(std::span<std::int32_t const> tokens, bool rewindable) {
  require(!rewindable || tokens.size() <= std::size_t(CudaModel::kMaxTokens), ErrorCode::kInvalidArgument,
          "decode_all: a rewindable call takes at most " + std::to_string(CudaModel::kMaxTokens) +
              " tokens on the GPU");
  require(!rewindable || impl_->model->takes_tokens(), ErrorCode::kUnsupported,
          "decode_all: a rewindable call needs passes of two tokens (not with LING_PREDICT or LING_AHEAD)");
  impl_->check_prompt(tokens);
  impl_->run(tokens, true);
  impl_->rewindable = rewindable;
  return impl_->all;
}

void CudaSession::rewind(std::int64_t n) {
  Impl& s = *impl_;
  require(s.rewindable, ErrorCode::kInvalidArgument, "rewind: the last call was not a rewindable decode_all");
  std::int64_t const T = s.model->last_tokens();
  require(n >= 0 && n < T, ErrorCode::kInvalidArgument,
          "rewind(" + std::to_string(n) + "): the last call fed " + std::to_string(T) + " tokens");
  if (n > 0) s.model->rewind(n);  // a rewindable call is one pass: its rows are the model's, which rewinds them
  s.rewindable = false;
}

bool CudaSession::has_mtp() const { return impl_->model->has_mtp(); }
std::int64_t CudaSession::mtp_position() const { return impl_->model->mtp_position(); }

std::span<float const> CudaSession::mtp_after(std::span<std::int32_t const> next) {
  Impl& s = *impl_;
  CudaModel& m = *s.model;
  require(m.has_mtp(), ErrorCode::kUnsupported, "mtp_after: the checkpoint has no MTP layer");
  std::int64_t const rows = s.rows_in_model ? m.last_tokens() : s.rows_kept;
  require(!next.empty() && std::int64_t(next.size()) <= rows, ErrorCode::kInvalidArgument,
          "mtp_after: " + std::to_string(next.size()) + " tokens but the last call produced " + std::to_string(rows) +
              " positions");
  // a rewind may still follow (as on the CPU session)
  if (s.rows_in_model) m.mtp_after(next);
  else m.mtp_after(next, s.hidden.data<float>(), s.rows_first);
  m.download_mtp_logits(s.logits.data());
  return s.logits;
}

void CudaSession::reset() {
  impl_->model->reset();
  impl_->begin_call();
}
std::int64_t CudaSession::position() const { return impl_->model->position(); }
std::int64_t CudaSession::vocab_size() const { return impl_->model->vocab_size(); }
CudaModel& CudaSession::model() { return *impl_->model; }

runtime::AnySession make_cuda_session(std::filesystem::path const& dir, CudaModelOptions const& options) {
  return runtime::AnySession(CudaSession::open(dir, options), "cuda");
}

}  // namespace ling::cuda
