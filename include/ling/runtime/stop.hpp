#pragma once
// Stop strings over streamed text: text that may still be the start of a stop string is held back; once a stop
// string appears, the text before it is released and nothing after (the stop string itself is never emitted).
// Input pieces are whole UTF-8 characters; held-back text always starts at a character boundary (a stop string's
// first byte is a lead byte), so released text is whole characters too.
#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ling::runtime {

class StopStringMatcher {
 public:
  StopStringMatcher() = default;
  explicit StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
    stops_.erase(std::remove_if(stops_.begin(), stops_.end(), [](auto const& s) { return s.empty(); }), stops_.end());
  }

  struct Result {
    std::string text;                  // safe to emit now
    std::optional<std::string> stop;   // the stop string that ended the stream, if one did
  };

  // Feed the next piece. After a stop, further pushes return nothing.
  Result push(std::string_view piece) {
    Result r;
    if (stopped_) return r;
    held_.append(piece);
    // earliest occurrence of any stop string (longest wins at equal position)
    std::size_t best = std::string::npos, best_len = 0;
    std::string const* which = nullptr;
    for (auto const& s : stops_) {
      auto p = held_.find(s);
      if (p != std::string::npos && (p < best || (p == best && s.size() > best_len))) {
        best = p;
        best_len = s.size();
        which = &s;
      }
    }
    if (which) {
      r.text = held_.substr(0, best);
      r.stop = *which;
      held_.clear();
      stopped_ = true;
      return r;
    }
    // hold back the longest suffix that is a proper prefix of some stop string
    std::size_t keep = 0;
    for (auto const& s : stops_) {
      std::size_t max_k = std::min(s.size() - 1, held_.size());
      for (std::size_t k = max_k; k > keep; --k)
        if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
          keep = k;
          break;
        }
    }
    r.text = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return r;
  }

  // End of stream without a stop: release what was held back.
  std::string finish() {
    std::string out;
    if (!stopped_) out.swap(held_);
    held_.clear();
    return out;
  }

  bool stopped() const noexcept { return stopped_; }
  std::size_t held_bytes() const noexcept { return held_.size(); }
  void reset() {
    held_.clear();
    stopped_ = false;
  }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace ling::runtime
