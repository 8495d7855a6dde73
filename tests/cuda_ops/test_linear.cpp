// GPU matvec against the CPU backend's linear (cpu/linear.hpp) on fresh random inputs, with tails: cols not a
// multiple of the 16-byte chunk or of the FP8 block, rows not a multiple of the warp task, a single row; outputs
// poisoned before each run. Also the repack round trip, the fused multi-matvec, the residual epilogue, and a policy
// defined in the test (generic kernel).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "ling/cpu/linear.hpp"
#include "util.hpp"

using namespace ling;
using namespace ling::test_ops;

namespace {

template <class P>
std::vector<double> cpu_matvec(HostMatrix<P> const& m, std::vector<float> const& x) {
  using L = layers::Linear<quant::PolicyList<P>>;
  L l = L::view(m.view());
  cpu::Matrix xm = Eigen::Map<cpu::Matrix const>(x.data(), 1, m.cols);
  cpu::Matrix y = cpu::linear(l, xm);
  std::vector<double> out(static_cast<std::size_t>(m.rows));
  for (std::int64_t r = 0; r < m.rows; ++r) out[static_cast<std::size_t>(r)] = y(0, r);
  return out;
}

struct Shape {
  std::int64_t rows, cols;
};
constexpr Shape kShapes[] = {{1, 64}, {37, 203}, {129, 1043}, {300, 2560}, {3, 4099}};

}  // namespace

#define LING_POLICIES quant::Bf16, quant::F16, quant::F32, quant::Fp8Block, quant::Fp8Row, quant::Mxfp4, test::Int8Row

TEST_CASE_TEMPLATE("repack round trip: host and through the device", P, LING_POLICIES) {
  for (Shape s : kShapes) {
    auto m = random_matrix<P>(s.rows, fit_cols<P>(s.cols));
    cuda::PackedMatrix<P> p = cuda::repack(m.view());
    auto back = cuda::unpack(p);
    REQUIRE(back.size() == m.data.size());
    CHECK(std::memcmp(back.data(), m.data.data(), back.size() * sizeof(back[0])) == 0);
    if constexpr (cuda::has_fast_kernel<P>) CHECK((p.ld * std::int64_t(sizeof(back[0]))) % 16 == 0);
    if (!cuda::device_available()) continue;
    auto d = cuda::DeviceMatrix<P>::upload(m.view());
    std::vector<typename P::storage_type> st;
    std::vector<typename P::scale_type> sc;
    d.download(0, st, sc);
    CHECK(std::memcmp(st.data(), m.data.data(), st.size() * sizeof(st[0])) == 0);
    if (!m.scales.empty()) CHECK(std::memcmp(sc.data(), m.scales.data(), sc.size() * sizeof(sc[0])) == 0);
  }
}

TEST_CASE_TEMPLATE("matvec matches the CPU linear (tails, poisoned outputs)", P, LING_POLICIES) {
  LING_REQUIRE_GPU();
  for (Shape s : kShapes) {
    std::int64_t const cols = fit_cols<P>(s.cols);
    CAPTURE(s.rows);
    CAPTURE(cols);
    auto m = random_matrix<P>(s.rows, cols, 0.05f);
    auto d = cuda::DeviceMatrix<P>::upload(m.view());
    auto x = randn(static_cast<std::size_t>(cols));
    DeviceVec dx(x), dy(static_cast<std::size_t>(s.rows));
    REQUIRE(cuda::launch_matvec(d, dx.data(), dy.data(), nullptr) == cudaSuccess);
    device_sync();
    auto ref = cpu_matvec(m, x);
    double err = rel_err(dy.get(), ref, m, x);
    CHECK(err < 1e-5);

    // epilogue: y = W x + residual, in place (residual aliases y)
    auto res = randn(static_cast<std::size_t>(s.rows));
    DeviceVec dr(res);
    REQUIRE(cuda::launch_matvec(d, dx.data(), dr.data(), nullptr, cuda::MatvecEpilogue{dr.data()}) == cudaSuccess);
    device_sync();
    for (std::size_t i = 0; i < ref.size(); ++i) ref[i] += res[i];
    // W x + r can cancel (one row: |ref| may be far below |W x|), so fp32 summation-order error shows more here
    CHECK(rel_l2(dr.get(), ref) < 1e-4);
  }
}

