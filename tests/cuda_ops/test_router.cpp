// GPU router against the CPU router (cpu/router.hpp route_scores) on the GPU's own logits (so near-ties cannot make
// the two selections differ), and the GPU logits against the CPU linear. Launched twice: the block counter must
// re-arm itself (graph replay).
#include <doctest/doctest.h>

#include "ling/cpu/linear.hpp"
#include "ling/cpu/router.hpp"
#include "ling/cuda/router.hpp"
#include "util.hpp"

using namespace ling;
using namespace ling::test_ops;

namespace {

// The CPU router's config for the GPU router's parameters.
layers::Router<>::Config router_config(std::int64_t experts, std::int64_t hidden, cuda::RouterParams const& p) {
  layers::Router<>::Config cfg;
  cfg.experts = Extent<dynamic>(experts, "num_experts");
  cfg.hidden = Extent<dynamic>(hidden, "hidden_size");
  cfg.top_k = p.top_k;
  cfg.n_group = p.n_group;
  cfg.topk_group = p.topk_group;
  cfg.norm_topk_prob = p.norm_topk_prob;
  cfg.routed_scaling_factor = p.routed_scaling;
  return cfg;
}

// The GPU's picks (didx) and weights (dw) against the CPU's.
void check_picks(layers::Routing const& want, cuda::DeviceBuffer const& didx, DeviceVec const& dw, int top_k) {
  std::vector<int> idx(static_cast<std::size_t>(top_k));
  didx.download(idx.data(), idx.size() * sizeof(int));
  auto wts = dw.get();
  for (int k = 0; k < top_k; ++k) {
    CAPTURE(k);
    CHECK(idx[static_cast<std::size_t>(k)] == want.experts[static_cast<std::size_t>(k)]);
    CHECK(wts[static_cast<std::size_t>(k)] == doctest::Approx(want.weights[static_cast<std::size_t>(k)]).epsilon(1e-5));
  }
}

// distinct > 0 (unscaled policies): every router row and bias is one of `distinct` patterns, so that many experts tie
// (equal logits and biased scores, in one group and across groups, and equal group scores): the selection must break
// the ties by the lower expert id and the lower group index, as the CPU does.
template <class P>
void check_router(std::int64_t experts, std::int64_t hidden, cuda::RouterParams p, bool with_bias, int distinct = 0) {
  CAPTURE(experts);
  CAPTURE(p.n_group);
  CAPTURE(distinct);
  auto w = random_matrix<P>(experts, hidden, 0.05f);
  auto u = randn(static_cast<std::size_t>(hidden));
  std::vector<float> bias = with_bias ? randn(static_cast<std::size_t>(experts), 0.05f) : std::vector<float>{};
  if (distinct > 0) {
    static_assert(std::is_same_v<typename P::scale_type, quant::NoScale>, "rows are copied as plain storage");
    auto const pattern = [&](std::int64_t e) { return (e * 37 / 11 + e / 64) % distinct; };
    auto const rows = w.data;
    auto const biases = bias;
    for (std::int64_t e = 0; e < experts; ++e) {
      std::copy_n(rows.begin() + pattern(e) * hidden, hidden, w.data.begin() + e * hidden);
      if (with_bias) bias[std::size_t(e)] = biases[std::size_t(pattern(e))];
    }
  }
  auto dw = cuda::DeviceMatrix<P>::upload(w.view());
  DeviceVec du(u), dbias(with_bias ? bias : std::vector<float>(1)), dweights(static_cast<std::size_t>(p.top_k));
  cuda::DeviceBuffer didx(static_cast<std::size_t>(p.top_k) * sizeof(int));
  cuda::RouterWorkspace ws(experts);

  // CPU logits through the CPU backend's linear
  using L = layers::Linear<quant::PolicyList<P>>;
  cpu::Matrix um = Eigen::Map<cpu::Matrix const>(u.data(), 1, hidden);
  cpu::Matrix logits_ref = cpu::linear(L::view(w.view()), um);

  layers::Router<>::Config const cfg = router_config(experts, hidden, p);
  REQUIRE(cuda::can_implement_router(experts, p).is_ok());

  for (int rep = 0; rep < 2; ++rep) {
    dweights.poison();
    cuda::check(cudaMemset(didx.data(), 0xFF, didx.bytes()), "poison idx");
    REQUIRE(cuda::launch_router(dw, with_bias ? dbias.data() : nullptr, du.data(), p, ws, didx.data<int>(), dweights.data(),
                                nullptr) == cudaSuccess);
    device_sync();
    std::vector<float> logits(static_cast<std::size_t>(experts));
    cuda::check(cudaMemcpy(logits.data(), ws.logits(), logits.size() * sizeof(float), cudaMemcpyDeviceToHost), "logits");
    std::vector<double> ref(static_cast<std::size_t>(experts));
    for (std::int64_t e = 0; e < experts; ++e) ref[static_cast<std::size_t>(e)] = logits_ref(0, e);
    CHECK(rel_l2(logits, ref) < 1e-5);

    check_picks(cpu::route_scores(cfg, logits.data(), bias), didx, dweights, p.top_k);
  }
}

}  // namespace

