// runtime::Session over tests/data/ling-a-bf16: a static spec (every dimension a compile-time constant) and the
// dynamic one give identical logits; static specs refuse configs that differ (the error names the key); token ids
// out of range and context overflow are errors that leave the caches untouched; snapshot/restore of all caches.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ling/model/dynamic.hpp"
#include "ling/model/ling3_flash.hpp"
#include "ling/runtime/session.hpp"

using namespace ling;

namespace {

// The ling-a set's dimensions, all static.
struct LingASpec {
  static constexpr std::string_view name = "ling-a (static test spec)";
  static constexpr std::int64_t vocab_size = 512, hidden_size = 64, num_hidden_layers = 6, layer_group_size = 3,
                                first_k_dense_replace = 1, intermediate_size = 160, num_experts = 16,
                                num_experts_per_tok = 4, moe_intermediate_size = 32, shared_width = 32, n_group = 4,
                                topk_group = 2, num_attention_heads = 5, head_dim = 16, short_conv_kernel_size = 4,
                                mla_num_heads = 5, q_lora_rank = 48, kv_lora_rank = 48, qk_nope_head_dim = 16,
                                qk_rope_head_dim = 16, v_head_dim = 32, num_nextn_predict_layers = 1;
  static constexpr Family family = Family::kLing;
  static constexpr OutputGate output_gate = OutputGate::kHeadWise;
  static constexpr bool mla_use_rope = true, kda_safe_gate = true, no_kda_lora = true;
};
using LingA = model::HybridModel<LingASpec>;
static_assert(Extent<LingASpec::hidden_size>::is_static && !Extent<model::DynamicSpec::hidden_size>::is_static);

std::string const kDir = std::string(LING_TEST_DATA) + "/ling-a-bf16";
std::vector<std::int32_t> prompt(int n) {
  std::vector<std::int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(std::int32_t((i * 37 + 11) % 512));
  return t;
}
template <class F>
ErrorCode code_of(F&& f, std::string* what = nullptr) {
  try {
    f();
  } catch (Error const& e) {
    if (what) *what = e.what();
    return e.code();
  }
  return ErrorCode::kOk;
}

}  // namespace

TEST_CASE("static and dynamic specs give identical logits on ling-a-bf16") {
  auto st = runtime::Session::open_as<LingA>(kDir);
  auto dy = runtime::Session::open_as<model::DynamicModel<>>(kDir);
  CHECK(st.model_type() == LingASpec::name);
  CHECK(dy.model_type() == "dynamic");
  auto toks = prompt(70);
  auto aspan = st.prefill_all(toks);
  std::vector<float> a(aspan.begin(), aspan.end());
  auto bspan = dy.prefill_all(toks);
  std::vector<float> b(bspan.begin(), bspan.end());
  REQUIRE(a.size() == b.size());
  double max_diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) max_diff = std::max(max_diff, double(std::abs(a[i] - b[i])));
  MESSAGE("static vs dynamic prefill: max |diff| = " << max_diff);
  CHECK(max_diff == 0.0);
  std::vector<std::int32_t> next(toks.begin() + 1, toks.end());
  auto m1 = st.mtp_after(next);
  std::vector<float> m1v(m1.begin(), m1.end());
  auto m2 = dy.mtp_after(next);
  CHECK(m1v.size() == std::size_t(69 * 512));
  CHECK(std::equal(m1v.begin(), m1v.end(), m2.begin()));
  for (std::int32_t t : {3, 99, 250}) {
    auto x = st.decode(t);
    std::vector<float> xs(x.begin(), x.end());
    auto y = dy.decode(t);
    CHECK(std::equal(xs.begin(), xs.end(), y.begin()));
  }
}

TEST_CASE("static specs refuse a config that does not match, naming the key") {
  std::string what;
  CHECK(code_of([&] { (void)runtime::Session::open_as<model::Ling3Flash<>>(kDir); }, &what) == ErrorCode::kConfig);
  CHECK(what.find("vocab_size") != std::string::npos);
  CHECK(what.find("157184") != std::string::npos);
  CHECK(code_of([&] { (void)runtime::Session::open_as<LingA>(std::string(LING_TEST_DATA) + "/kimi-bf16"); }, &what) ==
        ErrorCode::kConfig);
  CHECK(what.find("vocab_size") != std::string::npos);
  // The auto pick takes the dynamic model for a config no static spec matches.
  CHECK(runtime::Session::open(kDir).model_type() == "dynamic");
}

