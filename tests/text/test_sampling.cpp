// runtime/sampling.hpp and stop.hpp on fixed logits against hand-computed distributions and a brute-force reference.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "ling/runtime/sampling.hpp"
#include "ling/runtime/stop.hpp"

using namespace ling::runtime;

namespace {
std::vector<float> log_of(std::vector<double> p) {
  std::vector<float> l;
  for (double x : p) l.push_back(static_cast<float>(std::log(x)));
  return l;
}
SamplingParams with(float t, int k, float p, float minp) {
  SamplingParams s;
  s.temperature = t;
  s.top_k = k;
  s.top_p = p;
  s.min_p = minp;
  return s;
}
void check_dist(std::vector<Candidate> const& got, std::vector<std::pair<int, double>> const& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CHECK(got[i].id == want[i].first);
    CHECK(got[i].p == doctest::Approx(want[i].second).epsilon(1e-5));
  }
}
}  // namespace

TEST_CASE("sampling: penalties on known logits") {
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f};
  std::vector<std::int32_t> hist = {0, 1, 1};
  Sampler::apply_penalties(l, hist, 2.0f, 0.5f);
  CHECK(l[0] == doctest::Approx(0.5));   // 2 / 2 - 0.5
  CHECK(l[1] == doctest::Approx(-2.5));  // -1 * 2 - 0.5 (once, though seen twice)
  CHECK(l[2] == doctest::Approx(0.5));
  CHECK(l[3] == doctest::Approx(3.0));
  std::vector<float> w = {1.0f, 1.0f, 1.0f};
  Sampler::apply_penalties(w, std::vector<std::int32_t>{0, 1, 2, 2}, 1.0f, 1.0f, /*last_n=*/2);  // only {2}
  CHECK(w == std::vector<float>{1.0f, 1.0f, 0.0f});
}

TEST_CASE("sampling: greedy, and a penalty moving the argmax") {
  std::vector<float> l = {0.1f, 2.0f, 1.5f};
  Sampler g(with(0.0f, 0, 1.0f, 0.0f));
  CHECK(g.sample(l) == 1);
  auto p = with(0.0f, 0, 1.0f, 0.0f);
  p.repetition_penalty = 1.5f;  // 2.0 / 1.5 = 1.33 < 1.5
  Sampler g2(p);
  CHECK(g2.sample(l, std::vector<std::int32_t>{1}) == 2);
}

TEST_CASE("sampling: temperature, top-k, top-p, min-p distributions") {
  // temperature 0.5 on logits 1,2,3: softmax of 2,4,6
  std::vector<float> l = {1.0f, 2.0f, 3.0f};
  double z = std::exp(-4.0) + std::exp(-2.0) + 1.0;
  Sampler t(with(0.5f, 0, 1.0f, 0.0f));
  check_dist(t.distribution(l, {}), {{2, 1.0 / z}, {1, std::exp(-2.0) / z}, {0, std::exp(-4.0) / z}});

  auto probs = log_of({0.05, 0.5, 0.15, 0.3});  // ids: 1 (.5), 3 (.3), 2 (.15), 0 (.05)
  Sampler k2(with(1.0f, 2, 1.0f, 0.0f));
  check_dist(k2.distribution(probs, {}), {{1, 0.5 / 0.8}, {3, 0.3 / 0.8}});
  Sampler p75(with(1.0f, 0, 0.75f, 0.0f));
  check_dist(p75.distribution(probs, {}), {{1, 0.5 / 0.8}, {3, 0.3 / 0.8}});
  Sampler p90(with(1.0f, 0, 0.9f, 0.0f));
  check_dist(p90.distribution(probs, {}), {{1, 0.5 / 0.95}, {3, 0.3 / 0.95}, {2, 0.15 / 0.95}});
  Sampler m20(with(1.0f, 0, 1.0f, 0.2f));  // keep p >= 0.1
  check_dist(m20.distribution(probs, {}), {{1, 0.5 / 0.95}, {3, 0.3 / 0.95}, {2, 0.15 / 0.95}});
  Sampler m70(with(1.0f, 0, 1.0f, 0.7f));  // keep p >= 0.35
  check_dist(m70.distribution(probs, {}), {{1, 1.0}});
  // top-k 3 then top-p 0.8 on the renormalized .526/.316/.158: cumulative .526, .842 -> two kept
  Sampler kp(with(1.0f, 3, 0.8f, 0.0f));
  check_dist(kp.distribution(probs, {}), {{1, 0.5 / 0.8}, {3, 0.3 / 0.8}});
  // temperature 2 then top-p 0.6: p ∝ sqrt(p)
  std::vector<double> sq = {std::sqrt(0.05), std::sqrt(0.5), std::sqrt(0.15), std::sqrt(0.3)};
  double zs = sq[0] + sq[1] + sq[2] + sq[3];  // 0.2236+0.7071+0.3873+0.5477 = 1.8657
  // sorted: .379, .2936, .2076, .1198 -> cumulative .379, .6726 -> two kept
  Sampler tp(with(2.0f, 0, 0.6f, 0.0f));
  check_dist(tp.distribution(probs, {}), {{1, sq[1] / (sq[1] + sq[3])}, {3, sq[3] / (sq[1] + sq[3])}});
  (void)zs;
}

