#include "data_check.hpp"

#include <algorithm>
#include <cmath>
#include <span>

#include "ling/io/safetensors.hpp"
#include "ling/runtime/session.hpp"

namespace ling::test {
namespace {

template <class T>
std::span<T const> tensor(io::SafetensorsFile const& f, char const* name, DType want) {
  auto const* t = f.find(name);
  if (!t) fail(ErrorCode::kMissingTensor, std::string("expected.safetensors: no tensor '") + name + "'");
  if (t->dtype != want) fail(ErrorCode::kShape, std::string("expected.safetensors: '") + name + "' has another dtype");
  return {reinterpret_cast<T const*>(t->data), std::size_t(t->numel())};
}

double rel_l2(std::span<float const> a, std::span<float const> b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

std::int32_t argmax(std::span<float const> r) { return std::int32_t(std::max_element(r.begin(), r.end()) - r.begin()); }

}  // namespace

DataSetReport run_data_set(std::string const& dir) {
  auto exp = io::SafetensorsFile::open(dir + "/expected.safetensors");
  auto tokens = tensor<std::int32_t>(exp, "tokens", DType::kI32);
  auto prefill = tensor<float>(exp, "prefill_logits", DType::kF32);
  auto dec_tokens = tensor<std::int32_t>(exp, "decode_tokens", DType::kI32);
  auto dec_logits = tensor<float>(exp, "decode_logits", DType::kF32);

  auto s = runtime::Session::open(dir);
  DataSetReport r;
  r.model_type = std::string(s.model_type());
  r.tokens = std::int64_t(tokens.size());
  r.decode_steps = std::int64_t(dec_tokens.size());
  std::int64_t const V = r.vocab = s.vocab_size();
  auto pre = s.prefill_all(tokens);
  std::vector<float> pre_copy(pre.begin(), pre.end());
  r.prefill_rel_l2 = rel_l2(pre_copy, prefill);

  std::vector<float> mtp_expected;
  bool const has_mtp = exp.find("mtp_logits") != nullptr;
  std::vector<float> mtp_got;
  if (has_mtp) {
    auto m = s.mtp_after(tokens.subspan(1));
    mtp_got.assign(m.begin(), m.end());
    r.mtp_rel_l2 = rel_l2(mtp_got, tensor<float>(exp, "mtp_logits", DType::kF32));
  }
  std::vector<float> hidden(s.last_hidden().begin(), s.last_hidden().end());

  // Greedy decode: g0 = argmax(last prefill row), feeding g_i yields row i.
  std::vector<float> dec;
  std::int32_t next = argmax(std::span<float const>(pre_copy).subspan(std::size_t((r.tokens - 1) * V)));
  for (std::int64_t i = 0; i < r.decode_steps; ++i) {
    r.greedy.push_back(next);
    auto row = s.decode(next);
    dec.insert(dec.end(), row.begin(), row.end());
    next = argmax(row);
  }
  r.expected_greedy.assign(dec_tokens.begin(), dec_tokens.end());
  r.greedy_equal = r.greedy == r.expected_greedy;
  r.decode_rel_l2 = r.decode_steps ? rel_l2(dec, dec_logits) : 0.0;

  // The prompt through the decode path one token at a time, and MTP one position at a time.
  s.reset();
  std::vector<float> step;
  for (auto t : tokens) {
    auto row = s.decode(t);
    step.insert(step.end(), row.begin(), row.end());
  }
  r.prefill_step_rel_l2 = rel_l2(step, prefill);
  if (has_mtp) {
    std::vector<float> mstep;
    std::int64_t const H = s.config().hidden_size;
    for (std::int64_t j = 0; j + 1 < r.tokens; ++j) {
      auto m = s.mtp_logits(std::span<float const>(hidden).subspan(std::size_t(j * H), std::size_t(H)),
                            tokens.subspan(std::size_t(j + 1), 1), j);
      mstep.insert(mstep.end(), m.begin(), m.end());
    }
    r.mtp_step_rel_l2 = rel_l2(mstep, tensor<float>(exp, "mtp_logits", DType::kF32));
  }
  return r;
}

}  // namespace ling::test