// Random matrices of `rows` x cols (host and device) for one multi-matvec launch, and the CPU reference.
template <class P>
struct MultiSet {
  std::vector<HostMatrix<P>> hm;
  std::vector<cuda::DeviceMatrix<P>> dm;
  std::vector<cuda::DeviceMatrix<P> const*> ptrs;
  std::int64_t total = 0;
  MultiSet(std::int64_t cols, std::vector<std::int64_t> const& rows) {
    for (auto r : rows) {
      hm.push_back(random_matrix<P>(r, cols, 0.05f));
      dm.push_back(cuda::DeviceMatrix<P>::upload(hm.back().view()));
      total += r;
    }
    for (auto& d : dm) ptrs.push_back(&d);
  }
  // The outputs of `launch` (a multi-matvec launcher) on x, each poisoned before the run.
  template <class Launch>
  std::vector<float> run(std::vector<float> const& x, Launch launch) const {
    DeviceVec dx(x), dy(static_cast<std::size_t>(total));
    REQUIRE(launch(std::span<cuda::DeviceMatrix<P> const* const>(ptrs), dx.data(), dy.data()) == cudaSuccess);
    device_sync();
    return dy.get();
  }
  std::vector<double> ref(std::vector<float> const& x) const {
    std::vector<double> r;
    for (auto& m : hm) {
      auto part = cpu_matvec(m, x);
      r.insert(r.end(), part.begin(), part.end());
    }
    return r;
  }
  // ‖out − (W x + res)‖ / ‖Σ|w x|‖: the error against the terms' magnitudes (check_multi says why); res may be empty.
  double err_of_terms(std::vector<float> const& out, std::vector<float> const& x, std::vector<float> const& res = {}) const {
    auto const r = ref(x), m = mag(x);
    REQUIRE(out.size() == r.size());
    double e = 0, n = 0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      double const d = out[i] - (r[i] + (res.empty() ? 0.0 : double(res[i])));
      e += d * d;
      n += m[i] * m[i];
    }
    return std::sqrt(e / n);
  }
  // Σ_j |w_rj x_j| per row r (the size of the terms each output sums, whatever their cancellation)
  std::vector<double> mag(std::vector<float> const& x) const {
    std::vector<double> r;
    for (auto& m : hm)
      for (std::int64_t i = 0; i < m.rows; ++i) {
        auto const w = m.row(i);
        double s = 0;
        for (std::size_t j = 0; j < w.size(); ++j) s += std::abs(w[j] * double(x[j]));
        r.push_back(s);
      }
    return r;
  }
};

// Matrices of `rows` x cols sharing one input through `launch` (a multi-matvec launcher), against the CPU. The error is
// measured against the terms' magnitudes (‖out − ref‖ / ‖Σ|w x|‖), not the outputs': an output that cancels to near
// zero (one row of 256 random columns did, 2026-12-02: 1.8e-5 relative to itself) must not fail an exact kernel.
template <class P, class Launch>
void check_multi(std::int64_t cols, std::vector<std::int64_t> const& rows, std::vector<float> const& x, Launch launch) {
  CAPTURE(cols);
  MultiSet<P> set(cols, rows);
  CHECK(set.err_of_terms(set.run(x, launch), x) < 1e-5);  // NaN fails
}

TEST_CASE_TEMPLATE("multi-matvec: several matrices sharing x in one launch, outputs concatenated", P, quant::Fp8Block,
                   quant::Mxfp4, quant::Bf16, test::Int8Row) {
  LING_REQUIRE_GPU();
  for (std::int64_t cols : {std::int64_t(203), std::int64_t(2560)}) {
    cols = fit_cols<P>(cols);
    check_multi<P>(cols, {5, 130, 1, 33}, randn(static_cast<std::size_t>(cols)), [](auto ws, float const* x, float* y) {
      return cuda::launch_matvec_multi(ws, x, y, nullptr);
    });
  }
}

