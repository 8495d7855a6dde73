#pragma once
// Matrix-vector products on the GPU for batch-1 decode (spec §3 storage formats, §4 bytes per token).
// Host side only (compiles with g++): the device copy of a weight matrix in the kernels' layout (DeviceMatrix),
// the repack that produces it, and the launcher declarations. The kernels are in linear.cuh; a .cu file that calls
// a launcher includes linear.cuh (or explicitly instantiates it) once.
//
// Layouts. A policy with a fast kernel (DeviceLayout<P>::kFast) is stored row-major with each row padded to a
// multiple of 16 bytes (the padding decodes to 0), so every lane issues 16-byte loads whatever `cols` is; scales
// keep the policy's own layout. Any other policy keeps its own storage untouched and runs the generic kernel, which
// only calls P::decode (STYLE.md: a new policy works with no new kernel).
// Batches: one DeviceMatrix may hold `count` matrices of one shape (the routed experts of a layer), expert e at
// data + e * data_stride, so kernels index it by expert id.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ling/core/error.hpp"
#include "ling/cuda/runtime.hpp"
#include "ling/quant/concept.hpp"
#include "ling/quant/policies.hpp"

namespace ling::cuda {

// ---- device layout of a policy ----------------------------------------------------------------------
template <class P>
struct DeviceLayout {
  static constexpr bool kFast = false;  // generic: the policy's own storage, decoded element by element
  static constexpr std::int64_t ld(std::int64_t cols) { return cols; }
};

namespace detail {
// Elements per row after padding the row to a multiple of 16 bytes.
template <class T>
constexpr std::int64_t padded_ld(std::int64_t cols) {
  constexpr std::int64_t per16 = 16 / std::int64_t(sizeof(T));
  return (cols + per16 - 1) / per16 * per16;
}
template <class P>
struct PaddedRows {
  static constexpr bool kFast = true;
  static constexpr std::int64_t ld(std::int64_t cols) { return padded_ld<typename P::storage_type>(cols); }
};
}  // namespace detail

template <> struct DeviceLayout<quant::Bf16> : detail::PaddedRows<quant::Bf16> {};
template <> struct DeviceLayout<quant::F16> : detail::PaddedRows<quant::F16> {};
template <> struct DeviceLayout<quant::F32> : detail::PaddedRows<quant::F32> {};
template <> struct DeviceLayout<quant::Fp8Block> : detail::PaddedRows<quant::Fp8Block> {};
template <> struct DeviceLayout<quant::Fp8Row> : detail::PaddedRows<quant::Fp8Row> {};
// MXFP4: cols is a multiple of 32 by the format, so a row (cols/2 bytes) is already a whole number of 16-byte
// chunks, one scale block each; scales stay [rows, cols/32].
template <> struct DeviceLayout<quant::Mxfp4> {
  static constexpr bool kFast = true;
  static constexpr std::int64_t kColsMultiple = 32;
  static constexpr std::int64_t ld(std::int64_t cols) { return cols / 2; }  // bytes (= storage elements) per row
};

template <class P>
inline constexpr bool has_fast_kernel = DeviceLayout<P>::kFast;

// A layout may permute the bytes of each row (pack_row/unpack_row, inverse of each other; same row length).
template <class L>
concept row_permuting_layout = requires(std::uint8_t const* src, std::uint8_t* dst, std::int64_t n) {
  L::pack_row(src, dst, n);
  L::unpack_row(src, dst, n);
};

// Storage elements of one matrix in the device layout, and its scale count (policy layout).
template <quant::weight_policy P>
constexpr std::int64_t device_storage_count(std::int64_t rows, std::int64_t cols) {
  if constexpr (has_fast_kernel<P>) return rows * DeviceLayout<P>::ld(cols);
  else return P::storage_count(rows, cols);
}
template <quant::weight_policy P>
constexpr std::int64_t device_scale_count(std::int64_t rows, std::int64_t cols) {
  if constexpr (std::is_same_v<typename P::scale_type, quant::NoScale>) return 0;
  else return P::scale_count(rows, cols);
}

// A repacked host matrix: storage in the device layout, scales as the policy stores them.
template <quant::weight_policy P>
struct PackedMatrix {
  std::vector<typename P::storage_type> data;
  std::vector<std::uint8_t> scales;  // raw bytes of scale_type
  std::int64_t rows = 0, cols = 0, ld = 0;
};

// Repack (DESIGN.md decision 3): pad each row to 16 bytes for the fast kernels; identity for the generic layout.
template <quant::weight_policy P>
PackedMatrix<P> repack(quant::MatrixView<P> const& m) {
  using S = typename P::storage_type;
  PackedMatrix<P> out;
  out.rows = m.rows;
  out.cols = m.cols;
  std::int64_t const nsc = device_scale_count<P>(m.rows, m.cols);
  if constexpr (has_fast_kernel<P>) {
    out.ld = DeviceLayout<P>::ld(m.cols);
    std::int64_t const src_ld = P::storage_count(1, m.cols);  // storage elements per source row
    out.data.assign(std::size_t(m.rows * out.ld), S{});
    for (std::int64_t r = 0; r < m.rows; ++r) {
      if constexpr (row_permuting_layout<DeviceLayout<P>>)
        DeviceLayout<P>::pack_row(reinterpret_cast<std::uint8_t const*>(m.data + r * src_ld),
                                  reinterpret_cast<std::uint8_t*>(out.data.data() + r * out.ld), src_ld * std::int64_t(sizeof(S)));
      else
        std::memcpy(out.data.data() + r * out.ld, m.data + r * src_ld, std::size_t(src_ld) * sizeof(S));
    }
  } else {
    out.ld = m.cols;
    std::int64_t n = P::storage_count(m.rows, m.cols);
    out.data.assign(m.data, m.data + n);
  }
  if (nsc > 0) {
    auto const* b = reinterpret_cast<std::uint8_t const*>(m.scales);
    out.scales.assign(b, b + nsc * std::int64_t(sizeof(typename P::scale_type)));
  }
  return out;
}

// The inverse of repack (the round-trip test): storage in the policy's own layout.
template <quant::weight_policy P>
std::vector<typename P::storage_type> unpack(PackedMatrix<P> const& p) {
  using S = typename P::storage_type;
  std::vector<S> out(std::size_t(P::storage_count(p.rows, p.cols)));
  if constexpr (has_fast_kernel<P>) {
    std::int64_t const src_ld = P::storage_count(1, p.cols);
    for (std::int64_t r = 0; r < p.rows; ++r) {
      if constexpr (row_permuting_layout<DeviceLayout<P>>)
        DeviceLayout<P>::unpack_row(reinterpret_cast<std::uint8_t const*>(p.data.data() + r * p.ld),
                                    reinterpret_cast<std::uint8_t*>(out.data() + r * src_ld), src_ld * std::int64_t(sizeof(S)));
      else
        std::memcpy(out.data() + r * src_ld, p.data.data() + r * p.ld, std::size_t(src_ld) * sizeof(S));
    }
  } else {
    out.assign(p.data.begin(), p.data.end());
  }
  return out;
}

// What a kernel receives for one (batch of) matrix: plain data, passed by value.
struct MatrixArgs {
  void const* data = nullptr;    // storage, device layout
  void const* scales = nullptr;  // scale_type array (policy layout), or null
  std::int64_t rows = 0, cols = 0;
  std::int64_t ld = 0;               // storage elements per row (device layout)
  std::int64_t data_stride = 0;      // bytes between the matrices of a batch
  std::int64_t scale_stride = 0;     // bytes between their scale arrays
  std::int32_t count = 1;            // matrices in the batch
};

// The device copy of a matrix (or a batch of equally shaped ones) in policy P.
template <quant::weight_policy P>
class DeviceMatrix {
 public:
  using policy = P;
  using storage_type = typename P::storage_type;
  using scale_type = typename P::scale_type;

