// model/tensor_plan.hpp, io/weights.hpp and model/footprint.hpp: the plan's names against spec §3 (spelled out here),
// tiny checkpoints in the BF16, -fp8 and -fp4 layouts bound and decoded, the error cases, and the spec §4 numbers.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <string>

#include "io_test_util.hpp"
#include "ling/io/checkpoint.hpp"
#include "ling/io/weights.hpp"
#include "ling/model/footprint.hpp"
#include "ling/model/tensor_plan.hpp"

using namespace ling;
using iotest::check_error;
using model::TensorGroup;
using model::TensorRole;
using Shape = std::vector<std::int64_t>;

TEST_CASE("plan: Ling names and shapes (spec §3)") {
  auto cfg = ModelConfig::from_json(iotest::tiny_ling_config());
  auto plan = model::plan_tensors(cfg);
  // hidden D=160, V=50, KDA H=2 K=32 P=64, MLA H=2 qk=16+8 v=16 r=32, dense 96, experts 4 x 64, shared 64
  struct Want { char const* name; Shape shape; TensorRole role; };
  Want const want[] = {
      {"model.word_embeddings.weight", {50, 160}, TensorRole::kMatrix},
      {"model.norm.weight", {160}, TensorRole::kVector},
      {"lm_head.weight", {50, 160}, TensorRole::kMatrix},
      {"model.layers.0.input_layernorm.weight", {160}, TensorRole::kVector},
      {"model.layers.0.post_attention_layernorm.weight", {160}, TensorRole::kVector},
      {"model.layers.0.attention.q_proj.weight", {64, 160}, TensorRole::kMatrix},
      {"model.layers.0.attention.k_proj.weight", {64, 160}, TensorRole::kMatrix},
      {"model.layers.0.attention.v_proj.weight", {64, 160}, TensorRole::kMatrix},
      {"model.layers.0.attention.f_proj.weight", {64, 160}, TensorRole::kMatrix},
      {"model.layers.0.attention.g_proj.weight", {64, 160}, TensorRole::kMatrix},
      {"model.layers.0.attention.b_proj.weight", {2, 160}, TensorRole::kMatrix},
      {"model.layers.0.attention.q_conv1d.weight", {64, 1, 4}, TensorRole::kConv},
      {"model.layers.0.attention.k_conv1d.weight", {64, 1, 4}, TensorRole::kConv},
      {"model.layers.0.attention.v_conv1d.weight", {64, 1, 4}, TensorRole::kConv},
      {"model.layers.0.attention.A_log", {2}, TensorRole::kALog},
      {"model.layers.0.attention.dt_bias", {64}, TensorRole::kDtBias},
      {"model.layers.0.attention.o_norm.weight", {32}, TensorRole::kVector},
      {"model.layers.0.attention.o_proj.weight", {160, 64}, TensorRole::kMatrix},
      {"model.layers.0.mlp.gate_proj.weight", {96, 160}, TensorRole::kMatrix},
      {"model.layers.0.mlp.up_proj.weight", {96, 160}, TensorRole::kMatrix},
      {"model.layers.0.mlp.down_proj.weight", {160, 96}, TensorRole::kMatrix},
      {"model.layers.1.mlp.gate.weight", {4, 160}, TensorRole::kMatrix},
      {"model.layers.1.mlp.gate.expert_bias", {4}, TensorRole::kVector},
      {"model.layers.1.mlp.experts.3.gate_proj.weight", {64, 160}, TensorRole::kRoutedExpert},
      {"model.layers.1.mlp.experts.3.up_proj.weight", {64, 160}, TensorRole::kRoutedExpert},
      {"model.layers.1.mlp.experts.3.down_proj.weight", {160, 64}, TensorRole::kRoutedExpert},
      {"model.layers.1.mlp.shared_experts.gate_proj.weight", {64, 160}, TensorRole::kMatrix},
      {"model.layers.1.mlp.shared_experts.down_proj.weight", {160, 64}, TensorRole::kMatrix},
      {"model.layers.2.attention.q_proj.weight", {2 * 24, 160}, TensorRole::kMatrix},
      {"model.layers.2.attention.kv_a_proj_with_mqa.weight", {32 + 8, 160}, TensorRole::kMatrix},
      {"model.layers.2.attention.kv_a_layernorm.weight", {32}, TensorRole::kVector},
      {"model.layers.2.attention.kv_b_proj.weight", {2 * 32, 32}, TensorRole::kMatrix},
      {"model.layers.2.attention.g_proj.weight", {2, 160}, TensorRole::kMatrix},
      {"model.layers.2.attention.dense.weight", {160, 2 * 16}, TensorRole::kMatrix},
      {"model.layers.3.enorm.weight", {160}, TensorRole::kVector},
      {"model.layers.3.hnorm.weight", {160}, TensorRole::kVector},
      {"model.layers.3.eh_proj.weight", {160, 320}, TensorRole::kMatrix},
      {"model.layers.3.final_layernorm.weight", {160}, TensorRole::kVector},
      {"model.layers.3.attention.kv_b_proj.weight", {64, 32}, TensorRole::kMatrix},
      {"model.layers.3.mlp.experts.0.down_proj.weight", {160, 64}, TensorRole::kRoutedExpert},
  };
  for (auto const& w : want) {
    std::string const name = w.name;
    CAPTURE(name);
    auto const* t = plan.find(w.name);
    REQUIRE(t);
    CHECK(t->shape == w.shape);
    CHECK(t->role == w.role);
  }
  CHECK(plan.find("model.layers.1.mlp.gate.e_score_correction_bias") == plan.find("model.layers.1.mlp.gate.expert_bias"));
  CHECK(plan.find("model.layers.2.attention.A_log") == nullptr);  // MLA layer
  CHECK(plan.find("model.layers.3.attention.A_log") == nullptr);  // MTP is MLA
  CHECK(plan.find("model.layers.4.input_layernorm.weight") == nullptr);
  CHECK(plan.find("model.layers.0.mlp.gate.weight") == nullptr);  // dense layer
  // Count: 3 global; layer 0 (KDA + dense): 2 + 13 + 3; layer 1 (KDA + MoE): 2 + 13 + 2 + 12 + 3;
  // layer 2 (MLA + MoE): 2 + 6 + 17; MTP: 2 + 6 + 17 + 4
  CHECK(plan.size() == 3 + 18 + 32 + 25 + 29);
  auto const* a = plan.find("model.layers.0.attention.A_log");
  CHECK(a->accepts_shape(Shape{2}));
  CHECK(a->accepts_shape(Shape{1, 1, 2, 1}));
  CHECK_FALSE(a->accepts_shape(Shape{2, 1}));

  auto tied = iotest::tiny_ling_config();
  tied["tie_word_embeddings"] = true;
  CHECK(model::plan_tensors(ModelConfig::from_json(tied)).find("lm_head.weight")->optional);
  CHECK_FALSE(plan.find("lm_head.weight")->optional);
}

