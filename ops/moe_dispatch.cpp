// ops/moe_dispatch.cpp — argument checks and backend dispatch for ops/moe_dispatch.h.
#include "ops/moe_dispatch.h"

#include <cstdint>

#include "ops/act_check.h"
#include "ops/moe_dispatch_backends.h"

namespace lockstep {

namespace {
constexpr int64_t kMostExperts = 4096;  // the CUDA kernel keeps two ints per expert in shared memory
}  // namespace

void moe_dispatch(Tensor& offsets, Tensor& token_of_row, Tensor& slots, const Tensor& expert_ids) {
  const Device d = expert_ids.device();
  check_tensor(expert_ids, "moe_dispatch: expert_ids", DType::i32, d);
  LOCKSTEP_CHECK(expert_ids.rank() == 2 && expert_ids.dim(1) >= 1, "moe_dispatch: expert_ids: expected [T, k], got ",
                 expert_ids.describe());
  const int64_t T = expert_ids.dim(0), k = expert_ids.dim(1);
  check_tensor(offsets, "moe_dispatch: offsets", DType::i64, d);
  LOCKSTEP_CHECK(offsets.rank() == 1 && offsets.dim(0) >= 2 && offsets.dim(0) - 1 <= kMostExperts,
                 "moe_dispatch: offsets: expected [E + 1] with 1 <= E <= ", kMostExperts, ", got ",
                 offsets.describe());
  LOCKSTEP_CHECK(T * k <= INT32_MAX, "moe_dispatch: ", T, " tokens × ", k, " rows do not fit i32 row indices");
  check_tensor(token_of_row, "moe_dispatch: token_of_row", DType::i32, d);
  check_shape(token_of_row, "moe_dispatch: token_of_row", {T * k});
  check_tensor(slots, "moe_dispatch: slots", DType::i32, d);
  check_shape(slots, "moe_dispatch: slots", {T, k});
  if (d == Device::cuda) {
#if LOCKSTEP_HAS_CUDA
    return cuda::moe_dispatch(offsets, token_of_row, slots, expert_ids);
#else
    LOCKSTEP_NO_CUDA_OP("moe_dispatch");
#endif
  }
  const int64_t E = offsets.dim(0) - 1;
  const int32_t* id = expert_ids.data_as<int32_t>();
  for (int64_t i = 0; i < T * k; ++i)
    LOCKSTEP_CHECK(id[i] >= 0 && id[i] < E, "moe_dispatch: token ", i / k, " choice ", i % k, " is expert ", id[i],
                   ", outside [0, ", E, ")");
  cpu::moe_dispatch(offsets, token_of_row, slots, expert_ids);
}

}  // namespace lockstep
