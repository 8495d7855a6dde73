// Fused MoE (two launches) against an fp64 reference built from MatrixView rows: top-k routed experts by ids read on
// the device, the shared expert, both clamps (spec §2 φ), weighted combine and the residual add; outputs poisoned.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <string>
#include <utility>

#include "ling/cuda/moe.hpp"
#include "ling/cuda/moe_pace.hpp"
#include "util.hpp"

using namespace ling;
using namespace ling::test_ops;

namespace {

int g_clamp_hits = 0;  // how often φ's clamp changed a value in the reference

double swiglu_ref(double a, double b, double limit) {
  double s = a / (1.0 + std::exp(-a));
  if (limit > 0) {
    if (s > limit || std::fabs(b) > limit) ++g_clamp_hits;
    s = std::min(s, limit);
    b = std::clamp(b, -limit, limit);
  }
  return s * b;
}

template <class P>
std::vector<double> matvec_ref(HostMatrix<P> const& m, std::vector<double> const& x) {
  std::vector<double> y(static_cast<std::size_t>(m.rows));
  for (std::int64_t r = 0; r < m.rows; ++r) {
    auto row = m.row(r);
    double acc = 0;
    for (std::int64_t c = 0; c < m.cols; ++c) acc += row[static_cast<std::size_t>(c)] * x[static_cast<std::size_t>(c)];
    y[static_cast<std::size_t>(r)] = acc;
  }
  return y;
}

template <class PE, class PS>
void check_moe(std::int64_t hidden, std::int64_t inter, std::int64_t shared_inter, int experts, int top_k, float lr,
               float ls) {
  CAPTURE(hidden);
  CAPTURE(inter);
  CAPTURE(top_k);
  CAPTURE(lr);
  // One draw of weights per shape and run, reused by every configuration that checks that shape (the ids, weights,
  // input and residual are drawn per call): drawing and quantizing them is most of this test's time (~3.5 s of CPU
  // at 12 experts of 2560 × 768, which ~35 configurations check).
  struct Draw {
    std::vector<HostMatrix<PE>> g, u, d;
    HostMatrix<PS> sg, su, sd;
  };
  static std::map<std::array<std::int64_t, 4>, Draw> draws;
  auto const [slot, fresh] = draws.try_emplace(std::array<std::int64_t, 4>{hidden, inter, shared_inter, experts});
  Draw& dr = slot->second;
  if (fresh) {
    for (int e = 0; e < experts; ++e) {
      dr.g.push_back(random_matrix<PE>(inter, hidden, 0.05f));
      dr.u.push_back(random_matrix<PE>(inter, hidden, 0.05f));
      dr.d.push_back(random_matrix<PE>(hidden, inter, 0.05f));
    }
    if (shared_inter > 0) {
      dr.sg = random_matrix<PS>(shared_inter, hidden, 0.05f);
      dr.su = random_matrix<PS>(shared_inter, hidden, 0.05f);
      dr.sd = random_matrix<PS>(hidden, shared_inter, 0.05f);
    }
  }
  auto const &g = dr.g, &u = dr.u, &d = dr.d;
  auto const &sg = dr.sg, &su = dr.su, &sd = dr.sd;
  auto views = [](std::vector<HostMatrix<PE>> const& v) {
    std::vector<quant::MatrixView<PE>> out;
    for (auto& m : v) out.push_back(m.view());
    return out;
  };
  cuda::MoeWeights<PE, PS> w;
  auto gv = views(g), uv = views(u), dv = views(d);
  w.gate = cuda::DeviceMatrix<PE>::upload_batch(gv);
  w.up = cuda::DeviceMatrix<PE>::upload_batch(uv);
  w.down = cuda::DeviceMatrix<PE>::upload_batch(dv);
  if (shared_inter > 0) {
    w.shared_gate = cuda::DeviceMatrix<PS>::upload(sg.view());
    w.shared_up = cuda::DeviceMatrix<PS>::upload(su.view());
    w.shared_down = cuda::DeviceMatrix<PS>::upload(sd.view());
  }
  REQUIRE(cuda::can_implement_moe(hidden, inter, top_k).is_ok());

  // distinct random experts, random positive weights
  std::vector<int> ids(static_cast<std::size_t>(experts));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng());
  ids.resize(static_cast<std::size_t>(top_k));
  std::vector<float> wts(static_cast<std::size_t>(top_k));
  std::uniform_real_distribution<float> ud(0.1f, 1.0f);
  for (auto& x : wts) x = ud(rng());
  auto x = randn(static_cast<std::size_t>(hidden), 3.f);  // large enough that some pre-activations pass the clamp
  auto res = randn(static_cast<std::size_t>(hidden));
  std::vector<double> xd(x.begin(), x.end());
  // A clamp limit above every pre-activation of this draw (the seed changes per run) would leave φ's clamp untested:
  // each limit is lowered to 0.7 × the largest |pre-activation| (SiLU(a) or |b|) of the matrices it applies to.
  auto peak = [&](auto const& gm, auto const& um) {
    auto a = matvec_ref(gm, xd), b = matvec_ref(um, xd);
    double m = 0;
    for (std::size_t i = 0; i < a.size(); ++i) m = std::max({m, a[i] / (1.0 + std::exp(-a[i])), std::fabs(b[i])});
    return m;
  };
  if (lr > 0) {
    double m = 0;
    for (int s = 0; s < top_k; ++s) m = std::max(m, peak(g[std::size_t(ids[std::size_t(s)])], u[std::size_t(ids[std::size_t(s)])]));
    lr = std::min(lr, float(0.7 * m));
  }
  if (ls > 0 && shared_inter > 0) ls = std::min(ls, float(0.7 * peak(sg, su)));

