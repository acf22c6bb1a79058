// ops/swiglu.cpp — argument checks and backend dispatch for ops/swiglu.h.
#include "ops/swiglu.h"

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

}  // namespace

void swiglu_forward(Tensor& out, const Tensor& gate_up) {
  const int64_t I = check_gate_up(gate_up, "swiglu_forward: gate_up");
  check_act(out, "swiglu_forward: out", gate_up.device(), {gate_up.dim(0), I});
  if (gate_up.is_cuda()) LOCKSTEP_NO_CUDA_OP("swiglu_forward");
  cpu::swiglu_forward(out, gate_up);
}

void swiglu_backward(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up) {
  const int64_t I = check_gate_up(gate_up, "swiglu_backward: gate_up");
  check_act(dout, "swiglu_backward: dout", gate_up.device(), {gate_up.dim(0), I});
  check_act(dgate_up, "swiglu_backward: dgate_up", gate_up.device(), gate_up.shape());
  if (gate_up.is_cuda()) LOCKSTEP_NO_CUDA_OP("swiglu_backward");
  cpu::swiglu_backward(dgate_up, dout, gate_up);
}

}  // namespace lockstep
