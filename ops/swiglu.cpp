// ops/swiglu.cpp — argument checks and backend dispatch for ops/swiglu.h.
#include "ops/swiglu.h"

#include "numerics/quantize.h"
#include "ops/act_check.h"
#include "ops/swiglu_backends.h"

namespace lockstep {

namespace {

// gate_up [T, 2I] (it sets the device); returns I.
int64_t check_gate_up(const Tensor& gate_up, const char* what) {
  check_act(gate_up, what, gate_up.device(), gate_up.shape());
  LOCKSTEP_CHECK(gate_up.rank() == 2 && gate_up.dim(1) % 2 == 0, what,
                 ": expected a 2-D tensor [T, 2I] (gate columns, then up), got ",
                 gate_up.describe());
  return gate_up.dim(1) / 2;
}

// gate_up: the E4M3 SwiGLU input [T, 2I] (it sets the device); returns I.
int64_t check_fp8_gate_up(const Fp8Rows& gate_up, const char* what) {
  LOCKSTEP_CHECK(gate_up.data.defined() && gate_up.data.rank() == 2 && gate_up.data.dim(1) % kQuantGroup == 0,
                 what, ": expected an Fp8Rows [T, 2I] (2I a multiple of ", kQuantGroup,
                 ": unpadded, so that up's columns start at I), got ",
                 gate_up.data.defined() ? gate_up.data.describe() : "an empty tensor");
  check_fp8_rows(gate_up, what, gate_up.rows(), gate_up.cols(), gate_up.data.device());
  return gate_up.cols() / 2;
}

// Checks the fused forward's outputs for an output [T, I] on `device`; returns whether the columnwise
// copy is wanted.
bool check_fp8_outputs(const Fp8Rows& out_rows, const Fp8Rows& out_cols, int64_t T, int64_t I, Device device) {
  LOCKSTEP_CHECK(I % kFp8ColsMultiple == 0, "swiglu_forward_fp8: gate_up: the output width (", I,
                 ") must be a multiple of ", kFp8ColsMultiple, " for FP8 groups");
  check_fp8_rows(out_rows, "swiglu_forward_fp8: out_rows", T, I, device);
  const bool columns = out_cols.data.defined();
  if (columns) check_fp8_rows(out_cols, "swiglu_forward_fp8: out_cols", I, T, device);
  if (device == Device::cuda) {
    check_cuda_vectors(out_rows.data, "swiglu_forward_fp8: out_rows", /*rows=*/true);
    if (columns) check_cuda_vectors(out_cols.data, "swiglu_forward_fp8: out_cols", /*rows=*/true);
  }
  return columns;
}

// The composition's input: the bf16 [T, 2I] dequantize makes of gate_up (on its device).
Tensor dequantized(const Fp8Rows& gate_up) {
  Tensor x = Tensor::empty(gate_up.data.shape(), DType::bf16, gate_up.data.device());
  dequantize(x, gate_up);
  return x;
}

}  // namespace

void swiglu_forward(Tensor& out, const Tensor& gate_up) {
  const int64_t I = check_gate_up(gate_up, "swiglu_forward: gate_up");
  check_act(out, "swiglu_forward: out", gate_up.device(), {gate_up.dim(0), I});
  if (gate_up.is_cuda()) {
#if LOCKSTEP_HAS_CUDA
    check_cuda_act(gate_up, "swiglu_forward: gate_up");
    check_cuda_act(out, "swiglu_forward: out");
    return cuda::swiglu_forward(out, gate_up);
#else
    LOCKSTEP_NO_CUDA_OP("swiglu_forward");
#endif
  }
  cpu::swiglu_forward(out, gate_up);
}

void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up) {
  const int64_t I = check_gate_up(gate_up, "swiglu_backward: gate_up");
  check_act(dout, "swiglu_backward: dout", gate_up.device(), {gate_up.dim(0), I});
  check_act(dgate_up, "swiglu_backward: dgate_up", gate_up.device(), gate_up.shape());
  if (gate_up.is_cuda()) {
#if LOCKSTEP_HAS_CUDA
    check_cuda_act(gate_up, "swiglu_backward: gate_up");
    check_cuda_act(dout, "swiglu_backward: dout");
    check_cuda_act(dgate_up, "swiglu_backward: dgate_up");
    return cuda::swiglu_backward(dgate_up, dout, gate_up);
#else
    LOCKSTEP_NO_CUDA_OP("swiglu_backward");
#endif
  }
  cpu::swiglu_backward(dgate_up, dout, gate_up);
}

