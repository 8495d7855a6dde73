#pragma once
// The policies the library ships, and the list a model accepts by default.
#include "ling/quant/bf16.hpp"
#include "ling/quant/fp8_block.hpp"
#include "ling/quant/fp8_row.hpp"
#include "ling/quant/mxfp4.hpp"

namespace ling::quant {
using DefaultPolicies = PolicyList<Bf16, F16, F32, Fp8Block, Mxfp4, Fp8Row>;
}  // namespace ling::quant
