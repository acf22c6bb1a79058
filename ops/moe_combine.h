// ops/moe_combine.h — the return trip of a sparse layer's tokens: each token's k expert outputs,
// which the experts computed as rows of one tensor ordered by expert, summed back into the token's
// row, weighted by the router (transformers' index_add_ of the weighted expert outputs).
//
//   forward   out[t, :] = Σ_j weights[t, j] · rows[slots[t, j], :]   (fp32, j in order, one rounding)
//             weights undefined: the plain sum (the backward of the gather that sent token t to rows
//             slots[t, ·]: ops/embedding.h's embedding_forward with the tokens of each row)
//   backward  drows[slots[t, j], :] = weights[t, j] · dout[t, :]   (one rounding; undefined weights: 1)
//             dweights[t, j] = Σ_h dout[t, h] · rows[slots[t, j], h]   (fp32, h in order; only with
//             weights)
//
// rows, drows [R, H], out, dout [T, H]: f32 or bf16; slots: i32 [T, k], every row of [0, R) exactly
// once (R = T·k: a permutation; checked on the CPU); weights, dweights: f32 [T, k]. A token's output
// depends on its own rows alone, so a token gets the same bits whichever batch it is in. CUDA: bf16
// rows and activations, H a multiple of 8, 16-byte aligned; slots are not read on the host; sums in
// the same order as the CPU's, dweights in a fixed order of its own (the same bits every run).
#pragma once

#include "core/tensor.h"

namespace lockstep {

void moe_combine_forward(Tensor& out, const Tensor& rows, const Tensor& slots, const Tensor& weights);
void moe_combine_backward(Tensor& drows, Tensor& dweights, const Tensor& dout, const Tensor& rows,
                          const Tensor& slots, const Tensor& weights);

}  // namespace lockstep
