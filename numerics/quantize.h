// numerics/quantize.h — FP8 (E4M3) quantization in the layouts cuBLASLt's block-scaled GEMMs read.
//
// Three granularities, each with one fp32 scale per group (x ≈ e4m3(x / scale) · scale):
//
//   Fp8Rows    1×128 groups along the contiguous dimension (activations, output gradients).
//              data   e4m3 [rows, Cp]   Cp = round_up(cols, 128); columns c >= cols: padding
//              scales f32  [Cp/128, rows]        scale of (row r, group g) at g * rows + r
//              — cuBLASLt VEC128_32F: the scale of group g for every row is contiguous.
//
//   columnwise 128×1 groups along the *rows* of x [T, K] (for WGrad, which reduces over T).
//              Stored transposed, as the Fp8Rows of xᵀ [K, T] (Fp8Rows::empty_columnwise):
//              data   e4m3 [K, Tp]      Tp = round_up(T, 128); columns t >= T: padding
//              scales f32  [Tp/128, K]
//
//   Fp8Blocks  128×128 blocks (weights).
//              data   e4m3 [rows, Cp]   Cp = round_up(cols, 128); columns c >= cols: padding
//              scales f32  [ceil(rows/128), round_up(Cp/128, 4)]
//                     scale of block (rb, cb) at rb * round_up(Cp/128, 4) + cb; padding is 0
//              — cuBLASLt BLK128x128_32F.
//   Fp8Weight  W [N, K] and Wᵀ [K, N] as Fp8Blocks of the same block values: FProp reads W,
//              DGrad reads Wᵀ (the FP8 GEMM must be TN, so the transpose is materialized once).
//
// Partial groups. Real models' widths are multiples of 16, not always of 128 (SmolLM2: 576, 960;
// Qwen2.5-0.5B: 896). A group or block cut by the end of a dimension is quantized as if it were
// zero-extended to whole: its scale is the formula below over its valid elements (zeros change no
// amax), its valid elements' bytes are the same as anywhere else. Only the contiguous dimension —
// the one every GEMM reduces over — is stored padded, with those zeros' bytes (0x00; the NaN code
// in a group holding a NaN or an infinity), so that every 128-wide group is whole in memory: the
// 128-group kernels and cuBLASLt's K loop (k = Cp) run unchanged, a zero adds nothing to a dot
// product, and the columnwise copy's token padding is this same rule applied to xᵀ. The other
// dimension is a GEMM's M or N and is not padded (cuBLASLt takes multiples of 4 there, the scale
// tables hold ceil(rows/128) block rows): padding it would cost an output slice. The padding costs
// less than one group a row (576 → 640 bytes).
//
// Scales (ScaleFormat): fp32 `amax / 448`, or pow2: that value rounded up to a power of two
// (representable as e8m0). An all-zero group has scale 1 (its data is ±0). A group holding a NaN or
// an infinity gets a NaN scale and NaN data: non-finite input is never turned into numbers;
// first_nonfinite() reports it. E4M3 rounding is to nearest even, saturating at ±448.
// The CPU reference and the CUDA kernels produce identical bytes and scales, padding included.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace lockstep {

constexpr int kQuantGroup = 128;
// What the quantized widths must be a multiple of: whole 16-byte vectors of bf16 (the CUDA
// kernels' loads) and of e4m3 rows at 16-byte aligned strides (cuBLASLt's operands).
constexpr int kFp8ColsMultiple = 16;

enum class ScaleFormat { fp32, pow2 };

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The stored (padded) width of a contiguous dimension of `cols` values.
inline int64_t padded_cols(int64_t cols) { return round_up(cols, kQuantGroup); }

struct Fp8Rows {
  Tensor data;    // e4m3 [rows, padded_cols(cols)]
  Tensor scales;  // f32 [padded_cols(cols)/128, rows]
  int64_t rows() const { return data.dim(0); }
  int64_t cols() const { return data.dim(1); }  // the stored width, a multiple of 128
  // For x [rows, cols]: data [rows, padded_cols(cols)].
  static Fp8Rows empty(int64_t rows, int64_t cols, Device device);
  // The transposed, padded output of quantize_columns for x [rows, cols].
  static Fp8Rows empty_columnwise(int64_t rows, int64_t cols, Device device);
};

struct Fp8Blocks {
  Tensor data;    // e4m3 [rows, padded_cols(cols)]
  Tensor scales;  // f32 [ceil(rows/128), round_up(padded_cols(cols)/128, 4)]
  int64_t rows() const { return data.dim(0); }
  int64_t cols() const { return data.dim(1); }  // the stored width, a multiple of 128
  static Fp8Blocks empty(int64_t rows, int64_t cols, Device device);
};

struct Fp8Weight {
  Fp8Blocks w;   // [N, K]
  Fp8Blocks wt;  // [K, N]
  static Fp8Weight empty(int64_t n, int64_t k, Device device);
};

// x: bf16 or f32 [rows, cols], cols a multiple of kFp8ColsMultiple (the CUDA kernels take bf16
// activations).
void quantize_rows(Fp8Rows& out, const Tensor& x, ScaleFormat format = ScaleFormat::fp32);
void quantize_columns(Fp8Rows& out_t, const Tensor& x, ScaleFormat format = ScaleFormat::fp32);
// Both of the above from one read of x (the fused producer epilogue of the fp8 recipe).
void quantize_rows_and_columns(Fp8Rows& out, Fp8Rows& out_t, const Tensor& x,
                               ScaleFormat format = ScaleFormat::fp32);
// w: f32 or bf16 [N, K], N and K multiples of kFp8ColsMultiple; writes the blocks of W and of Wᵀ in one pass.
void quantize_weight(Fp8Weight& out, const Tensor& w, ScaleFormat format = ScaleFormat::fp32);
// Writes w.wt (data and scales) from w.w alone: the bytes quantize_weight writes there, padding
// included (a padding column of Wᵀ is a quantized zero of its block's scale). A sharded optimizer
// all-gathers W's blocks only (half the bytes) and remakes Wᵀ on every rank with this.
void transpose_weight_blocks(Fp8Weight& w);
// Throws (naming `what`) unless `out` is an Fp8Weight for W [n, k] on `device`.
void check_fp8_weight(const Fp8Weight& out, const char* what, int64_t n, int64_t k, Device device);

// out: f32 [rows, cols] on the quantized tensor's device, cols the stored width or the unpadded
// one (any cols with padded_cols(cols) == q.cols()); Fp8Rows: f32 or bf16, rounded to nearest even
// from the fp32 product.
void dequantize(Tensor& out, const Fp8Rows& q);
void dequantize(Tensor& out, const Fp8Blocks& q);

// Checks that q is the Fp8Rows of an x [rows, cols] (e4m3 data [rows, padded_cols(cols)], f32
// scales [padded_cols(cols)/128, rows]) on `device`; `what` names it in the error. (A columnwise
// output of x [T, K]: rows K, cols T or Tp.)
void check_fp8_rows(const Fp8Rows& q, const char* what, int64_t rows, int64_t cols, Device device);

// Index of the first non-finite scale, or -1 when all are finite.
int64_t first_nonfinite(const Tensor& scales);

}  // namespace lockstep
