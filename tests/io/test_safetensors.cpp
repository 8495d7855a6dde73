// io/safetensors.hpp and io/checkpoint.hpp: a matrix of malformed files (in the spirit of llama.cpp's test-gguf),
// each checked for its error code and a message naming the file, the tensor and the problem; then good files.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "io_test_util.hpp"
#include "ling/io/checkpoint.hpp"
#include "ling/io/safetensors.hpp"
#include "ling/io/safetensors_writer.hpp"

using namespace ling;
using ling::io::SafetensorsFile;
using iotest::check_error;
using iotest::write_raw_safetensors;

namespace {
std::string tensor(char const* name, char const* dtype, char const* shape, std::uint64_t b, std::uint64_t e) {
  return "\"" + std::string(name) + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(e) + "]}";
}
}  // namespace

TEST_CASE("safetensors: malformed files are rejected with a precise error") {
  iotest::TempDir tmp("st_bad");
  struct Case {
    char const* what;
    std::string header;
    std::size_t data;
    std::int64_t header_len;  // -1: the real one
    ErrorCode code;
    std::vector<std::string> needles;
  };
  std::vector<Case> cases = {
      {"header length above 100 MB", "{}", 0, 100'000'001, ErrorCode::kFormat, {"100 MB"}},
      {"header length past the end", "{}", 0, 64, ErrorCode::kFormat, {"past the end of the file"}},
      {"header not JSON", "{\"a\": nope}", 0, -1, ErrorCode::kFormat, {"not valid UTF-8 JSON"}},
      {"header truncated JSON", "{\"a\":{\"dtype\"", 0, -1, ErrorCode::kFormat, {"not valid UTF-8 JSON"}},
      {"header with bad UTF-8", "{\"w\xff\xfe\":{}}", 0, -1, ErrorCode::kFormat, {"UTF-8"}},
      {"header a JSON array", "[1, 2]", 0, -1, ErrorCode::kFormat, {"not a JSON object"}},
      {"header a JSON string", "\"x\"", 0, -1, ErrorCode::kFormat, {"not a JSON object"}},
      {"empty header", "", 0, -1, ErrorCode::kFormat, {"not a JSON object"}},
      {"unknown dtype", "{" + tensor("w", "F4X", "[2]", 0, 2) + "}", 2, -1, ErrorCode::kFormat, {"'w'", "unknown dtype 'F4X'"}},
      {"dtype not a string", "{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -1, ErrorCode::kFormat, {"'w'", "dtype"}},
      {"shape product overflow", "{" + tensor("big", "F32", "[4294967296,4294967296,16]", 0, 0) + "}", 0, -1,
       ErrorCode::kFormat, {"'big'", "overflows"}},
      {"negative shape", "{" + tensor("neg", "F32", "[-1]", 0, 4) + "}", 4, -1, ErrorCode::kFormat, {"'neg'", "non-negative"}},
      {"byte size != shape x dtype", "{" + tensor("w", "F32", "[2,2]", 0, 8) + "}", 8, -1, ErrorCode::kFormat,
       {"'w'", "8 bytes for shape [2,2]", "16 bytes"}},
      {"end before begin", "{" + tensor("w", "U8", "[0]", 4, 0) + "}", 4, -1, ErrorCode::kFormat, {"'w'", "< begin"}},
      {"gap between tensors", "{" + tensor("a", "F32", "[1]", 0, 4) + "," + tensor("b", "F32", "[1]", 8, 12) + "}", 12, -1,
       ErrorCode::kFormat, {"'b'", "gap"}},
      {"overlapping tensors", "{" + tensor("a", "F32", "[2]", 0, 8) + "," + tensor("b", "F32", "[2]", 4, 12) + "}", 12, -1,
       ErrorCode::kFormat, {"'b'", "overlaps"}},
      {"first tensor not at 0", "{" + tensor("a", "F32", "[1]", 4, 8) + "}", 8, -1, ErrorCode::kFormat, {"'a'", "gap"}},
      {"last offset short of the data", "{" + tensor("a", "F32", "[1]", 0, 4) + "}", 8, -1, ErrorCode::kFormat,
       {"end at data offset 4", "holds 8 bytes"}},
      {"tensor past the end of the data", "{" + tensor("a", "F32", "[4]", 0, 16) + "}", 8, -1, ErrorCode::kFormat,
       {"'a'", "past the end of the data"}},
      {"duplicate tensor names", "{" + tensor("a", "F32", "[1]", 0, 4) + "," + tensor("a", "F32", "[1]", 4, 8) + "}", 8, -1,
       ErrorCode::kFormat, {"repeats the key 'a'"}},
      {"metadata value not a string", "{\"__metadata__\":{\"format\":1}}", 0, -1, ErrorCode::kFormat, {"__metadata__", "'format'"}},
      {"metadata not a map", "{\"__metadata__\":[\"pt\"]}", 0, -1, ErrorCode::kFormat, {"__metadata__"}},
      {"data_offsets not a pair", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, -1, ErrorCode::kFormat,
       {"'w'", "data_offsets"}},
      {"missing shape", "{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, -1, ErrorCode::kFormat, {"'w'", "lacks"}},
      {"tensor entry not an object", "{\"w\":[1,2]}", 0, -1, ErrorCode::kFormat, {"'w'", "not an object"}},
  };
  int n = 0;
  for (auto const& c : cases) {
    std::string const what = c.what;
    CAPTURE(what);
    auto path = tmp / ("bad" + std::to_string(n++) + ".safetensors");
    write_raw_safetensors(path, c.header, c.data, c.header_len);
    auto needles = c.needles;
    needles.push_back(path.string());  // every message names the file
    check_error([&] { SafetensorsFile::open(path); }, c.code, needles);
  }
  SUBCASE("a file shorter than the length field") {
    iotest::write_text(tmp / "short.safetensors", "abc");
    check_error([&] { SafetensorsFile::open(tmp / "short.safetensors"); }, ErrorCode::kFormat, {"short.safetensors", "too short"});
  }
  SUBCASE("an empty file") {
    iotest::write_text(tmp / "empty.safetensors", "");
    check_error([&] { SafetensorsFile::open(tmp / "empty.safetensors"); }, ErrorCode::kFormat, {"empty.safetensors", "0 bytes"});
  }
  SUBCASE("a file that does not exist") {
    check_error([&] { SafetensorsFile::open(tmp / "nope.safetensors"); }, ErrorCode::kIo, {"nope.safetensors", "cannot open"});
  }
  SUBCASE("a directory") {
    check_error([&] { SafetensorsFile::open(tmp.path); }, ErrorCode::kIo, {"not a regular file"});
  }
}

TEST_CASE("safetensors: a good file maps its tensors, metadata and padding") {
  iotest::TempDir tmp("st_good");
  std::vector<float> a{1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  std::vector<std::uint16_t> b{0x3F80, 0xC000};
  io::SafetensorsWriter w;
  w.add("a", DType::kF32, {2, 3}, a).add("b", DType::kBF16, {2}, b).add("empty", DType::kF32, {0, 5}, nullptr, 0);
  w.add("scalar", DType::kI64, {}, std::vector<std::int64_t>{42});
  w.metadata("format", "pt");
  CHECK(w.header().size() % 8 == 0);
  w.write(tmp / "m.safetensors");
  auto f = SafetensorsFile::open(tmp / "m.safetensors");
  REQUIRE(f.tensors().size() == 4);
  CHECK(f.metadata().at("format") == "pt");
  auto const* ta = f.find("a");
  REQUIRE(ta);
  CHECK(ta->dtype == DType::kF32);
  CHECK(ta->shape == std::vector<std::int64_t>{2, 3});
  CHECK(ta->size == 24);
  CHECK(ta->numel() == 6);
  CHECK(ta->file == (tmp / "m.safetensors").string());
  float got[6];
  std::memcpy(got, ta->data, 24);
  for (int i = 0; i < 6; ++i) CHECK(got[i] == a[std::size_t(i)]);
  auto const* tb = f.find("b");
  REQUIRE(tb);
  CHECK(to_float(Bfloat16{*reinterpret_cast<std::uint16_t const*>(tb->data)}) == 1.0f);
  CHECK(tb->data == ta->data + 24);  // contiguous
  CHECK(f.find("empty")->size == 0);
  CHECK(f.find("scalar")->numel() == 1);
  CHECK(f.find("missing") == nullptr);
  // Moving keeps the mapping (pointers stay valid).
  SafetensorsFile g = std::move(f);
  CHECK(g.find("a")->data == ta->data);
  // A header with no tensors at all is valid.
  write_raw_safetensors(tmp / "none.safetensors", "{}      ", 0);
  CHECK(SafetensorsFile::open(tmp / "none.safetensors").tensors().empty());
}

TEST_CASE("checkpoint: single file, sharded, and broken indexes") {
  iotest::TempDir tmp("ckpt");
  auto cfg = iotest::tiny_ling_config();
  SUBCASE("single file") {
    iotest::write_checkpoint(tmp / "one", cfg, iotest::Layout::kBf16);
    auto c = io::Checkpoint::open(tmp / "one");
    CHECK(c.config().hidden_size == 160);
    CHECK(c.files().size() == 1);
    CHECK(c.find("model.norm.weight") != nullptr);
    CHECK(c.get("lm_head.weight").shape == std::vector<std::int64_t>{50, 160});
    CHECK(c.names().size() == c.size());
    check_error([&] { c.get("model.nothing.weight"); }, ErrorCode::kMissingTensor, {"'model.nothing.weight'", "one"});
    io::Checkpoint moved = std::move(c);
    CHECK(moved.find("model.norm.weight")->size == 160 * 2);
  }
  SUBCASE("sharded") {
    iotest::WriteOptions o;
    o.shards = 3;
    iotest::write_checkpoint(tmp / "sharded", cfg, iotest::Layout::kFp8, o);
    auto c = io::Checkpoint::open(tmp / "sharded");
    CHECK(c.files().size() == 3);
    CHECK(c.find("lm_head.weight") != nullptr);
    CHECK(c.find("model.layers.0.attention.q_proj.weight_scale_inv") != nullptr);
    std::size_t total = 0;
    for (auto const& f : c.files()) total += f.tensors().size();
    CHECK(total == c.size());
  }
  SUBCASE("index naming a missing shard") {
    iotest::WriteOptions o;
    o.shards = 2;
    iotest::write_checkpoint(tmp / "s", cfg, iotest::Layout::kBf16, o);
    std::filesystem::remove(tmp / "s" / "model-2-of-2.safetensors");
    check_error([&] { io::Checkpoint::open(tmp / "s"); }, ErrorCode::kIo, {"model-2-of-2.safetensors", "does not exist"});
  }
  SUBCASE("index naming a tensor its shard lacks") {
    iotest::WriteOptions o;
    o.shards = 2;
    iotest::write_checkpoint(tmp / "s", cfg, iotest::Layout::kBf16, o);
    std::ifstream in(tmp / "s" / "model.safetensors.index.json");
    auto j = nlohmann::json::parse(in);
    j["weight_map"]["model.ghost.weight"] = "model-1-of-2.safetensors";
    iotest::write_text(tmp / "s" / "model.safetensors.index.json", j.dump());
    check_error([&] { io::Checkpoint::open(tmp / "s"); }, ErrorCode::kFormat, {"'model.ghost.weight'", "does not hold it"});
  }
  SUBCASE("a tensor in two shards") {
    iotest::TempDir d("dup");
    iotest::write_text(d / "config.json", cfg.dump());
    std::vector<float> x{1.f};
    io::SafetensorsWriter a, b;
    a.add("model.norm.weight", DType::kF32, {1}, x);
    b.add("model.norm.weight", DType::kF32, {1}, x).add("other", DType::kF32, {1}, x);
    a.write(d / "a.safetensors");
    b.write(d / "b.safetensors");
    iotest::write_text(d / "model.safetensors.index.json",
                       R"({"weight_map": {"model.norm.weight": "a.safetensors", "other": "b.safetensors"}})");
    check_error([&] { io::Checkpoint::open(d.path); }, ErrorCode::kFormat, {"'model.norm.weight'", "stored twice"});
  }
  SUBCASE("index without weight_map, and one escaping the directory") {
    iotest::TempDir d("idx");
    iotest::write_text(d / "config.json", cfg.dump());
    iotest::write_text(d / "model.safetensors.index.json", R"({"metadata": {}})");
    check_error([&] { io::Checkpoint::open(d.path); }, ErrorCode::kFormat, {"weight_map"});
    iotest::write_text(d / "model.safetensors.index.json", R"({"weight_map": {"w": "../x.safetensors"}})");
    check_error([&] { io::Checkpoint::open(d.path); }, ErrorCode::kFormat, {"'w'", "bad file"});
  }
  SUBCASE("no weights, no config") {
    iotest::TempDir d("empty");
    check_error([&] { io::Checkpoint::open(d.path); }, ErrorCode::kIo, {"config.json"});
    iotest::write_text(d / "config.json", cfg.dump());
    check_error([&] { io::Checkpoint::open(d.path); }, ErrorCode::kIo, {"model.safetensors"});
    iotest::write_text(d / "config.json", "{not json");
    check_error([&] { io::Checkpoint::open(d.path); }, ErrorCode::kFormat, {"config.json", "not valid JSON"});
  }
}

TEST_CASE("safetensors: every truncation and many byte flips of a good file fail cleanly or load") {
  iotest::TempDir tmp("st_fuzz");
  io::SafetensorsWriter w;
  w.add("a", DType::kF32, {2, 3}, std::vector<float>(6, 1.f)).add("b", DType::kBF16, {4}, std::vector<std::uint16_t>(4, 0));
  w.metadata("k", "v");
  w.write(tmp / "good.safetensors");
  std::ifstream in(tmp / "good.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto attempt = [&](std::string const& content) {
    iotest::write_text(tmp / "x.safetensors", content);
    try {
      auto f = SafetensorsFile::open(tmp / "x.safetensors");
      for (auto const& t : f.tensors()) {  // whatever loads lies inside the file
        CHECK(t.data >= f.tensors().front().data);
        CHECK(t.size == std::size_t(t.numel()) * dtype_size(t.dtype));
      }
      return true;
    } catch (ling::Error const& e) {
      CHECK((e.code() == ErrorCode::kFormat || e.code() == ErrorCode::kIo));
      return false;
    }
  };
  int ok = 0;
  for (std::size_t n = 0; n < bytes.size(); ++n) ok += attempt(bytes.substr(0, n));
  CHECK(ok == 0);  // no proper prefix is a valid file
  CHECK(attempt(bytes));
  std::uint32_t state = 12345;
  for (int i = 0; i < 400; ++i) {
    std::string m = bytes;
    state = state * 1664525u + 1013904223u;
    std::size_t pos = state % std::min<std::size_t>(m.size(), 8 + 120);
    state = state * 1664525u + 1013904223u;
    m[pos] = char(state >> 24);
    attempt(m);
  }
}