  cuda::DeviceBuffer didx(ids.size() * sizeof(int));
  didx.upload(ids.data(), ids.size() * sizeof(int));
  DeviceVec dw(wts), dx(x), dres(res), dh(static_cast<std::size_t>(w.h_elements(top_k))), dout(static_cast<std::size_t>(hidden));
  cuda::MoeStep step{didx.data<int>(), dw.data(), top_k, lr, ls};
  REQUIRE(cuda::launch_moe(w, step, dx.data(), dh.data(), dres.data(), dout.data(), nullptr) == cudaSuccess);
  device_sync();

  g_clamp_hits = 0;
  std::vector<double> href;
  std::vector<double> out(res.begin(), res.end());
  for (int s = 0; s < top_k; ++s) {
    int e = ids[static_cast<std::size_t>(s)];
    auto a = matvec_ref(g[static_cast<std::size_t>(e)], xd), b = matvec_ref(u[static_cast<std::size_t>(e)], xd);
    std::vector<double> h(static_cast<std::size_t>(inter));
    for (std::int64_t i = 0; i < inter; ++i) h[static_cast<std::size_t>(i)] = swiglu_ref(a[static_cast<std::size_t>(i)], b[static_cast<std::size_t>(i)], lr);
    href.insert(href.end(), h.begin(), h.end());
    auto y = matvec_ref(d[static_cast<std::size_t>(e)], h);
    for (std::int64_t r = 0; r < hidden; ++r) out[static_cast<std::size_t>(r)] += double(wts[static_cast<std::size_t>(s)]) * y[static_cast<std::size_t>(r)];
  }
  if (shared_inter > 0) {
    auto a = matvec_ref(sg, xd), b = matvec_ref(su, xd);
    std::vector<double> h(static_cast<std::size_t>(shared_inter));
    for (std::int64_t i = 0; i < shared_inter; ++i) h[static_cast<std::size_t>(i)] = swiglu_ref(a[static_cast<std::size_t>(i)], b[static_cast<std::size_t>(i)], ls);
    href.insert(href.end(), h.begin(), h.end());
    auto y = matvec_ref(sd, h);
    for (std::int64_t r = 0; r < hidden; ++r) out[static_cast<std::size_t>(r)] += y[static_cast<std::size_t>(r)];
  }
  // MXFP4 experts run on int8 dot products with the activations in two int8 limbs per 32-block (error ≤ amax / 64516
  // per element, ~2e-5 relative on a dot product; moe.cuh); every other path accumulates fp32 products of exact
  // decodes.
  bool const q8 = std::is_same_v<PE, quant::Mxfp4> && cuda::moe_q8_mode() > 0;
  double const tol = q8 ? 1e-4 : 1e-5;
  CHECK(rel_l2(dh.get(), href) < tol);
  CHECK(rel_l2(dout.get(), out) < tol);

  // the clamp must have been exercised (else the test proves little about φ)
  if (lr > 0) CHECK(g_clamp_hits > 0);
}