  DeviceMatrix() = default;

  // Uninitialised storage for `count` matrices [rows, cols] (filled on the GPU, e.g. by quantize_fp8_rows).
  static DeviceMatrix allocate(std::int64_t rows, std::int64_t cols, std::int32_t count = 1) {
    require(rows > 0 && cols > 0 && count > 0, ErrorCode::kShape, "DeviceMatrix: empty shape");
    if constexpr (std::is_base_of_v<quant::Mxfp4, P>)
      require(cols % DeviceLayout<P>::kColsMultiple == 0, ErrorCode::kShape,
              "DeviceMatrix<mxfp4>: cols must be a multiple of " + std::to_string(DeviceLayout<P>::kColsMultiple));
    DeviceMatrix m;
    m.rows_ = rows;
    m.cols_ = cols;
    m.count_ = count;
    m.ld_ = has_fast_kernel<P> ? DeviceLayout<P>::ld(cols) : cols;
    m.data_stride_ = round_up(device_storage_count<P>(rows, cols) * std::int64_t(sizeof(storage_type)));
    std::int64_t sc = device_scale_count<P>(rows, cols);
    m.scale_stride_ = sc > 0 ? round_up(sc * std::int64_t(sizeof(scale_type))) : 0;
    m.data_ = DeviceBuffer(std::size_t(m.data_stride_ * count), std::string("DeviceMatrix<") + std::string(P::name) + ">");
    if (m.scale_stride_ > 0) m.scales_ = DeviceBuffer(std::size_t(m.scale_stride_ * count), "DeviceMatrix scales");
    return m;
  }
  // Repacks and uploads one host matrix.
  static DeviceMatrix upload(quant::MatrixView<P> const& host) {
    quant::MatrixView<P> one[1] = {host};
    return upload_batch(std::span<quant::MatrixView<P> const>(one, 1));
  }
  // From raw host bytes in the checkpoint's layout (spec §3): storage then scales (null when the policy has none).
  static DeviceMatrix upload_raw(void const* storage, void const* scales, std::int64_t rows, std::int64_t cols) {
    quant::MatrixView<P> v{static_cast<storage_type const*>(storage), static_cast<scale_type const*>(scales), rows, cols};
    return upload(v);
  }
  // Several equally shaped matrices (a layer's routed experts) into one allocation, expert e at index e.
  static DeviceMatrix upload_batch(std::span<quant::MatrixView<P> const> mats) {
    require(!mats.empty(), ErrorCode::kShape, "DeviceMatrix::upload_batch: no matrices");
    DeviceMatrix m = allocate(mats[0].rows, mats[0].cols, std::int32_t(mats.size()));
    for (std::size_t e = 0; e < mats.size(); ++e) {
      require(mats[e].rows == m.rows_ && mats[e].cols == m.cols_, ErrorCode::kShape,
              "DeviceMatrix::upload_batch: matrix " + std::to_string(e) + " has a different shape");
      PackedMatrix<P> p = repack(mats[e]);
      m.data_.upload(p.data.data(), p.data.size() * sizeof(storage_type), std::size_t(m.data_stride_) * e);
      if (!p.scales.empty()) m.scales_.upload(p.scales.data(), p.scales.size(), std::size_t(m.scale_stride_) * e);
    }
    return m;
  }

  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  std::int64_t ld() const { return ld_; }
  std::int32_t count() const { return count_; }
  bool empty() const { return rows_ == 0; }
  template <class T = void>
  T* data() const { return data_.template data<T>(); }
  template <class T = void>
  T* scales() const { return scales_.template data<T>(); }
  // Bytes one matvec over one matrix of the batch reads (storage incl. padding, plus scales).
  std::int64_t bytes_per_matrix() const {
    return device_storage_count<P>(rows_, cols_) * std::int64_t(sizeof(storage_type)) +
           device_scale_count<P>(rows_, cols_) * std::int64_t(sizeof(scale_type));
  }
  MatrixArgs args() const {
    return MatrixArgs{data_.data(), scales_.data(), rows_, cols_, ld_, data_stride_, scale_stride_, count_};
  }
  // Host copy of matrix e in the policy's own layout (tests: round trip through the device).
  quant::MatrixView<P> download(std::int32_t e, std::vector<storage_type>& storage, std::vector<scale_type>& scales) const {
    PackedMatrix<P> p;
    p.rows = rows_;
    p.cols = cols_;
    p.ld = ld_;
    p.data.resize(std::size_t(device_storage_count<P>(rows_, cols_)));
    data_.download(p.data.data(), p.data.size() * sizeof(storage_type), std::size_t(data_stride_) * e);
    storage = unpack(p);
    std::int64_t sc = device_scale_count<P>(rows_, cols_);
    scales.resize(std::size_t(sc));
    if (sc > 0) scales_.download(scales.data(), std::size_t(sc) * sizeof(scale_type), std::size_t(scale_stride_) * e);
    return quant::MatrixView<P>{storage.data(), sc > 0 ? scales.data() : nullptr, rows_, cols_};
  }

