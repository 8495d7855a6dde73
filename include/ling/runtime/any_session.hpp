#pragma once
// AnySession: a type-erased LogitSession, so that code choosing a backend at run time (the `ling` command line:
// CPU or CUDA) drives one Generator<AnySession>. Wraps any session by value (move) and forwards the five calls.
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
  };
  template <class S>
  struct Model final : Concept {
    explicit Model(S s) : session(std::move(s)) {}
    std::span<float const> prefill(std::span<std::int32_t const> t) override { return session.prefill(t); }
    std::span<float const> decode(std::int32_t t) override { return session.decode(t); }
    void reset() override { session.reset(); }
    std::int64_t position() const override { return session.position(); }
    std::int64_t vocab_size() const override { return session.vocab_size(); }
    S session;
  };
  std::unique_ptr<Concept> impl_;
  std::string backend_;
};

static_assert(LogitSession<AnySession>);

}  // namespace ling::runtime