// Device MoE weights of `experts` random MXFP4 experts [inter, hidden] / [hidden, inter], no shared expert.
cuda::MoeWeights<quant::Mxfp4, quant::Fp8Block> random_mxfp4_experts(std::int64_t hidden, std::int64_t inter, int experts) {
  std::vector<HostMatrix<quant::Mxfp4>> g, u, d;
  std::vector<quant::MatrixView<quant::Mxfp4>> gv, uv, dv;
  for (int e = 0; e < experts; ++e) {
    g.push_back(random_matrix<quant::Mxfp4>(inter, hidden, 0.05f));
    u.push_back(random_matrix<quant::Mxfp4>(inter, hidden, 0.05f));
    d.push_back(random_matrix<quant::Mxfp4>(hidden, inter, 0.05f));
  }
  for (int e = 0; e < experts; ++e) {
    gv.push_back(g[std::size_t(e)].view());
    uv.push_back(u[std::size_t(e)].view());
    dv.push_back(d[std::size_t(e)].view());
  }
  cuda::MoeWeights<quant::Mxfp4, quant::Fp8Block> w;
  w.gate = cuda::DeviceMatrix<quant::Mxfp4>::upload_batch(gv);
  w.up = cuda::DeviceMatrix<quant::Mxfp4>::upload_batch(uv);
  w.down = cuda::DeviceMatrix<quant::Mxfp4>::upload_batch(dv);
  return w;
}

// Sets NAME=VALUE (the value may hold commas) in the environment; returns NAME, for unsetenv.
std::string set_env(std::string const& kv) {
  std::string const name = kv.substr(0, kv.find('='));
  setenv(name.c_str(), kv.substr(kv.find('=') + 1).c_str(), 1);
  return name;
}

// One MoE step (both launches, no residual) on ids / weights / x; returns h and the output.
std::pair<std::vector<float>, std::vector<float>> run_moe(cuda::MoeWeights<quant::Mxfp4, quant::Fp8Block> const& w,
                                                          std::vector<int> const& ids, std::vector<float> const& wts,
                                                          std::vector<float> const& x) {
  int const top_k = int(ids.size());
  cuda::DeviceBuffer didx(ids.size() * sizeof(int));
  didx.upload(ids.data(), ids.size() * sizeof(int));
  DeviceVec dw(wts), dx(x), dh(static_cast<std::size_t>(w.h_elements(top_k))), dout(x.size());
  cuda::MoeStep step{didx.data<int>(), dw.data(), top_k, 0.f, 0.f};
  REQUIRE(cuda::launch_moe(w, step, dx.data(), dh.data(), nullptr, dout.data(), nullptr) == cudaSuccess);
  device_sync();
  return {dh.get(), dout.get()};
}

}  // namespace

// Launch B: the lane kernel (default: int8, lanes fixed on their chunks; kU = 6 without predicates at Ling's 192
// chunks, kU = 8 with them below 256, the register kernel above) and the register kernel (LING_MOE_DOWN_LANE=0).
TEST_CASE("moe: MXFP4 routed experts + FP8-block shared expert, clamps on and off") {
  LING_REQUIRE_GPU();
  for (char const* lane : {"1", "2", "0"}) {  // lane kernel with 1 and 2 rows per warp, register kernel
    for (char const* q8 : {"1", "0", "2"}) {  // int8 (default), the fp32 decoder, int8 in both register kernels
      CAPTURE(lane);
      CAPTURE(q8);
      setenv("LING_MOE_DOWN_LANE", *lane == '0' ? "0" : "1", 1);
      setenv("LING_MOE_LANE_ROWS", lane, 1);
      setenv("LING_MOE_Q8", q8, 1);
      check_moe<quant::Mxfp4, quant::Fp8Block>(256, 96, 72, 16, 4, 4.0f, 5.0f);
      check_moe<quant::Mxfp4, quant::Fp8Block>(256, 96, 72, 16, 4, 0.f, 0.f);
      check_moe<quant::Mxfp4, quant::Fp8Block>(2560, 768, 768, 12, 8, 4.0f, 7.0f);  // Ling's shapes, fewer experts
      check_moe<quant::Mxfp4, quant::Fp8Block>(512, 64, 0, 8, 1, 0.f, 0.f);       // top-1, no shared expert
      check_moe<quant::Mxfp4, quant::Fp8Block>(2560, 736, 768, 12, 8, 0.f, 0.f);  // 184 chunks: kU = 8, predicated
      check_moe<quant::Mxfp4, quant::Fp8Block>(128, 1024, 40, 10, 9, 0.f, 0.f);   // 288 chunks: the register kernel
    }
  }
  unsetenv("LING_MOE_DOWN_LANE");
  unsetenv("LING_MOE_LANE_ROWS");
  unsetenv("LING_MOE_Q8");
}

