// The f16 tensor-core MXFP4 operand layout (cuda/mma_layout.hpp), checked on the CPU: a 32-lane warp is simulated
// from PTX's fragment definitions of mma.m16n8k16 (row.col, f16 -> f32), fed by the same helper functions the kernels
// use, and its result compared with the plain dot products of E2M1 codes and x.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "ling/core/dtypes.hpp"
#include "ling/cuda/mma_layout.hpp"

using namespace ling;
namespace m16 = ling::cuda::mma16;

namespace {

double e2m1_value(unsigned code) {
  static constexpr double kMag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return (code & 8u) ? -kMag[code & 7u] : kMag[code & 7u];
}
double half_value(std::uint16_t bits) { return double(to_float(Half{bits})); }

}  // namespace

TEST_CASE("e2m1_pair: every code pair becomes its value times 2^-14 in f16, exactly") {
  for (int j = 0; j < 4; ++j)
    for (unsigned a = 0; a < 16; ++a)
      for (unsigned b = 0; b < 16; ++b) {
        std::uint32_t w = 0x9C5A3E71u;  // other codes: must not leak into the pair
        w &= ~((0xFu << (4 * j)) | (0xFu << (4 * (j + 4))));
        w |= (a << (4 * j)) | (b << (4 * (j + 4)));
        std::uint32_t const p = m16::e2m1_pair(w, j);
        CHECK(half_value(std::uint16_t(p & 0xFFFFu)) * m16::kCodeScale == e2m1_value(a));
        CHECK(half_value(std::uint16_t(p >> 16)) * m16::kCodeScale == e2m1_value(b));
      }
}

TEST_CASE("staged_half is a permutation of each block, consistent with block_element") {
  std::set<int> seen;
  for (int e = 0; e < 32; ++e) seen.insert(m16::staged_half(3, e));
  CHECK(seen.size() == 32);
  CHECK(*seen.begin() == 3 * 32);
  CHECK(*seen.rbegin() == 3 * 32 + 31);
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < 4; ++t)
      for (int pair = 0; pair < 4; ++pair)
        CHECK(m16::staged_half(3, m16::block_element(t, h, pair)) == m16::staged_quad(3, h, t) + pair);
}

TEST_CASE("a simulated warp of two m16n8k16 MMAs per block gives the 16 rows' block dot products") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<unsigned> code(0, 15);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int rep = 0; rep < 20; ++rep) {
    // one 32-element block of 16 rows (codes), one block of x with a wide dynamic range
    std::array<std::array<unsigned, 32>, 16> c{};
    for (auto& row : c)
      for (auto& v : row) v = code(rng);
    std::array<float, 32> x{};
    for (auto& v : x) v = nd(rng) * std::ldexp(1.0f, int(rng() % 40) - 20);
    // words: lane quad position t holds elements 8t..8t+7 of a row
    auto word = [&](int row, int t) {
      std::uint32_t w = 0;
      for (int i = 0; i < 8; ++i) w |= std::uint32_t(c[std::size_t(row)][std::size_t(8 * t + i)]) << (4 * i);
      return w;
    };
    // staged limbs (block 0): x / sx = hi + lo
    float amax = 0.f;
    for (float v : x) amax = std::fmax(amax, std::fabs(v));
    std::uint32_t bits = 0;
    std::memcpy(&bits, &amax, 4);
    int const ex = m16::limb_exponent(bits);
    std::vector<std::uint16_t> hi(32), lo(32);
    for (int e = 0; e < 32; ++e) {
      float const s = std::ldexp(x[std::size_t(e)], -ex);
      Half const h = half_from_float(s);
      hi[std::size_t(m16::staged_half(0, e))] = h.bits;
      lo[std::size_t(m16::staged_half(0, e))] = half_from_float(s - to_float(h)).bits;
    }
    // D over the two MMAs, built from each lane's registers by PTX's fragment maps
    double D[16][8] = {};
    for (int h = 0; h < 2; ++h) {
      double A[16][16] = {}, B[16][8] = {};
      for (int lane = 0; lane < 32; ++lane) {
        int const g = lane >> 2, t = lane & 3;
        std::uint32_t const a[4] = {m16::e2m1_pair(word(g, t), 2 * h), m16::e2m1_pair(word(g + 8, t), 2 * h),
                                    m16::e2m1_pair(word(g, t), 2 * h + 1), m16::e2m1_pair(word(g + 8, t), 2 * h + 1)};
        // a0,a1: (g, 2t..2t+1); a2,a3: (g+8, 2t..); a4,a5: (g, 2t+8..); a6,a7: (g+8, 2t+8..)
        A[g][2 * t] = half_value(std::uint16_t(a[0])), A[g][2 * t + 1] = half_value(std::uint16_t(a[0] >> 16));
        A[g + 8][2 * t] = half_value(std::uint16_t(a[1])), A[g + 8][2 * t + 1] = half_value(std::uint16_t(a[1] >> 16));
        A[g][2 * t + 8] = half_value(std::uint16_t(a[2])), A[g][2 * t + 9] = half_value(std::uint16_t(a[2] >> 16));
        A[g + 8][2 * t + 8] = half_value(std::uint16_t(a[3])), A[g + 8][2 * t + 9] = half_value(std::uint16_t(a[3] >> 16));
        // b0,b1: (k 2t..2t+1, n g); b2,b3: (k 2t+8..2t+9, n g); columns 0/1 = hi/lo limb, the rest zero
        std::uint16_t q[4] = {0, 0, 0, 0};
        if (g < 2) {
          auto const& limb = g == 0 ? hi : lo;
          for (int p = 0; p < 4; ++p) q[p] = limb[std::size_t(m16::staged_quad(0, h, t) + p)];
        }
        B[2 * t][g] = half_value(q[0]), B[2 * t + 1][g] = half_value(q[1]);
        B[2 * t + 8][g] = half_value(q[2]), B[2 * t + 9][g] = half_value(q[3]);
      }
      for (int i = 0; i < 16; ++i)
        for (int n = 0; n < 8; ++n)
          for (int k = 0; k < 16; ++k) D[i][n] += A[i][k] * B[k][n];
    }
    // lanes t = 0: c0 + c1 = row g, c2 + c3 = row g + 8 (columns 0 and 1)
    for (int row = 0; row < 16; ++row) {
      double ref = 0, mag = 0;
      for (int e = 0; e < 32; ++e) {
        ref += e2m1_value(c[std::size_t(row)][std::size_t(e)]) * double(x[std::size_t(e)]);
        mag += std::fabs(e2m1_value(c[std::size_t(row)][std::size_t(e)]) * double(x[std::size_t(e)]));
      }
      double const got = (D[row][0] + D[row][1]) * m16::kCodeScale * std::ldexp(1.0, ex);
      CHECK(std::fabs(got - ref) <= 1e-6 * mag + 1e-30);
      for (int n = 2; n < 8; ++n) CHECK(D[row][n] == 0.0);
    }
  }
}
