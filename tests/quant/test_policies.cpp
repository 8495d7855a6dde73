// Weight policies (quant/*.hpp) against values computed here from the format definitions (std::ldexp), on hand-built
// bytes and on round trips through quantize().
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ling/quant/policies.hpp"

using namespace ling;
using namespace ling::quant;

namespace {

float e4m3_value(std::uint8_t code) {  // E4M3fn by definition
  int s = code >> 7, e = (code >> 3) & 0xF, m = code & 7;
  if (e == 15 && m == 7) return std::nanf("");
  double v = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return float(s ? -v : v);
}
float e2m1_value(int code) {
  static float const mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  return (code & 8) ? -mag[code & 7] : mag[code & 7];
}
std::vector<float> random_matrix(std::int64_t rows, std::int64_t cols, unsigned seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> x(std::size_t(rows * cols));
  for (auto& v : x) v = nd(rng);
  return x;
}

}  // namespace

TEST_CASE("storage_bytes per policy") {
  CHECK(storage_bytes<Bf16>(3, 5) == 30);
  CHECK(storage_bytes<F16>(3, 5) == 30);
  CHECK(storage_bytes<F32>(3, 5) == 60);
  CHECK(storage_bytes<Fp8Block>(200, 300) == 200 * 300 + 2 * 3 * 4);
  CHECK(storage_bytes<Fp8Block>(128, 128) == 128 * 128 + 4);
  CHECK(storage_bytes<Fp8Block>(129, 1) == 129 + 2 * 4);
  CHECK(storage_bytes<Mxfp4>(4, 64) == 4 * 32 + 4 * 2);
  CHECK(storage_bytes<Mxfp4>(768, 2560) * 8 == 768 * 2560 * 17 / 4);  // 4.25 bit per element
  CHECK(storage_bytes<Fp8Row>(3, 5) == 15 + 3 * 4);
  CHECK(Fp8Block::scale_count(200, 300) == 6);
  CHECK(Mxfp4::storage_count(2, 64) == 64);
  CHECK(Mxfp4::scale_count(2, 64) == 4);
}