// Launch A's pace (MoeArgs::pace): unset, the launcher gives the routed tiles the device's pace, one tile at an SM's
// share of the peak DRAM rate (moe_pace.hpp), from the device's own attributes; at Ling's shape 4 gate and 4 up rows
// of 1280 bytes and their 80 scale bytes each. The outputs are checked as everywhere (the pace moves no value).
TEST_CASE("moe: launch A's routed tiles take the device's pace") {
  LING_REQUIRE_GPU();
  if (std::getenv("LING_MOE_PACE") || std::getenv("LING_MOE_ROWS_A")) return;  // a set pace or tile (measurements)
  int dev = 0, sms = 0, sm_khz = 0, mem_khz = 0, bus = 0;
  REQUIRE(cudaGetDevice(&dev) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, dev) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess);
  MESSAGE("SMs ", sms, ", SM clock ", sm_khz, " kHz, memory clock ", mem_khz, " kHz, bus ", bus, " bits: peak ",
          cuda::moe_pace::peak_bandwidth(mem_khz, bus) / 1e9, " GB/s");
  cuda::moe_pace_used() = -1;
  check_moe<quant::Mxfp4, quant::Fp8Block>(2560, 768, 768, 12, 8, 4.0f, 7.0f);
  int const want = cuda::moe_pace::cycles(2 * 4 * (1280 + 80), sms, sm_khz, mem_khz, bus, -2);
  CHECK(want > 0);  // the attributes were read
  CHECK(cuda::moe_pace_used() == want);
  MESSAGE("launch A's pace: ", cuda::moe_pace_used().load(), " SM cycles");
}

