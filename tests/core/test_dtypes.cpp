// Number formats (core/dtypes.hpp) against values computed here from the format definitions with std::ldexp,
// never with the library's own bit tricks.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ling/core/dtypes.hpp"

using namespace ling;

namespace {

// E4M3 (fn): bias 7, no infinities, S.1111.111 is NaN.
float e4m3_reference(int code) {
  int s = (code >> 7) & 1, e = (code >> 3) & 0xF, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  double v = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return float(s ? -v : v);
}
// E2M1: bias 1, e == 0 subnormal (0 or 0.5).
float e2m1_reference(int code) {
  int s = (code >> 3) & 1, e = (code >> 1) & 3, m = code & 1;
  double v = e == 0 ? std::ldexp(double(m), -1) : std::ldexp(1.0 + m / 2.0, e - 1);
  return float(s ? -v : v);
}

// Round-to-nearest-even onto a finite sorted list of non-negative representable values (index = code magnitude),
// by brute force: the nearest value, on a tie the one with the even code.
int rne_index(double a, std::vector<double> const& values) {
  int best = 0;
  for (int i = 1; i < int(values.size()); ++i) {
    double d = std::fabs(a - values[i]), db = std::fabs(a - values[best]);
    if (d < db || (d == db && (i % 2 == 0) && (best % 2 == 1))) best = i;
  }
  return best;
}

std::vector<double> e4m3_magnitudes() {  // codes 0..126
  std::vector<double> v;
  for (int c = 0; c < 127; ++c) v.push_back(e4m3_reference(c));
  return v;
}

}  // namespace

TEST_CASE("E4M3: every one of the 256 codes decodes to its definition") {
  int nan_codes = 0;
  for (int c = 0; c < 256; ++c) {
    float want = e4m3_reference(c), got = to_float(E4m3{std::uint8_t(c)});
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
      ++nan_codes;
    } else {
      CHECK_MESSAGE(got == want, "code " << c);
      CHECK(std::signbit(got) == bool(c & 0x80));
    }
  }
  CHECK(nan_codes == 2);  // 0x7F and 0xFF only
  CHECK(to_float(E4m3{0x7E}) == 448.0f);
  CHECK(to_float(E4m3{0x01}) == std::ldexp(1.0f, -9));
  CHECK(to_float(E4m3{0x08}) == std::ldexp(1.0f, -6));
}

TEST_CASE("E4M3: conversion is round-to-nearest-even, saturating, NaN-preserving") {
  auto const mags = e4m3_magnitudes();
  // Every code round-trips.
  for (int c = 0; c < 256; ++c) {
    if (c == 0x7F || c == 0xFF) continue;
    float x = e4m3_reference(c);
    int back = e4m3_from_float(x).bits;
    if (c == 0x80) CHECK((back == 0x80 || back == 0x00));  // -0
    else CHECK_MESSAGE(back == c, "code " << c);
  }
  // Midpoints between neighbours (ties) and points a quarter step either side, both signs.
  for (int c = 0; c < 126; ++c) {
    double lo = mags[c], hi = mags[c + 1];
    for (double t : {0.25, 0.5, 0.75}) {
      double x = lo + t * (hi - lo);
      int want = rne_index(x, mags);
      if (t == 0.5) CHECK(want == ((c % 2 == 0) ? c : c + 1));  // the tie goes to the even code
      CHECK_MESSAGE(e4m3_from_float(float(x)).bits == want, "x = " << x);
      CHECK_MESSAGE(e4m3_from_float(float(-x)).bits == (want | 0x80), "x = " << -x);
    }
  }
  // Subnormals: multiples of 2^-9 and ties between them.
  CHECK(e4m3_from_float(std::ldexp(1.0f, -10)).bits == 0x00);        // 0.5 ulp: tie to even (0)
  CHECK(e4m3_from_float(std::ldexp(3.0f, -10)).bits == 0x02);        // 1.5 ulp: tie to even (2)
  CHECK(e4m3_from_float(std::ldexp(15.0f, -10)).bits == 0x08);       // 7.5 ulp: tie carries into the first normal
  CHECK(e4m3_from_float(std::ldexp(1.0f, -12)).bits == 0x00);
  // Saturation: past 448 (even past 464 and infinity) becomes +-448; NaN stays NaN.
  for (float x : {448.0f, 449.0f, 464.0f, 480.0f, 1e6f, std::numeric_limits<float>::infinity()}) {
    CHECK(e4m3_from_float(x).bits == 0x7E);
    CHECK(e4m3_from_float(-x).bits == 0xFE);
  }
  CHECK(e4m3_from_float(std::nanf("")).bits == 0x7F);
  CHECK(e4m3_from_float(-std::nanf("")).bits == 0xFF);
}

TEST_CASE("E2M1: every one of the 16 codes, and conversion") {
  float const table[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};  // spec §3
  for (int c = 0; c < 16; ++c) {
    CHECK(e2m1_reference(c) == ((c & 8) ? -table[c & 7] : table[c & 7]));
    CHECK_MESSAGE(e2m1_to_float(std::uint8_t(c)) == e2m1_reference(c), "code " << c);
    CHECK(e2m1_to_float(std::uint8_t(c | 0xF0)) == e2m1_reference(c));  // high bits ignored
  }
  std::vector<double> mags(table, table + 8);
  for (int c = 0; c < 16; ++c)
    if (c != 8) CHECK(e2m1_from_float(e2m1_reference(c)) == c);
  for (int c = 0; c < 7; ++c)
    for (double t : {0.25, 0.5, 0.75}) {
      double x = mags[c] + t * (mags[c + 1] - mags[c]);
      int want = rne_index(x, mags);
      CHECK_MESSAGE(e2m1_from_float(float(x)) == want, "x = " << x);
      CHECK_MESSAGE(e2m1_from_float(float(-x)) == (want | 8), "x = " << -x);
    }
  // ties: 0.25 -> 0, 0.75 -> 1.0 (code 2), 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5.0 -> 4.0
  CHECK(e2m1_from_float(0.25f) == 0);
  CHECK(e2m1_from_float(0.75f) == 2);
  CHECK(e2m1_from_float(1.25f) == 2);
  CHECK(e2m1_from_float(1.75f) == 4);
  CHECK(e2m1_from_float(2.5f) == 4);
  CHECK(e2m1_from_float(3.5f) == 6);
  CHECK(e2m1_from_float(5.0f) == 6);
  // saturation at +-6
  for (float x : {6.0f, 7.0f, 100.0f, std::numeric_limits<float>::infinity()}) {
    CHECK(e2m1_from_float(x) == 7);
    CHECK(e2m1_from_float(-x) == 15);
  }
}

