#pragma once
// The Ling chat format (spec §5, ling3.md), exactly:
//   "<role>SYSTEM</role>" + (system.empty() ? "" : system + "\n") + "detailed thinking " + ("on"|"off") + "<|role_end|>"
//   then per turn "<role>HUMAN</role>" + user + "<|role_end|><role>ASSISTANT</role>",
//   and for a past turn its assistant reply + "<|role_end|>".
// With thinking on, a reply opens with "\n<think>\n" ... "\n</think>\n\n" before the answer. strip_thinking() and
// ThinkFilter (streaming) remove that part when asked; by default it is shown.
#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ling::io {

inline constexpr std::string_view kRoleEnd = "<|role_end|>";
inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";

struct ChatTurn {
  std::string user;
  std::string assistant;  // empty for the turn being answered (must be the last one)
};

struct ChatOptions {
  std::string system;
  bool think = true;
};

// The prompt for turns[...]: every turn but the last is a past one with its reply; the last one is left open
// after "<role>ASSISTANT</role>" for the model to answer.
inline std::string chat_prompt(std::span<ChatTurn const> turns, ChatOptions const& options) {
  std::string p = "<role>SYSTEM</role>";
  if (!options.system.empty()) p += options.system + "\n";
  p += "detailed thinking ";
  p += options.think ? "on" : "off";
  p += kRoleEnd;
  for (std::size_t i = 0; i < turns.size(); ++i) {
    p += "<role>HUMAN</role>";
    p += turns[i].user;
    p += kRoleEnd;
    p += "<role>ASSISTANT</role>";
    if (i + 1 < turns.size()) {
      p += turns[i].assistant;
      p += kRoleEnd;
    }
  }
  return p;
}

inline std::string chat_prompt(std::string_view user, ChatOptions const& options) {
  ChatTurn t{std::string(user), {}};
  return chat_prompt(std::span<ChatTurn const>(&t, 1), options);
}

// The answer part of a reply: without a "<think>" block (and the newlines after "</think>"); a reply whose
// thinking never closed has no answer (""). A reply with no "<think>" comes back unchanged.
inline std::string strip_thinking(std::string_view reply) {
  std::size_t i = 0;
  while (i < reply.size() && (reply[i] == '\n' || reply[i] == ' ' || reply[i] == '\r' || reply[i] == '\t')) ++i;
  if (reply.compare(i, kThinkOpen.size(), kThinkOpen) != 0) return std::string(reply);
  auto close = reply.find(kThinkClose, i + kThinkOpen.size());
  if (close == std::string_view::npos) return {};
  std::size_t a = close + kThinkClose.size();
  while (a < reply.size() && (reply[a] == '\n' || reply[a] == '\r')) ++a;
  return std::string(reply.substr(a));
}

// Streaming form of strip_thinking: push pieces of a reply, get the visible text. With hide=false it passes
// everything through unchanged. Leading whitespace is held until it is known whether a "<think>" follows.
class ThinkFilter {
 public:
  explicit ThinkFilter(bool hide = true) : hide_(hide) {}

  std::string push(std::string_view piece) {
    if (!hide_) return std::string(piece);
    std::string out;
    buf_.append(piece);
    for (;;) {
      if (state_ == State::kStart) {
        std::size_t i = 0;
        while (i < buf_.size() && (buf_[i] == '\n' || buf_[i] == ' ' || buf_[i] == '\r' || buf_[i] == '\t')) ++i;
        std::string_view rest = std::string_view(buf_).substr(i);
        if (rest.size() >= kThinkOpen.size()) {
          if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
            buf_.erase(0, i + kThinkOpen.size());
            state_ = State::kThinking;
            continue;
          }
        } else if (kThinkOpen.substr(0, rest.size()) == rest) {
          return out;  // could still become "<think>": wait
        }
        state_ = State::kAnswer;  // no thinking block: pass everything
        out += buf_;
        buf_.clear();
        return out;
      }
      if (state_ == State::kThinking) {
        auto close = buf_.find(kThinkClose);
        if (close == std::string::npos) {
          // keep only what may be the start of "</think>"
          std::size_t keep = std::min(buf_.size(), kThinkClose.size() - 1);
          buf_.erase(0, buf_.size() - keep);
          return out;
        }
        buf_.erase(0, close + kThinkClose.size());
        state_ = State::kAfterClose;
        continue;
      }
      if (state_ == State::kAfterClose) {
        std::size_t i = 0;
        while (i < buf_.size() && (buf_[i] == '\n' || buf_[i] == '\r')) ++i;
        if (i == buf_.size()) {
          buf_.clear();
          return out;
        }
        buf_.erase(0, i);
        state_ = State::kAnswer;
        continue;
      }
      out += buf_;  // kAnswer
      buf_.clear();
      return out;
    }
  }

  // End of reply: releases held leading whitespace (a reply that never opened "<think>").
  std::string finish() {
    std::string out;
    if (hide_ && state_ == State::kStart) out.swap(buf_);
    buf_.clear();
    return out;
  }

  bool in_thinking() const noexcept { return state_ == State::kThinking; }

 private:
  enum class State { kStart, kThinking, kAfterClose, kAnswer };
  bool hide_;
  State state_ = State::kStart;
  std::string buf_;
};

// A multi-turn conversation, kept as turns; prompt() renders it for the next answer.
class Conversation {
 public:
  explicit Conversation(ChatOptions options = {}) : options_(std::move(options)) {}
  void add_user(std::string text) { turns_.push_back({std::move(text), {}}); }
  // The reply to the last user turn, as it should appear in later prompts (the CLI stores it without thinking).
  void add_assistant(std::string text) {
    if (!turns_.empty()) turns_.back().assistant = std::move(text);
  }
  std::string prompt() const { return chat_prompt(turns_, options_); }
  void reset() { turns_.clear(); }
  ChatOptions& options() noexcept { return options_; }
  std::vector<ChatTurn> const& turns() const noexcept { return turns_; }

 private:
  ChatOptions options_;
  std::vector<ChatTurn> turns_;
};

}  // namespace ling::io