// Launch A's streamed kernel (per-warp cp.async rings in shared memory; moe.cuh) runs Ling's formats by default; the
// same cases run with two blocks of 8 warps per SM and one of 16 and 20, and on the register-streaming kernels. Shapes:
// a shared expert with an odd row count (37), 20 experts per down tile (top_k 20), rows of 12 and 80 chunks (one and
// two rows per warp at a time), fewer tiles than SMs.
TEST_CASE("moe: the streamed launch A at odd shapes, 2 × 8, 1 × 16 and 1 × 20 warps per SM, and the register kernels") {
  LING_REQUIRE_GPU();
  // 20 warps here ask for launch A on the biased lookup (the default), which has no 20-warp instance: the launcher
  // falls back to 16 warps; the 20-warp instance runs below with LING_MOE_Q8U=0
  for (char const* stream : {"1", "0"}) {  // launch A streamed (default), or the register kernels
    for (char const* warps : {"8", "16", "20"}) {
      for (char const* q8 : {"1", "2"}) {
        if (std::string(warps) == "20" && (std::string(stream) != "1" || std::string(q8) != "1")) continue;
        CAPTURE(stream);
        CAPTURE(warps);
        CAPTURE(q8);
        setenv("LING_MOE_STREAM", stream, 1);
        setenv("LING_MOE_STREAM_WARPS_A", warps, 1);
        setenv("LING_MOE_Q8", q8, 1);
        check_moe<quant::Mxfp4, quant::Fp8Block>(384, 160, 37, 24, 20, 4.0f, 5.0f);
        check_moe<quant::Mxfp4, quant::Fp8Block>(2560, 768, 768, 12, 8, 4.0f, 7.0f);
        check_moe<quant::Mxfp4, quant::Fp8Block>(128, 32, 0, 4, 2, 0.f, 0.f);
      }
    }
  }
  // launch A's streamed kernel on q8_chunk (LING_MOE_Q8U=0; the default is the biased lookup q8u_chunk) on 8, 16 and
  // 20 warps (the 20-warp instance is q8_chunk's only), with one ring stage per warp (LING_MOE_STREAM_STAGES=1; at
  // these shapes a warp has at most one tile, buffer refills are the next block's), and with tiles of 2, 4 and 6 routed
  // and 1, 2 and 3 shared row pairs (LING_MOE_ROWS_A: partial last tiles at 160 and 37 rows)
  setenv("LING_MOE_STREAM", "1", 1);
  for (char const* var : {"LING_MOE_Q8U=0", "LING_MOE_STREAM_STAGES=1", "LING_MOE_ROWS_A=2,1",
                          "LING_MOE_ROWS_A=4,2", "LING_MOE_ROWS_A=6,3"}) {
    auto const name = set_env(var);
    for (char const* warps : {"8", "16", "20"}) {
      if (std::string(warps) == "20" && name != "LING_MOE_Q8U") continue;  // 20 warps: q8_chunk only
      CAPTURE(var);
      CAPTURE(warps);
      setenv("LING_MOE_STREAM_WARPS_A", warps, 1);
      check_moe<quant::Mxfp4, quant::Fp8Block>(384, 160, 37, 24, 20, 4.0f, 5.0f);
      check_moe<quant::Mxfp4, quant::Fp8Block>(2560, 768, 768, 12, 8, 4.0f, 7.0f);
      check_moe<quant::Mxfp4, quant::Fp8Block>(128, 32, 0, 4, 2, 0.f, 0.f);
    }
    unsetenv(name.c_str());
  }
  // more tiles than warps (2 routed row pairs per tile: 3 840 tiles at Ling's shapes on 132 × 16 warps; 2 per tile of
  // 4 096 rows at the last shape): a warp decodes a tile and refills its buffer, each buffer's barrier in its second
  // and third phases with one stage (and with two: the second tile in its own buffer)
  setenv("LING_MOE_ROWS_A", "2,1", 1);
  for (char const* stages : {"1", "2"}) {
    CAPTURE(stages);
    setenv("LING_MOE_STREAM_STAGES", stages, 1);
    setenv("LING_MOE_STREAM_WARPS_A", "16", 1);
    check_moe<quant::Mxfp4, quant::Fp8Block>(2560, 768, 768, 12, 8, 4.0f, 7.0f);
    check_moe<quant::Mxfp4, quant::Fp8Block>(256, 4096, 64, 16, 8, 4.0f, 5.0f);
  }
  unsetenv("LING_MOE_STREAM_STAGES");
  unsetenv("LING_MOE_ROWS_A");
  unsetenv("LING_MOE_STREAM");
  unsetenv("LING_MOE_STREAM_WARPS_A");
  unsetenv("LING_MOE_Q8");
}

// Launch B's lane kernel with its staging in one batch of loads (the default at Ling's shape: 192 chunks, one row per
// warp) and with the three staging calls (LING_MOE_B_STAGE1=0): Ling's shape, no shared expert and fewer rows than
// warps, two passes over the rows (4 096 rows), and an out-of-range id (every output NaN, no read outside the expert
// arrays).
TEST_CASE("moe: launch B's lane kernel with its staging in one batch of loads") {
  LING_REQUIRE_GPU();
  for (char const* var : {"LING_MOE_B_STAGE1=1", "LING_MOE_B_STAGE1=0"}) {
    CAPTURE(var);
    auto const name = set_env(var);
    check_moe<quant::Mxfp4, quant::Fp8Block>(2560, 768, 768, 12, 8, 4.0f, 7.0f);
    check_moe<quant::Mxfp4, quant::Fp8Block>(512, 384, 0, 20, 16, 0.f, 0.f);
    check_moe<quant::Mxfp4, quant::Fp8Block>(4096, 768, 256, 10, 8, 4.0f, 5.0f);
    std::int64_t const hidden = 256, inter = 768;
    auto w = random_mxfp4_experts(hidden, inter, 9);
    auto const [h, o] = run_moe(w, {2, 1000, 0, 1, 3, 4, 5, 6}, std::vector<float>(8, 0.125f),
                                randn(static_cast<std::size_t>(hidden)));
    CHECK(std::none_of(o.begin(), o.end(), [](float v) { return std::isfinite(v); }));
    unsetenv(name.c_str());
  }
}