TEST_CASE("UE8M0: 2^(s-127), 0xFF NaN, s = 0 a float subnormal") {
  for (int s = 0; s < 255; ++s) CHECK_MESSAGE(to_float(Ue8m0{std::uint8_t(s)}) == std::ldexp(1.0f, s - 127), "s " << s);
  CHECK(std::isnan(to_float(Ue8m0{0xFF})));
  CHECK(std::fpclassify(to_float(Ue8m0{0})) == FP_SUBNORMAL);
  // ue8m0_ceil: the smallest power of two >= x
  CHECK(ue8m0_ceil(1.0f).bits == 127);
  CHECK(ue8m0_ceil(1.5f).bits == 128);
  CHECK(ue8m0_ceil(0.75f).bits == 127);
  CHECK(ue8m0_ceil(std::ldexp(1.0f, -100)).bits == 27);
  CHECK(ue8m0_ceil(std::ldexp(1.0f, -100) * 1.01f).bits == 28);
  for (int e = -126; e <= 127; ++e) CHECK(to_float(ue8m0_ceil(std::ldexp(1.0f, e))) == std::ldexp(1.0f, e));
  CHECK(ue8m0_ceil(std::nanf("")).bits == 0xFF);
  CHECK(ue8m0_ceil(std::ldexp(1.0f, -127)).bits == 0);    // 2^-127 is code 0
  CHECK(ue8m0_ceil(std::ldexp(1.0f, -140)).bits == 0);    // clamped to the smallest
  CHECK(ue8m0_ceil(std::ldexp(1.5f, -127)).bits == 1);    // just above 2^-127
  CHECK(ue8m0_ceil(std::numeric_limits<float>::infinity()).bits == 254);  // clamped below the NaN code
}

TEST_CASE("bf16 and fp16: round-to-nearest-even against std::ldexp-built neighbours") {
  // bf16: 8 significant bits. Around 1.0 the step is 2^-7.
  CHECK(round_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 1.0f);                                  // tie -> even (1.0)
  CHECK(round_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 1.0f + 2 * std::ldexp(1.0f, -7));  // tie -> even
  CHECK(round_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)) == 1.0f + std::ldexp(1.0f, -7));
  CHECK(std::isnan(round_to_bf16(std::nanf(""))));
  CHECK(std::isinf(round_to_bf16(std::numeric_limits<float>::max())));  // rounds up past the largest bf16
  for (int e = -133; e < 127; e += 7)
    for (int m = 0; m < 128; m += 5) {
      float v = std::ldexp(1.0f + m / 128.0f, e);
      if (e < -126) v = std::ldexp(float(m), e);  // subnormal bf16 values are exact too
      CHECK(round_to_bf16(v) == v);
      CHECK(to_float(bf16_from_float(-v)) == -v);
    }
  // fp16: 11 significant bits, max 65504, subnormal step 2^-24.
  for (int b = 0; b < 0x7C00; b += 37) {
    int e = b >> 10, m = b & 0x3FF;
    float want = e == 0 ? std::ldexp(float(m), -24) : std::ldexp(1.0f + m / 1024.0f, e - 15);
    CHECK(to_float(Half{std::uint16_t(b)}) == want);
    CHECK(half_from_float(want).bits == b);
  }
  CHECK(half_from_float(1.0f + std::ldexp(1.0f, -11)).bits == 0x3C00);               // tie -> even
  CHECK(half_from_float(1.0f + 3 * std::ldexp(1.0f, -11)).bits == 0x3C02);           // tie -> even
  CHECK(half_from_float(std::ldexp(1.0f, -25)).bits == 0x0000);                      // half the smallest: tie to 0
  CHECK(half_from_float(std::ldexp(3.0f, -25)).bits == 0x0002);                      // 1.5 ulp: tie to even
  CHECK(half_from_float(65504.0f).bits == 0x7BFF);
  CHECK(half_from_float(65519.0f).bits == 0x7BFF);                                   // below the midpoint
  CHECK(half_from_float(65520.0f).bits == 0x7C00);                                   // the midpoint: inf
  CHECK(std::isnan(to_float(half_from_float(std::nanf("")))));
  CHECK(to_float(Half{0xFC00}) == -std::numeric_limits<float>::infinity());
}

TEST_CASE("safetensors dtype names round-trip with their sizes") {
  struct Row { char const* name; std::size_t size; };
  Row const rows[] = {{"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2},
                      {"F16", 2}, {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4}, {"I64", 8}, {"U64", 8}, {"F64", 8}};
  for (auto const& r : rows) {
    DType d{};
    REQUIRE(parse_dtype(r.name, d));
    CHECK(dtype_name(d) == r.name);
    CHECK(dtype_size(d) == r.size);
  }
  DType d{};
  CHECK_FALSE(parse_dtype("F4", d));
  CHECK_FALSE(parse_dtype("bf16", d));
}