// Block FP8 runs matvec_lane_kernel by default (LING_MATVEC_LANE=0: matvec_pipe_kernel). Both sum the same products in
// the same order, so their outputs must be the same bits: rows of exactly 32 kU chunks (1024, 2560, 4096 columns: no
// predicates) and ragged ones (1000, 2000, 3000: kU = 2, 5, 8 with predicated lanes), several matrices per launch
// (the lane kernel's matrix index only moves forward), each output poisoned before its run. At 2560 and 2000 columns a
// 5000-row matrix gives warps several rows each and a partial last round.
namespace {
// The block-FP8 multi-matvec's outputs for the set on x, with the environment variable `off` (if any) set to "0" for
// the run.
std::vector<float> fp8_outputs(MultiSet<quant::Fp8Block> const& set, std::vector<float> const& x, char const* off = nullptr) {
  auto launch = [](auto ws, float const* xp, float* y) { return cuda::launch_matvec_multi(ws, xp, y, nullptr); };
  if (off) setenv(off, "0", 1);
  auto out = set.run(x, launch);
  if (off) unsetenv(off);
  return out;
}
bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
}  // namespace

TEST_CASE("block FP8: the lane-fixed matvec gives the pipelined kernel's bits and matches the CPU") {
  LING_REQUIRE_GPU();
  for (std::int64_t cols : {1024, 1000, 2560, 2000, 4096, 3000}) {
    CAPTURE(cols);
    std::vector<std::int64_t> rows{5, 300, 1, 129};
    if (cols == 2560 || cols == 2000) rows.push_back(5000);
    MultiSet<quant::Fp8Block> set(cols, rows);
    auto const x = randn(static_cast<std::size_t>(cols));
    auto const pipe = fp8_outputs(set, x, "LING_MATVEC_LANE");
    auto const out = fp8_outputs(set, x);
    CHECK(rel_l2(out, set.ref(x)) < 1e-5);
    CHECK(same_bits(out, pipe));
  }
}

// Rows that the usual grid (two blocks of 8 warps per SM) would give some warps twice run on blocks of 10 or 12 warps,
// one row per warp (matvec_lane_one_warps; on the H200's 132 SMs: 2113..2640 rows take 10 warps, up to 3168 take 12).
// The same sums as the pipelined kernel and as the usual grid (LING_MATVEC_ONE=0): the same bits.
TEST_CASE("block FP8: one row per warp on wider blocks gives the usual bits and matches the CPU") {
  LING_REQUIRE_GPU();
  for (std::vector<std::int64_t> rows : {std::vector<std::int64_t>{2560}, std::vector<std::int64_t>{2000, 1000, 3},
                                         std::vector<std::int64_t>{2200}, std::vector<std::int64_t>{1100, 1100, 900}}) {
    std::int64_t total = 0;
    for (auto r : rows) total += r;
    CAPTURE(total);
    MultiSet<quant::Fp8Block> set(4096, rows);
    auto const x = randn(4096);
    auto const pipe = fp8_outputs(set, x, "LING_MATVEC_LANE");
    auto const usual = fp8_outputs(set, x, "LING_MATVEC_ONE");
    auto const out = fp8_outputs(set, x);
    CHECK(rel_l2(out, set.ref(x)) < 1e-5);
    CHECK(same_bits(out, pipe));
    CHECK(same_bits(out, usual));
  }
}

