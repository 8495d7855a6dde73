#pragma once
// Tokenizer: HF `tokenizer.json` byte-level BPE (spec §5, ling3.md), ids equal to the HF `tokenizers` package's.
//
// Encode: (1) input that is not valid UTF-8 is first made valid, each maximal invalid subpart replaced by U+FFFD
// (what Python's bytes.decode("utf-8", "replace") and Rust's from_utf8_lossy do); (2) added tokens are split out,
// leftmost-longest, first those with normalized=false, then those with normalized=true (HF's two passes), honouring
// lstrip / rstrip / single_word; with parse_special=false the special ones stay text; (3) normalizer (null, or NFC on
// text that NFC cannot change, else an Error); (4) pre-tokenizer: Sequence / Split (PCRE2, UTF + UCP, JIT) /
// ByteLevel (prefix space, GPT-2 regex); (5) ranked BPE per word on the GPT-2 byte->char map, cached per word.
// Decode: ByteLevel decoder (per token: chars -> bytes when every char is in the map, else the token's own UTF-8),
// then invalid UTF-8 -> U+FFFD as above. TokenStreamDecoder does the same incrementally and never emits a partial
// character. Unsupported features are a ling::Error naming the feature. docs/text.md has the details.
#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>
#include <nlohmann/json.hpp>

#include "ling/core/error.hpp"

namespace ling::io {

// ---- UTF-8 ------------------------------------------------------------------------------------------------------
namespace utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid sequence at s[i..] (1..4), 0 if the bytes there are a valid but incomplete prefix running to
// the end, or -k if the first k bytes are a maximal invalid subpart (one U+FFFD replaces them).
inline int scan(std::string_view s, std::size_t i) {
  auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b >= 0xC2 && b <= 0xDF) need = 1;
  else if (b == 0xE0) need = 2, lo = 0xA0;
  else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) need = 2;
  else if (b == 0xED) need = 2, hi = 0x9F;
  else if (b == 0xF0) need = 3, lo = 0x90;
  else if (b >= 0xF1 && b <= 0xF3) need = 3;
  else if (b == 0xF4) need = 3, hi = 0x8F;
  else return -1;
  for (int k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return 0;
    auto c = static_cast<unsigned char>(s[i + k]);
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) return -k;
  }
  return need + 1;
}

inline bool is_valid(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    int n = scan(s, i);
    if (n <= 0) return false;
    i += static_cast<std::size_t>(n);
  }
  return true;
}

