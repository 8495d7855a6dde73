#pragma once
// Number formats of the checkpoints and kernels, usable on host and device:
// bf16, fp16, E4M3 (fn: no inf, 0x7F/0xFF NaN, max 448), E2M1 (FP4, max 6), UE8M0 (2^(s-127), 0xFF NaN).
// Conversions into a narrow format round to nearest, ties to even.
#include <cstdint>
#include <cstring>
#include <string_view>

#include "ling/core/config.hpp"

namespace ling {

LING_HOST_DEVICE LING_FORCEINLINE float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
LING_HOST_DEVICE LING_FORCEINLINE std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
LING_HOST_DEVICE LING_FORCEINLINE bool is_nan(float f) { return (float_to_bits(f) & 0x7FFFFFFFu) > 0x7F800000u; }

// ---- bfloat16 --------------------------------------------------------------------------------
struct Bfloat16 {
  std::uint16_t bits = 0;
};
LING_HOST_DEVICE LING_FORCEINLINE float to_float(Bfloat16 x) { return bits_to_float(std::uint32_t(x.bits) << 16); }
LING_HOST_DEVICE LING_FORCEINLINE Bfloat16 bf16_from_float(float f) {
  std::uint32_t u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return Bfloat16{std::uint16_t((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);                                                              // RNE
  return Bfloat16{std::uint16_t(u >> 16)};
}
LING_HOST_DEVICE LING_FORCEINLINE float round_to_bf16(float f) { return to_float(bf16_from_float(f)); }

// ---- IEEE half ---------------------------------------------------------------------------------
struct Half {
  std::uint16_t bits = 0;
};
LING_HOST_DEVICE LING_FORCEINLINE float to_float(Half x) {
  std::uint32_t sign = std::uint32_t(x.bits & 0x8000u) << 16;
  std::uint32_t exp = (x.bits >> 10) & 0x1Fu, man = x.bits & 0x3FFu;
  if (exp == 0x1F) return bits_to_float(sign | 0x7F800000u | (man << 13));
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    float v = float(man) * bits_to_float(0x33800000u);
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}
LING_HOST_DEVICE LING_FORCEINLINE Half half_from_float(float f) {
  std::uint32_t u = float_to_bits(f);
  std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return Half{std::uint16_t(sign | 0x7E00u)};
  if (a >= 0x477FF000u) return Half{std::uint16_t(sign | 0x7C00u)};  // rounds past 65504: inf
  if (a < 0x38800000u) {                                               // below 2^-14: subnormal (or 0)
    // value / 2^-24, rounded to nearest even, is the mantissa
    float v = bits_to_float(a) * 16777216.0f;  // exact: scaling by a power of two
    std::uint32_t m = std::uint32_t(v);
    float rem = v - float(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return Half{std::uint16_t(sign | m)};
  }
  std::uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
  return Half{std::uint16_t(sign | (((r >> 23) - 112u) << 10) | ((r >> 13) & 0x3FFu))};
}

// ---- E4M3 (fn) -----------------------------------------------------------------------------------
struct E4m3 {
  std::uint8_t bits = 0;
};
inline constexpr float kE4m3Max = 448.0f;
LING_HOST_DEVICE LING_FORCEINLINE float to_float(E4m3 x) {
  std::uint32_t sign = std::uint32_t(x.bits & 0x80u) << 24;
  std::uint32_t exp = (x.bits >> 3) & 0xFu, man = x.bits & 0x7u;
  if (exp == 0xF && man == 0x7) return bits_to_float(0x7FC00000u | sign);
  if (exp == 0) {  // subnormal: man * 2^-9
    float v = float(man) * 0.001953125f;
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 120u) << 23) | (man << 20));
}
// Saturating conversion (as quantizers and cvt.rn.satfinite do): |x| > 448 becomes ±448, NaN stays NaN.
LING_HOST_DEVICE LING_FORCEINLINE E4m3 e4m3_from_float(float f) {
  std::uint32_t u = float_to_bits(f);
  std::uint8_t sign = std::uint8_t((u >> 24) & 0x80u);
  std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return E4m3{std::uint8_t(sign | 0x7Fu)};
  if (a >= 0x43E00000u) return E4m3{std::uint8_t(sign | 0x7Eu)};  // >= 448: saturate
  if (a < 0x3C800000u) {                                            // below 2^-6: subnormal, step 2^-9
    float v = bits_to_float(a) * 512.0f;
    std::uint32_t m = std::uint32_t(v);
    float rem = v - float(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return E4m3{std::uint8_t(sign | m)};  // m == 8 carries into the smallest normal (0x08): correct
  }
  std::uint32_t r = a + 0x7FFFFu + ((a >> 20) & 1u);
  std::uint32_t code = (((r >> 23) - 120u) << 3) | ((r >> 20) & 0x7u);
  if (code > 0x7Eu) code = 0x7Eu;  // 448 < x < 464 rounds down to 448 anyway; guard the NaN code
  return E4m3{std::uint8_t(sign | code)};
}

// ---- E2M1 (FP4) -----------------------------------------------------------------------------------
// A 4-bit code: bit 3 sign, codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6.
LING_HOST_DEVICE LING_FORCEINLINE float e2m1_to_float(std::uint8_t code) {
  std::uint32_t c = code & 0x7u;
  float mag = c < 2 ? 0.5f * float(c) : bits_to_float(((c >> 1) + 126u) << 23 | ((c & 1u) << 22));
  return (code & 0x8u) ? -mag : mag;
}
// Round to nearest, ties to the even code; saturates at ±6; NaN maps to +0 (E2M1 has no NaN).
LING_HOST_DEVICE LING_FORCEINLINE std::uint8_t e2m1_from_float(float f) {
  std::uint8_t sign = (float_to_bits(f) >> 28) & 0x8u;
  float a = f < 0 ? -f : f;
  if (is_nan(f)) return 0;
  std::uint8_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return std::uint8_t(sign | c);
}

// ---- UE8M0 (power-of-two scale) --------------------------------------------------------------------
struct Ue8m0 {
  std::uint8_t bits = 127;
};
LING_HOST_DEVICE LING_FORCEINLINE float to_float(Ue8m0 s) {
  if (s.bits == 0xFF) return bits_to_float(0x7FC00000u);
  if (s.bits == 0) return bits_to_float(0x00400000u);  // 2^-127 is a float subnormal
  return bits_to_float(std::uint32_t(s.bits) << 23);
}
// The smallest power of two >= x (x > 0, finite), as UE8M0; clamps to the format's range.
LING_HOST_DEVICE LING_FORCEINLINE Ue8m0 ue8m0_ceil(float x) {
  if (is_nan(x)) return Ue8m0{0xFF};  // before the sign test, which NaN would fail
  if (!(x > 0.0f)) return Ue8m0{0};
  std::uint32_t u = float_to_bits(x);
  int e = int(u >> 23);  // biased exponent of a normal float
  if (e == 0) return Ue8m0{std::uint8_t(u <= 0x00400000u ? 0 : 1)};  // subnormal: 2^-127 (code 0) or 2^-126
  if ((u & 0x7FFFFFu) != 0) ++e;
  if (e > 254) e = 254;
  return Ue8m0{std::uint8_t(e)};
}

// ---- storage dtypes of a checkpoint ------------------------------------------------------------
enum class DType : std::uint8_t { kBool, kU8, kI8, kF8E4M3, kF8E5M2, kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kI64, kU64, kF64 };

constexpr std::size_t dtype_size(DType d) noexcept {
  switch (d) {
    case DType::kBool: case DType::kU8: case DType::kI8: case DType::kF8E4M3: case DType::kF8E5M2: return 1;
    case DType::kI16: case DType::kU16: case DType::kF16: case DType::kBF16: return 2;
    case DType::kI32: case DType::kU32: case DType::kF32: return 4;
    case DType::kI64: case DType::kU64: case DType::kF64: return 8;
  }
  return 0;
}
constexpr std::string_view dtype_name(DType d) noexcept {
  switch (d) {
    case DType::kBool: return "BOOL"; case DType::kU8: return "U8"; case DType::kI8: return "I8";
    case DType::kF8E4M3: return "F8_E4M3"; case DType::kF8E5M2: return "F8_E5M2"; case DType::kI16: return "I16";
    case DType::kU16: return "U16"; case DType::kF16: return "F16"; case DType::kBF16: return "BF16";
    case DType::kI32: return "I32"; case DType::kU32: return "U32"; case DType::kF32: return "F32";
    case DType::kI64: return "I64"; case DType::kU64: return "U64"; case DType::kF64: return "F64";
  }
  return "?";
}
// Parses a safetensors dtype string; returns false for one this library does not know.
constexpr bool parse_dtype(std::string_view s, DType& out) noexcept {
  constexpr DType all[] = {DType::kBool, DType::kU8, DType::kI8, DType::kF8E4M3, DType::kF8E5M2,
                           DType::kI16, DType::kU16, DType::kF16, DType::kBF16, DType::kI32,
                           DType::kU32, DType::kF32, DType::kI64, DType::kU64, DType::kF64};
  for (DType d : all)
    if (dtype_name(d) == s) { out = d; return true; }
  return false;
}

}  // namespace ling