// The dynamic tail (launch_matvec_multi_tail, MultiArgs::tail): the last p% of the tasks go to blocks by tickets in the
// order the blocks get there. Each row is still one warp's sum in the same order, so the outputs are the static
// order's bits whatever block takes the row; the counter must be back at 0 after every launch (each launch takes
// exactly its groups plus one ticket per block, atomicInc's wrap), also when two launches share it back to back in one
// stream. Shapes: the KDA projections' six matrices (20 512 rows of 2560: several static rounds, the groups capped at
// 1024), ragged rows (2000 columns), and a set too small for a tail (the launcher leaves every task static). A policy
// other than block FP8 ignores the tail; a missing counter or a tail over 100% is refused.
TEST_CASE("block FP8: the matvec's dynamic tail gives the static order's bits and puts its counter back to 0") {
  LING_REQUIRE_GPU();
  using P = quant::Fp8Block;
  cuda::DeviceBuffer ctr(sizeof(unsigned), "tail counter");
  cuda::check(cudaMemset(ctr.data(), 0, sizeof(unsigned)), "zero the counter");
  auto counter = [&] {
    unsigned v = 1;
    ctr.download(&v, sizeof v);
    return v;
  };
  struct Case {
    std::int64_t cols;
    std::vector<std::int64_t> rows;
  };
  for (Case const& c :
       {Case{2560, {4096, 4096, 4096, 4096, 4096, 32}}, Case{2000, {5000, 7}}, Case{1024, {300, 1, 129}}}) {
    CAPTURE(c.cols);
    MultiSet<P> set(c.cols, c.rows);
    auto const x = randn(static_cast<std::size_t>(c.cols));
    auto const plain = fp8_outputs(set, x);
    CHECK(rel_l2(plain, set.ref(x)) < 1e-5);
    for (int const pct : {5, 25, 40, 100}) {
      CAPTURE(pct);
      auto tail = [&](auto ws, float const* xp, float* y) {
        return cuda::launch_matvec_multi_tail(ws, xp, y, nullptr, ctr.data<unsigned>(), pct);
      };
      CHECK(same_bits(set.run(x, tail), plain));
      CHECK(counter() == 0u);
      // two launches back to back on the same counter, one sync
      DeviceVec dx(x), y1(static_cast<std::size_t>(set.total)), y2(static_cast<std::size_t>(set.total));
      std::span<cuda::DeviceMatrix<P> const* const> ws(set.ptrs);
      REQUIRE(tail(ws, dx.data(), y1.data()) == cudaSuccess);
      REQUIRE(tail(ws, dx.data(), y2.data()) == cudaSuccess);
      device_sync();
      CHECK(same_bits(y1.get(), plain));
      CHECK(same_bits(y2.get(), plain));
      CHECK(counter() == 0u);
    }
  }
  {  // another policy: the tail is ignored, the counter untouched
    MultiSet<quant::Bf16> set(256, {100, 3});
    auto const x = randn(256);
    auto const out = set.run(x, [&](auto ws, float const* xp, float* y) {
      return cuda::launch_matvec_multi_tail(ws, xp, y, nullptr, ctr.data<unsigned>(), 50);
    });
    CHECK(set.err_of_terms(out, x) < 1e-5);
    CHECK(counter() == 0u);
  }
  MultiSet<P> set(256, {10});
  DeviceVec dx(randn(256)), dy(10);
  std::span<cuda::DeviceMatrix<P> const* const> ws(set.ptrs);
  CHECK(cuda::launch_matvec_multi_tail(ws, dx.data(), dy.data(), nullptr, nullptr, 25) == cudaErrorInvalidValue);
  CHECK(cuda::launch_matvec_multi_tail(ws, dx.data(), dy.data(), nullptr, ctr.data<unsigned>(), 101) ==
        cudaErrorInvalidValue);
  CHECK(cuda::launch_matvec_multi_tail(ws, dx.data(), dy.data(), nullptr, ctr.data<unsigned>(), -1) ==
        cudaErrorInvalidValue);
}

