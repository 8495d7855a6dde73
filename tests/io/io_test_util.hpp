#pragma once
// Helpers shared by the io tests: temp dirs, error checks, a tiny Ling config and a checkpoint writer.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ling/core/dtypes.hpp"
#include "ling/core/error.hpp"
#include "ling/io/model_config.hpp"
#include "ling/io/safetensors_writer.hpp"
#include "ling/model/tensor_plan.hpp"
#include "ling/quant/policies.hpp"

namespace iotest {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  explicit TempDir(std::string const& tag) {
    static int counter = 0;
    path = fs::temp_directory_path() / ("ling_io_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path operator/(std::string const& name) const { return path / name; }
};

inline void write_text(fs::path const& p, std::string const& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(s.data(), std::streamsize(s.size()));
}

// A raw safetensors file: the u64 header length (as given, or the real one), the header bytes, the data bytes.
inline void write_raw_safetensors(fs::path const& p, std::string const& header, std::size_t data_bytes,
                                  std::int64_t header_len = -1) {
  std::uint64_t n = header_len < 0 ? header.size() : std::uint64_t(header_len);
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[std::size_t(i)] = char((n >> (8 * i)) & 0xFF);
  s += header;
  s.append(data_bytes, '\x01');
  write_text(p, s);
}

// Runs f, expects a ling::Error with `code` whose message contains every needle.
inline void check_error(std::function<void()> const& f, ling::ErrorCode code, std::vector<std::string> const& needles) {
  try {
    f();
    FAIL("no error thrown; expected " << ling::to_string(code));
  } catch (ling::Error const& e) {
    std::string msg = e.what();
    CHECK_MESSAGE(e.code() == code, "got " << ling::to_string(e.code()) << ": " << msg);
    for (auto const& n : needles) CHECK_MESSAGE(msg.find(n) != std::string::npos, "'" << n << "' not in: " << msg);
  }
}

// A tiny Ling config: 3 layers (K K M) + 1 MTP, dense layer 0, MoE 4 experts top-2; hidden 160 so that 128-blocks are
// partial; MXFP4-compatible inner dims (multiples of 32).
inline nlohmann::json tiny_ling_config() {
  return nlohmann::json::parse(R"({
    "architectures": ["BailingMoeV3ForCausalLM"], "model_type": "bailing_hybrid",
    "vocab_size": 50, "hidden_size": 160, "num_hidden_layers": 3, "layer_group_size": 3,
    "first_k_dense_replace": 1, "intermediate_size": 96, "moe_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 64, "num_shared_experts": 1,
    "num_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "norm_topk_prob": true,
    "routed_scaling_factor": 2.5, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32,
    "short_conv_kernel_size": 4, "no_kda_lora": true, "kda_safe_gate": true, "kda_lower_bound": -5.0,
    "q_lora_rank": null, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "rope_theta": 10000.0, "gated_attention_proj_granularity_type": "head_wise", "rms_norm_eps": 1e-6,
    "num_nextn_predict_layers": 1, "max_position_embeddings": 256, "tie_word_embeddings": false,
    "expert_swiglu_limit_list": [0, 0, 4.0], "share_expert_swiglu_limit_list": [0, 5.0, 7.0],
    "pad_token_id": 0, "eos_token_id": 1, "unknown_key_is_ignored": {"x": 1}
  })");
}

enum class Layout { kBf16, kFp8, kFp4 };

// The value stored at (r, c) of the i-th tensor, chosen to be exact in BF16, E4M3 and (as a code) E2M1.
inline float plain_value(std::size_t i, std::int64_t r, std::int64_t c) {
  return float(int((r * 7 + c * 3 + std::int64_t(i)) % 13) - 6) * 0.25f;
}
inline int fp4_code(std::size_t i, std::int64_t r, std::int64_t c) { return int((r * 5 + c + std::int64_t(i)) % 16); }
inline constexpr float kFp8ScaleInv = 2.0f;
inline constexpr std::uint8_t kFp4Scale = 126;  // 2^-1

inline bool fp8_matrix(Layout l, ling::model::PlannedTensor const& t) {
  using G = ling::model::TensorGroup;
  if (l == Layout::kBf16 || !t.is_matrix()) return false;
  if (t.group == G::kEmbedding || t.group == G::kLmHead || t.group == G::kRouter) return false;
  return !(l == Layout::kFp4 && t.role == ling::model::TensorRole::kRoutedExpert);
}
inline bool fp4_matrix(Layout l, ling::model::PlannedTensor const& t) {
  return l == Layout::kFp4 && t.role == ling::model::TensorRole::kRoutedExpert;
}

// Writes every planned tensor in `layout` (skipping names in `skip`), into `shards` files when > 1 (with an index).
// `tweak` may edit the writer's input: it is called with (name, dtype, shape) before each add.
struct WriteOptions {
  std::vector<std::string> skip;
  std::vector<std::string> extra;  // extra BF16 [1] tensors
  std::function<void(std::string&, ling::DType&, std::vector<std::int64_t>&)> tweak;
  int shards = 1;
};

inline void write_checkpoint(fs::path const& dir, nlohmann::json const& config, Layout layout, WriteOptions const& opt = {}) {
  using namespace ling;
  fs::create_directories(dir);
  write_text(dir / "config.json", config.dump(2));
  ModelConfig cfg = ModelConfig::from_json(config);
  auto plan = model::plan_tensors(cfg);
  std::vector<io::SafetensorsWriter> writers(std::size_t(opt.shards));
  nlohmann::json weight_map = nlohmann::json::object();
  auto add = [&](std::size_t i, std::string name, DType dt, std::vector<std::int64_t> shape, std::vector<std::uint8_t> bytes) {
    if (opt.tweak) {
      opt.tweak(name, dt, shape);
      std::size_t n = dtype_size(dt);
      for (auto d : shape) n *= std::size_t(d);
      bytes.resize(n);
    }
    std::size_t w = i % writers.size();
    writers[w].add(name, dt, shape, bytes.data(), bytes.size());
    weight_map[name] = "model-" + std::to_string(w + 1) + "-of-" + std::to_string(writers.size()) + ".safetensors";
  };
  std::size_t idx = 0;
  for (auto const& t : plan.tensors()) {
    std::size_t const i = idx++;
    if (std::find(opt.skip.begin(), opt.skip.end(), t.name) != opt.skip.end()) continue;
    std::int64_t const rows = t.is_matrix() || t.role == model::TensorRole::kConv ? t.shape[0] : 1;
    std::int64_t const cols = t.is_matrix() ? t.shape[1] : t.numel() / rows;
    if (fp8_matrix(layout, t)) {
      std::vector<std::uint8_t> q(std::size_t(rows * cols));
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) q[std::size_t(r * cols + c)] = e4m3_from_float(plain_value(i, r, c)).bits;
      add(i, t.name, DType::kF8E4M3, t.shape, std::move(q));
      std::vector<float> s(std::size_t(quant::Fp8Block::scale_count(rows, cols)), kFp8ScaleInv);
      std::vector<std::uint8_t> sb(s.size() * 4);
      std::memcpy(sb.data(), s.data(), sb.size());
      add(i, t.name + "_scale_inv", DType::kF32, {quant::ceil_div(rows, 128), quant::ceil_div(cols, 128)}, std::move(sb));
    } else if (fp4_matrix(layout, t)) {
      std::vector<std::uint8_t> q(std::size_t(rows * cols / 2));
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; c += 2)
          q[std::size_t(r * cols / 2 + c / 2)] = std::uint8_t(fp4_code(i, r, c) | (fp4_code(i, r, c + 1) << 4));
      add(i, t.name, DType::kU8, {rows, cols / 2}, std::move(q));
      add(i, t.name + "_scale_inv", DType::kU8, {rows, cols / 32}, std::vector<std::uint8_t>(std::size_t(rows * cols / 32), kFp4Scale));
    } else {
      bool f32 = t.role == model::TensorRole::kALog || t.role == model::TensorRole::kDtBias;
      std::vector<std::uint8_t> b(std::size_t(rows * cols) * (f32 ? 4 : 2));
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) {
          float v = plain_value(i, r, c);
          std::size_t k = std::size_t(r * cols + c);
          if (f32) std::memcpy(&b[k * 4], &v, 4);
          else {
            std::uint16_t h = bf16_from_float(v).bits;
            std::memcpy(&b[k * 2], &h, 2);
          }
        }
      add(i, t.name, f32 ? DType::kF32 : DType::kBF16, t.shape, std::move(b));
    }
  }
  for (auto const& e : opt.extra) add(idx++, e, DType::kBF16, {1}, {0, 0});
  if (writers.size() == 1) {
    writers[0].write(dir / "model.safetensors");
  } else {
    for (std::size_t w = 0; w < writers.size(); ++w)
      writers[w].write(dir / ("model-" + std::to_string(w + 1) + "-of-" + std::to_string(writers.size()) + ".safetensors"));
    write_text(dir / "model.safetensors.index.json", nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
  }
}

}  // namespace iotest