namespace ling::cuda::test {
cudaError_t launch_select_fast(float const* logits, float const* bias, int experts, RouterParams const& p, int* idx,
                               float* w, int* cand);
}

// MoE launch A's selection (router_select_fast: the candidate path, its fallback beyond 32 candidates) against the CPU
// on given logits at Ling's shape: random scores, equal scores across groups and inside one (the candidate path's
// tie-break), and patterns of a few values (more than 32 candidates: the fallback). Both paths must run.
TEST_CASE("router: launch A's candidate selection and its fallback against the CPU, ties included") {
  LING_REQUIRE_GPU();
  int const experts = 512;
  cuda::RouterParams const p{8, 8, 4, 2.5f, true};
  layers::Router<>::Config const cfg = router_config(experts, 64, p);
  DeviceVec dw(static_cast<std::size_t>(p.top_k));
  cuda::DeviceBuffer didx(static_cast<std::size_t>(p.top_k) * sizeof(int)), dcand(sizeof(int));
  int runs[2] = {0, 0};
  for (int t = 0; t < 24; ++t) {
    CAPTURE(t);
    auto logits = randn(static_cast<std::size_t>(experts));
    auto bias = randn(static_cast<std::size_t>(experts), 0.05f);
    if (t % 3 == 1) {  // groups 0 and 1 equal (equal group scores too), and pairs of equal experts in group 2
      for (int i = 0; i < 64; ++i) logits[std::size_t(64 + i)] = logits[std::size_t(i)], bias[std::size_t(64 + i)] = bias[std::size_t(i)];
      for (int i = 0; i < 64; i += 2)
        logits[std::size_t(129 + i)] = logits[std::size_t(128 + i)], bias[std::size_t(129 + i)] = bias[std::size_t(128 + i)];
    } else if (t % 3 == 2) {  // a few values only: many candidates
      for (int e = 0; e < experts; ++e) logits[std::size_t(e)] = float((e * 37 / 11 + e / 64) % 3), bias[std::size_t(e)] = 0.f;
    }
    DeviceVec dl(logits), db(bias);
    dw.poison();
    cuda::check(cudaMemset(didx.data(), 0xFF, didx.bytes()), "poison idx");
    REQUIRE(cuda::test::launch_select_fast(dl.data(), db.data(), experts, p, didx.data<int>(), dw.data(), dcand.data<int>()) ==
            cudaSuccess);
    device_sync();
    int cand = -1;
    dcand.download(&cand, sizeof(int));
    REQUIRE((cand == 0 || cand == 1));
    ++runs[cand];
    check_picks(cpu::route_scores(cfg, logits.data(), bias), didx, dw, p.top_k);
  }
  CHECK(runs[1] >= 16);  // random and paired scores: at most ~10 candidates
  CHECK(runs[0] >= 1);   // three values: hundreds of candidates
}

TEST_CASE("router: Ling shape (512 experts, 8 groups keep 4, top-8, bf16 weights, bias)") {
  LING_REQUIRE_GPU();
  check_router<quant::Bf16>(512, 2560, {8, 8, 4, 2.5f, true}, true);
}

TEST_CASE("router: no groups, no normalisation, f32 weights, odd hidden") {
  LING_REQUIRE_GPU();
  check_router<quant::F32>(64, 203, {6, 1, 1, 1.0f, false}, false);
  check_router<quant::Bf16>(256, 1000, {8, 8, 4, 2.446f, true}, true);
  check_router<quant::Bf16>(1024, 96, {32, 16, 8, 1.5f, true}, true);
}

// The ranked path (groups of 32 or 64 experts, topk_group · top_k <= 32) and the other paths on ties.
TEST_CASE("router: ties break by the lower expert id and group index") {
  LING_REQUIRE_GPU();
  check_router<quant::F32>(512, 96, {8, 8, 4, 2.446f, true}, true, 3);
  check_router<quant::F32>(512, 96, {8, 8, 4, 2.446f, true}, true, 40);
  check_router<quant::F32>(256, 96, {8, 8, 4, 1.0f, false}, false, 5);
  check_router<quant::F32>(1024, 64, {16, 16, 2, 1.0f, true}, true, 7);
  check_router<quant::F32>(128, 64, {8, 8, 4, 1.0f, true}, true, 5);  // groups of 16: the two-stage path
  check_router<quant::F32>(64, 64, {6, 1, 1, 1.0f, false}, false, 4);  // no groups: one warp over all experts
}

TEST_CASE("router: ranked path shapes (16 groups of 64, 2 groups of 64, top-1)") {
  LING_REQUIRE_GPU();
  check_router<quant::Bf16>(1024, 256, {16, 16, 2, 1.5f, true}, true);
  check_router<quant::Bf16>(128, 256, {8, 2, 1, 1.0f, true}, false);
  check_router<quant::Bf16>(512, 256, {1, 8, 4, 2.446f, false}, true);
}