// The FP8-block matvec on wgmma with tensor-map copies (matvec_wg.cuh): the KDA projections' six matrices, o_proj's
// shape, tails of the 32- and 64-row units, units of one ring slot (512 columns), rows spanning several 128-row scale
// blocks, the widest rows (6144 columns: a unit's slots outnumber the ring's, so the ring wraps inside a unit), units
// claimed from the launch's counter, both unit sizes forced, the RMSNorm prologue and a residual. Its error is the
// tensor core's FP8 accumulation within each k-block of 128 (about 14 bits): measured against Σ|w x| as check_multi
// does (MultiSet::err_of_terms), with a looser bound. Repeated launches (the claim counters reused) give the same bits.
// A NaN input reaches every row; other policies and columns that are not a multiple of 512 are refused.

TEST_CASE("block FP8 matvec on wgmma and tensor-map copies matches the CPU") {
  LING_REQUIRE_GPU();
  using P = quant::Fp8Block;
  struct Shape {
    std::int64_t cols;
    std::vector<std::int64_t> rows;
  };
  for (Shape const& sh : {Shape{2560, {4096, 4096, 4096, 4096, 4096, 32}}, Shape{4096, {2560}}, Shape{512, {1, 5, 300}},
                          Shape{1536, {70, 33, 129}}, Shape{6144, {64, 40}}}) {
    MultiSet<P> set(sh.cols, sh.rows);
    auto x = randn(static_cast<std::size_t>(sh.cols));
    x[5] = 40.f;  // one large input: the k-block's power-of-two scale follows it, the limbs keep the small ones
    for (int R : {0, 32, 64}) {
      CAPTURE(sh.cols);
      CAPTURE(R);
      auto const out = set.run(x, [R](auto ws, float const* xp, float* y) {
        return cuda::launch_matvec_multi_wg(ws, xp, y, nullptr, cuda::InputPrologue{}, nullptr, R);
      });
      double const err = set.err_of_terms(out, x);
      MESSAGE("wgmma matvec: cols " << sh.cols << ", R " << R << ": error " << err << " of sum |w x|");
      CHECK(err < (sh.cols == 512 ? 2e-4 : 1e-4));  // four k-blocks: little averaging over blocks. NaN fails
    }
  }
  // the RMSNorm prologue and a residual (the KDA projections take the first, o_proj the second)
  {
    std::int64_t const cols = 2560;
    MultiSet<P> set(cols, {300, 64});
    auto const x = randn(static_cast<std::size_t>(cols));
    auto w = randn(static_cast<std::size_t>(cols));
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    float const eps = 1e-6f;
    double const inv = 1.0 / std::sqrt(ss / double(cols) + eps);
    std::vector<float> xn(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) xn[i] = float(x[i] * inv * w[i]);
    auto const res = randn(static_cast<std::size_t>(set.total));
    DeviceVec dw(w), dres(res);
    cuda::InputPrologue pro;
    pro.kind = cuda::PrologueKind::kRmsNorm;
    pro.norm_w = dw.data();
    pro.eps = eps;
    auto const out = set.run(x, [&](auto ws, float const* xp, float* y) {
      return cuda::launch_matvec_multi_wg(ws, xp, y, nullptr, pro, dres.data());
    });
    CHECK(set.err_of_terms(out, xn, res) < 1e-4);
  }
  // the units past the first are claimed from a counter that each launch's last claim puts back to zero: 300 launches
  // (more than the kWgvCounters counters, so each is taken again) give the first launch's bits, with both unit sizes
  {
    MultiSet<P> set(2560, {4096, 1000, 17});
    auto const x = randn(2560);
    for (int R : {32, 64}) {
      CAPTURE(R);
      auto wg = [R](auto ws, float const* xp, float* y) {
        return cuda::launch_matvec_multi_wg(ws, xp, y, nullptr, cuda::InputPrologue{}, nullptr, R);
      };
      auto const first = set.run(x, wg);
      CHECK(set.err_of_terms(first, x) < 1e-4);
      int same = 0;
      for (int i = 0; i < 300; ++i) same += set.run(x, wg) == first ? 1 : 0;
      CHECK(same == 300);
    }
  }
  // a NaN input: every row NaN
  {
    MultiSet<P> set(2560, {100, 7});
    auto x = randn(2560);
    x[1000] = std::nanf("");
    auto const y = set.run(
        x, [](auto ws, float const* xp, float* yp) { return cuda::launch_matvec_multi_wg(ws, xp, yp, nullptr); });
    CHECK(std::all_of(y.begin(), y.end(), [](float v) { return std::isnan(v); }));
  }
  // refused: columns that are not a multiple of 512 (96: not whole 128-blocks; 640: 5 k-blocks, rows of scales that
  // are not whole 16-byte units), and another policy
  for (std::int64_t cols : {96, 640}) {
    auto m = random_matrix<P>(8, cols, 0.05f);
    auto d = cuda::DeviceMatrix<P>::upload(m.view());
    cuda::DeviceMatrix<P> const* one[1] = {&d};
    DeviceVec dx(randn(static_cast<std::size_t>(cols))), dy(8);
    CHECK(cuda::launch_matvec_multi_wg(std::span<cuda::DeviceMatrix<P> const* const>(one), dx.data(), dy.data(), nullptr) ==
          cudaErrorInvalidValue);
  }
  {
    DeviceVec dy(8);
    auto r = random_matrix<quant::Fp8Row>(8, 256, 0.05f);
    auto dr = cuda::DeviceMatrix<quant::Fp8Row>::upload(r.view());
    cuda::DeviceMatrix<quant::Fp8Row> const* oner[1] = {&dr};
    DeviceVec dx2(randn(256));
    CHECK(cuda::launch_matvec_multi_wg(std::span<cuda::DeviceMatrix<quant::Fp8Row> const* const>(oner), dx2.data(), dy.data(),
                                       nullptr) == cudaErrorInvalidValue);
  }
}