TEST_CASE("plan: Kimi-Linear names as HF transformers writes them") {
  auto j = nlohmann::json::parse(R"({"model_type": "kimi_linear", "vocab_size": 50, "hidden_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "kv_lora_rank": 16,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "intermediate_size": 96, "moe_intermediate_size": 32,
    "num_experts": 4, "num_experts_per_token": 2, "num_shared_experts": 1, "first_k_dense_replace": 1,
    "linear_attn_config": {"kda_layers": [1], "full_attn_layers": [2], "num_heads": 3, "head_dim": 16,
                           "short_conv_kernel_size": 4}})");
  auto cfg = ModelConfig::from_json(j);
  auto plan = model::plan_tensors(cfg);
  struct Want { char const* name; Shape shape; };
  Want const want[] = {
      {"model.embed_tokens.weight", {50, 64}},
      {"model.layers.0.self_attn.q_proj.weight", {48, 64}},
      {"model.layers.0.self_attn.q_conv1d.weight", {48, 1, 4}},
      {"model.layers.0.self_attn.f_a_proj.weight", {16, 64}},
      {"model.layers.0.self_attn.f_b_proj.weight", {48, 16}},
      {"model.layers.0.self_attn.g_a_proj.weight", {16, 64}},
      {"model.layers.0.self_attn.g_b_proj.weight", {48, 16}},
      {"model.layers.0.self_attn.b_proj.weight", {3, 64}},
      {"model.layers.0.self_attn.A_log", {3}},
      {"model.layers.0.self_attn.dt_bias", {48}},
      {"model.layers.0.self_attn.o_norm.weight", {16}},
      {"model.layers.0.self_attn.o_proj.weight", {64, 48}},
      {"model.layers.0.block_sparse_moe.gate_proj.weight", {96, 64}},
      {"model.layers.1.self_attn.q_proj.weight", {2 * 12, 64}},
      {"model.layers.1.self_attn.kv_a_proj_with_mqa.weight", {20, 64}},
      {"model.layers.1.self_attn.kv_b_proj.weight", {2 * 16, 16}},
      {"model.layers.1.self_attn.o_proj.weight", {64, 16}},
      {"model.layers.1.block_sparse_moe.gate.weight", {4, 64}},
      {"model.layers.1.block_sparse_moe.gate.e_score_correction_bias", {4}},
      {"model.layers.1.block_sparse_moe.experts.2.w1.weight", {32, 64}},
      {"model.layers.1.block_sparse_moe.experts.2.w3.weight", {32, 64}},
      {"model.layers.1.block_sparse_moe.experts.2.w2.weight", {64, 32}},
      {"model.layers.1.block_sparse_moe.shared_experts.up_proj.weight", {32, 64}},
  };
  for (auto const& w : want) {
    std::string const name = w.name;
    CAPTURE(name);
    auto const* t = plan.find(w.name);
    REQUIRE(t);
    CHECK(t->shape == w.shape);
  }
  CHECK(plan.find("model.layers.0.mlp.gate_proj.weight") == plan.find("model.layers.0.block_sparse_moe.gate_proj.weight"));
  CHECK(plan.find("model.layers.1.self_attn.g_proj.weight") == nullptr);  // no output gate
  CHECK(plan.find("model.layers.0.self_attn.f_proj.weight") == nullptr);
}

