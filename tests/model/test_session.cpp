// runtime::Session over tests/data/ling-a-bf16: a static spec (every dimension a compile-time constant) and the
// dynamic one give identical logits; static specs refuse configs that differ (the error names the key); token ids
// out of range and context overflow are errors that leave the caches untouched; snapshot/restore of all caches;
// decode_all and rewind (speculative decoding's verification).
#include <doctest/doctest.h>

#include <cmath>
#include <span>
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

namespace {
double rel_l2(std::span<float const> a, std::span<float const> b) {
  double d = 0, n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    n += double(b[i]) * b[i];
  }
  return std::sqrt(d / n);
}
std::vector<float> copy(std::span<float const> s) { return {s.begin(), s.end()}; }
}  // namespace

TEST_CASE("decode_all feeds tokens on the decode path; rewind drops the last ones from every cache") {
  std::int64_t const V = 512;
  auto toks = prompt(30);
  std::vector<std::int32_t> const seq{4, 8, 15, 16};
  // the reference: one token at a time
  auto ref = runtime::Session::open(kDir);
  ref.prefill(toks);
  std::vector<std::vector<float>> one;
  for (auto t : seq) one.push_back(copy(ref.decode(t)));

  auto s = runtime::Session::open(kDir);
  s.prefill(toks);
  auto snap = s.snapshot();
  // several tokens at once: each row as fed alone (the products round differently with two rows, so not bit for bit)
  auto all = copy(s.decode_all(std::span(seq).first(3), true));
  REQUIRE(all.size() == std::size_t(3 * V));
  for (std::size_t i = 0; i < 3; ++i) CHECK(rel_l2(std::span(all).subspan(i * V, V), one[i]) < 1e-4);
  CHECK(s.position() == 33);
  CHECK(s.last_hidden().size() == std::size_t(3 * 64));
  // the checkpoints change nothing: the same call without them gives the same bits
  auto plain = runtime::Session::open(kDir);
  plain.prefill(toks);
  CHECK(copy(plain.decode_all(std::span(seq).first(3))) == all);

  // drop the last two (every KDA state, conv window and MLA latent cache back to after token 4), then go on
  auto h0 = std::vector<float>(s.last_hidden().begin(), s.last_hidden().begin() + 64);
  s.rewind(2);
  CHECK(s.position() == 31);
  CHECK(copy(s.last_hidden()) == h0);
  CHECK(rel_l2(s.decode(8), one[1]) < 1e-4);
  CHECK(rel_l2(s.decode(15), one[2]) < 1e-4);
  CHECK(rel_l2(s.decode(16), one[3]) < 1e-4);

  // drop one of two, then a second rewindable call from there
  s.restore(snap);
  s.decode_all(std::span(seq).first(2), true);
  s.rewind(1);
  auto rows = copy(s.decode_all(std::span(seq).subspan(1, 3), true));
  for (std::size_t i = 0; i < 3; ++i) CHECK(rel_l2(std::span(rows).subspan(i * V, V), one[i + 1]) < 1e-4);
  s.rewind(0);  // nothing dropped
  CHECK(s.position() == 34);

  // rewind only right after a rewindable decode_all, by fewer tokens than it fed
  std::string what;
  CHECK(code_of([&] { s.rewind(1); }, &what) == ErrorCode::kInvalidArgument);  // already used: rewind(0) ended it
  CHECK(what.find("decode_all") != std::string::npos);
  s.restore(snap);
  s.decode_all(std::span(seq).first(2), true);
  CHECK(code_of([&] { s.rewind(2); }, &what) == ErrorCode::kInvalidArgument);
  CHECK(code_of([&] { s.rewind(-1); }) == ErrorCode::kInvalidArgument);
  s.decode(23);
  CHECK(code_of([&] { s.rewind(1); }) == ErrorCode::kInvalidArgument);
  s.decode_all(std::span(seq).first(2));  // not rewindable
  CHECK(code_of([&] { s.rewind(1); }) == ErrorCode::kInvalidArgument);
  s.decode_all(std::span(seq).first(2), true);
  s.reset();
  CHECK(code_of([&] { s.rewind(1); }) == ErrorCode::kInvalidArgument);
  // a bad id fails before any cache changes, and leaves nothing to rewind
  s.prefill(toks);
  std::vector<std::int32_t> const bad{4, 9999};
  CHECK(code_of([&] { s.decode_all(bad, true); }) == ErrorCode::kInvalidArgument);
  CHECK(s.position() == 30);
  CHECK(code_of([&] { s.rewind(1); }) == ErrorCode::kInvalidArgument);
}
