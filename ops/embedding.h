// ops/embedding.h — token embedding lookup and its gradient.
//
//   forward   out[t, :] = table[tokens[t], :]          table f32/bf16 [V, H], out f32/bf16 [T, H]
//   backward  dtable[tokens[t], :] += dout[t, :]       dtable f32 [V, H] (accumulates)
//
// tokens: i32 [T]. CPU: a token outside [0, V) is an error naming its position. CUDA: table, out
// and dout bf16, H a multiple of 8; token ids are not read on the host: a bad one gets a NaN output
// row (forward) and sets dtable row 0 to NaN (backward), for the non-finite checks to catch.
// The backward adds the rows of one token in increasing t, so the result does not depend on
// threading; CUDA does the same (a sort by token, no atomics): the CPU's bits.
#pragma once

#include "core/tensor.h"

namespace lockstep {

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table);
void embedding_backward(Tensor& dtable, const Tensor& tokens, const Tensor& dout);

}  // namespace lockstep