TEST_CASE("sampling: large vocabulary top-p / min-p against a brute-force reference") {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> l(50000);
  for (auto& x : l) x = nd(rng);
  for (float top_p : {0.3f, 0.9f, 0.99f}) {
    for (float min_p : {0.0f, 0.05f}) {
      for (float temp : {0.7f, 1.3f}) {
        // reference: full sort of softmax(l / temp)
        std::vector<double> p(l.size());
        double mx = *std::max_element(l.begin(), l.end()), z = 0;
        for (std::size_t i = 0; i < l.size(); ++i) z += (p[i] = std::exp((l[i] - mx) / temp));
        std::vector<int> idx(l.size());
        std::iota(idx.begin(), idx.end(), 0);
        std::sort(idx.begin(), idx.end(), [&](int a, int b) { return p[a] > p[b]; });
        std::size_t keep = 0;
        double cum = 0;
        while (keep < idx.size() && cum < top_p * z) cum += p[idx[keep++]];
        std::size_t m = 1;
        while (m < keep && p[idx[m]] >= min_p * p[idx[0]]) ++m;
        if (min_p > 0) keep = m;
        double kept = 0;
        for (std::size_t i = 0; i < keep; ++i) kept += p[idx[i]];
        Sampler s(with(temp, 0, top_p, min_p));
        auto d = s.distribution(l, {});
        CAPTURE(top_p);
        CAPTURE(min_p);
        REQUIRE(d.size() == keep);
        for (std::size_t i = 0; i < keep; i += std::max<std::size_t>(1, keep / 17)) {
          CHECK(d[i].id == idx[i]);
          CHECK(d[i].p == doctest::Approx(p[idx[i]] / kept).epsilon(1e-4));
        }
      }
    }
  }
}

TEST_CASE("sampling: draw frequencies match the distribution; same seed, same draws") {
  auto probs = log_of({0.05, 0.5, 0.15, 0.3});
  for (auto params : {with(1.0f, 3, 1.0f, 0.0f), with(1.0f, 0, 1.0f, 0.0f)}) {
    params.seed = 42;
    Sampler s(params);
    auto d = s.distribution(probs, {});
    std::vector<int> count(4, 0);
    int const n = 100000;
    for (int i = 0; i < n; ++i) ++count[static_cast<std::size_t>(s.sample(probs))];
    for (auto const& c : d) CHECK(count[static_cast<std::size_t>(c.id)] / double(n) == doctest::Approx(c.p).epsilon(0.03));
    if (params.top_k == 3) CHECK(count[0] == 0);
  }
  auto params = with(1.0f, 0, 0.95f, 0.0f);
  params.seed = 7;
  Sampler a(params), b(params);
  auto other = params;
  other.seed = 8;
  Sampler c(other);
  std::vector<int> da, db, dc;
  for (int i = 0; i < 200; ++i) {
    da.push_back(a.sample(probs));
    db.push_back(b.sample(probs));
    dc.push_back(c.sample(probs));
  }
  CHECK(da == db);
  CHECK(da != dc);
}