TEST_CASE("token ids out of range are kInvalidArgument naming the id; the caches stay as they were") {
  auto s = runtime::Session::open(kDir);
  auto toks = prompt(5);
  auto ref_span = s.prefill(toks);
  std::vector<float> ref(ref_span.begin(), ref_span.end());
  std::string what;
  std::vector<std::int32_t> bad = {1, 2, 512};
  CHECK(code_of([&] { s.prefill(bad); }, &what) == ErrorCode::kInvalidArgument);
  CHECK(what.find("512") != std::string::npos);
  CHECK(code_of([&] { s.decode(-3); }, &what) == ErrorCode::kInvalidArgument);
  CHECK(what.find("-3") != std::string::npos);
  CHECK(code_of([&] { s.decode(100000); }, &what) == ErrorCode::kInvalidArgument);
  CHECK(what.find("100000") != std::string::npos);
  CHECK(s.position() == 5);
  // Same stream as a fresh session that never saw the bad calls.
  auto fresh = runtime::Session::open(kDir);
  fresh.prefill(toks);
  auto a = s.decode(9);
  std::vector<float> av(a.begin(), a.end());
  auto b = fresh.decode(9);
  CHECK(std::equal(av.begin(), av.end(), b.begin()));
}

TEST_CASE("context overflow is kOutOfRange") {
  runtime::SessionOptions opt;
  opt.max_context = 10;
  auto s = runtime::Session::open(kDir, opt);
  s.prefill(prompt(8));
  std::string what;
  CHECK(code_of([&] { s.prefill(prompt(3)); }, &what) == ErrorCode::kOutOfRange);
  CHECK(what.find("10") != std::string::npos);
  CHECK(s.position() == 8);
  s.decode(1);
  s.decode(2);
  CHECK(s.position() == 10);
  CHECK(code_of([&] { s.decode(3); }) == ErrorCode::kOutOfRange);
  // Without a configured limit, max_position_embeddings (4096) bounds the context; a larger option is clamped.
  opt.max_context = 1 << 30;
  auto big = runtime::Session::open(kDir, opt);
  CHECK(code_of([&] { big.prefill(prompt(4097)); }, &what) == ErrorCode::kOutOfRange);
  CHECK(what.find("4096") != std::string::npos);
  CHECK(big.position() == 0);
}

TEST_CASE("snapshot and restore cover every cache (KDA states, conv windows, MLA latents, MTP)") {
  auto s = runtime::Session::open(kDir);
  auto toks = prompt(40);
  s.prefill(toks);
  auto m0 = s.mtp_after(std::vector<std::int32_t>(toks.begin() + 1, toks.end()));
  CHECK(m0.size() == std::size_t(39 * 512));
  CHECK(s.mtp_position() == 39);
  auto snap = s.snapshot();
  std::vector<float> first;
  for (std::int32_t t : {4, 8, 15}) {
    auto r = s.decode(t);
    first.insert(first.end(), r.begin(), r.end());
  }
  auto hid = std::vector<float>(s.last_hidden().begin(), s.last_hidden().end());
  auto mtp_a = s.mtp_logits(hid, std::vector<std::int32_t>{16}, 39);
  std::vector<float> mtp_first(mtp_a.begin(), mtp_a.end());
  CHECK(s.position() == 43);
  s.restore(snap);
  CHECK(s.position() == 40);
  CHECK(s.mtp_position() == 39);
  std::vector<float> second;
  for (std::int32_t t : {4, 8, 15}) {
    auto r = s.decode(t);
    second.insert(second.end(), r.begin(), r.end());
  }
  CHECK(first == second);
  auto mtp_b = s.mtp_logits(hid, std::vector<std::int32_t>{16}, 39);
  CHECK(std::equal(mtp_first.begin(), mtp_first.end(), mtp_b.begin()));
  // MTP positions must continue the MTP stream.
  CHECK(code_of([&] { s.mtp_logits(hid, std::vector<std::int32_t>{16}, 7); }) == ErrorCode::kInvalidArgument);
  // reset() starts a fresh stream: the first prefill again gives the first logits.
  s.reset();
  CHECK(s.position() == 0);
  CHECK(s.mtp_position() == 0);
  auto other = runtime::Session::open(kDir);
  auto x = s.prefill(toks);
  std::vector<float> xv(x.begin(), x.end());
  auto y = other.prefill(toks);
  CHECK(std::equal(xv.begin(), xv.end(), y.begin()));
  // A snapshot of another session is refused.
  CHECK(code_of([&] { other.restore(snap); }) == ErrorCode::kInvalidArgument);
}
