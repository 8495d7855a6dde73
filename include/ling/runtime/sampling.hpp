#pragma once
// Sampling of the next token from one position's logits.
// Order (as HF transformers' logits processors): repetition penalty (CTRL: positive logits divided, negative
// multiplied, once per distinct token seen) and presence penalty (subtracted once per distinct token seen) ->
// greedy argmax if temperature <= 0 -> logits / temperature -> softmax -> top-k -> top-p -> min-p (each filter
// renormalizes what it keeps) -> one draw. The penalties see the prompt and the generated tokens (HF does the same);
// penalty_last_n > 0 limits them to the last n tokens. Draws use std::mt19937_64 seeded with `seed` and a portable
// 53-bit uniform, so the same seed gives the same tokens on every platform.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "ling/core/error.hpp"

namespace ling::runtime {

struct SamplingParams {
  float temperature = 1.0f;          // <= 0: greedy
  std::int32_t top_k = 0;            // 0: off
  float top_p = 1.0f;                // 1: off
  float min_p = 0.0f;                // 0: off
  float repetition_penalty = 1.0f;   // 1: off (CTRL-style)
  float presence_penalty = 0.0f;     // 0: off
  std::int32_t penalty_last_n = 0;   // 0: whole history (prompt + generated)
  std::uint64_t seed = 0;
  std::int64_t max_new_tokens = 512;
  std::vector<std::int32_t> stop_token_ids;  // end generation; the token is not emitted
  std::vector<std::string> stop_strings;     // end generation; the string is not emitted

  void validate() const {
    auto bad = [](std::string const& what) { fail(ErrorCode::kInvalidArgument, "sampling: " + what); };
    if (!std::isfinite(temperature)) bad("temperature must be finite");
    if (top_k < 0) bad("top_k must be >= 0");
    if (!(top_p > 0.0f && top_p <= 1.0f)) bad("top_p must be in (0, 1]");
    if (!(min_p >= 0.0f && min_p <= 1.0f)) bad("min_p must be in [0, 1]");
    if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) bad("repetition_penalty must be > 0");
    if (!std::isfinite(presence_penalty)) bad("presence_penalty must be finite");
    if (penalty_last_n < 0) bad("penalty_last_n must be >= 0");
    if (max_new_tokens < 0) bad("max_new_tokens must be >= 0");
    for (auto const& s : stop_strings)
      if (s.empty()) bad("a stop string is empty");
  }
};

struct Candidate {
  std::int32_t id;
  float p;
};

class Sampler {
 public:
  explicit Sampler(SamplingParams params) : params_(std::move(params)), rng_(params_.seed) { params_.validate(); }

  SamplingParams const& params() const noexcept { return params_; }
  void reseed(std::uint64_t seed) { rng_.seed(seed); }

  // Penalties on logits in place, for each distinct token in history (its last penalty_last_n entries).
  static void apply_penalties(std::span<float> logits, std::span<std::int32_t const> history, float repetition,
                              float presence, std::int32_t last_n = 0) {
    if (repetition == 1.0f && presence == 0.0f) return;
    if (last_n > 0 && history.size() > static_cast<std::size_t>(last_n)) history = history.last(static_cast<std::size_t>(last_n));
    std::unordered_set<std::int32_t> seen;
    for (auto id : history) {
      if (id < 0 || static_cast<std::size_t>(id) >= logits.size() || !seen.insert(id).second) continue;
      float& l = logits[static_cast<std::size_t>(id)];
      if (repetition != 1.0f) l = l > 0 ? l / repetition : l * repetition;
      l -= presence;
    }
  }

  // The distribution the next draw uses: candidates (id, probability) after every filter, sorted by probability
  // (descending; ties by id). Empty only for greedy, where sample() takes the argmax instead.
  std::vector<Candidate> distribution(std::span<float const> logits, std::span<std::int32_t const> history) {
    prepare_(logits, history);
    if (params_.temperature <= 0.0f) return {};
    return filtered_();
  }