namespace {

// Checks every bound weight decodes to what the writer stored (values chosen independently in io_test_util.hpp).
void check_values(io::CheckpointWeights const& w, iotest::Layout layout) {
  std::size_t i = 0;
  std::set<io::StorageFormat> seen;
  for (auto const& t : w.plan().tensors()) {
    std::size_t const idx = i++;
    auto const* r = w.find(t.name);
    if (!r) continue;
    seen.insert(r->format);
    io::StorageFormat want_format = iotest::fp8_matrix(layout, t)   ? io::StorageFormat::kFp8Block
                                    : iotest::fp4_matrix(layout, t) ? io::StorageFormat::kMxfp4
                                    : (t.role == TensorRole::kALog || t.role == TensorRole::kDtBias) ? io::StorageFormat::kF32
                                                                                                      : io::StorageFormat::kBf16;
    CHECK_MESSAGE(r->format == want_format, t.name);
    CHECK(r->shape == t.shape);
    CHECK((r->scales != nullptr) == (want_format == io::StorageFormat::kFp8Block || want_format == io::StorageFormat::kMxfp4));
    // A few elements, including the last (edge blocks).
    for (std::int64_t rr : {std::int64_t(0), r->rows / 2, r->rows - 1})
      for (std::int64_t cc : {std::int64_t(0), r->cols / 2 + 1 < r->cols ? r->cols / 2 + 1 : r->cols - 1, r->cols - 1}) {
        float got = io::visit_policy(r->format, [&]<class P>() {
          return P::decode(static_cast<typename P::storage_type const*>(r->data),
                           static_cast<typename P::scale_type const*>(r->scales), r->rows, r->cols, rr, cc);
        });
        float want;
        if (want_format == io::StorageFormat::kFp8Block) want = iotest::plain_value(idx, rr, cc) * iotest::kFp8ScaleInv;
        else if (want_format == io::StorageFormat::kMxfp4) {
          static float const mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
          int code = iotest::fp4_code(idx, rr, cc);
          want = ((code & 8) ? -mag[code & 7] : mag[code & 7]) * 0.5f;
        } else want = iotest::plain_value(idx, rr, cc);
        CHECK_MESSAGE(got == want, t.name << " (" << rr << "," << cc << ")");
      }
  }
  if (layout == iotest::Layout::kFp4) CHECK(seen.count(io::StorageFormat::kMxfp4));
  if (layout != iotest::Layout::kBf16) CHECK(seen.count(io::StorageFormat::kFp8Block));
}

}  // namespace