void swiglu_forward_fp8(Fp8Rows& out_rows, Fp8Rows& out_cols, const Tensor& gate_up,
                        ScaleFormat format) {
  const int64_t I = check_gate_up(gate_up, "swiglu_forward_fp8: gate_up"), T = gate_up.dim(0);
  const bool columns = check_fp8_outputs(out_rows, out_cols, T, I, gate_up.device());
  // The fused kernel quantizes whole 128-wide groups; an I with a partial group takes the
  // composition itself (swiglu_forward, then the quantizers).
  if (gate_up.is_cuda() && I % kQuantGroup == 0) {
#if LOCKSTEP_HAS_CUDA
    check_cuda_act(gate_up, "swiglu_forward_fp8: gate_up");
    return cuda::swiglu_forward_fp8(out_rows, columns ? &out_cols : nullptr, gate_up,
                                    format == ScaleFormat::pow2);
#else
    LOCKSTEP_NO_CUDA_OP("swiglu_forward_fp8");
#endif
  }
  Tensor out = Tensor::empty({T, I}, DType::bf16, gate_up.device());
  swiglu_forward(out, gate_up);
  if (columns) quantize_rows_and_columns(out_rows, out_cols, out, format);
  else quantize_rows(out_rows, out, format);
}

void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Fp8Rows& gate_up) {
  const int64_t I = check_fp8_gate_up(gate_up, "swiglu_backward: gate_up"), T = gate_up.rows();
  const Device device = gate_up.data.device();
  check_act(dout, "swiglu_backward: dout", device, {T, I});
  check_act(dgate_up, "swiglu_backward: dgate_up", device, {T, 2 * I});
  if (device == Device::cuda) {
#if LOCKSTEP_HAS_CUDA
    check_cuda_act(dout, "swiglu_backward: dout");
    check_cuda_act(dgate_up, "swiglu_backward: dgate_up");
    check_cuda_vectors(gate_up.data, "swiglu_backward: gate_up", /*rows=*/true);
    return cuda::swiglu_backward(dgate_up, dout, gate_up);
#else
    LOCKSTEP_NO_CUDA_OP("swiglu_backward");
#endif
  }
  cpu::swiglu_backward(dgate_up, dout, dequantized(gate_up));
}

void swiglu_forward_fp8(Fp8Rows& out_rows, Fp8Rows& out_cols, const Fp8Rows& gate_up, ScaleFormat format) {
  const int64_t I = check_fp8_gate_up(gate_up, "swiglu_forward_fp8: gate_up"), T = gate_up.rows();
  const Device device = gate_up.data.device();
  [[maybe_unused]] const bool columns = check_fp8_outputs(out_rows, out_cols, T, I, device);
  if (device == Device::cuda && I % kQuantGroup == 0) {
#if LOCKSTEP_HAS_CUDA
    check_cuda_vectors(gate_up.data, "swiglu_forward_fp8: gate_up", /*rows=*/true);
    return cuda::swiglu_forward_fp8(out_rows, columns ? &out_cols : nullptr, gate_up,
                                    format == ScaleFormat::pow2);
#else
    LOCKSTEP_NO_CUDA_OP("swiglu_forward_fp8");
#endif
  }
  swiglu_forward_fp8(out_rows, out_cols, dequantized(gate_up), format);
}

}  // namespace lockstep
