#pragma once
// Operand layouts of the f16 tensor-core MXFP4 path (mma.sync.m16n8k16, f16 A and B, fp32 accumulate), host and
// device. The kernels (moe.cuh, Mxfp4QuadMma) and a CPU test that rebuilds the MMA from PTX's fragment definitions use
// these same functions, so the index algebra is tested without a GPU.
//
// Weights: the Mxfp4Quad row layout (moe.hpp): in each 64-byte group of a row (4 scale blocks), lane quad position
// t = lane % 4 loads 16 bytes = word t of the 4 blocks, i.e. elements 8t..8t+7 of each block (code i of a word in
// bits 4i..4i+3). A tile is 16 rows: lane group g = lane / 4 holds rows g and g + 8.
// Per block two MMAs (h = 0, 1), each k = 16: A = {P(2h, row g), P(2h, row g+8), P(2h+1, row g), P(2h+1, row g+8)},
// where P(j, w) is the half2 of codes j and j + 4 of word w. MMA h's k index then maps to block elements
//   k = 2t -> 8t+2h,  2t+1 -> 8t+2h+4,  2t+8 -> 8t+2h+1,  2t+9 -> 8t+2h+5,
// and the input vector is staged in that order (staged_half), as f16 limbs in B's columns: column 0 = hi, column 1 =
// lo (x / sx = hi + lo, ~22 significant bits; sx a power of two per 32-element block). D's column 0 + column 1 in the
// lanes with t = 0 (c0 + c1: row g, c2 + c3: row g + 8) is the block's dot product, times 2^14 * sx * block scale.
#include <cstdint>

#include "ling/core/config.hpp"

namespace ling::cuda::mma16 {

// f16 bits of E2M1 codes j and j + 4 (j < 4) of word w as a half2 (low half = code j): value * 2^-14 exactly (code 1,
// 0.5, becomes the f16 subnormal 2^-15). Magnitude bits 0..2 of a code go to f16 bits 9..11, its sign to bit 15.
LING_HOST_DEVICE constexpr std::uint32_t e2m1_pair(std::uint32_t w, int j) {
  std::uint32_t const mag = j == 0 ? w << 9 : j == 1 ? w << 5 : j == 2 ? w << 1 : w >> 3;
  std::uint32_t const sgn = w << (12 - 4 * j);
  return (mag & 0x0E000E00u) | (sgn & 0x80008000u);
}
inline constexpr float kCodeScale = 16384.0f;  // 2^14: undoes e2m1_pair's offset

// Block element that MMA h's k index (pair = 0..3 for k = 2t, 2t+1, 2t+8, 2t+9) of lane quad position t carries.
LING_HOST_DEVICE constexpr int block_element(int t, int h, int pair) {
  return 8 * t + 2 * h + (pair == 0 ? 0 : pair == 1 ? 4 : pair == 2 ? 1 : 5);
}

// Index (in halves) of block element e of block `block` in one staged limb: [block][h][t][pair]. Lane (g < 2, t)
// reads 8 bytes at staged_half(block, 8t + 2h) / 4 * 4, i.e. its B registers {k = 2t, 2t+1} and {2t+8, 2t+9}.
LING_HOST_DEVICE constexpr int staged_half(int block, int e) {
  int const t = e >> 3, r = e & 7, h = (r >> 1) & 1;
  int const pair = ((r >> 2) & 1) | ((r & 1) << 1);  // r: 0,4,1,5 -> 0,1,2,3 (h = 0); 2,6,3,7 -> 0,1,2,3 (h = 1)
  return ((block * 2 + h) * 4 + t) * 4 + pair;
}
// First half of lane quad position t's 4 halves for MMA h of `block`.
LING_HOST_DEVICE constexpr int staged_quad(int block, int h, int t) { return ((block * 2 + h) * 4 + t) * 4; }

// The power of two sx for a block whose largest |x| is amax: amax / sx lies in [2^14, 2^15) (inside f16's range with
// the most bits kept); 1 for an all-zero block. Returned as its exponent (sx = 2^e), clamped to fp32's normal range.
LING_HOST_DEVICE constexpr int limb_exponent(std::uint32_t amax_bits) {
  int const e = int((amax_bits >> 23) & 0xFFu);  // biased exponent of amax (0: zero or subnormal)
  if (e == 0) return (amax_bits & 0x7FFFFFFFu) == 0 ? 0 : -126;
  int const x = e - 127 - 14;
  return x < -126 ? -126 : x;
}

}  // namespace ling::cuda::mma16