TEST_CASE_TEMPLATE("multi-matvec with its rows preloaded into shared memory matches the CPU", P, quant::Fp8Block,
                   quant::Fp8Row, quant::Mxfp4, quant::Bf16) {
  LING_REQUIRE_GPU();
  struct Shape {
    std::int64_t cols;
    std::vector<std::int64_t> rows;
  };
  // o_proj's shape (BF16: 1024 of its rows; all 2560 are 160 KB per SM, over the limit, refused below); several
  // matrices whose rows straddle the blocks' slices; fewer rows than SMs; one row
  constexpr bool kWide = sizeof(typename P::storage_type) > 1;
  for (Shape const& sh : {Shape{4096, {kWide ? 1024 : 2560}}, Shape{512, {300, 5, 77}}, Shape{2560, {7}}, Shape{256, {1}}}) {
    std::int64_t const cols = fit_cols<P>(sh.cols);
    check_multi<P>(cols, sh.rows, randn(static_cast<std::size_t>(cols)), [](auto ws, float const* xp, float* y) {
      return cuda::launch_matvec_multi_preload(ws, xp, y, nullptr);
    });
  }
  if constexpr (kWide) {  // 2560 BF16 rows of 4096: each SM's slice over 112 KB, refused
    auto big = random_matrix<P>(2560, 4096, 0.05f);
    auto dbig = cuda::DeviceMatrix<P>::upload(big.view());
    cuda::DeviceMatrix<P> const* one[1] = {&dbig};
    DeviceVec dx(randn(4096)), dy(2560);
    CHECK(cuda::launch_matvec_multi_preload(std::span<cuda::DeviceMatrix<P> const* const>(one), dx.data(), dy.data(),
                                            nullptr) == cudaErrorInvalidValue);
  }
  // a row longer than a block's shared memory for rows (256K columns: 128 KB or more): refused, so that the caller
  // runs the streaming kernel
  std::int64_t const cols = fit_cols<P>(262144);
  auto m = random_matrix<P>(1, cols, 0.05f);
  auto d = cuda::DeviceMatrix<P>::upload(m.view());
  cuda::DeviceMatrix<P> const* one[1] = {&d};
  DeviceVec dx(randn(static_cast<std::size_t>(cols))), dy(1);
  CHECK(cuda::launch_matvec_multi_preload(std::span<cuda::DeviceMatrix<P> const* const>(one), dx.data(), dy.data(),
                                          nullptr) == cudaErrorInvalidValue);
}

