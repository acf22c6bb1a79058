// ops/embedding.h — token embedding lookup and its gradient.
//
//   forward   out[t, :] = table[tokens[t], :]          table f32/bf16 [V, H], out f32/bf16 [T, H]
//   backward  dtable[tokens[t], :] += dout[t, :]       dtable f32 [V, H] (accumulates)
//
// tokens: i32 [T]; a token outside [0, V) is an error naming its position.
// The backward adds the rows of one token in increasing t, so the result does not depend on
// threading.
#pragma once

#include "core/tensor.h"

namespace lockstep {

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table);
void embedding_backward(Tensor& dtable, const Tensor& tokens, const Tensor& dout);

}  // namespace lockstep