TEST_CASE("weights: BF16, -fp8 and -fp4 layouts bind every planned tensor") {
  iotest::TempDir tmp("weights");
  auto cfg = iotest::tiny_ling_config();
  for (auto layout : {iotest::Layout::kBf16, iotest::Layout::kFp8, iotest::Layout::kFp4}) {
    CAPTURE(int(layout));
    auto dir = tmp / ("layout" + std::to_string(int(layout)));
    iotest::WriteOptions o;
    o.shards = layout == iotest::Layout::kFp8 ? 2 : 1;
    iotest::write_checkpoint(dir, cfg, layout, o);
    auto ckpt = io::Checkpoint::open(dir);
    auto w = io::CheckpointWeights::load(ckpt);
    CHECK(w.weights().size() == w.plan().size());
    check_values(w, layout);
    auto const& q = w.get("model.layers.0.attention.q_proj.weight");
    CHECK(q.rows == 64);
    CHECK(q.cols == 160);
    CHECK(w.get("model.layers.0.attention.q_conv1d.weight").cols == 4);
    CHECK(w.get("model.norm.weight").rows == 1);
    CHECK(w.get("model.norm.weight").cols == 160);
    // alias lookup
    CHECK(w.find("model.layers.1.mlp.gate.e_score_correction_bias") == w.find("model.layers.1.mlp.gate.expert_bias"));
    if (layout == iotest::Layout::kFp8) {
      CHECK(q.bytes == 64 * 160 + 1 * 2 * 4);
      auto v = q.view<quant::Fp8Block>();
      CHECK(v.at(63, 159) == iotest::plain_value(3, 63, 159) * 2.0f);  // q_proj is tensor 3 in plan order
      check_error([&] { (void)q.view<quant::Mxfp4>(); }, ErrorCode::kInternal, {"q_proj"});
    }
    if (layout == iotest::Layout::kFp4) {
      auto const& e = w.get("model.layers.1.mlp.experts.0.down_proj.weight");
      CHECK(e.format == io::StorageFormat::kMxfp4);
      CHECK(e.bytes == 160 * 32 + 160 * 2);
    }
    check_error([&] { w.get("model.layers.9.nothing"); }, ErrorCode::kMissingTensor, {"model.layers.9.nothing"});
  }
}