  // One token id.
  std::int32_t sample(std::span<float const> logits, std::span<std::int32_t const> history = {}) {
    prepare_(logits, history);
    if (params_.temperature <= 0.0f) return argmax_();
    if (params_.top_k <= 0 && params_.top_p >= 1.0f && params_.min_p <= 0.0f) return draw_unfiltered_();
    auto cand = filtered_();
    double u = uniform_();
    double acc = 0;
    for (auto const& c : cand) {
      acc += c.p;
      if (u < acc) return c.id;
    }
    return cand.back().id;  // u within rounding of 1
  }

  // Speculative decoding's acceptance rule for a draft token proposed without a distribution of its own (the MTP
  // head's argmax, a one-hot proposal). Greedy: the argmax, accepted when it is the draft. Otherwise the draft is
  // accepted with its probability p(draft) under this sampler's distribution (every filter applied); on rejection the
  // token is drawn from that distribution without the draft. So P(token = x) = p(x) for every x: the same
  // distribution as sample(), whatever the draft (it only changes how many tokens a verification step yields).
  struct Verdict {
    std::int32_t token = -1;
    bool accepted = false;
  };
  Verdict verify(std::span<float const> logits, std::span<std::int32_t const> history, std::int32_t draft) {
    prepare_(logits, history);
    if (params_.temperature <= 0.0f) {
      std::int32_t const t = argmax_();
      return {t, t == draft};
    }
    auto cand = filtered_();
    double pd = 0;
    for (auto const& c : cand)
      if (c.id == draft) pd = c.p;
    double const u = uniform_();
    if (u < pd) return {draft, true};
    // u is uniform on [pd, 1): rescaled, it draws from the candidates without the draft
    double const v = u - pd;
    double acc = 0;
    std::int32_t last = -1;
    for (auto const& c : cand) {
      if (c.id == draft) continue;
      acc += c.p;
      last = c.id;
      if (v < acc) return {c.id, false};
    }
    // v within rounding of the rest's mass: the last other candidate, or the draft when it held all of it
    return last >= 0 ? Verdict{last, false} : Verdict{draft, true};
  }

 private:
  void prepare_(std::span<float const> logits, std::span<std::int32_t const> history) {
    if (logits.empty()) fail(ErrorCode::kInvalidArgument, "sampling: empty logits");
    work_.assign(logits.begin(), logits.end());
    apply_penalties(work_, history, params_.repetition_penalty, params_.presence_penalty, params_.penalty_last_n);
  }

  std::int32_t argmax_() const {
    std::size_t best = 0;
    for (std::size_t i = 1; i < work_.size(); ++i)
      if (work_[i] > work_[best] || std::isnan(work_[best])) best = i;
    if (std::isnan(work_[best])) fail(ErrorCode::kInvalidArgument, "sampling: logits are all NaN");
    return static_cast<std::int32_t>(best);
  }

