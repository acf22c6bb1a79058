// core/early_start.h — where kernels may start before the kernel queued before them has ended
// (programmatic dependent launch; CUDA-free, so host code can open the scope).
//
// Inside an EarlyStartScope, the kernels that support it are launched with
// LaunchConfig::early_start_in_scope (core/cuda_launch.h): each waits near its start for the
// kernel before to end (core/dependent_launch.cuh) and then lets the next one start, so a kernel's
// launch and its CTAs' setup overlap the tail of the one before instead of following its end.
// Before that wait some read what the scope promises its work never writes: the weights (the fp8
// small-T GEMM requests its first weight tiles, RMSNorm prefetches its weight), the inputs the work
// was given before it began (RoPE reads the positions; the paged decode attention its row, context
// length and first cache blocks from cu_seqlens, the lengths and the block tables), and the K/V
// cache rows of earlier steps (the decode attention's first tile, when it holds no row of this
// step, and at batch 1–2 both tiles of its ring but the step's row: a step writes only its own new
// rows, in the RoPE kernel). Never anything else a kernel of the scope writes, and no write at all:
// a scope's temporaries may reuse memory the kernel before still reads (core/graph_arena.h). The
// decode steps of the rollout engine run in one (rollout/decode_graph.cpp). Outside any scope every
// launch is an ordinary one.
//
// In a CUDA graph an early start becomes a programmatic edge only between two kernel nodes: the
// graph must hold no allocation nodes between them (core/graph_arena.h).
#pragma once

namespace lockstep {

class EarlyStartScope {
 public:
  EarlyStartScope();
  ~EarlyStartScope();
  EarlyStartScope(const EarlyStartScope&) = delete;
  EarlyStartScope& operator=(const EarlyStartScope&) = delete;

 private:
  bool previous_;
};

bool early_start_enabled();  // on this thread

}  // namespace lockstep