TEST_CASE("the preloaded matvec refuses a policy without the 16-byte row layout (the caller streams it instead)") {
  LING_REQUIRE_GPU();
  auto m = random_matrix<test::Int8Row>(16, 64, 0.05f);
  auto d = cuda::DeviceMatrix<test::Int8Row>::upload(m.view());
  cuda::DeviceMatrix<test::Int8Row> const* one[1] = {&d};
  DeviceVec dx(randn(64)), dy(16);
  CHECK(cuda::launch_matvec_multi_preload(std::span<cuda::DeviceMatrix<test::Int8Row> const* const>(one), dx.data(),
                                          dy.data(), nullptr) == cudaErrorInvalidValue);
}

TEST_CASE("matvec refuses an empty matrix and a multi-matvec of mismatched cols") {
  LING_REQUIRE_GPU();
  cuda::DeviceMatrix<quant::Bf16> empty;
  DeviceVec v(16);
  CHECK(cuda::launch_matvec(empty, v.data(), v.data(), nullptr) == cudaErrorInvalidValue);
  auto a = cuda::DeviceMatrix<quant::Bf16>::upload(random_matrix<quant::Bf16>(4, 16).view());
  auto b = cuda::DeviceMatrix<quant::Bf16>::upload(random_matrix<quant::Bf16>(4, 24).view());
  cuda::DeviceMatrix<quant::Bf16> const* ab[] = {&a, &b};
  CHECK(cuda::launch_matvec_multi(std::span<cuda::DeviceMatrix<quant::Bf16> const* const>(ab), v.data(), v.data(),
                                  nullptr) == cudaErrorInvalidValue);
}