TEST_CASE("weights: missing, unexpected and mis-shaped tensors and scales") {
  iotest::TempDir tmp("weights_bad");
  auto cfg = iotest::tiny_ling_config();
  auto load = [&](std::string const& name, iotest::Layout layout, iotest::WriteOptions const& o) {
    auto dir = tmp / name;
    iotest::write_checkpoint(dir, cfg, layout, o);
    auto ckpt = io::Checkpoint::open(dir);
    io::CheckpointWeights::load(ckpt);
  };
  using L = iotest::Layout;
  struct Case {
    char const* what;
    L layout;
    iotest::WriteOptions opt;
    ErrorCode code;
    std::vector<std::string> needles;
  };
  auto tweak_shape = [](std::string target, Shape s) {
    return [=](std::string& n, DType&, Shape& shape) { if (n == target) shape = s; };
  };
  auto tweak_dtype = [](std::string target, DType d) {
    return [=](std::string& n, DType& dt, Shape&) { if (n == target) dt = d; };
  };
  auto rename = [](std::string from, std::string to) {
    return [=](std::string& n, DType&, Shape&) { if (n == from) n = to; };
  };
  std::vector<Case> cases;
  cases.push_back({"missing tensor", L::kBf16, {{"model.layers.1.attention.dt_bias"}, {}, {}, 1}, ErrorCode::kMissingTensor,
                   {"'model.layers.1.attention.dt_bias'", "[64]", "missing"}});
  cases.push_back({"missing lm_head (not tied)", L::kBf16, {{"lm_head.weight"}, {}, {}, 1}, ErrorCode::kMissingTensor,
                   {"'lm_head.weight'"}});
  cases.push_back({"missing MTP tensor", L::kBf16, {{"model.layers.3.eh_proj.weight"}, {}, {}, 1}, ErrorCode::kMissingTensor,
                   {"'model.layers.3.eh_proj.weight'"}});
  cases.push_back({"unexpected tensor", L::kBf16, {{}, {"model.layers.0.attention.extra.weight"}, {}, 1},
                   ErrorCode::kUnexpectedTensor, {"'model.layers.0.attention.extra.weight'", "model.safetensors"}});
  cases.push_back({"mis-shaped matrix", L::kBf16, {{}, {}, tweak_shape("model.layers.0.attention.o_proj.weight", {64, 160}), 1},
                   ErrorCode::kShape, {"'model.layers.0.attention.o_proj.weight'", "[64,160]", "[160,64]"}});
  cases.push_back({"mis-shaped A_log", L::kBf16, {{}, {}, tweak_shape("model.layers.0.attention.A_log", {1, 2}), 1},
                   ErrorCode::kShape, {"A_log", "[1,2]"}});
  cases.push_back({"mis-shaped conv", L::kBf16, {{}, {}, tweak_shape("model.layers.1.attention.v_conv1d.weight", {64, 4}), 1},
                   ErrorCode::kShape, {"v_conv1d", "[64,1,4]"}});
  cases.push_back({"integer dtype", L::kBf16, {{}, {}, tweak_dtype("model.norm.weight", DType::kI32), 1}, ErrorCode::kShape,
                   {"'model.norm.weight'", "I32"}});
  cases.push_back({"FP8 without its scale", L::kFp8,
                   {{}, {}, rename("model.layers.0.attention.k_proj.weight_scale_inv", "model.layers.0.attention.k_scale"), 1},
                   ErrorCode::kMissingTensor, {"k_proj.weight_scale_inv", "missing"}});
  cases.push_back({"FP8 scale of the wrong shape", L::kFp8,
                   {{}, {}, tweak_shape("model.layers.0.attention.k_proj.weight_scale_inv", {1, 1}), 1}, ErrorCode::kShape,
                   {"k_proj.weight_scale_inv", "[1,1]", "[1,2]"}});
  cases.push_back({"FP8 scale of the wrong dtype", L::kFp8,
                   {{}, {}, tweak_dtype("model.layers.0.attention.k_proj.weight_scale_inv", DType::kBF16), 1},
                   ErrorCode::kShape, {"k_proj.weight_scale_inv", "BF16"}});
  cases.push_back({"MXFP4 packed shape wrong", L::kFp4,
                   {{}, {}, tweak_shape("model.layers.2.mlp.experts.1.up_proj.weight", {64, 160}), 1}, ErrorCode::kShape,
                   {"experts.1.up_proj.weight", "[64,80]"}});
  cases.push_back({"MXFP4 scale shape wrong", L::kFp4,
                   {{}, {}, tweak_shape("model.layers.2.mlp.experts.1.up_proj.weight_scale_inv", {64, 4}), 1},
                   ErrorCode::kShape, {"experts.1.up_proj.weight_scale_inv", "[64,5]"}});
  cases.push_back({"orphan scale", L::kBf16, {{}, {"model.norm.weight_scale_inv"}, {}, 1}, ErrorCode::kShape,
                   {"'model.norm.weight'", "scale sibling"}});
  cases.push_back({"FP8 vector", L::kBf16, {{}, {}, tweak_dtype("model.layers.0.attention.o_norm.weight", DType::kF8E4M3), 1},
                   ErrorCode::kShape, {"o_norm.weight", "only matrices"}});
  cases.push_back({"renamed expert", L::kFp4,
                   {{}, {}, rename("model.layers.1.mlp.experts.2.gate_proj.weight", "model.layers.1.mlp.experts.2.w1.weight"), 1},
                   ErrorCode::kMissingTensor, {"experts.2.gate_proj.weight"}});
  int n = 0;
  for (auto const& c : cases) {
    std::string const what = c.what;
    CAPTURE(what);
    check_error([&] { load("case" + std::to_string(n++), c.layout, c.opt); }, c.code, c.needles);
  }
  SUBCASE("tied embeddings: lm_head may be absent") {
    auto tied = cfg;
    tied["tie_word_embeddings"] = true;
    iotest::write_checkpoint(tmp / "tied", tied, L::kBf16, {{"lm_head.weight"}, {}, {}, 1});
    auto ckpt = io::Checkpoint::open(tmp / "tied");
    auto w = io::CheckpointWeights::load(ckpt);
    CHECK(w.find("lm_head.weight") == nullptr);
    CHECK(w.find("model.word_embeddings.weight") != nullptr);
  }
  SUBCASE("A_log stored [1,1,H,1] and the e_score_correction_bias alias") {
    auto rn = [](std::string& n, DType&, Shape& s) {
      if (n == "model.layers.1.attention.A_log") s = {1, 1, 2, 1};
      if (n == "model.layers.1.mlp.gate.expert_bias") n = "model.layers.1.mlp.gate.e_score_correction_bias";
    };
    iotest::write_checkpoint(tmp / "alias", cfg, L::kBf16, {{}, {}, rn, 1});
    auto ckpt = io::Checkpoint::open(tmp / "alias");
    auto w = io::CheckpointWeights::load(ckpt);
    auto const& b = w.get("model.layers.1.mlp.gate.expert_bias");
    CHECK(b.stored_name == "model.layers.1.mlp.gate.e_score_correction_bias");
    CHECK(w.get("model.layers.1.attention.A_log").cols == 2);
  }
}

