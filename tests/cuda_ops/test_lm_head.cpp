// LM head: the GPU FP8-row quantization is bit-identical to quant::Fp8Row::quantize; logits against the CPU linear;
// the fused argmax against the argmax of the returned logits (twice: the workspace re-arms itself); the BF16 head.
// Also the read-bandwidth kernel returns a plausible number.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>

#include "ling/cpu/linear.hpp"
#include "ling/cuda/bandwidth.hpp"
#include "ling/cuda/lm_head.hpp"
#include "util.hpp"

using namespace ling;
using namespace ling::test_ops;

namespace {

template <class P>
std::vector<double> cpu_matvec(quant::MatrixView<P> const& m, std::vector<float> const& x) {
  using L = layers::Linear<quant::PolicyList<P>>;
  cpu::Matrix xm = Eigen::Map<cpu::Matrix const>(x.data(), 1, m.cols);
  cpu::Matrix y = cpu::linear(L::view(m), xm);
  std::vector<double> out(static_cast<std::size_t>(m.rows));
  for (std::int64_t r = 0; r < m.rows; ++r) out[static_cast<std::size_t>(r)] = y(0, r);
  return out;
}

std::int64_t argmax_of(std::vector<float> const& v) {
  std::int64_t best = 0;
  for (std::size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[static_cast<std::size_t>(best)]) best = std::int64_t(i);
  return best;
}

}  // namespace

TEST_CASE("lm head: online FP8-row quantization on the GPU, logits and argmax") {
  LING_REQUIRE_GPU();
  // 20000 x 2560: several rows per warp on matvec_lane_kernel; 2300 x 4096: one row per warp (its wider blocks)
  for (auto [vocab, hidden] : {std::pair<std::int64_t, std::int64_t>{1001, 256}, {4099, 2560}, {1, 40}, {20000, 2560}, {2300, 4096}}) {
    CAPTURE(vocab);
    CAPTURE(hidden);
    auto bf = random_matrix<quant::Bf16>(vocab, hidden, 0.05f);
    auto dbf = cuda::DeviceMatrix<quant::Bf16>::upload(bf.view());
    auto dq = cuda::quantize_fp8_rows(dbf, nullptr);
    device_sync();

    // host quantization of the same bf16 values
    std::vector<E4m3> hq(static_cast<std::size_t>(vocab * hidden));
    std::vector<float> hs(static_cast<std::size_t>(vocab));
    quant::Fp8Row::quantize([&](std::int64_t r, std::int64_t c) { return to_float(bf.data[static_cast<std::size_t>(r * hidden + c)]); },
                            vocab, hidden, hq.data(), hs.data());
    std::vector<E4m3> gq;
    std::vector<float> gs;
    auto gview = dq.download(0, gq, gs);
    CHECK(std::memcmp(gq.data(), hq.data(), hq.size()) == 0);
    CHECK(std::memcmp(gs.data(), hs.data(), hs.size() * sizeof(float)) == 0);

    auto x = randn(static_cast<std::size_t>(hidden));
    DeviceVec dx(x), dlogits(static_cast<std::size_t>(vocab));
    cuda::DeviceBuffer dargmax(sizeof(int));
    cuda::ArgmaxWorkspace ws;
    for (int rep = 0; rep < 2; ++rep) {
      dlogits.poison();
      cuda::check(cudaMemset(dargmax.data(), 0xFF, sizeof(int)), "poison");
      REQUIRE(cuda::launch_lm_head(dq, dx.data(), dlogits.data(), dargmax.data<int>(), &ws, nullptr) == cudaSuccess);
      device_sync();
      auto logits = dlogits.get();
      CHECK(rel_err(logits, cpu_matvec(gview, x), bf, x) < 1e-5);  // the products' size from the BF16 rows
      int am = -1;
      dargmax.download(&am, sizeof(int));
      CHECK(am == argmax_of(logits));
      // row FP8 runs matvec_lane_kernel (LING_MATVEC_ROW_LANE=0: matvec_kernel): the same sums, the same bits
      dlogits.poison();
      setenv("LING_MATVEC_ROW_LANE", "0", 1);
      cudaError_t const e = cuda::launch_lm_head(dq, dx.data(), dlogits.data(), dargmax.data<int>(), &ws, nullptr);
      unsetenv("LING_MATVEC_ROW_LANE");
      REQUIRE(e == cudaSuccess);
      device_sync();
      auto const old = dlogits.get();
      CHECK(std::memcmp(old.data(), logits.data(), logits.size() * sizeof(float)) == 0);
      int am_old = -1;
      dargmax.download(&am_old, sizeof(int));
      CHECK(am_old == am);
    }
    // the BF16 head
    dlogits.poison();
    REQUIRE(cuda::launch_lm_head(dbf, dx.data(), dlogits.data(), dargmax.data<int>(), &ws, nullptr) == cudaSuccess);
    device_sync();
    auto logits = dlogits.get();
    CHECK(rel_err(logits, cpu_matvec(bf.view(), x), bf, x) < 1e-5);
    int am = -1;
    dargmax.download(&am, sizeof(int));
    CHECK(am == argmax_of(logits));
  }
}

TEST_CASE("read bandwidth: a plausible number for an HBM device") {
  LING_REQUIRE_GPU();
  auto r = cuda::measure_read_bandwidth<16>(static_cast<std::size_t>(1) << 30, 3);
  MESSAGE("read bandwidth over 1 GiB: " << r.gb_per_s << " GB/s");
  CHECK(r.gb_per_s < 20000.0);
  // the lower bound is a speed check: compute-sanitizer's instrumented kernels run far below it (racecheck measured
  // 48 GB/s); scripts/device-test.sh sets LING_SANITIZER for its sanitizer runs
  if (std::getenv("LING_SANITIZER") == nullptr) CHECK(r.gb_per_s > 100.0);
}