  // softmax(logits / T) then top-k, top-p, min-p. Only the head of the sorted distribution is materialized: it grows
  // until it holds top_k, or the top_p mass, or everything above min_p * p_max.
  std::vector<Candidate> filtered_() {
    double const inv_t = 1.0 / params_.temperature;
    std::size_t const n = work_.size();
    float mx = -std::numeric_limits<float>::infinity();
    for (float l : work_)
      if (l > mx) mx = l;
    if (!std::isfinite(mx)) fail(ErrorCode::kInvalidArgument, "sampling: no finite logit");
    // probabilities (unnormalized, in double for the sums) over the whole vocabulary
    prob_.resize(n);
    double total = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double e = std::isnan(work_[i]) ? 0.0 : std::exp((static_cast<double>(work_[i]) - mx) * inv_t);
      prob_[i] = e;
      total += e;
    }
    idx_.resize(n);
    for (std::size_t i = 0; i < n; ++i) idx_[i] = static_cast<std::int32_t>(i);
    auto by_prob = [&](std::int32_t a, std::int32_t b) {
      return prob_[static_cast<std::size_t>(a)] > prob_[static_cast<std::size_t>(b)] ||
             (prob_[static_cast<std::size_t>(a)] == prob_[static_cast<std::size_t>(b)] && a < b);
    };
    std::size_t const k = params_.top_k > 0 ? std::min<std::size_t>(static_cast<std::size_t>(params_.top_k), n) : n;
    bool const top_p_on = params_.top_p < 1.0f, min_p_on = params_.min_p > 0.0f;
    std::size_t head = k;
    if (k == n && (top_p_on || min_p_on)) {
      // no top-k cut: sort only as far as top-p / min-p reach, growing the sorted head geometrically
      head = std::min<std::size_t>(n, 256);
      for (;;) {
        std::partial_sort(idx_.begin(), idx_.begin() + static_cast<std::ptrdiff_t>(head), idx_.end(), by_prob);
        if (head == n) break;
        double cum = 0;
        for (std::size_t i = 0; i < head; ++i) cum += prob_[static_cast<std::size_t>(idx_[i])];
        double pmax = prob_[static_cast<std::size_t>(idx_[0])];
        if (top_p_on && cum >= params_.top_p * total) break;
        if (min_p_on && prob_[static_cast<std::size_t>(idx_[head - 1])] < params_.min_p * pmax) break;
        head = std::min(n, head * 4);
      }
    } else {
      std::partial_sort(idx_.begin(), idx_.begin() + static_cast<std::ptrdiff_t>(head), idx_.end(), by_prob);
    }
    // mass of what top-k keeps (everything when there is no cut)
    double mass = total;
    if (k < n) {
      mass = 0;
      for (std::size_t i = 0; i < k; ++i) mass += prob_[static_cast<std::size_t>(idx_[i])];
    }
    std::size_t keep = head;  // if top-p's cut lies beyond the head, min-p cuts inside it (see the loop above)
    if (top_p_on) {
      double cum = 0;
      for (std::size_t i = 0; i < head; ++i) {
        cum += prob_[static_cast<std::size_t>(idx_[i])];
        if (cum >= params_.top_p * mass) {
          keep = i + 1;
          break;
        }
      }
    }
    if (min_p_on) {
      double thresh = params_.min_p * prob_[static_cast<std::size_t>(idx_[0])];
      std::size_t m = 1;
      while (m < keep && prob_[static_cast<std::size_t>(idx_[m])] >= thresh) ++m;
      keep = m;
    }
    double sum = 0;
    for (std::size_t i = 0; i < keep; ++i) sum += prob_[static_cast<std::size_t>(idx_[i])];
    std::vector<Candidate> out(keep);
    for (std::size_t i = 0; i < keep; ++i)
      out[i] = {idx_[i], static_cast<float>(prob_[static_cast<std::size_t>(idx_[i])] / sum)};
    return out;
  }

  // Plain temperature sampling: a linear scan, no sort (same softmax as filtered_()).
  std::int32_t draw_unfiltered_() {
    double const inv_t = 1.0 / params_.temperature;
    float mx = -std::numeric_limits<float>::infinity();
    for (float l : work_)
      if (l > mx) mx = l;
    if (!std::isfinite(mx)) fail(ErrorCode::kInvalidArgument, "sampling: no finite logit");
    prob_.resize(work_.size());
    double total = 0;
    for (std::size_t i = 0; i < work_.size(); ++i) {
      prob_[i] = std::isnan(work_[i]) ? 0.0 : std::exp((static_cast<double>(work_[i]) - mx) * inv_t);
      total += prob_[i];
    }
    double u = uniform_() * total, acc = 0;
    std::size_t last = 0;
    for (std::size_t i = 0; i < prob_.size(); ++i) {
      if (prob_[i] == 0.0) continue;
      acc += prob_[i];
      last = i;
      if (u < acc) return static_cast<std::int32_t>(i);
    }
    return static_cast<std::int32_t>(last);
  }

  double uniform_() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<double> prob_;
  std::vector<std::int32_t> idx_;
};

}  // namespace ling::runtime
