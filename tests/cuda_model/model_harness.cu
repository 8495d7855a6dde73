// The CUDA session's definitions for test_cuda_model (session.cuh is included by exactly one .cu of a program).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "ling/cuda/model.cuh"
#include "ling/io/checkpoint.hpp"
#include "ling/io/weights.hpp"
#include "ling/cuda/session.cuh"
#include "model_harness.hpp"

namespace ling::test_gpu {

namespace {

// Ling-3.0-flash's widths (config_json) cut to `layers` layers; under the sanitizer scripts also to a vocabulary of
// LING_TEST_FLASH_VOCAB rows (1024 to the config's; unset: the config's 157 184). The LM head is the same kernel
// instance at 16 384 rows as at 157 184 (more rows than one pass of the grid's warps). At 157 184 rows its shared-memory
// reads of x (~100 M per step) are about as many as the rest of the 6-layer step's together, each of them checked by
// racecheck (session 47's estimate from the kernels' loads, not measured).
ModelConfig flash_config(std::string const& config_json, int layers) {
  std::ifstream f(config_json);
  require(bool(f), ErrorCode::kIo, config_json + ": cannot open");
  nlohmann::json j = nlohmann::json::parse(f);
  j["num_hidden_layers"] = layers;
  if (char const* e = std::getenv("LING_TEST_FLASH_VOCAB"); e && *e) {
    long long const v = std::atoll(e), full = j.value("vocab_size", 0LL);
    require(v >= 1024 && v <= full, ErrorCode::kInvalidArgument,
            "LING_TEST_FLASH_VOCAB=" + std::string(e) + ": must lie in [1024, " + std::to_string(full) + "]");
    j["vocab_size"] = v;
    for (char const* k : {"pad_token_id", "eos_token_id", "bos_token_id"})  // ids past the cut would be refused
      if (j.contains(k) && j[k].is_number_integer() && j[k].get<long long>() >= v) j.erase(k);
  }
  for (char const* k : {"expert_swiglu_limit_list", "share_expert_swiglu_limit_list"})
    if (j.contains(k) && j[k].is_array() && int(j[k].size()) > layers) j[k].erase(j[k].begin() + layers, j[k].end());
  return ModelConfig::from_json(j, config_json + " (cut to " + std::to_string(layers) + " layers)");
}

}  // namespace

FlashSteps flash_random_steps(std::string const& config_json, int layers, std::uint64_t seed, bool graph, int mla_short,
                              int steps, std::int32_t token, std::vector<std::int32_t> const* feed) {
  ModelConfig const c = flash_config(config_json, layers);
  cuda::CudaModelOptions o;
  o.max_context = 64;
  o.use_graph = graph;
  o.mla_short = mla_short;
  auto m = cuda::CudaModel::random(c, seed, o);
  FlashSteps out;
  std::vector<float> host(static_cast<std::size_t>(c.vocab_size));
  std::int32_t t = token;
  for (int s = 0; s < steps; ++s) {
    if (s > 0) t = feed ? (*feed)[static_cast<std::size_t>(s - 1)] : out.picks.back();
    m->step(t);
    m->download_logits(host.data());
    out.logits.push_back(host);
    out.picks.push_back(std::int32_t(std::max_element(host.begin(), host.end()) - host.begin()));
  }
  return out;
}

namespace {

PredictCount count_predictions(cuda::CudaModel& m, int steps) {
  PredictCount n;
  for (int s = 0; s < steps; ++s) {
    auto const p = m.predict_step();
    n.hits += p.hits, n.picks += p.picks;
  }
  return n;
}

}  // namespace

PredictCount flash_predict_count(std::string const& config_json, int layers, std::uint64_t seed, std::int32_t token,
                                 int steps) {
  cuda::CudaModelOptions o;
  o.max_context = 64;
  auto m = cuda::CudaModel::random(flash_config(config_json, layers), seed, o);
  m->step(token);
  return count_predictions(*m, steps);
}

PredictCount checkpoint_predict_count(std::string const& dir, std::vector<std::int32_t> const& prompt, int steps) {
  auto s = cuda::CudaSession::open(dir, {4096, false, true});
  (void)s.prefill(prompt);
  return count_predictions(s.model(), steps);
}

namespace {

TokensCompare compare_tokens(cuda::CudaModel& m, std::vector<std::int32_t> const& feed) {
  std::size_t const V = std::size_t(m.vocab_size()), n = feed.size();
  std::vector<float> one(n * V), two(n * V);
  m.reset();
  for (std::size_t i = 0; i < n; ++i) {
    m.step(feed[i]);
    m.download_logits(one.data() + i * V);
  }
  m.reset();
  for (std::size_t i = 0, pass = 0; i < n; ++pass) {
    std::size_t const k = pass % 3 == 2 || i + 1 == n ? 1 : 2;
    m.step_tokens(std::span<std::int32_t const>(feed.data() + i, k));
    std::memset(two.data() + i * V, 0xFF, k * V * sizeof(float));  // NaN unless written
    m.download_logits(two.data() + i * V, int(k));
    i += k;
  }
  TokensCompare r;
  for (std::size_t i = 0; i < n * V; ++i) {
    ++r.compared;
    r.differing += std::memcmp(&one[i], &two[i], sizeof(float)) != 0;
    r.nan += std::isnan(two[i]);
  }
  return r;
}

}  // namespace

TokensCompare step_tokens_checkpoint(std::string const& dir, std::vector<std::int32_t> const& feed, int mla_short,
                                     bool fp8_head, bool graph) {
  io::Checkpoint ckpt = io::Checkpoint::open(dir);
  io::CheckpointWeights w = io::CheckpointWeights::load(ckpt);
  cuda::CudaModelOptions o;
  o.max_context = 64;
  o.lm_head_fp8 = fp8_head;
  o.use_graph = graph;
  o.mla_short = mla_short;
  auto m = cuda::CudaModel::from_checkpoint(w, ckpt.config(), o);
  return compare_tokens(*m, feed);
}

TokensCompare step_tokens_flash(std::string const& config_json, int layers, std::uint64_t seed,
                                std::vector<std::int32_t> const& feed, int mla_short) {
  cuda::CudaModelOptions o;
  o.max_context = 64;
  o.mla_short = mla_short;
  auto m = cuda::CudaModel::random(flash_config(config_json, layers), seed, o);
  return compare_tokens(*m, feed);
}

TokensCompare rewind_checkpoint(std::string const& dir, int mla_short) {
  io::Checkpoint ckpt = io::Checkpoint::open(dir);
  io::CheckpointWeights w = io::CheckpointWeights::load(ckpt);
  cuda::CudaModelOptions o;
  o.max_context = 64;
  o.mla_short = mla_short;
  auto m = cuda::CudaModel::from_checkpoint(w, ckpt.config(), o);
  std::size_t const V = std::size_t(m->vocab_size());
  std::vector<std::int32_t> feed(10);
  for (std::size_t i = 0; i < feed.size(); ++i) feed[i] = std::int32_t((i * 29 + 3) % 256);
  std::vector<float> one(feed.size() * V), got(feed.size() * V, NAN), two(2 * V);
  m->reset();
  for (std::size_t i = 0; i < feed.size(); ++i) {
    m->step(feed[i]);
    m->download_logits(one.data() + i * V);
  }
  m->reset();
  auto single = [&](std::size_t i) {
    m->step(feed[i]);
    m->download_logits(got.data() + i * V);
  };
  auto pass = [&](std::size_t i, std::int32_t second, bool keep) {  // feed[i] and `second`; keep: second is feed[i + 1]
    std::int32_t const t[2] = {feed[i], second};
    m->step_tokens(t);
    m->download_logits(two.data(), 2);
    std::copy(two.begin(), two.begin() + std::ptrdiff_t(V), got.begin() + std::ptrdiff_t(i * V));
    if (keep) std::copy(two.begin() + std::ptrdiff_t(V), two.end(), got.begin() + std::ptrdiff_t((i + 1) * V));
    else m->rewind(1);
  };
  single(0), single(1), single(2);
  pass(3, 77, false);  // a wrong draft taken back: position 4 next
  pass(4, feed[5], true);
  pass(6, 199, false);
  single(7);
  pass(8, feed[9], true);
  TokensCompare r;
  for (std::size_t i = 0; i < one.size(); ++i) {
    ++r.compared;
    r.differing += std::memcmp(&one[i], &got[i], sizeof(float)) != 0;
    r.nan += std::isnan(got[i]);
  }
  return r;
}

MtpRun mtp_checkpoint(std::string const& dir, std::vector<std::int32_t> const& feed) {
  io::Checkpoint ckpt = io::Checkpoint::open(dir);
  io::CheckpointWeights w = io::CheckpointWeights::load(ckpt);
  cuda::CudaModelOptions o;
  o.max_context = 64;
  o.lm_head_fp8 = false;  // the CPU's head
  auto m = cuda::CudaModel::from_checkpoint(w, ckpt.config(), o);
  MtpRun r;
  r.has_mtp = m->has_mtp();
  if (!r.has_mtp) return r;
  std::vector<float> l(static_cast<std::size_t>(m->vocab_size()));
  for (std::size_t i = 0; i + 1 < feed.size(); ++i) {
    m->step(feed[i]);
    m->mtp_after(std::span<std::int32_t const>(&feed[i + 1], 1));
    std::fill(l.begin(), l.end(), NAN);
    m->download_mtp_logits(l.data());
    r.single.push_back(l);
    r.draft.push_back(m->mtp_argmax());
  }
  m->reset();
  for (std::size_t i = 0; i + 2 < feed.size(); i += 2) {
    m->step_tokens(std::span<std::int32_t const>(&feed[i], 2));
    m->mtp_after(std::span<std::int32_t const>(&feed[i + 1], 2));
    std::fill(l.begin(), l.end(), NAN);
    m->download_mtp_logits(l.data());
    r.passes.push_back(l);
  }
  return r;
}

TokensRefusals step_tokens_refusals(std::string const& dir) {
  io::Checkpoint ckpt = io::Checkpoint::open(dir);
  io::CheckpointWeights w = io::CheckpointWeights::load(ckpt);
  cuda::CudaModelOptions o;
  o.max_context = 8;
  auto m = cuda::CudaModel::from_checkpoint(w, ckpt.config(), o);
  auto code = [&](std::vector<std::int32_t> const& t) {
    try {
      m->step_tokens(t);
    } catch (Error const& e) {
      return int(e.code());
    }
    return -1;
  };
  auto rewind_code = [&](int n) {
    try {
      m->rewind(n);
    } catch (Error const& e) {
      return int(e.code());
    }
    return -1;
  };
  TokensRefusals r;
  r.too_many = code({1, 2, 3});
  r.bad_id = code({1, std::int32_t(m->vocab_size())});
  m->step(1);
  r.rewind_single = rewind_code(1);
  (void)code({1, 2});
  r.rewind_two = rewind_code(2);
  (void)rewind_code(1);
  r.rewind_twice = rewind_code(1);
  m->reset();
  for (int i = 0; i < 7; ++i) m->step(1);  // position 7 of 8: room for one token
  r.overflow = code({1, 2});
  std::vector<float> l(static_cast<std::size_t>(m->vocab_size()));
  m->step(2);
  m->download_logits(l.data());
  r.still_decodes = m->position() == 8 && std::all_of(l.begin(), l.end(), [](float v) { return std::isfinite(v); });
  return r;
}

std::int64_t route_predictor_mismatches(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  using cuda::DeviceBuffer;
  using cuda::MatFormat;
  using cuda::ModelMatrix;
  DeviceBuffer rw(std::size_t(rows * cols) * 2, "router");
  ModelMatrix const router{MatFormat::kBf16, rw.data(), nullptr, rows, cols};
  cuda::rnd::fill_matrix(router, seed, 1.0f / std::sqrt(float(cols)));
  // norm weights: N(1, 0.3), with zeros (and a tiny w_in) on some columns
  std::mt19937 g{static_cast<unsigned>(seed)};
  std::normal_distribution<float> nd(1.0f, 0.3f);
  std::vector<float> post(static_cast<std::size_t>(cols)), in(static_cast<std::size_t>(cols));
  for (std::int64_t c = 0; c < cols; ++c) {
    post[std::size_t(c)] = nd(g), in[std::size_t(c)] = nd(g);
    if (c % 97 == 5) in[std::size_t(c)] = 0.f;
    if (c % 89 == 7) post[std::size_t(c)] = 0.f;
    if (c % 211 == 3) in[std::size_t(c)] = 1e-30f;  // a huge ratio: its tile's scale grows, no value is lost to inf
  }
  DeviceBuffer dpost(post.size() * 4, "post"), din(in.size() * 4, "in");
  dpost.upload(post.data(), post.size() * 4);
  din.upload(in.data(), in.size() * 4);
  std::vector<std::uint16_t> hr(static_cast<std::size_t>(rows * cols));
  cuda::check(cudaMemcpy(hr.data(), rw.data(), hr.size() * 2, cudaMemcpyDeviceToHost), "router download");
  auto value = [&](std::int64_t r, std::int64_t c) {  // the host's P[r, c] (float, as the kernel computes it)
    float const w = to_float(Bfloat16{hr[std::size_t(r * cols + c)]});
    float const i = in[std::size_t(c)], v = std::fabs(i) > 0.f ? w * (post[std::size_t(c)] / i) : 0.f;
    return std::isfinite(v) ? v : 0.f;
  };
  std::int64_t bad = 0;
  for (MatFormat f : {MatFormat::kFp8Block, MatFormat::kBf16, MatFormat::kF32}) {
    std::size_t const sb = std::size_t(cuda::matrix_storage_bytes(f, rows, cols)),
                      cb = std::size_t(cuda::matrix_scale_bytes(f, rows, cols));
    DeviceBuffer dd(sb, "predictor"), ds(std::max<std::size_t>(cb, 4), "predictor scales");
    cuda::check(cudaMemset(dd.data(), 0xA5, sb), "poison");  // every value is written
    ModelMatrix const dst{f, dd.data(), cb ? ds.data() : nullptr, rows, cols};
    cuda::build_route_predictor(router, dpost.data<float>(), din.data<float>(), dst);
    cuda::check(cudaDeviceSynchronize(), "route predictor");
    std::vector<unsigned char> hd(sb);
    std::vector<float> hs(cb / 4);
    cuda::check(cudaMemcpy(hd.data(), dd.data(), sb, cudaMemcpyDeviceToHost), "predictor download");
    if (cb) cuda::check(cudaMemcpy(hs.data(), ds.data(), cb, cudaMemcpyDeviceToHost), "predictor download");
    std::int64_t const nbc = (cols + 127) / 128;
    for (std::int64_t br = 0; br < (rows + 127) / 128; ++br)
      for (std::int64_t bc = 0; bc < nbc; ++bc) {
        float amax = 0.f;
        for (std::int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r)
          for (std::int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c)
            amax = std::max(amax, std::fabs(value(r, c)));
        float const scale = amax > 0.f ? amax / kE4m3Max : 1.f;
        if (f == MatFormat::kFp8Block) bad += hs[std::size_t(br * nbc + bc)] != scale;
        for (std::int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r)
          for (std::int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c) {
            std::size_t const i = std::size_t(r * cols + c);
            float const v = value(r, c);
            switch (f) {
              case MatFormat::kFp8Block:
                bad += hd[i] != e4m3_from_float(v / scale).bits;
                break;
              case MatFormat::kBf16: {
                std::uint16_t got;
                std::memcpy(&got, hd.data() + 2 * i, 2);
                bad += got != bf16_from_float(v).bits;
                break;
              }
              default: {
                float got;
                std::memcpy(&got, hd.data() + 4 * i, 4);
                bad += std::memcmp(&got, &v, 4) != 0;
                break;
              }
            }
          }
      }
  }
  return bad;
}

}  // namespace ling::test_gpu