 private:
  static std::int64_t round_up(std::int64_t b) { return (b + 255) / 256 * 256; }
  DeviceBuffer data_, scales_;
  std::int64_t rows_ = 0, cols_ = 0, ld_ = 0, data_stride_ = 0, scale_stride_ = 0;
  std::int32_t count_ = 1;
};

// ---- launchers (defined in linear.cuh) ----------------------------------------------------------------
// Optional epilogue: y = W x + residual (residual may alias y: y += W x).
struct MatvecEpilogue {
  float const* residual = nullptr;
};

inline constexpr int kMaxMultiMatrices = 8;

// A prologue fused into the staging of a kernel's input vector (spec §2 norms), so that no separate launch writes the
// normalized vector: plain; RMSNorm with a weight (x · rsqrt(mean x² + eps) · w); or KDA's per-head gated RMSNorm
// (RMSNorm over each `head` elements with weight w[head], times sigmoid(gate) element-wise); or kHeadScale, the same
// norm's last factor when the producer already applied the element-wise ones (x = o · w · sigmoid(gate): the KDA step's
// KdaStepArgs::out_gate): each head times rsqrt(Σ o² / head + eps), Σ o² from head_ss (required).
enum class PrologueKind : int { kPlain = 0, kRmsNorm, kGatedHeadNorm, kHeadScale };
struct InputPrologue {
  PrologueKind kind = PrologueKind::kPlain;
  float const* norm_w = nullptr;  // kRmsNorm: [cols]; kGatedHeadNorm: [head]
  float const* gate = nullptr;    // kGatedHeadNorm: [cols]
  int head = 0;                   // kGatedHeadNorm, kHeadScale: elements per head (divides cols)
  float eps = 1e-6f;
  // kGatedHeadNorm, optional: each head's Σ x² in ss_parts partials (head_ss[h · ss_parts + s], written by the launch
  // that produced x: the KDA step's KdaStepArgs::o_ss). With them the fused staging needs no reduction of its own.
  // kHeadScale, required: the partials of the head's values before the element-wise factors (Σ o²).
  float const* head_ss = nullptr;
  int ss_parts = 0;
  // kFusedWeights: aligned inputs load the norm weights (and the gate) with x, one round trip (linear.cuh
  // stage_input); kPrefetchWeights: the launch asks the L2 for the norm weights before its PDL wait. Both by default;
  // the model's LING_PROLOGUE=<bits> sets them for A/B measurements.
  static constexpr int kFusedWeights = 1, kPrefetchWeights = 2;
  int flags = kFusedWeights | kPrefetchWeights;
};

// y[rows] = W x, x fp32 [cols], fp32 accumulation. Returns cudaErrorInvalidValue for an empty matrix; graph-safe
// (no allocation, no host synchronisation).
template <quant::weight_policy P>
cudaError_t launch_matvec(DeviceMatrix<P> const& w, float const* x, float* y, cudaStream_t stream,
                          MatvecEpilogue epilogue = {});

// Several matrices that share the input x (KDA q,k,v,f,g,b; MLA q, kv_a, g) in one launch: outputs concatenated
// in order, y[sum of rows]. All have the same cols; at most kMaxMultiMatrices.
template <quant::weight_policy P>
cudaError_t launch_matvec_multi(std::span<DeviceMatrix<P> const* const> ws, float const* x, float* y,
                                cudaStream_t stream);

// The same with a dynamic tail (block FP8 on matvec_lane_kernel; other policies and kernels ignore it): the last
// tail_percent% of the tasks (at most 1024 groups of a block's warps) go to blocks by tickets from *counter in the
// order the blocks get there, instead of by the static stride. *counter must be 0 before the launch and is 0 after it;
// launches in one stream may share it. The outputs are the same bits as without the tail.
template <quant::weight_policy P>
cudaError_t launch_matvec_multi_tail(std::span<DeviceMatrix<P> const* const> ws, float const* x, float* y,
                                     cudaStream_t stream, unsigned* counter, int tail_percent);

// The same with each block's slice of rows copied into shared memory before the PDL wait (fast layouts; every matrix
// of one row length; at most ~112 KB of rows per SM): cudaErrorInvalidValue when the rows do not fit. linear.cuh
// explains why; not yet measured.
template <quant::weight_policy P>
cudaError_t launch_matvec_multi_preload(std::span<DeviceMatrix<P> const* const> ws, float const* x, float* y,
                                        cudaStream_t stream);

// `tokens` input rows at once (a speculative verification step): x [tokens][cols], y [tokens][Σ rows] (each token's
// outputs concatenated as launch_matvec_multi's), residual (may alias y) in y's layout, pro's gate [tokens][cols] and
// head_ss [tokens][heads · ss_parts]. Token k's outputs are the bits of the same launch with tokens = 1 on its input.
// Block and row FP8 at two tokens read each weight row once (matvec_lane_kernel); other policies and token counts run
// one launch per token. The argmax epilogue is not offered here.
template <quant::weight_policy P>
cudaError_t launch_matvec_multi_tokens(std::span<DeviceMatrix<P> const* const> ws, float const* x, int tokens, float* y,
                                       cudaStream_t stream, InputPrologue const& pro = {},
                                       float const* residual = nullptr);
// Launches of the preloaded matvec that the CUDA model made in this process (its LING_MATVEC_PRELOAD=1 path): the
// tests check that it ran, since the model streams a matrix whose rows do not fit instead.
inline std::atomic<int>& matvec_preload_launches() {
  static std::atomic<int> n{0};
  return n;
}

// The same (FP8-block only, cols a whole number of 128-column blocks) on FP8 wgmma, the weights streamed by tensor-map
// copies (matvec_wg.cuh), with an input prologue and a residual (added at the outputs' offsets, may alias y).
// cudaErrorInvalidValue where it does not apply. rows_per_unit 32 or 64 forces the kernel's unit of rows; 0 chooses.
template <quant::weight_policy P>
cudaError_t launch_matvec_multi_wg(std::span<DeviceMatrix<P> const* const> ws, float const* x, float* y,
                                   cudaStream_t stream, InputPrologue const& pro = {}, float const* residual = nullptr,
                                   int rows_per_unit = 0);

}  // namespace ling::cuda