TEST_CASE("plain policies decode their element") {
  std::vector<Bfloat16> b{{0x3F80}, {0xC000}, {0x3E80}, {0x0000}, {0x4049}, {0xBF00}};  // 1, -2, 0.25, 0, 3.140625, -0.5
  float const want_b[] = {1.f, -2.f, 0.25f, 0.f, 3.140625f, -0.5f};
  std::vector<Half> h{{0x3C00}, {0xC000}, {0x3400}, {0x0001}, {0x7BFF}, {0xB800}};  // 1, -2, 0.25, 2^-24, 65504, -0.5
  float const want_h[] = {1.f, -2.f, 0.25f, std::ldexp(1.f, -24), 65504.f, -0.5f};
  std::vector<float> f{1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  for (std::int64_t r = 0; r < 2; ++r)
    for (std::int64_t c = 0; c < 3; ++c) {
      CHECK(Bf16::decode(b.data(), nullptr, 2, 3, r, c) == want_b[r * 3 + c]);
      CHECK(F16::decode(h.data(), nullptr, 2, 3, r, c) == want_h[r * 3 + c]);
      CHECK(F32::decode(f.data(), nullptr, 2, 3, r, c) == f[std::size_t(r * 3 + c)]);
    }
  MatrixView<Bf16> v{b.data(), nullptr, 2, 3};
  float row[3];
  v.row(1, row);
  CHECK(row[0] == 0.f);
  CHECK(row[1] == 3.140625f);
  CHECK(row[2] == -0.5f);
}

TEST_CASE("Fp8Block: hand-built bytes, partial edge blocks (200 x 300)") {
  std::int64_t const R = 200, C = 300, nbc = 3;
  std::vector<E4m3> w(std::size_t(R * C));
  for (std::int64_t i = 0; i < R * C; ++i) w[std::size_t(i)].bits = std::uint8_t((i * 37 + 11) % 256 == 0x7F ? 0x11 : (i * 37 + 11) % 256 == 0xFF ? 0x91 : (i * 37 + 11) % 256);
  std::vector<float> s{0.5f, 2.f, 4.f, 0.125f, 8.f, 1.f};  // [2, 3]
  MatrixView<Fp8Block> v{w.data(), s.data(), R, C};
  std::vector<float> row(static_cast<std::size_t>(C));
  for (std::int64_t r : {0L, 1L, 127L, 128L, 199L}) {
    v.row(r, row.data());
    for (std::int64_t c : {0L, 5L, 127L, 128L, 255L, 256L, 299L}) {
      float want = e4m3_value(w[std::size_t(r * C + c)].bits) * s[std::size_t((r / 128) * nbc + c / 128)];
      CHECK_MESSAGE(v.at(r, c) == want, "r " << r << " c " << c);
      CHECK(row[std::size_t(c)] == want);
    }
  }
}

TEST_CASE("Fp8Block::quantize: per-block scale = amax / 448, elements within half an E4M3 step") {
  std::int64_t const R = 200, C = 300;
  auto x = random_matrix(R, C, 1);
  x[std::size_t(199 * C + 299)] = 50.f;  // a large value alone in the last (partial) block
  for (bool ue8m0 : {false, true}) {
    std::vector<E4m3> w(std::size_t(R * C));
    std::vector<float> s(std::size_t(Fp8Block::scale_count(R, C)));
    Fp8Block::quantize(x.data(), R, C, w.data(), s.data(), ue8m0);
    for (std::int64_t br = 0; br < 2; ++br)
      for (std::int64_t bc = 0; bc < 3; ++bc) {
        float amax = 0;
        for (std::int64_t r = br * 128; r < std::min<std::int64_t>(R, br * 128 + 128); ++r)
          for (std::int64_t c = bc * 128; c < std::min<std::int64_t>(C, bc * 128 + 128); ++c)
            amax = std::max(amax, std::fabs(x[std::size_t(r * C + c)]));
        float sc = s[std::size_t(br * 3 + bc)];
        if (ue8m0) {
          int e;
          CHECK(std::frexp(sc, &e) == 0.5f);  // a power of two
          CHECK(sc >= amax / 448.f);
          CHECK(sc < 2 * amax / 448.f);
        } else {
          CHECK(sc == doctest::Approx(amax / 448.f).epsilon(1e-6));
        }
      }
    MatrixView<Fp8Block> v{w.data(), s.data(), R, C};
    for (std::int64_t r = 0; r < R; r += 7)
      for (std::int64_t c = 0; c < C; c += 3) {
        float xv = x[std::size_t(r * C + c)], sc = s[std::size_t((r / 128) * 3 + c / 128)];
        float q = e4m3_value(w[std::size_t(r * C + c)].bits);
        CHECK(v.at(r, c) == q * sc);
        // E4M3 relative step is 2^-3 for normals; subnormals step 2^-9 absolute (in scaled units)
        CHECK(std::fabs(q - xv / sc) <= std::max(std::fabs(xv / sc) / 16.f, std::ldexp(1.f, -10)) * 1.0001f);
      }
    if (!ue8m0) CHECK(v.at(199, 299) == doctest::Approx(50.f).epsilon(1e-6));  // the block max maps to 448 exactly
  }
}

TEST_CASE("Mxfp4: low nibble = even element, UE8M0 scale per 32") {
  std::int64_t const R = 2, C = 64;
  std::vector<std::uint8_t> w(std::size_t(R * C / 2));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::uint8_t((i * 29 + 3) & 0xFF);
  std::vector<Ue8m0> s{{127}, {129}, {120}, {0}};  // [2, 2]: 1, 4, 2^-7, 2^-127
  MatrixView<Mxfp4> v{w.data(), s.data(), R, C};
  std::vector<float> row(C);
  for (std::int64_t r = 0; r < R; ++r) {
    v.row(r, row.data());
    for (std::int64_t c = 0; c < C; ++c) {
      std::uint8_t byte = w[std::size_t(r * C / 2 + c / 2)];
      int code = c % 2 == 0 ? byte & 0xF : byte >> 4;
      float want = e2m1_value(code) * std::ldexp(1.f, s[std::size_t(r * 2 + c / 32)].bits - 127);
      CHECK_MESSAGE(v.at(r, c) == want, "r " << r << " c " << c);
      CHECK(row[std::size_t(c)] == want);
    }
  }
  // One byte, spelled out: 0x71 holds element 0 = code 1 (0.5) and element 1 = code 7 (6).
  std::uint8_t b = 0x71;
  Ue8m0 one{127};
  std::vector<Ue8m0> ones(1, one);
  std::vector<std::uint8_t> bytes(16, 0);
  bytes[0] = b;
  CHECK(Mxfp4::decode(bytes.data(), ones.data(), 1, 32, 0, 0) == 0.5f);
  CHECK(Mxfp4::decode(bytes.data(), ones.data(), 1, 32, 0, 1) == 6.0f);
}

TEST_CASE("Mxfp4::quantize: scale = 2^ceil(log2(amax/6)); representable values round-trip") {
  std::int64_t const R = 3, C = 64;
  std::vector<float> x(std::size_t(R * C));
  std::mt19937 rng(7);
  for (std::int64_t i = 0; i < R * C; ++i) {
    int code = int(rng() % 16), block_exp = int((i / 32) % 5) - 2;
    x[std::size_t(i)] = e2m1_value(code) * std::ldexp(1.f, block_exp);
  }
  for (std::int64_t b = 0; b < R * C / 32; ++b) x[std::size_t(b * 32 + 3)] = 6.f * std::ldexp(1.f, int(b % 5) - 2);  // amax
  std::vector<std::uint8_t> w(std::size_t(Mxfp4::storage_count(R, C)));
  std::vector<Ue8m0> s(std::size_t(Mxfp4::scale_count(R, C)));
  Mxfp4::quantize(x.data(), R, C, w.data(), s.data());
  for (std::int64_t b = 0; b < R * C / 32; ++b) CHECK(int(s[std::size_t(b)].bits) == 127 + int(b % 5) - 2);
  MatrixView<Mxfp4> v{w.data(), s.data(), R, C};
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t c = 0; c < C; ++c) CHECK(v.at(r, c) == x[std::size_t(r * C + c)]);
  // Non-representable values: nearest E2M1 step (ties to even), scale from the block max.
  std::vector<float> y(32, 0.f);
  y[0] = 12.f;   // amax: scale 2, code 6 -> 12
  y[1] = 5.f;    // 2.5 -> tie -> 2 -> 4
  y[2] = 7.f;    // 3.5 -> tie -> 4 -> 8
  y[3] = -1.4f;  // -0.7 -> 0.5 -> -1
  std::vector<std::uint8_t> wy(16);
  std::vector<Ue8m0> sy(1);
  Mxfp4::quantize(y.data(), 1, 32, wy.data(), sy.data());
  CHECK(sy[0].bits == 128);
  CHECK(Mxfp4::decode(wy.data(), sy.data(), 1, 32, 0, 0) == 12.f);
  CHECK(Mxfp4::decode(wy.data(), sy.data(), 1, 32, 0, 1) == 4.f);
  CHECK(Mxfp4::decode(wy.data(), sy.data(), 1, 32, 0, 2) == 8.f);
  CHECK(Mxfp4::decode(wy.data(), sy.data(), 1, 32, 0, 3) == -1.f);
  CHECK((wy[0] & 0xF) == 7);   // element 0 in the low nibble
  CHECK((wy[0] >> 4) == 4);    // element 1 in the high nibble
}