// Launch A's two lookups (the biased q8u_chunk, the default, and q8_chunk with LING_MOE_Q8U=0) sum the same integers
// in the same order: h and the output equal bit for bit. Ling's rows (80 chunks: 16 lanes per row), 12 chunks (32
// lanes per row), tiles of 6 and 2 row pairs (a partial pass and partial tiles at 160 rows), and an out-of-range id
// (its rows NaN).
TEST_CASE("moe: launch A's two lookups give the same bits") {
  LING_REQUIRE_GPU();
  setenv("LING_MOE_STREAM", "1", 1);
  setenv("LING_MOE_STREAM_WARPS_A", "16", 1);
  struct Shape {
    std::int64_t hidden, inter;
    char const* rows;
  };
  for (Shape const sh : {Shape{2560, 768, "4,2"}, Shape{384, 160, "4,2"}, Shape{2560, 160, "6,3"}, Shape{384, 96, "2,1"}}) {
    CAPTURE(sh.hidden);
    CAPTURE(sh.inter);
    CAPTURE(sh.rows);
    setenv("LING_MOE_ROWS_A", sh.rows, 1);
    auto w = random_mxfp4_experts(sh.hidden, sh.inter, 12);
    auto const x = randn(static_cast<std::size_t>(sh.hidden), 3.f);
    for (std::vector<int> const& ids : {std::vector<int>{2, 7, 0, 1, 3, 4, 5, 11}, std::vector<int>{5, 1000, 9}}) {
      std::vector<float> const wts(ids.size(), 0.25f);
      auto const [h0, o0] = run_moe(w, ids, wts, x);
      setenv("LING_MOE_Q8U", "0", 1);
      auto const [h1, o1] = run_moe(w, ids, wts, x);
      unsetenv("LING_MOE_Q8U");
      REQUIRE(h0.size() == h1.size());
      CHECK(std::memcmp(h0.data(), h1.data(), h0.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(o0.data(), o1.data(), o0.size() * sizeof(float)) == 0);
      CHECK(std::count_if(h1.begin(), h1.end(), [](float v) { return std::isnan(v); }) == (ids[1] == 1000 ? sh.inter : 0));
    }
  }
  unsetenv("LING_MOE_ROWS_A");
  unsetenv("LING_MOE_STREAM");
  unsetenv("LING_MOE_STREAM_WARPS_A");
}

// Launch A's routed decode on FP8 wgmma (LING_MOE_DIAG_A=9, a trial; moe.cuh routed_decode_wgmma), at Ling's 2560
// columns (its one shape), against the default int8 path on the same draw (which the cases above check against the
// CPU to 1e-4): the instance must run (its launch count), an out-of-range id must turn its slot NaN, and the rest must
// agree within the FP8 tensor core's accumulation (~2^-14 of the largest product of each 32 summed; the probe
// bench/probes/wgmma_decode measured 6.8e-5 of Σ|w x| per row).
TEST_CASE("moe: launch A's routed decode on FP8 wgmma (LING_MOE_DIAG_A=9) against the int8 path") {
  LING_REQUIRE_GPU();
  setenv("LING_MOE_STREAM", "1", 1);
  setenv("LING_MOE_STREAM_WARPS_A", "16", 1);
  for (std::int64_t const inter : {768, 736}) {
    CAPTURE(inter);
    auto w = random_mxfp4_experts(2560, inter, 12);
    auto const x = randn(2560, 3.f);
    for (std::vector<int> const& ids : {std::vector<int>{2, 7, 0, 1, 3, 4, 5, 11}, std::vector<int>{5, 1000, 9}}) {
      std::vector<float> const wts(ids.size(), 0.25f);
      auto const [h0, o0] = run_moe(w, ids, wts, x);
      int const before = cuda::moe_wg_a_launches();
      setenv("LING_MOE_DIAG_A", "9", 1);
      auto const [h1, o1] = run_moe(w, ids, wts, x);
      unsetenv("LING_MOE_DIAG_A");
      CHECK(cuda::moe_wg_a_launches() == before + 1);
      REQUIRE(h0.size() == h1.size());
      std::vector<float> a, b;  // the finite slots' outputs
      std::int64_t nan = 0;
      for (std::size_t i = 0; i < h1.size(); ++i) {
        if (std::isnan(h1[i])) ++nan;
        if (std::isfinite(h0[i])) a.push_back(h1[i]), b.push_back(h0[i]);
      }
      CHECK(nan == (ids[1] == 1000 ? inter : 0));
      double const e = rel_l2(a, b);
      MESSAGE("wgmma against int8, launch A's outputs: relative L2 " << e);
      CHECK(e < 3e-3);
      if (ids[1] != 1000) CHECK(rel_l2(o1, o0) < 3e-3);
    }
  }
  unsetenv("LING_MOE_STREAM");
  unsetenv("LING_MOE_STREAM_WARPS_A");
}

TEST_CASE("moe: FP8-block and BF16 experts with odd shapes") {
  LING_REQUIRE_GPU();
  check_moe<quant::Fp8Block, quant::Fp8Block>(203, 72, 40, 10, 3, 4.0f, 5.0f);
  check_moe<quant::Bf16, quant::Bf16>(203, 77, 33, 9, 5, 0.f, 7.0f);
}

TEST_CASE("moe: a policy defined in the test runs through the generic kernels") {
  LING_REQUIRE_GPU();
  check_moe<test::Int8Row, quant::Bf16>(130, 50, 20, 6, 2, 4.0f, 0.f);
}

// An expert id out of range never reads outside the expert arrays: its slot's gate/up outputs and every output of the
// down launch are NaN (streamed and register kernels).
TEST_CASE("moe: an out-of-range expert id turns its outputs NaN") {
  LING_REQUIRE_GPU();
  std::int64_t const hidden = 256, inter = 64;
  int const experts = 4;
  auto w = random_mxfp4_experts(hidden, inter, experts);
  auto sg = random_matrix<quant::Fp8Block>(64, hidden, 0.05f), su = random_matrix<quant::Fp8Block>(64, hidden, 0.05f);
  auto sd = random_matrix<quant::Fp8Block>(hidden, 64, 0.05f);
  w.shared_gate = cuda::DeviceMatrix<quant::Fp8Block>::upload(sg.view());
  w.shared_up = cuda::DeviceMatrix<quant::Fp8Block>::upload(su.view());
  w.shared_down = cuda::DeviceMatrix<quant::Fp8Block>::upload(sd.view());
  for (char const* stream : {"1", "0"}) {  // the default launches, the register kernels
    CAPTURE(stream);
    setenv("LING_MOE_STREAM", stream, 1);
    auto const [h, o] = run_moe(w, {2, 1000}, {0.5f, 0.5f}, randn(static_cast<std::size_t>(hidden)));
    int finite_good = 0, finite_bad = 0, finite_shared = 0;
    for (std::size_t i = 0; i < std::size_t(inter); ++i) finite_good += std::isfinite(h[i]) ? 1 : 0;
    for (std::size_t i = std::size_t(inter); i < std::size_t(2 * inter); ++i) finite_bad += std::isfinite(h[i]) ? 1 : 0;
    for (std::size_t i = std::size_t(2 * inter); i < h.size(); ++i) finite_shared += std::isfinite(h[i]) ? 1 : 0;
    CHECK(finite_good == inter);
    CHECK(finite_bad == 0);
    CHECK(finite_shared == 64);
    CHECK(std::none_of(o.begin(), o.end(), [](float v) { return std::isfinite(v); }));
  }
  unsetenv("LING_MOE_STREAM");
}

// The int8 path must not turn a non-finite activation into a finite value: a NaN in one 32-block of x makes that
// block's scale NaN, so every routed gate/up row (all of them read every block) is NaN.
TEST_CASE("moe: a NaN activation stays visible on the int8 path") {
  LING_REQUIRE_GPU();
  std::int64_t const hidden = 256, inter = 64;
  int const experts = 4, top_k = 2;
  auto w = random_mxfp4_experts(hidden, inter, experts);
  auto x = randn(static_cast<std::size_t>(hidden));
  x[37] = std::nanf("");
  for (char const* lane : {"1", "0"}) {  // launch B: lane kernel (int8 limbs of h), register kernel
    CAPTURE(lane);
    setenv("LING_MOE_DOWN_LANE", lane, 1);
    auto const [h, o] = run_moe(w, {1, 3}, {0.5f, 0.5f}, x);
    int finite = 0;
    for (std::size_t i = 0; i < std::size_t(top_k * inter); ++i) finite += std::isfinite(h[i]) ? 1 : 0;
    CHECK(finite == 0);
    CHECK(std::none_of(o.begin(), o.end(), [](float v) { return std::isfinite(v); }));  // NaN h reaches every output
  }
  unsetenv("LING_MOE_DOWN_LANE");
}
