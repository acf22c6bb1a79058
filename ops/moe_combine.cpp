// ops/moe_combine.cpp — argument checks and backend dispatch for ops/moe_combine.h.
#include "ops/moe_combine.h"

#include <string>
#include <vector>

#include "ops/act_check.h"
#include "ops/moe_combine_backends.h"

namespace lockstep {

namespace {

// rows [R, H] (it sets the device), token rows [T, H], slots [T, k], weights [T, k] or undefined.
void check_combine(const Tensor& token_rows, const Tensor& rows, const Tensor& slots,
                   const Tensor& weights, const char* op, const char* token_name) {
  const std::string name(op);
  const Device d = rows.device();
  check_act(rows, (name + ": rows").c_str(), d, rows.shape());
  LOCKSTEP_CHECK(rows.rank() == 2, op, ": rows: expected a 2-D tensor [R, H], got ", rows.describe());
  check_tensor(slots, (name + ": slots").c_str(), DType::i32, d);
  LOCKSTEP_CHECK(slots.rank() == 2 && slots.dim(0) * slots.dim(1) == rows.dim(0), op,
                 ": slots: expected [T, k] with T·k = the ", rows.dim(0), " rows, got ", slots.describe());
  check_act(token_rows, (name + ": " + token_name).c_str(), d, {slots.dim(0), rows.dim(1)});
  if (weights.defined()) {
    check_tensor(weights, (name + ": weights").c_str(), DType::f32, d);
    check_shape(weights, (name + ": weights").c_str(), slots.shape());
  }
  if (d == Device::cuda) {
    check_cuda_act(rows, (name + ": rows").c_str());
    check_cuda_act(token_rows, (name + ": " + token_name).c_str());
    return;
  }
  // Host memory: every row exactly once.
  std::vector<bool> seen(size_t(rows.dim(0)));
  const int32_t* s = slots.data_as<int32_t>();
  for (int64_t i = 0; i < slots.numel(); ++i) {
    LOCKSTEP_CHECK(s[i] >= 0 && s[i] < rows.dim(0) && !seen[size_t(s[i])], op, ": slots[",
                   i / slots.dim(1), ", ", i % slots.dim(1), "] = ", s[i],
                   " is outside [0, ", rows.dim(0), ") or names a row twice (slots must be a "
                   "permutation of the rows)");
    seen[size_t(s[i])] = true;
  }
}

}  // namespace

void moe_combine_forward(Tensor& out, const Tensor& rows, const Tensor& slots, const Tensor& weights) {
  check_combine(out, rows, slots, weights, "moe_combine_forward", "out");
  if (rows.is_cuda()) {
#if LOCKSTEP_HAS_CUDA
    return cuda::moe_combine_forward(out, rows, slots, weights);
#else
    LOCKSTEP_NO_CUDA_OP("moe_combine_forward");
#endif
  }
  cpu::moe_combine_forward(out, rows, slots, weights);
}

void moe_combine_backward(Tensor& drows, Tensor& dweights, const Tensor& dout, const Tensor& rows,
                          const Tensor& slots, const Tensor& weights) {
  check_combine(dout, rows, slots, weights, "moe_combine_backward", "dout");
  check_act(drows, "moe_combine_backward: drows", rows.device(), rows.shape());
  if (weights.defined()) {
    check_tensor(dweights, "moe_combine_backward: dweights", DType::f32, rows.device());
    check_shape(dweights, "moe_combine_backward: dweights", slots.shape());
  }
  if (rows.is_cuda()) {
#if LOCKSTEP_HAS_CUDA
    check_cuda_act(drows, "moe_combine_backward: drows");
    return cuda::moe_combine_backward(drows, dweights, dout, rows, slots, weights);
#else
    LOCKSTEP_NO_CUDA_OP("moe_combine_backward");
#endif
  }
  cpu::moe_combine_backward(drows, dweights, dout, rows, slots, weights);
}

}  // namespace lockstep
