// Extension proof: a policy defined in this test (ext::Int8Row, not in include/) joins the model's policy list;
// the routed experts of tests/data/ling-a-bf16 are quantized to it after loading and the model runs through the
// CPU backend with no edit to the library.
//  - exactness: logits equal (rel L2 < 1e-5) those of the same model whose experts hold the int8 values decoded
//    to F32 ahead of time, so the CPU backend really runs Int8Row::decode;
//  - closeness to BF16: relative L2 < 5e-2 (measured 2.4e-2) and top-1 equal on >= 90% of positions.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "int8_row.hpp"
#include "ling/cpu/linear.hpp"
#include "ling/model/dynamic.hpp"
#include "ling/runtime/session.hpp"

using namespace ling;

namespace {

using Policies = quant::Append<quant::DefaultPolicies, ext::Int8Row>::type;
using Model = model::HybridModel<model::DynamicSpec, Policies>;
using Lin = layers::Linear<Policies>;

// Quantizes one matrix to Int8Row; with `fake`, stores the decoded values as F32 instead.
Lin to_int8(Lin const& w, bool fake) {
  cpu::Matrix m = cpu::dequantize(w);
  std::vector<std::int8_t> q(std::size_t(m.size()));
  std::vector<float> s(std::size_t(m.rows()));
  ext::Int8Row::quantize(m.data(), m.rows(), m.cols(), q.data(), s.data());
  if (!fake) return Lin::owned<ext::Int8Row>(std::move(q), std::move(s), m.rows(), m.cols());
  std::vector<float> d(q.size());
  for (std::int64_t r = 0; r < m.rows(); ++r)
    for (std::int64_t c = 0; c < m.cols(); ++c)
      d[std::size_t(r * m.cols() + c)] = ext::Int8Row::decode(q.data(), s.data(), m.rows(), m.cols(), r, c);
  return Lin::owned<quant::F32>(std::move(d), {}, m.rows(), m.cols());
}

int quantized_count = 0;
void quantize_experts(Model& m, bool fake) {
  auto moe_experts = [&](Model::Moe& moe) {
    for (auto& e : moe.weights.experts) {
      e.gate = to_int8(e.gate, fake);
      e.up = to_int8(e.up, fake);
      e.down = to_int8(e.down, fake);
      quantized_count += 3;
    }
  };
  for (auto& l : m.layers)
    if (l.ffn.is<Model::Moe>()) moe_experts(l.ffn.as<Model::Moe>());
  if (m.mtp) moe_experts(m.mtp->block.ffn);
}

std::vector<float> run(runtime::Session& s, std::vector<std::int32_t> const& toks) {
  auto l = s.prefill_all(toks);
  std::vector<float> out(l.begin(), l.end());
  auto m = s.mtp_after(std::vector<std::int32_t>(toks.begin() + 1, toks.end()));
  out.insert(out.end(), m.begin(), m.end());
  for (std::int32_t t : {3, 77, 300}) {
    auto d = s.decode(t);
    out.insert(out.end(), d.begin(), d.end());
  }
  return out;
}

double rel_l2(std::vector<float> const& a, std::vector<float> const& b) {
  double n = 0, d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += double(a[i] - b[i]) * (a[i] - b[i]), d += double(b[i]) * b[i];
  return std::sqrt(n / d);
}

}  // namespace

TEST_CASE("an out-of-library INT8 policy runs the routed experts of ling-a-bf16") {
  std::string const dir = std::string(LING_TEST_DATA) + "/ling-a-bf16";
  std::vector<std::int32_t> toks;
  for (int i = 0; i < 40; ++i) toks.push_back((i * 53 + 5) % 512);

  bool checked_policy = false;
  auto int8 = runtime::Session::open_as<Model>(dir, {}, [&](Model& m) {
    quantize_experts(m, false);
    auto const& e = m.layers.back().ffn.as<Model::Moe>().weights.experts[0];
    checked_policy = e.gate.holds<ext::Int8Row>() && e.gate.policy_name() == "int8-row";
  });
  CHECK(checked_policy);
  CHECK(quantized_count == 3 * 16 * 6);  // 5 MoE layers + MTP, 16 experts each
  auto fake = runtime::Session::open_as<Model>(dir, {}, [](Model& m) { quantize_experts(m, true); });
  auto bf16 = runtime::Session::open(dir);

  auto a = run(int8, toks), b = run(fake, toks), ref = run(bf16, toks);
  double exact = rel_l2(a, b), vs_bf16 = rel_l2(a, ref);
  // top-1 agreement over every row (prefill, MTP, decode)
  std::int64_t const V = 512, rows = std::int64_t(a.size()) / V;
  int same = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    auto ra = a.begin() + r * V, rb = ref.begin() + r * V;
    same += (std::max_element(ra, ra + V) - ra) == (std::max_element(rb, rb + V) - rb);
  }
  MESSAGE("int8-row experts: vs decoded-F32 rel L2 " << exact << ", vs BF16 rel L2 " << vs_bf16 << ", top-1 equal "
                                                      << same << "/" << rows);
  CHECK(exact < 1e-5);
  CHECK(vs_bf16 > 0.0);  // the quantization did change the experts
  CHECK(vs_bf16 < 5e-2);  // measured 2.4e-2: the tiny random model amplifies the ~0.6% per-matrix INT8 error
  CHECK(same >= 0.9 * double(rows));
}