TEST_CASE("footprint: Ling-3.0-flash parameter count and bytes per token (spec §4)") {
  auto cfg = ModelConfig::load(LING_TEST_DATA "/ling3-flash-config/config.json");
  auto plan = model::plan_tensors(cfg);
  auto p = model::count_parameters(cfg, plan);
  CHECK(std::fabs(p.total / 1e9 - 124.41) < 0.01);
  CHECK(std::fabs(p.total_with_mtp / 1e9 - 127.49) < 0.01);
  CHECK(std::fabs(p.active / 1e9 - 5.10) < 0.01);
  auto tb = model::bytes_per_token(cfg, plan, model::assumed_fp4_bytes);
  // spec §4's terms, each recomputed here from the dims
  double const experts = 40.0 * 8 * 3 * 2560 * 768 * 4.25 / 8;
  double const kda = 35.0 * (5.0 * 4096 * 2560 + 32 * 2560 + 2560 * 4096);
  double const mla = 7.0 * (32 * 192 * 2560 + 576 * 2560 + 32 * 256 * 512 + 32 * 2560 + 2560 * 4096);
  double const shared_dense = 40.0 * 3 * 2560 * 768 + 2.0 * 3 * 2560 * 6144;
  double const routers = 40.0 * 512 * 2560 * 2;
  CHECK(tb[TensorGroup::kRoutedExperts] == doctest::Approx(experts).epsilon(1e-9));
  CHECK(tb[TensorGroup::kKda] == doctest::Approx(kda).epsilon(0.005));  // + scales, conv, A_log, dt_bias, o_norm
  CHECK(tb[TensorGroup::kMla] == doctest::Approx(mla).epsilon(0.002));
  CHECK(tb[TensorGroup::kSharedExperts] + tb[TensorGroup::kDenseMlp] == doctest::Approx(shared_dense).epsilon(0.002));
  CHECK(tb[TensorGroup::kRouter] == doctest::Approx(routers).epsilon(0.002));
  CHECK(tb.lm_head_bf16 == 157184.0 * 2560 * 2);
  CHECK(tb.lm_head_fp8_row == 157184.0 * 2560 + 157184.0 * 4);
  double const spec_sum_fp8 = (1.00 + 2.20 + 0.22 + 0.33 + 0.1 + 0.40) * 1e9;  // spec §4, ≈ 4.3 GB/token
  CHECK(std::fabs(tb.total_fp8_head() - spec_sum_fp8) / spec_sum_fp8 < 0.02);
  CHECK(std::fabs(tb.total_bf16_head() / 1e9 - 4.7) < 0.05);
  auto mtp = model::bytes_per_token(cfg, plan, model::assumed_fp4_bytes, true);
  CHECK(mtp.total_fp8_head() > tb.total_fp8_head());
}

TEST_CASE("tests/data checkpoints (written by tools/oracle) load, and their counts match their files") {
  namespace fs = std::filesystem;
  int loaded = 0;
  std::error_code ec;
  if (!fs::is_directory(LING_TEST_DATA, ec)) return;
  for (auto const& entry : fs::directory_iterator(LING_TEST_DATA)) {
    fs::path dir = entry.path();
    if (!fs::exists(dir / "config.json") ||
        !(fs::exists(dir / "model.safetensors") || fs::exists(dir / "model.safetensors.index.json")))
      continue;
    std::string const name = dir.filename().string();
    CAPTURE(name);
    auto ckpt = io::Checkpoint::open(dir);
    auto w = io::CheckpointWeights::load(ckpt);
    // Parameters from the plan == elements stored in the files (scales excluded, MXFP4 bytes hold two elements).
    std::int64_t stored = 0;
    for (auto const& n : ckpt.names()) {
      if (n.size() > 10 && n.compare(n.size() - 10, 10, "_scale_inv") == 0) continue;
      auto const& t = ckpt.get(n);
      stored += t.numel() * (t.dtype == DType::kU8 || t.dtype == DType::kI8 ? 2 : 1);
    }
    auto p = model::count_parameters(ckpt.config(), w.plan());
    CHECK(p.total_with_mtp == stored);
    CHECK(p.active <= p.total);
    ++loaded;
  }
  MESSAGE("tests/data checkpoints loaded: " << loaded);
}
