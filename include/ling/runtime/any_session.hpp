#pragma once
// AnySession: a type-erased LogitSession, so that code choosing a backend at run time (the `ling` command line:
// CPU or CUDA) drives one Generator<AnySession>. Wraps any session by value (move) and forwards the five calls, and
// the calls of speculative decoding where the wrapped session has them (SpeculativeSession; else has_mtp() is false
// and they fail with kUnsupported).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "ling/runtime/generator.hpp"

namespace ling::runtime {

class AnySession {
 public:
  template <LogitSession S>
  AnySession(S session, std::string backend_name)
      : impl_(std::make_unique<Model<S>>(std::move(session))), backend_(std::move(backend_name)) {}

  std::span<float const> prefill(std::span<std::int32_t const> tokens) { return impl_->prefill(tokens); }
  std::span<float const> decode(std::int32_t token) { return impl_->decode(token); }
  void reset() { impl_->reset(); }
  std::int64_t position() const { return impl_->position(); }
  std::int64_t vocab_size() const { return impl_->vocab_size(); }
  std::string const& backend() const noexcept { return backend_; }

  std::span<float const> decode_all(std::span<std::int32_t const> tokens, bool rewindable = false) {
    return impl_->decode_all(tokens, rewindable);
  }
  void rewind(std::int64_t n) { impl_->rewind(n); }
  std::span<float const> mtp_after(std::span<std::int32_t const> next) { return impl_->mtp_after(next); }
  bool has_mtp() const { return impl_->has_mtp(); }
  std::int64_t mtp_position() const { return impl_->mtp_position(); }

  // The wrapped session, when its type is known (nullptr otherwise).
  template <class S>
  S* get() noexcept {
    auto* m = dynamic_cast<Model<S>*>(impl_.get());
    return m ? &m->session : nullptr;
  }

 private:
  struct Concept {
    virtual ~Concept() = default;
    virtual std::span<float const> prefill(std::span<std::int32_t const>) = 0;
    virtual std::span<float const> decode(std::int32_t) = 0;
    virtual void reset() = 0;
    virtual std::int64_t position() const = 0;
    virtual std::int64_t vocab_size() const = 0;
    virtual std::span<float const> decode_all(std::span<std::int32_t const>, bool) = 0;
    virtual void rewind(std::int64_t) = 0;
    virtual std::span<float const> mtp_after(std::span<std::int32_t const>) = 0;
    virtual bool has_mtp() const = 0;
    virtual std::int64_t mtp_position() const = 0;
  };
  template <class S>
  struct Model final : Concept {
    explicit Model(S s) : session(std::move(s)) {}
    std::span<float const> prefill(std::span<std::int32_t const> t) override { return session.prefill(t); }
    std::span<float const> decode(std::int32_t t) override { return session.decode(t); }
    void reset() override { session.reset(); }
    std::int64_t position() const override { return session.position(); }
    std::int64_t vocab_size() const override { return session.vocab_size(); }
    static constexpr bool kSpec = SpeculativeSession<S>;
    [[noreturn]] static void no_spec_() {
      fail(ErrorCode::kUnsupported, "this session cannot verify drafts (speculative decoding needs decode_all, rewind "
                                    "and the MTP layer: the CPU or CUDA session)");
    }
    std::span<float const> decode_all(std::span<std::int32_t const> t, bool r) override {
      if constexpr (kSpec) return session.decode_all(t, r);
      else no_spec_();
    }
    void rewind(std::int64_t n) override {
      if constexpr (kSpec) session.rewind(n);
      else no_spec_();
    }
    std::span<float const> mtp_after(std::span<std::int32_t const> next) override {
      if constexpr (kSpec) return session.mtp_after(next);
      else no_spec_();
    }
    bool has_mtp() const override {
      if constexpr (kSpec) return session.has_mtp();
      else return false;
    }
    std::int64_t mtp_position() const override {
      if constexpr (kSpec) return session.mtp_position();
      else return 0;
    }
    S session;
  };
  std::unique_ptr<Concept> impl_;
  std::string backend_;
};

static_assert(LogitSession<AnySession>);
static_assert(SpeculativeSession<AnySession>);

}  // namespace ling::runtime