TEST_CASE("sampling: verify keeps the distribution whatever the draft; accepts with the draft's probability") {
  auto probs = log_of({0.05, 0.5, 0.15, 0.3, 0.0001});
  for (auto params : {with(1.0f, 0, 1.0f, 0.0f), with(0.7f, 3, 1.0f, 0.0f), with(1.0f, 0, 0.9f, 0.0f)}) {
    params.seed = 11;
    Sampler s(params);
    auto d = s.distribution(probs, {});
    std::vector<double> p(5, 0.0);
    for (auto const& c : d) p[static_cast<std::size_t>(c.id)] = c.p;
    for (std::int32_t draft : {1, 3, 0, 4}) {  // likely, second, filtered out by top-k 3, all but excluded
      CAPTURE(draft);
      std::vector<int> count(5, 0);
      int accepted = 0;
      int const n = 60000;
      for (int i = 0; i < n; ++i) {
        auto v = s.verify(probs, {}, draft);
        ++count[static_cast<std::size_t>(v.token)];
        if (v.accepted) {
          ++accepted;
          CHECK(v.token == draft);
        } else {
          CHECK(v.token != draft);
        }
      }
      for (std::size_t id = 0; id < 5; ++id) {
        double const sigma = std::sqrt(p[id] * (1 - p[id]) / n);
        CHECK(std::abs(count[id] / double(n) - p[id]) <= 5 * sigma + 1e-9);
      }
      double const sa = std::sqrt(p[std::size_t(draft)] * (1 - p[std::size_t(draft)]) / n);
      CHECK(std::abs(accepted / double(n) - p[std::size_t(draft)]) <= 5 * sa + 1e-9);
    }
  }
  // greedy: the argmax, accepted exactly when it is the draft; penalties apply as in sample()
  Sampler g(with(0.0f, 0, 1.0f, 0.0f));
  CHECK(g.verify(probs, {}, 1).token == 1);
  CHECK(g.verify(probs, {}, 1).accepted);
  CHECK_FALSE(g.verify(probs, {}, 3).accepted);
  CHECK(g.verify(probs, {}, 3).token == 1);
  auto pen = with(0.0f, 0, 1.0f, 0.0f);
  pen.repetition_penalty = 100.0f;  // log(0.5) < 0 becomes ·100: token 1 falls below token 3
  Sampler gp(pen);
  std::vector<std::int32_t> hist{1};
  CHECK(gp.verify(probs, hist, 3).token == gp.sample(probs, hist));
  CHECK(gp.verify(probs, hist, 3).accepted);
}

TEST_CASE("sampling: bad parameters are errors") {
  CHECK_THROWS_AS(Sampler(with(1.0f, -1, 1.0f, 0.0f)), ling::Error);
  CHECK_THROWS_AS(Sampler(with(1.0f, 0, 0.0f, 0.0f)), ling::Error);
  CHECK_THROWS_AS(Sampler(with(1.0f, 0, 1.0f, 1.5f)), ling::Error);
  Sampler s(with(1.0f, 0, 1.0f, 0.0f));
  CHECK_THROWS_AS(s.sample(std::vector<float>{}), ling::Error);
}

TEST_CASE("stop strings: held back while matching, never emitted") {
  StopStringMatcher m({"STOP", "\n\nUser:"});
  auto r1 = m.push("Hello ST");
  CHECK(r1.text == "Hello ");
  CHECK_FALSE(r1.stop);
  auto r2 = m.push("OP more");
  CHECK(r2.text == "");
  REQUIRE(r2.stop);
  CHECK(*r2.stop == "STOP");
  CHECK(m.push("x").text.empty());

  StopStringMatcher n({"STOP"});
  std::string out;
  for (char c : std::string("STAY STO")) out += n.push(std::string(1, c)).text;
  CHECK(out == "STAY ");
  CHECK(n.finish() == "STO");

  // random texts split at every position: output is the text before the first stop occurrence
  std::mt19937_64 rng(5);
  std::string const alphabet = "ab\n:Us";
  int checked = 0;
  for (int t = 0; t < 200; ++t) {
    std::string text;
    for (int i = 0; i < 24; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops = {"aab", "\n\nU", "s:"};
    std::size_t first = std::string::npos;
    for (auto const& s : stops) first = std::min(first, text.find(s));
    std::string want = text.substr(0, first);
    for (std::size_t p = 0; p <= text.size(); ++p) {
      StopStringMatcher sm(stops);
      std::string got = sm.push(text.substr(0, p)).text;
      auto r = sm.push(text.substr(p));
      got += r.text;
      if (!r.stop && !sm.stopped()) got += sm.finish();
      CHECK(got == want);
      CHECK(sm.stopped() == (first != std::string::npos));
      ++checked;
    }
  }
  CHECK(checked == 200 * 25);
}