// Valid UTF-8 with every maximal invalid subpart (and a truncated tail) replaced by U+FFFD.
inline std::string make_valid(std::string_view s) {
  if (is_valid(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  for (std::size_t i = 0; i < s.size();) {
    int n = scan(s, i);
    if (n > 0) {
      out.append(s.substr(i, static_cast<std::size_t>(n)));
      i += static_cast<std::size_t>(n);
    } else if (n < 0) {
      out.append(kReplacement);
      i += static_cast<std::size_t>(-n);
    } else {
      out.append(kReplacement);
      break;
    }
  }
  return out;
}

// Decodes the code point at s[i] of valid UTF-8 and advances i.
inline char32_t next(std::string_view s, std::size_t& i) {
  auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) { ++i; return b; }
  int n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  char32_t c = b & (0x7F >> n);
  for (int k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += static_cast<std::size_t>(n);
  return c;
}

// Code point before position i (valid UTF-8), moving i back.
inline char32_t prev(std::string_view s, std::size_t& i) {
  std::size_t j = i - 1;
  while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
  std::size_t k = j;
  char32_t c = next(s, k);
  i = j;
  return c;
}

inline void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// Rust's char::is_whitespace (Unicode White_Space), used by added-token lstrip/rstrip as in HF.
inline bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Incremental UTF-8: push bytes, get back only complete characters (invalid subparts as U+FFFD at once);
// finish() turns a held-back incomplete tail into one U+FFFD. push-all-then-finish == make_valid(all).
class Assembler {
 public:
  std::string push(std::string_view bytes) {
    pending_.append(bytes);
    std::string out;
    std::size_t i = 0;
    while (i < pending_.size()) {
      int n = scan(pending_, i);
      if (n == 0) break;  // incomplete: wait for more
      if (n > 0) {
        out.append(pending_, i, static_cast<std::size_t>(n));
        i += static_cast<std::size_t>(n);
      } else {
        out.append(kReplacement);
        i += static_cast<std::size_t>(-n);
      }
    }
    pending_.erase(0, i);
    return out;
  }
  std::string finish() {
    std::string out = pending_.empty() ? std::string() : std::string(kReplacement);
    pending_.clear();
    return out;
  }
  std::size_t pending_bytes() const noexcept { return pending_.size(); }
  void reset() noexcept { pending_.clear(); }

 private:
  std::string pending_;
};

}  // namespace utf8

// ---- PCRE2 regex (UTF + UCP, JIT when available) ------------------------------------------------------------------
class Regex {
 public:
  Regex() = default;
  Regex(std::string const& pattern, std::string const& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail(ErrorCode::kFormat, where + ": regex does not compile at offset " + std::to_string(off) + ": " +
                                   reinterpret_cast<char const*>(msg) + " (pattern: " + pattern + ")");
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // failure is fine: pcre2_match interprets
    code_.reset(code, Free{});
  }
  explicit operator bool() const noexcept { return code_ != nullptr; }

  // Half-open [begin, end) byte ranges of all non-overlapping matches in s (valid UTF-8), left to right.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view s) const {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr), &pcre2_match_data_free);
    if (!md) fail(ErrorCode::kOutOfMemory, "tokenizer: pcre2_match_data_create failed");
    auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    std::size_t start = 0;
    while (start <= s.size()) {
      int rc = pcre2_match(code_.get(), subject, s.size(), start, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        fail(ErrorCode::kInternal, std::string("tokenizer: regex match failed: ") + reinterpret_cast<char const*>(msg));
      }
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      std::size_t b = ov[0], e = ov[1];
      if (e > b) {
        out.emplace_back(b, e);
        start = e;
      } else {  // empty match: step over one character
        if (b >= s.size()) break;
        std::size_t i = b;
        utf8::next(s, i);
        start = i;
      }
    }
    return out;
  }

 private:
  struct Free {
    void operator()(pcre2_code* c) const noexcept { pcre2_code_free(c); }
  };
  // shared: a compiled pattern is immutable and pcre2_match on it is thread-safe, so copies share it.
  std::shared_ptr<pcre2_code> code_;
};

// ---- the tokenizer ------------------------------------------------------------------------------------------------
struct AddedToken {
  std::int32_t id = 0;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

class Tokenizer {
 public:
  // The pre-tokenizer regex of GPT-2 (HF ByteLevel with use_regex=true).
  static constexpr std::string_view kGpt2Regex =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

  // path: a tokenizer.json, or a directory holding one.
  static Tokenizer load(std::filesystem::path const& path) {
    std::filesystem::path file = path;
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) file = path / "tokenizer.json";
    std::ifstream in(file, std::ios::binary);
    if (!in) fail(ErrorCode::kIo, "cannot open tokenizer file " + file.string());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return from_json_text(text, file.string());
  }