// Several input rows in one launch (launch_matvec_multi_tokens, MultiArgs::tokens: a speculative verification step
// reads each weight row once for the pending token and the draft). Token k's outputs must be the bits of a one-token
// launch on its own input, prologue inputs and residual, for every prologue: plain (also checked against the CPU),
// RMSNorm, KDA's gated head norm (with and without the producer's head partials), the head scale, with a residual.
// Block and row FP8 at two tokens run matvec_lane_kernel's two-row instances (rows of exactly 32 kU chunks and ragged
// ones, kU = 2, 5, 8; o_proj's 2560 × 4096, which one token runs on the one-row-per-warp blocks); three tokens, BF16,
// and block FP8 with LING_MATVEC_LANE=0 run one launch per token. Every output is poisoned before its run.
namespace {
template <class P>
void check_tokens(std::int64_t cols, std::vector<std::int64_t> const& rows, int tokens, cuda::PrologueKind kind,
                  bool with_ss, bool with_res) {
  CAPTURE(cols);
  CAPTURE(tokens);
  CAPTURE(int(kind));
  CAPTURE(with_ss);
  CAPTURE(with_res);
  MultiSet<P> set(cols, rows);
  int const head = 128, parts = 4, heads = int(cols / head);
  std::size_t const T = std::size_t(tokens), C = std::size_t(cols), N = std::size_t(set.total);
  auto const x = randn(T * C), gate = randn(T * C), res = randn(T * N);
  auto w = randn(kind == cuda::PrologueKind::kRmsNorm ? C : std::size_t(head));
  for (auto& v : w) v = 1.0f + 0.25f * v;
  std::vector<float> ss(T * std::size_t(heads * parts));
  for (auto& v : ss) v = 0.5f + std::abs(randn(1)[0]) * 8.0f;
  DeviceVec dx(x), dg(gate), dr(res), dw(w), dss(ss);
  cuda::InputPrologue pro{};
  pro.kind = kind;
  pro.norm_w = kind == cuda::PrologueKind::kPlain ? nullptr : dw.data();
  pro.gate = kind == cuda::PrologueKind::kGatedHeadNorm ? dg.data() : nullptr;
  pro.head = head;
  pro.head_ss = with_ss ? dss.data() : nullptr;
  pro.ss_parts = with_ss ? parts : 0;
  std::span<cuda::DeviceMatrix<P> const* const> const ws(set.ptrs);
  DeviceVec dy(T * N);
  REQUIRE(cuda::launch_matvec_multi_tokens(ws, dx.data(), tokens, dy.data(), nullptr, pro,
                                           with_res ? dr.data() : nullptr) == cudaSuccess);
  device_sync();
  auto const all = dy.get();
  for (int k = 0; k < tokens; ++k) {
    CAPTURE(k);
    cuda::InputPrologue p = pro;
    if (p.gate) p.gate += std::size_t(k) * C;
    if (p.head_ss) p.head_ss += std::size_t(k) * std::size_t(heads * parts);
    DeviceVec d1(N);
    REQUIRE(cuda::launch_matvec_multi_tokens(ws, dx.data() + std::size_t(k) * C, 1, d1.data(), nullptr, p,
                                             with_res ? dr.data() + std::size_t(k) * N : nullptr) == cudaSuccess);
    device_sync();
    auto const one = d1.get();
    std::vector<float> const mine(all.begin() + std::ptrdiff_t(std::size_t(k) * N),
                                  all.begin() + std::ptrdiff_t(std::size_t(k + 1) * N));
    CHECK(same_bits(mine, one));
    if (kind == cuda::PrologueKind::kPlain && !with_res) {
      std::vector<float> const xk(x.begin() + std::ptrdiff_t(std::size_t(k) * C),
                                  x.begin() + std::ptrdiff_t(std::size_t(k + 1) * C));
      CHECK(set.err_of_terms(mine, xk) < 1e-5);  // NaN fails
    }
  }
}
template <class P>
void check_tokens_all(int tokens) {
  using K = cuda::PrologueKind;
  for (std::int64_t c : {1024, 1000, 2560, 2000, 4096, 3000}) {
    std::int64_t const cols = fit_cols<P>(c);
    std::vector<std::int64_t> rows{5, 300, 1, 129};
    if (cols == 2560) rows.push_back(3000);
    check_tokens<P>(cols, rows, tokens, K::kPlain, false, false);
    check_tokens<P>(cols, rows, tokens, K::kPlain, false, true);
    check_tokens<P>(cols, rows, tokens, K::kRmsNorm, false, true);
    if (cols % 128 == 0) {
      check_tokens<P>(cols, rows, tokens, K::kGatedHeadNorm, false, false);
      check_tokens<P>(cols, rows, tokens, K::kGatedHeadNorm, true, true);
      check_tokens<P>(cols, rows, tokens, K::kHeadScale, true, false);
    }
  }
  if constexpr (std::is_same_v<P, quant::Fp8Block>) {  // o_proj's shape (one token: one row per warp)
    check_tokens<P>(4096, {2560}, tokens, K::kHeadScale, true, true);
    check_tokens<P>(4096, {2560}, tokens, K::kGatedHeadNorm, true, true);
  }
}
}  // namespace

TEST_CASE_TEMPLATE("matvec over several input rows: each token gets the one-token launch's bits", P, quant::Fp8Block,
                   quant::Fp8Row, quant::Bf16) {
  LING_REQUIRE_GPU();
  check_tokens_all<P>(2);
  check_tokens_all<P>(3);
  if constexpr (std::is_same_v<P, quant::Fp8Block>) {
    setenv("LING_MATVEC_LANE", "0", 1);  // two tokens on the pipelined kernel: one launch per token
    check_tokens_all<P>(2);
    unsetenv("LING_MATVEC_LANE");
  }
  MultiSet<P> set(256, {8});
  DeviceVec dx(randn(256)), dy(8);
  CHECK(cuda::launch_matvec_multi_tokens(std::span<cuda::DeviceMatrix<P> const* const>(set.ptrs), dx.data(), 0,
                                         dy.data(), nullptr) == cudaErrorInvalidValue);
}