TEST_CASE("Fp8Row: decode and quantize() from a BF16 source") {
  std::int64_t const R = 5, C = 40;
  auto xf = random_matrix(R, C, 3, 2.f);
  std::vector<Bfloat16> src(xf.size());
  for (std::size_t i = 0; i < xf.size(); ++i) src[i] = bf16_from_float(xf[i]);
  for (std::int64_t c = 0; c < C; ++c) src[std::size_t(4 * C + c)] = Bfloat16{0};  // an all-zero row: scale 1
  std::vector<E4m3> w(std::size_t(R * C));
  std::vector<float> s(static_cast<std::size_t>(R));
  Fp8Row::quantize([&](std::int64_t r, std::int64_t c) { return to_float(src[std::size_t(r * C + c)]); }, R, C, w.data(),
                   s.data());
  MatrixView<Fp8Row> v{w.data(), s.data(), R, C};
  std::vector<float> row(C);
  for (std::int64_t r = 0; r < R; ++r) {
    float amax = 0;
    for (std::int64_t c = 0; c < C; ++c) amax = std::max(amax, std::fabs(to_float(src[std::size_t(r * C + c)])));
    CHECK(s[std::size_t(r)] == (amax > 0 ? doctest::Approx(amax / 448.f).epsilon(1e-6) : doctest::Approx(1.0)));
    v.row(r, row.data());
    for (std::int64_t c = 0; c < C; ++c) {
      float x = to_float(src[std::size_t(r * C + c)]);
      float want = e4m3_value(w[std::size_t(r * C + c)].bits) * s[std::size_t(r)];
      CHECK(v.at(r, c) == want);
      CHECK(row[std::size_t(c)] == want);
      CHECK(std::fabs(want - x) <= std::max(std::fabs(x) / 16.f, std::ldexp(1.f, -10) * s[std::size_t(r)]) * 1.0001f);
    }
  }
}