  static Tokenizer from_json_text(std::string_view text, std::string const& source = "tokenizer.json") {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) fail(ErrorCode::kFormat, source + ": not a JSON object");
    Tokenizer t;
    t.source_ = source;
    t.parse_(j);
    return t;
  }

  // Token ids of text. parse_special=false keeps special added tokens as plain text (HF encode_special_tokens).
  // Never adds BOS/EOS (HF add_special_tokens=False; the post-processor is not applied).
  std::vector<std::int32_t> encode(std::string_view text, bool parse_special = true) const {
    std::string valid = utf8::make_valid(text);
    std::string_view s = valid;
    std::vector<std::int32_t> ids;
    // pass 1: added tokens with normalized=false on the raw text; pass 2: normalized=true ones on what is left.
    for (auto const& [piece, id] : split_added_(s, false, parse_special)) {
      if (id >= 0) {
        ids.push_back(id);
        continue;
      }
      for (auto const& [piece2, id2] : split_added_(piece, true, parse_special)) {
        if (id2 >= 0) {
          ids.push_back(id2);
          continue;
        }
        normalize_check_(piece2);
        encode_plain_(piece2, ids);
      }
    }
    return ids;
  }

  // Text of ids (HF decode with the ByteLevel decoder); invalid UTF-8 from split characters becomes U+FFFD.
  std::string decode(std::span<std::int32_t const> ids, bool skip_special = false) const {
    std::string bytes;
    for (auto id : ids) append_token_bytes(bytes, id, skip_special);
    return utf8::make_valid(bytes);
  }

  // The raw bytes of one token as the decoder sees them (may be a partial character); nothing if skipped.
  void append_token_bytes(std::string& out, std::int32_t id, bool skip_special = false) const {
    check_id_(id);
    if (skip_special && is_special(id)) return;
    out.append(token_bytes_[static_cast<std::size_t>(id)]);
  }

  std::optional<std::int32_t> token_to_id(std::string_view token) const {
    auto it = token_to_id_.find(std::string(token));
    if (it == token_to_id_.end()) return std::nullopt;
    return it->second;
  }
  // The token's string as stored in tokenizer.json (byte-level chars for model tokens, content for added ones).
  std::string const& id_to_token(std::int32_t id) const {
    check_id_(id);
    return id_to_token_[static_cast<std::size_t>(id)];
  }
  std::int64_t vocab_size() const noexcept { return static_cast<std::int64_t>(id_to_token_.size()); }
  std::vector<std::int32_t> special_ids() const {
    std::vector<std::int32_t> out;
    for (auto const& a : added_)
      if (a.special) out.push_back(a.id);
    std::sort(out.begin(), out.end());
    return out;
  }
  bool is_special(std::int32_t id) const noexcept {
    return id >= 0 && static_cast<std::size_t>(id) < is_special_.size() && is_special_[static_cast<std::size_t>(id)];
  }
  std::vector<AddedToken> const& added_tokens() const noexcept { return added_; }
  std::string const& source() const noexcept { return source_; }

  // GPT-2 byte <-> unicode map: printable Latin-1 bytes map to themselves, the other 68 to U+0100.. in order.
  static std::array<char32_t, 256> const& byte_to_char() {
    static std::array<char32_t, 256> const map = [] {
      std::array<char32_t, 256> m{};
      char32_t next = 256;
      for (int b = 0; b < 256; ++b) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        m[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
      }
      return m;
    }();
    return map;
  }
  static int char_to_byte(char32_t c) {
    static std::array<std::int16_t, 324> const inv = [] {
      std::array<std::int16_t, 324> m{};
      m.fill(-1);
      auto const& f = byte_to_char();
      for (int b = 0; b < 256; ++b) m[f[static_cast<std::size_t>(b)]] = static_cast<std::int16_t>(b);
      return m;
    }();
    return c < inv.size() ? inv[c] : -1;
  }

 private:
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct PreStep {
    enum Kind { kSplit, kByteLevel } kind = kSplit;
    Regex regex;           // kSplit with a regex, or kByteLevel with use_regex
    std::string literal;   // kSplit with a String pattern
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;
  };
  struct Merge {
    std::int32_t rank, merged;
  };

  void fail_at_(std::string const& field, std::string const& what, ErrorCode code = ErrorCode::kFormat) const {
    fail(code, source_ + ": " + field + ": " + what);
  }

  void check_id_(std::int32_t id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= id_to_token_.size() || !has_token_[static_cast<std::size_t>(id)])
      fail(ErrorCode::kInvalidArgument, "token id " + std::to_string(id) + " is not in the vocabulary of " + source_ +
                                            " (size " + std::to_string(id_to_token_.size()) + ")");
  }

  static std::string to_byte_chars_(std::string_view bytes) {
    std::string out;
    auto const& m = byte_to_char();
    for (unsigned char b : bytes) utf8::append(out, m[b]);
    return out;
  }

  void set_token_(std::int32_t id, std::string const& tok) {
    auto i = static_cast<std::size_t>(id);
    if (i >= id_to_token_.size()) {
      id_to_token_.resize(i + 1);
      has_token_.resize(i + 1, false);
      is_special_.resize(i + 1, false);
    }
    id_to_token_[i] = tok;
    has_token_[i] = true;
  }

  void parse_(nlohmann::json const& j) {
    // --- model ---
    if (!j.contains("model") || !j["model"].is_object()) fail_at_("model", "missing (expected a BPE model object)");
    auto const& m = j["model"];
    std::string type = m.value("type", std::string());
    if (type.empty() && m.contains("merges")) type = "BPE";  // old files omit the type
    if (type != "BPE")
      fail_at_("model.type", "\"" + type + "\" is not supported (only byte-level \"BPE\")", ErrorCode::kUnsupported);
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].is_number() && m["dropout"].get<double>() > 0)
      fail_at_("model.dropout", "BPE dropout is not supported", ErrorCode::kUnsupported);
    for (char const* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty())
        fail_at_(std::string("model.") + k, "is not supported (byte-level BPE has none)", ErrorCode::kUnsupported);
    if (m.value("byte_fallback", false))
      fail_at_("model.byte_fallback", "byte fallback is not supported (byte-level BPE needs none)",
               ErrorCode::kUnsupported);
    ignore_merges_ = m.value("ignore_merges", false);

    if (!m.contains("vocab") || !m["vocab"].is_object()) fail_at_("model.vocab", "missing or not an object");
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
      if (!it.value().is_number_integer()) fail_at_("model.vocab[\"" + it.key() + "\"]", "id is not an integer");
      auto id = it.value().get<std::int64_t>();
      if (id < 0 || id > (1 << 30)) fail_at_("model.vocab[\"" + it.key() + "\"]", "id out of range");
      set_token_(static_cast<std::int32_t>(id), it.key());
      token_to_id_[it.key()] = static_cast<std::int32_t>(id);
    }
    if (token_to_id_.empty()) fail_at_("model.vocab", "is empty");
    auto const& b2c = byte_to_char();
    for (int b = 0; b < 256; ++b) {
      std::string ch;
      utf8::append(ch, b2c[static_cast<std::size_t>(b)]);
      auto it = token_to_id_.find(ch);
      byte_id_[static_cast<std::size_t>(b)] = it == token_to_id_.end() ? -1 : it->second;
    }

    if (!m.contains("merges") || !m["merges"].is_array()) fail_at_("model.merges", "missing or not an array");
    std::int32_t rank = 0;
    for (auto const& e : m["merges"]) {
      std::string a, b;
      std::string where = "model.merges[" + std::to_string(rank) + "]";
      if (e.is_string()) {
        auto s = e.get<std::string>();
        auto sp = s.find(' ');
        if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() || s.find(' ', sp + 1) != std::string::npos)
          fail_at_(where, "\"" + s + "\" is not of the form \"left right\"");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      } else {
        fail_at_(where, "is neither \"a b\" nor [\"a\", \"b\"]");
      }
      auto ia = token_to_id_.find(a), ib = token_to_id_.find(b), im = token_to_id_.find(a + b);
      if (ia == token_to_id_.end()) fail_at_(where, "left part \"" + a + "\" is not in the vocab");
      if (ib == token_to_id_.end()) fail_at_(where, "right part \"" + b + "\" is not in the vocab");
      if (im == token_to_id_.end()) fail_at_(where, "merged token \"" + a + b + "\" is not in the vocab");
      merges_.try_emplace(pair_key_(ia->second, ib->second), Merge{rank, im->second});
      ++rank;
    }

    // --- added tokens ---
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      if (!j["added_tokens"].is_array()) fail_at_("added_tokens", "not an array");
      std::size_t k = 0;
      for (auto const& e : j["added_tokens"]) {
        std::string where = "added_tokens[" + std::to_string(k++) + "]";
        if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer() || !e.contains("content") ||
            !e["content"].is_string())
          fail_at_(where, "needs an integer \"id\" and a string \"content\"");
        AddedToken a;
        a.id = e["id"].get<std::int32_t>();
        if (a.id < 0) fail_at_(where, "negative id");
        a.content = e["content"].get<std::string>();
        if (a.content.empty()) fail_at_(where, "empty content");
        if (!utf8::is_valid(a.content)) fail_at_(where, "content is not valid UTF-8");
        a.special = e.value("special", false);
        a.lstrip = e.value("lstrip", false);
        a.rstrip = e.value("rstrip", false);
        a.single_word = e.value("single_word", false);
        a.normalized = e.value("normalized", !a.special);
        set_token_(a.id, a.content);
        token_to_id_[a.content] = a.id;
        added_.push_back(a);
      }
    }
    // longest first so that the first hit at a position is the longest (leftmost-longest)
    added_by_length_.resize(added_.size());
    for (std::size_t i = 0; i < added_.size(); ++i) added_by_length_[i] = i;
    std::stable_sort(added_by_length_.begin(), added_by_length_.end(),
                     [&](std::size_t x, std::size_t y) { return added_[x].content.size() > added_[y].content.size(); });
    for (auto const& a : added_) {
      if (a.special) is_special_[static_cast<std::size_t>(a.id)] = true;
      added_first_byte_[a.normalized ? 1 : 0][static_cast<unsigned char>(a.content[0])] = true;
    }
    for (auto const& a : added_)
      if (a.single_word) word_char_ = Regex(R"(^[\p{L}\p{N}\p{M}_])", source_ + ": single_word");

    // --- normalizer ---
    if (j.contains("normalizer") && !j["normalizer"].is_null()) parse_normalizer_(j["normalizer"], "normalizer");

    // --- pre-tokenizer: (Split)* ByteLevel, possibly in a Sequence ---
    if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
      fail_at_("pre_tokenizer", "missing: a byte-level BPE needs a ByteLevel pre-tokenizer", ErrorCode::kUnsupported);
    parse_pre_(j["pre_tokenizer"], "pre_tokenizer");
    if (pre_.empty() || pre_.back().kind != PreStep::kByteLevel)
      fail_at_("pre_tokenizer", "must end with ByteLevel (only byte-level BPE is supported)", ErrorCode::kUnsupported);
    for (std::size_t i = 0; i + 1 < pre_.size(); ++i)
      if (pre_[i].kind == PreStep::kByteLevel)
        fail_at_("pre_tokenizer", "ByteLevel must be the last step of the Sequence", ErrorCode::kUnsupported);

    // --- decoder ---
    if (j.contains("decoder") && !j["decoder"].is_null()) parse_decoder_(j["decoder"], "decoder");

    // what decode() emits per id: the ByteLevel decoder maps a token's chars to bytes when all are in the map,
    // else keeps the token's own UTF-8 (HF decoders/byte_level.rs)
    token_bytes_.resize(id_to_token_.size());
    for (std::size_t id = 0; id < id_to_token_.size(); ++id) {
      std::string const& tok = id_to_token_[id];
      std::string bytes;
      bool all = true;
      for (std::size_t i = 0; i < tok.size();) {
        int b = char_to_byte(utf8::next(tok, i));
        if (b < 0) { all = false; break; }
        bytes.push_back(static_cast<char>(b));
      }
      token_bytes_[id] = all ? bytes : tok;
    }
  }

  void parse_normalizer_(nlohmann::json const& n, std::string const& where) {
    std::string type = n.value("type", std::string());
    if (type == "Sequence") {
      std::size_t k = 0;
      for (auto const& e : n.value("normalizers", nlohmann::json::array()))
        parse_normalizer_(e, where + ".normalizers[" + std::to_string(k++) + "]");
    } else if (type == "NFC") {
      nfc_ = true;  // checked per text in normalize_check_
    } else {
      fail_at_(where, "normalizer \"" + type + "\" is not supported (only null or NFC)", ErrorCode::kUnsupported);
    }
  }

  void parse_pre_(nlohmann::json const& p, std::string const& where) {
    if (!p.is_object()) fail_at_(where, "not an object");
    std::string type = p.value("type", std::string());
    if (type == "Sequence") {
      if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array())
        fail_at_(where + ".pretokenizers", "missing or not an array");
      std::size_t k = 0;
      for (auto const& e : p["pretokenizers"]) parse_pre_(e, where + ".pretokenizers[" + std::to_string(k++) + "]");
    } else if (type == "Split") {
      PreStep s;
      s.kind = PreStep::kSplit;
      if (!p.contains("pattern") || !p["pattern"].is_object()) fail_at_(where + ".pattern", "missing");
      auto const& pat = p["pattern"];
      if (pat.contains("Regex") && pat["Regex"].is_string()) {
        s.regex = Regex(pat["Regex"].get<std::string>(), source_ + ": " + where + ".pattern.Regex");
      } else if (pat.contains("String") && pat["String"].is_string()) {
        s.literal = pat["String"].get<std::string>();
        if (s.literal.empty()) fail_at_(where + ".pattern.String", "empty");
      } else {
        fail_at_(where + ".pattern", "needs \"Regex\" or \"String\"");
      }
      std::string b = p.value("behavior", std::string("Isolated"));
      if (b == "Removed") s.behavior = Behavior::kRemoved;
      else if (b == "Isolated") s.behavior = Behavior::kIsolated;
      else if (b == "MergedWithPrevious") s.behavior = Behavior::kMergedWithPrevious;
      else if (b == "MergedWithNext") s.behavior = Behavior::kMergedWithNext;
      else if (b == "Contiguous") s.behavior = Behavior::kContiguous;
      else fail_at_(where + ".behavior", "unknown split behavior \"" + b + "\"");
      s.invert = p.value("invert", false);
      pre_.push_back(std::move(s));
    } else if (type == "ByteLevel") {
      PreStep s;
      s.kind = PreStep::kByteLevel;
      s.add_prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) s.regex = Regex(std::string(kGpt2Regex), source_ + ": " + where + " (GPT-2 regex)");
      pre_.push_back(std::move(s));
    } else {
      fail_at_(where, "pre-tokenizer \"" + type + "\" is not supported (Sequence, Split, ByteLevel)",
               ErrorCode::kUnsupported);
    }
  }

  void parse_decoder_(nlohmann::json const& d, std::string const& where) {
    std::string type = d.value("type", std::string());
    if (type == "ByteLevel") return;
    if (type == "Sequence") {
      std::size_t k = 0;
      for (auto const& e : d.value("decoders", nlohmann::json::array()))
        parse_decoder_(e, where + ".decoders[" + std::to_string(k++) + "]");
      return;
    }
    fail_at_(where, "decoder \"" + type + "\" is not supported (only ByteLevel)", ErrorCode::kUnsupported);
  }

  void normalize_check_(std::string_view s) const {
    if (!nfc_) return;
    // NFC leaves text below U+0300 unchanged (no combining marks, no compositions start there); beyond it we would
    // need Unicode composition tables, which this build does not carry: say so rather than differ from HF silently.
    for (std::size_t i = 0; i < s.size();) {
      if (utf8::next(s, i) >= 0x300)
        fail(ErrorCode::kUnsupported, source_ + ": normalizer NFC is implemented only for text below U+0300; this "
                                                "text needs Unicode normalization");
    }
  }

  // Splits s around added tokens of one pass (normalized == which). Pieces with id -1 are plain text.
  std::vector<std::pair<std::string_view, std::int32_t>> split_added_(std::string_view s, bool normalized_pass,
                                                                       bool parse_special) const {
    std::vector<std::pair<std::string_view, std::int32_t>> out;
    bool any = false;
    for (auto const& a : added_) any |= a.normalized == normalized_pass;
    if (!any || s.empty()) {
      if (!s.empty()) out.emplace_back(s, -1);
      return out;
    }
    std::size_t start_offset = 0, pos = 0;
    while (pos < s.size()) {
      // leftmost-longest match at or after pos (all tokens of this pass, special ones included; the special ones
      // are dropped afterwards when parse_special is off, as HF does)
      std::size_t best = s.size();
      AddedToken const* hit = nullptr;
      auto const& first = added_first_byte_[normalized_pass ? 1 : 0];
      for (std::size_t i = pos; i < s.size() && !hit; ++i) {
        if (!first[static_cast<unsigned char>(s[i])]) continue;
        for (auto idx : added_by_length_) {
          auto const& a = added_[idx];
          if (a.normalized != normalized_pass) continue;
          if (s.compare(i, a.content.size(), a.content) == 0) {
            hit = &a;
            best = i;
            break;
          }
        }
      }
      if (!hit) break;
      std::size_t start = best, stop = best + hit->content.size();
      pos = stop;
      if (!parse_special && hit->special) continue;
      if (hit->single_word) {
        bool start_ok = start == 0 || !is_word_char_before_(s, start);
        bool stop_ok = stop == s.size() || !is_word_char_after_(s, stop);
        if (!start_ok || !stop_ok) continue;
      }
      if (hit->lstrip) {
        std::size_t i = start;
        while (i > 0) {
          std::size_t j = i;
          if (!utf8::is_whitespace(utf8::prev(s, j))) break;
          i = j;
        }
        start = std::max(i, start_offset);
      }
      if (hit->rstrip) {
        std::size_t i = stop;
        while (i < s.size()) {
          std::size_t j = i;
          if (!utf8::is_whitespace(utf8::next(s, j))) break;
          i = j;
        }
        stop = i;
        pos = stop;
      }
      if (start_offset < start) out.emplace_back(s.substr(start_offset, start - start_offset), -1);
      out.emplace_back(s.substr(start, stop - start), hit->id);
      start_offset = stop;
    }
    if (start_offset < s.size()) out.emplace_back(s.substr(start_offset), -1);
    return out;
  }

  bool is_word_char_before_(std::string_view s, std::size_t at) const {
    std::size_t i = at;
    utf8::prev(s, i);
    return !word_char_.find_all(s.substr(i, at - i)).empty();
  }
  bool is_word_char_after_(std::string_view s, std::size_t at) const {
    std::size_t i = at;
    utf8::next(s, i);
    return !word_char_.find_all(s.substr(at, i - at)).empty();
  }

  // Applies HF's SplitDelimiterBehavior to the (range, is_match) cover of a piece.
  static void apply_behavior_(std::string_view s, std::vector<std::pair<std::pair<std::size_t, std::size_t>, bool>> const& m,
                              Behavior b, std::vector<std::string>& out) {
    std::vector<std::pair<std::size_t, std::size_t>> pieces;
    switch (b) {
      case Behavior::kRemoved:
        for (auto const& [r, is_match] : m)
          if (!is_match) pieces.push_back(r);
        break;
      case Behavior::kIsolated:
        for (auto const& [r, is_match] : m) pieces.push_back(r);
        break;
      case Behavior::kMergedWithPrevious: {
        bool prev_match = false;
        for (auto const& [r, is_match] : m) {
          if (is_match && !prev_match && !pieces.empty()) pieces.back().second = r.second;
          else pieces.push_back(r);
          prev_match = is_match;
        }
        break;
      }
      case Behavior::kMergedWithNext: {
        bool prev_match = false;
        for (auto it = m.rbegin(); it != m.rend(); ++it) {
          if (it->second && !prev_match && !pieces.empty()) pieces.back().first = it->first.first;
          else pieces.push_back(it->first);
          prev_match = it->second;
        }
        std::reverse(pieces.begin(), pieces.end());
        break;
      }
      case Behavior::kContiguous: {
        int prev = -1;
        for (auto const& [r, is_match] : m) {
          if (prev == static_cast<int>(is_match) && !pieces.empty()) pieces.back().second = r.second;
          else pieces.push_back(r);
          prev = static_cast<int>(is_match);
        }
        break;
      }
    }
    for (auto const& [b0, e0] : pieces)
      if (e0 > b0) out.emplace_back(s.substr(b0, e0 - b0));
  }

  static std::vector<std::pair<std::pair<std::size_t, std::size_t>, bool>> cover_(
      std::string_view s, std::vector<std::pair<std::size_t, std::size_t>> const& matches, bool invert) {
    std::vector<std::pair<std::pair<std::size_t, std::size_t>, bool>> m;
    std::size_t prev = 0;
    for (auto const& [b, e] : matches) {
      if (b > prev) m.push_back({{prev, b}, invert});
      m.push_back({{b, e}, !invert});
      prev = e;
    }
    if (prev < s.size()) m.push_back({{prev, s.size()}, invert});
    return m;
  }

  static std::vector<std::pair<std::size_t, std::size_t>> find_literal_(std::string_view s, std::string const& lit) {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for (std::size_t p = s.find(lit); p != std::string_view::npos; p = s.find(lit, p + lit.size()))
      out.emplace_back(p, p + lit.size());
    return out;
  }

  void encode_plain_(std::string_view text, std::vector<std::int32_t>& ids) const {
    if (text.empty()) return;
    std::vector<std::string> words{std::string(text)}, next;
    for (auto const& step : pre_) {
      next.clear();
      for (auto& w : words) {
        if (step.kind == PreStep::kByteLevel) {
          if (step.add_prefix_space && w.front() != ' ') w.insert(w.begin(), ' ');
          if (!step.regex) {
            next.push_back(std::move(w));
            continue;
          }
          apply_behavior_(w, cover_(w, step.regex.find_all(w), false), Behavior::kIsolated, next);
        } else {
          auto matches = step.regex ? step.regex.find_all(w) : find_literal_(w, step.literal);
          apply_behavior_(w, cover_(w, matches, step.invert), step.behavior, next);
        }
      }
      words.swap(next);
    }
    for (auto const& w : words) bpe_(w, ids);
  }

  static std::uint64_t pair_key_(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }

  // Ranked BPE over one word's bytes with a heap of candidate pairs ordered by (rank, position): the lowest rank
  // merges first, leftmost among equals, as HF's word.rs does; stale candidates are skipped. O(n log n).
  std::vector<std::int32_t> merge_word_(std::string const& word) const {
    struct Sym {
      std::int32_t id;
      std::int32_t prev, next;
    };
    struct Cand {
      std::int32_t rank, pos, merged, left, right;
      bool operator>(Cand const& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::vector<Sym> sy;
    sy.reserve(word.size());
    for (unsigned char b : word)
      if (byte_id_[b] >= 0) {  // a byte missing from the vocab is dropped, as in HF
        auto n = static_cast<std::int32_t>(sy.size());
        sy.push_back({byte_id_[b], n - 1, n + 1});
      }
    if (sy.empty()) return {};
    sy.back().next = -1;
    std::vector<Cand> heap;
    auto push = [&](std::int32_t l) {
      if (l < 0) return;
      std::int32_t r = sy[static_cast<std::size_t>(l)].next;
      if (r < 0) return;
      auto it = merges_.find(pair_key_(sy[static_cast<std::size_t>(l)].id, sy[static_cast<std::size_t>(r)].id));
      if (it == merges_.end()) return;
      heap.push_back({it->second.rank, l, it->second.merged, sy[static_cast<std::size_t>(l)].id, sy[static_cast<std::size_t>(r)].id});
      std::push_heap(heap.begin(), heap.end(), std::greater<>{});
    };
    for (std::int32_t i = 0; i + 1 < static_cast<std::int32_t>(sy.size()); ++i) push(i);
    std::vector<bool> dead(sy.size(), false);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
      Cand c = heap.back();
      heap.pop_back();
      auto& l = sy[static_cast<std::size_t>(c.pos)];
      if (dead[static_cast<std::size_t>(c.pos)] || l.id != c.left || l.next < 0) continue;
      auto& r = sy[static_cast<std::size_t>(l.next)];
      if (r.id != c.right) continue;
      l.id = c.merged;
      dead[static_cast<std::size_t>(l.next)] = true;
      l.next = r.next;
      if (r.next >= 0) sy[static_cast<std::size_t>(r.next)].prev = c.pos;
      push(l.prev);
      push(c.pos);
    }
    std::vector<std::int32_t> out;
    for (std::int32_t i = 0; i >= 0; i = sy[static_cast<std::size_t>(i)].next) out.push_back(sy[static_cast<std::size_t>(i)].id);
    return out;
  }

  // BPE of one pre-tokenized word, cached per word.
  void bpe_(std::string const& word, std::vector<std::int32_t>& ids) const {
    {
      std::lock_guard<std::mutex> lock(cache_->mutex);
      auto it = cache_->map.find(word);
      if (it != cache_->map.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<std::int32_t> sym;
    if (ignore_merges_) {
      auto it = token_to_id_.find(to_byte_chars_(word));
      if (it != token_to_id_.end()) sym.push_back(it->second);
    }
    if (sym.empty()) sym = merge_word_(word);
    ids.insert(ids.end(), sym.begin(), sym.end());
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (cache_->map.size() > 200000) cache_->map.clear();  // bound memory on long varied inputs
    cache_->map.emplace(word, std::move(sym));
  }

  struct Cache {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<std::int32_t>> map;
  };

  std::string source_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_token_, is_special_;
  std::vector<std::string> token_bytes_;
  std::unordered_map<std::string, std::int32_t> token_to_id_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::array<std::int32_t, 256> byte_id_{};
  std::vector<AddedToken> added_;
  std::vector<std::size_t> added_by_length_;
  std::array<std::array<bool, 256>, 2> added_first_byte_{};  // [normalized pass][first byte of some token]
  std::vector<PreStep> pre_;
  Regex word_char_;
  bool ignore_merges_ = false, nfc_ = false;
  std::shared_ptr<Cache> cache_ = std::make_shared<Cache>();
};

// Streaming detokenizer: push ids, get text that is always whole UTF-8 characters; a character split across
// tokens is held back until complete; finish() flushes a dangling partial character as U+FFFD.
// The concatenation of all pushes and finish() equals Tokenizer::decode of the same ids.
class TokenStreamDecoder {
 public:
  explicit TokenStreamDecoder(Tokenizer const& tokenizer, bool skip_special = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}
  std::string push(std::int32_t id) {
    scratch_.clear();
    tokenizer_->append_token_bytes(scratch_, id, skip_special_);
    return assembler_.push(scratch_);
  }
  std::string finish() { return assembler_.finish(); }
  void reset() noexcept { assembler_.reset(); }
  std::size_t pending_bytes() const noexcept { return assembler_.pending_bytes(); }

 private:
  Tokenizer const* tokenizer_;
  bool skip_special_;
  utf8::Assembler assembler_;
  std::string scratch_;
};

}  // namespace ling::io
