#pragma once
// Device-side weight descriptions of the CUDA model (plain C++: no kernels here).
// A ModelMatrix is one matrix [rows, cols] (PyTorch's [out, in]) in device memory, in one of the storage formats
// of spec §3 (the same bytes as the checkpoint: no repack), plus the online FP8-row LM head.
#include <cstdint>
#include <string>
#include <string_view>

#include "ling/core/config.hpp"
#include "ling/quant/policies.hpp"

namespace ling::cuda {

enum class MatFormat : int { kF32 = 0, kBf16, kFp8Block, kFp8Row, kMxfp4 };

inline std::string_view to_string(MatFormat f) {
  switch (f) {
    case MatFormat::kF32: return "f32";
    case MatFormat::kBf16: return "bf16";
    case MatFormat::kFp8Block: return "fp8-block";
    case MatFormat::kFp8Row: return "fp8-row";
    case MatFormat::kMxfp4: return "mxfp4";
  }
  return "?";
}

// Bytes of storage + scales of one matrix in a format.
inline std::int64_t matrix_bytes(MatFormat f, std::int64_t rows, std::int64_t cols) {
  switch (f) {
    case MatFormat::kF32: return quant::storage_bytes<quant::F32>(rows, cols);
    case MatFormat::kBf16: return quant::storage_bytes<quant::Bf16>(rows, cols);
    case MatFormat::kFp8Block: return quant::storage_bytes<quant::Fp8Block>(rows, cols);
    case MatFormat::kFp8Row: return quant::storage_bytes<quant::Fp8Row>(rows, cols);
    case MatFormat::kMxfp4: return quant::storage_bytes<quant::Mxfp4>(rows, cols);
  }
  return 0;
}
LING_HOST_DEVICE constexpr std::int64_t matrix_storage_bytes(MatFormat f, std::int64_t rows, std::int64_t cols) {
  switch (f) {
    case MatFormat::kF32: return rows * cols * 4;
    case MatFormat::kBf16: return rows * cols * 2;
    case MatFormat::kFp8Block:
    case MatFormat::kFp8Row: return rows * cols;
    case MatFormat::kMxfp4: return rows * (cols / 2);
  }
  return 0;
}
inline std::int64_t matrix_scale_bytes(MatFormat f, std::int64_t rows, std::int64_t cols) {
  return matrix_bytes(f, rows, cols) - matrix_storage_bytes(f, rows, cols);
}

// A non-owning device view. `data` and `scales` point into an arena the model owns.
struct ModelMatrix {
  MatFormat format = MatFormat::kBf16;
  void const* data = nullptr;
  void const* scales = nullptr;
  std::int64_t rows = 0, cols = 0;
  std::int64_t bytes() const { return rows ? matrix_bytes(format, rows, cols) : 0; }
};

}  // namespace ling::cuda
