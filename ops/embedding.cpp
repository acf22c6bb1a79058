// ops/embedding.cpp — argument checks and backend dispatch for ops/embedding.h.
#include "ops/embedding.h"

#include "ops/act_check.h"
#include "ops/embedding_backends.h"

namespace lockstep {

namespace {

// tokens: i32 [T] on `device`; returns T.
int64_t check_tokens(const Tensor& tokens, const char* what, Device device) {
  check_tensor(tokens, what, DType::i32, device);
  LOCKSTEP_CHECK(tokens.rank() == 1, what, ": expected a 1-D tensor [T], got ", tokens.describe());
  return tokens.dim(0);
}

// Host memory only: a CUDA kernel has to report a bad id itself.
void check_token_range(const Tensor& tokens, const char* op, int64_t vocab) {
  const int32_t* tok = tokens.data_as<int32_t>();
  for (int64_t t = 0; t < tokens.dim(0); ++t)
    LOCKSTEP_CHECK(tok[t] >= 0 && tok[t] < vocab, op, ": tokens[", t, "] = ", tok[t],
                   " is outside the vocabulary [0, ", vocab, ")");
}

}  // namespace

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table) {
  const Device d = table.device();
  check_act(table, "embedding_forward: table", d, table.shape());
  LOCKSTEP_CHECK(table.rank() == 2, "embedding_forward: table: expected a 2-D tensor [V, H], got ",
                 table.describe());
  const int64_t T = check_tokens(tokens, "embedding_forward: tokens", d);
  check_act(out, "embedding_forward: out", d, {T, table.dim(1)});
  if (d == Device::cuda) {
#if LOCKSTEP_HAS_CUDA
    check_cuda_act(table, "embedding_forward: table");
    check_cuda_act(out, "embedding_forward: out");
    return cuda::embedding_forward(out, tokens, table);
#else
    LOCKSTEP_NO_CUDA_OP("embedding_forward");
#endif
  }
  check_token_range(tokens, "embedding_forward", table.dim(0));
  cpu::embedding_forward(out, tokens, table);
}

void embedding_backward(Tensor& dtable, const Tensor& tokens, const Tensor& dout) {
  const Device d = dtable.device();
  check_tensor(dtable, "embedding_backward: dtable", DType::f32, d);
  LOCKSTEP_CHECK(dtable.rank() == 2,
                 "embedding_backward: dtable: expected a 2-D tensor [V, H], got ",
                 dtable.describe());
  const int64_t T = check_tokens(tokens, "embedding_backward: tokens", d);
  check_act(dout, "embedding_backward: dout", d, {T, dtable.dim(1)});
  if (d == Device::cuda) {
#if LOCKSTEP_HAS_CUDA
    check_cuda_act(dout, "embedding_backward: dout");
    check_cuda_vectors(dtable, "embedding_backward: dtable", /*rows=*/true);
    return cuda::embedding_backward(dtable, tokens, dout);
#else
    LOCKSTEP_NO_CUDA_OP("embedding_backward");
#endif
  }
  check_token_range(tokens, "embedding_backward", dtable.dim(0));
  cpu::embedding_backward(dtable, tokens, dout);
}

}  // namespace lockstep
