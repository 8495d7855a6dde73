// io/tokenizer.hpp against the HF `tokenizers` package: ids of tests/data/tokenizer/cases*.jsonl
// (tools/tokenizer/make_testdata.py), round trips, streaming decode, and errors on bad tokenizer.json.
#include <doctest/doctest.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ling/io/tokenizer.hpp"

using ling::io::Tokenizer;
using ling::io::TokenStreamDecoder;
namespace utf8 = ling::io::utf8;

namespace {

std::string data(std::string const& name) { return std::string(LING_TEST_DATA) + "/tokenizer/" + name; }

std::vector<nlohmann::json> read_jsonl(std::string const& path) {
  std::ifstream in(path);
  REQUIRE(in);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::string from_hex(std::string const& h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

struct Counts {
  int encode = 0, no_special = 0, invalid = 0, decode = 0;
};

Counts check_cases(Tokenizer const& tok, std::string const& cases_file) {
  Counts n;
  for (auto const& c : read_jsonl(data(cases_file))) {
    if (c.contains("text")) {
      auto text = c["text"].get<std::string>();
      auto want = c["ids"].get<std::vector<std::int32_t>>();
      CAPTURE(text);
      CHECK(tok.encode(text) == want);
      ++n.encode;
      if (c.contains("ids_no_special")) {
        CHECK(tok.encode(text, false) == c["ids_no_special"].get<std::vector<std::int32_t>>());
        ++n.no_special;
      }
    } else if (c.contains("bytes_hex")) {
      auto bytes = from_hex(c["bytes_hex"].get<std::string>());
      CAPTURE(c["bytes_hex"].get<std::string>());
      CHECK(utf8::make_valid(bytes) == c["replaced"].get<std::string>());
      CHECK(tok.encode(bytes) == c["ids"].get<std::vector<std::int32_t>>());
      ++n.invalid;
    } else if (c.contains("decode_ids")) {
      auto ids = c["decode_ids"].get<std::vector<std::int32_t>>();
      CHECK(tok.decode(ids) == c["decoded"].get<std::string>());
      CHECK(tok.decode(ids, true) == c["decoded_skip"].get<std::string>());
      // streaming gives the same text, one id at a time, each piece whole UTF-8
      TokenStreamDecoder stream(tok);
      std::string streamed;
      for (auto id : ids) {
        auto piece = stream.push(id);
        CHECK(utf8::is_valid(piece));
        streamed += piece;
      }
      streamed += stream.finish();
      CHECK(streamed == c["decoded"].get<std::string>());
      ++n.decode;
    }
  }
  return n;
}

// Random valid UTF-8 over a spread of scripts, whitespace, digits and the special tokens' characters.
std::string random_utf8(std::mt19937_64& rng, int max_len) {
  static char32_t const ranges[][2] = {{0x20, 0x7E}, {0x09, 0x0D}, {0xA0, 0x17F}, {0x300, 0x36F}, {0x400, 0x4FF},
                                       {0x600, 0x6FF}, {0x900, 0x97F}, {0x3040, 0x30FF}, {0x4E00, 0x4E80},
                                       {0xAC00, 0xAC40}, {0x1F300, 0x1F6FF}, {0x200B, 0x200D}, {0x10000, 0x10100}};
  std::uniform_int_distribution<int> len(0, max_len), which(0, std::size(ranges) - 1);
  std::string s;
  int n = len(rng);
  for (int i = 0; i < n; ++i) {
    auto const& r = ranges[which(rng)];
    std::uniform_int_distribution<std::uint32_t> cp(r[0], r[1]);
    if (rng() % 20 == 0) { s += "<role>"; continue; }
    utf8::append(s, cp(rng));
  }
  return s;
}

}  // namespace

TEST_CASE("tokenizer: ids equal HF's (Ling split regex, pair merges)") {
  auto tok = Tokenizer::load(data("tokenizer.json"));
  CHECK(tok.vocab_size() == 2006);
  auto n = check_cases(tok, "cases.jsonl");
  CHECK(n.encode >= 100);
  CHECK(n.no_special == n.encode);
  CHECK(n.invalid == 7);
  CHECK(n.decode == 40);
}

TEST_CASE("tokenizer: ids equal HF's (GPT-2 ByteLevel regex, \"a b\" merges)") {
  auto tok = Tokenizer::load(data("tokenizer_gpt2.json"));
  auto n = check_cases(tok, "cases_gpt2.jsonl");
  CHECK(n.encode >= 100);
  CHECK(n.decode == 40);
}

TEST_CASE("tokenizer: ids equal HF's (add_prefix_space, ignore_merges, lstrip/rstrip added token)") {
  auto tok = Tokenizer::load(data("tokenizer_gpt2_prefix.json"));
  auto n = check_cases(tok, "cases_gpt2_prefix.jsonl");
  CHECK(n.encode >= 100);
}

TEST_CASE("tokenizer: load from a directory, lookups, special ids") {
  auto tok = Tokenizer::load(LING_TEST_DATA "/tokenizer");
  auto role_end = tok.token_to_id("<|role_end|>");
  REQUIRE(role_end.has_value());
  CHECK(*role_end == 2003);
  CHECK(tok.id_to_token(*role_end) == "<|role_end|>");
  CHECK(tok.special_ids() == std::vector<std::int32_t>{2000, 2001, 2002, 2003, 2004, 2005});
  CHECK(tok.is_special(2004));
  CHECK_FALSE(tok.is_special(5));
  CHECK_FALSE(tok.token_to_id("no such token").has_value());
  CHECK(tok.id_to_token(*tok.token_to_id("Ġthe")) == "Ġthe");
  CHECK(tok.decode(std::vector<std::int32_t>{*tok.token_to_id("Ġthe")}) == " the");
  CHECK_THROWS_AS(tok.id_to_token(2006), ling::Error);
  CHECK_THROWS_AS(tok.decode(std::vector<std::int32_t>{-1}), ling::Error);
  CHECK(tok.decode(tok.encode("<role>HUMAN</role>hi<|role_end|>"), true) == "HUMANhi");
}

TEST_CASE("tokenizer: decode(encode(s)) == s for random valid UTF-8 (seeded)") {
  for (auto const* file : {"tokenizer.json", "tokenizer_gpt2.json"}) {
    auto tok = Tokenizer::load(data(file));
    std::mt19937_64 rng(20261130);
    int checked = 0;
    for (int i = 0; i < 400; ++i) {
      auto s = random_utf8(rng, 60);
      REQUIRE(utf8::is_valid(s));
      auto ids = tok.encode(s);
      CAPTURE(s);
      CHECK(tok.decode(ids) == s);
      ++checked;
    }
    CHECK(checked == 400);
  }
}

TEST_CASE("tokenizer: streaming decode of split strings equals the whole") {
  auto tok = Tokenizer::load(data("tokenizer.json"));
  std::string const s = "Emoji 😀👍🏽 family 👨‍👩‍👧‍👦 中文字 नमस्ते é\n<role>x";
  // token level: one id at a time (CJK and emoji span several byte tokens here)
  auto ids = tok.encode(s);
  TokenStreamDecoder stream(tok);
  std::string out;
  int held = 0;
  for (auto id : ids) {
    auto piece = stream.push(id);
    CHECK(utf8::is_valid(piece));
    held += stream.pending_bytes() > 0;
    out += piece;
  }
  out += stream.finish();
  CHECK(out == s);
  CHECK(held > 0);  // some character really was split across tokens
  // byte level: the string cut at every byte position, and byte by byte
  for (std::size_t p = 0; p <= s.size(); ++p) {
    utf8::Assembler a;
    auto x = a.push(std::string_view(s).substr(0, p));
    CHECK(utf8::is_valid(x));
    x += a.push(std::string_view(s).substr(p));
    x += a.finish();
    CHECK(x == s);
  }
  utf8::Assembler a;
  std::string bytewise;
  for (char c : s) bytewise += a.push(std::string_view(&c, 1));
  CHECK(bytewise + a.finish() == s);
  // invalid bytes: streaming equals the one-shot replacement at every cut
  std::mt19937_64 rng(7);
  for (int t = 0; t < 50; ++t) {
    std::string junk;
    for (int i = 0; i < 12; ++i) junk.push_back(static_cast<char>(rng() % 4 == 0 ? 0x41 : 0x80 + rng() % 0x80));
    for (std::size_t p = 0; p <= junk.size(); ++p) {
      utf8::Assembler b;
      auto x = b.push(std::string_view(junk).substr(0, p));
      x += b.push(std::string_view(junk).substr(p));
      x += b.finish();
      CHECK(x == utf8::make_valid(junk));
    }
  }
}

TEST_CASE("tokenizer: invalid UTF-8 input is replaced, never crashes") {
  auto tok = Tokenizer::load(data("tokenizer.json"));
  std::string bad = "a\xff\xfe\xc3";
  auto ids = tok.encode(bad);
  CHECK(tok.decode(ids) == "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  CHECK(utf8::make_valid("\xf0\x9f\x98") == "\xEF\xBF\xBD");  // truncated 4-byte sequence: one U+FFFD
  CHECK(utf8::make_valid("\xed\xa0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate: three
}

namespace {
std::string error_of(std::string const& json_text) {
  try {
    Tokenizer::from_json_text(json_text, "bad.json");
  } catch (ling::Error const& e) {
    return e.what();
  }
  return "";
}
std::string minimal(std::string const& model, std::string const& pre = R"({"type":"ByteLevel"})") {
  return R"({"added_tokens":[],"normalizer":null,"pre_tokenizer":)" + pre + R"(,"decoder":{"type":"ByteLevel"},"model":)" +
         model + "}";
}
}  // namespace

TEST_CASE("tokenizer: bad tokenizer.json gives a ling::Error naming the problem") {
  CHECK(error_of("{not json").find("not a JSON object") != std::string::npos);
  CHECK(error_of("[1,2]").find("bad.json") != std::string::npos);
  CHECK(error_of(R"({"added_tokens":[]})").find("model: missing") != std::string::npos);
  auto unigram = error_of(minimal(R"({"type":"Unigram","vocab":[["a",0.0]]})"));
  CHECK(unigram.find("Unigram") != std::string::npos);
  CHECK(unigram.find("unsupported") != std::string::npos);
  std::string const vocab = R"("vocab":{"a":0,"b":1,"ab":2})";
  CHECK(error_of(minimal(R"({"type":"BPE",)" + vocab + R"(,"merges":["a c"]})")).find("right part \"c\"") !=
        std::string::npos);
  CHECK(error_of(minimal(R"({"type":"BPE",)" + vocab + R"(,"merges":["b b"]})")).find("merged token \"bb\"") !=
        std::string::npos);
  CHECK(error_of(minimal(R"({"type":"BPE",)" + vocab + R"(,"merges":["ab"]})")).find("model.merges[0]") !=
        std::string::npos);
  CHECK(error_of(minimal(R"({"type":"BPE",)" + vocab + R"(,"merges":[["a"]]})")).find("model.merges[0]") !=
        std::string::npos);
  CHECK(error_of(minimal(R"({"type":"BPE",)" + vocab + R"(})")).find("model.merges") != std::string::npos);
  CHECK(error_of(minimal(R"({"type":"BPE",)" + vocab + R"(,"merges":[],"byte_fallback":true})"))
            .find("byte_fallback") != std::string::npos);
  CHECK(error_of(minimal(R"({"type":"BPE",)" + vocab + R"(,"merges":[]})", R"({"type":"Whitespace"})"))
            .find("\"Whitespace\" is not supported") != std::string::npos);
  CHECK(error_of(minimal(R"({"type":"BPE",)" + vocab + R"(,"merges":[]})",
                         R"({"type":"Split","pattern":{"Regex":"(unclosed"},"behavior":"Isolated"})"))
            .find("regex does not compile") != std::string::npos);
  // a valid minimal file loads and merges
  auto ok = Tokenizer::from_json_text(minimal(R"({"type":"BPE",)" + vocab + R"(,"merges":["a b"]})"));
  CHECK(ok.encode("abab") == std::vector<std::int32_t>{2, 2});
  CHECK(ok.encode("ba") == std::vector<std::int32_t>{1, 0});
  CHECK(ok.encode("xyz").empty());  // bytes absent from the vocab are dropped, as HF does
  CHECK_THROWS_AS(Tokenizer::load("/nonexistent/tokenizer.json"), ling::Error);
  // NFC: fine below U+0300, an Error beyond
  auto nfc = Tokenizer::from_json_text(R"({"normalizer":{"type":"NFC"},"pre_tokenizer":{"type":"ByteLevel"},"model":{"type":"BPE",)" +
                                       vocab + R"(,"merges":["a b"]}})");
  CHECK(nfc.encode("ab") == std::vector<std::int32_t>{2});
  CHECK_THROWS_AS(nfc.encode("e\u0301"), ling::Error);
}

TEST_CASE("tokenizer: long inputs (one 200k-letter word, 100k spaces, 50k digits) round-trip") {
  auto tok = Tokenizer::load(data("tokenizer.json"));
  std::string s = std::string(200000, 'a') + std::string(100000, ' ') + std::string(50000, '7') + "end";
  auto ids = tok.encode(s);
  CHECK(ids.size() > 50000);  // every digit is its own word in the Ling split
  CHECK(tok.decode(ids) == s);
}

TEST_CASE("tokenizer: Split behaviors / invert, String pattern, single_word and normalized added tokens vs HF") {
  std::ifstream in(data("tokenizer.json"));
  nlohmann::json base = nlohmann::json::parse(in);
  int variants = 0, cases = 0;
  for (auto const& v : read_jsonl(data("cases_variants.jsonl"))) {
    nlohmann::json j = base;
    auto const& edit = v["edit"];
    if (edit.contains("pre_tokenizer")) j["pre_tokenizer"] = edit["pre_tokenizer"];
    if (edit.contains("extra_added"))
      for (auto const& a : edit["extra_added"]) j["added_tokens"].push_back(a);
    auto tok = Tokenizer::from_json_text(j.dump(), "variant");
    CAPTURE(edit.dump());
    for (auto const& c : v["cases"]) {
      auto text = c["text"].get<std::string>();
      CAPTURE(text);
      CHECK(tok.encode(text) == c["ids"].get<std::vector<std::int32_t>>());
      ++cases;
    }
    ++variants;
  }
  CHECK(variants == 14);
  CHECK(cases == 140);
}
