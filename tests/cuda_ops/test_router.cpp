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

template <class P>
void check_router(std::int64_t experts, std::int64_t hidden, cuda::RouterParams p, bool with_bias) {
  CAPTURE(experts);
  CAPTURE(p.n_group);
  auto w = random_matrix<P>(experts, hidden, 0.05f);
  auto dw = cuda::DeviceMatrix<P>::upload(w.view());
  auto u = randn(static_cast<std::size_t>(hidden));
  std::vector<float> bias = with_bias ? randn(static_cast<std::size_t>(experts), 0.05f) : std::vector<float>{};
  DeviceVec du(u), dbias(with_bias ? bias : std::vector<float>(1)), dweights(static_cast<std::size_t>(p.top_k));
  cuda::DeviceBuffer didx(static_cast<std::size_t>(p.top_k) * sizeof(int));
  cuda::RouterWorkspace ws(experts);

  // CPU logits through the CPU backend's linear
  using L = layers::Linear<quant::PolicyList<P>>;
  cpu::Matrix um = Eigen::Map<cpu::Matrix const>(u.data(), 1, hidden);
  cpu::Matrix logits_ref = cpu::linear(L::view(w.view()), um);

  layers::Router<>::Config cfg;
  cfg.experts = Extent<dynamic>(experts, "num_experts");
  cfg.hidden = Extent<dynamic>(hidden, "hidden_size");
  cfg.top_k = p.top_k;
  cfg.n_group = p.n_group;
  cfg.topk_group = p.topk_group;
  cfg.norm_topk_prob = p.norm_topk_prob;
  cfg.routed_scaling_factor = p.routed_scaling;
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

    layers::Routing want = cpu::route_scores(cfg, logits.data(), bias);
    std::vector<int> idx(static_cast<std::size_t>(p.top_k));
    didx.download(idx.data(), idx.size() * sizeof(int));
    auto wts = dweights.get();
    for (int k = 0; k < p.top_k; ++k) {
      CAPTURE(k);
      CHECK(idx[static_cast<std::size_t>(k)] == want.experts[static_cast<std::size_t>(k)]);
      CHECK(wts[static_cast<std::size_t>(k)] == doctest::Approx(want.weights[static_cast<std::size_t>(k)]).epsilon(1e-5));
    }
  }
}

}  // namespace

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
