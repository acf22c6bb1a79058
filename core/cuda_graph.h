// core/cuda_graph.h — device work captured once into a CUDA graph and replayed, behind a CUDA-free
// interface (CUDA calls stay in core/ and the kernels: core/device.h).
//
// SideStream: a CUDA stream of its own, created non-blocking: a capture cannot run on the legacy
// default stream, and while a blocking stream is being captured nothing may touch the legacy one.
// Its work is not ordered with any other stream's: synchronize around it. A CurrentStream scope
// makes it the stream every op of this thread launches and allocates on (core/cuda_stream.h), and
// restores the previous one when it ends; side_stream_waits_for_current / current_stream_waits_for
// order it with the current stream.
//
// CudaGraph::capture(stream, work) runs `work` with `stream` current, under capture in thread-local
// mode, and instantiates what it queued. Nothing runs on the device meanwhile, and a call of this
// thread that could synchronize (cudaMalloc, cudaMemcpy from pageable memory, a synchronize) fails
// the capture instead of running. Tensors that `work` allocates become allocation nodes of the
// graph (core/device.cpp's stream-ordered allocator under capture) at addresses fixed for the
// graph's life, or come from a graph arena if `work` opens an ArenaScope (core/graph_arena.h);
// they must be freed before `work` returns. Memory allocated before may be read and
// written by `work`, not freed.
//
// launch() queues the captured work on the current stream: the same kernels with the same arguments
// and pointers, reading what the memory they point to holds when they run. Graphs launched into one
// stream may share the physical memory of their allocations (CUDA aliases it: their runs never
// overlap). Without CUDA, making a SideStream or capturing is an error.
#pragma once

#include <cstddef>
#include <functional>

namespace lockstep {

class SideStream {
 public:
  SideStream();
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  // Waits for the work queued on this stream.
  void synchronize() const;
  void* handle() const { return stream_; }  // a cudaStream_t

 private:
  void* stream_ = nullptr;
};

class CurrentStream {
 public:
  explicit CurrentStream(const SideStream& stream);
  ~CurrentStream();
  CurrentStream(const CurrentStream&) = delete;
  CurrentStream& operator=(const CurrentStream&) = delete;

 private:
  void* previous_;
};

// Orders two streams' work without the host waiting (a CUDA event between them): what `later`
// queues from now on runs after what the current stream has queued so far, or the other way round.
void side_stream_waits_for_current(const SideStream& later);
void current_stream_waits_for(const SideStream& earlier);

class CudaGraph {
 public:
  CudaGraph() = default;
  CudaGraph(CudaGraph&& other) noexcept;
  CudaGraph& operator=(CudaGraph&& other) noexcept;
  ~CudaGraph();

  static CudaGraph capture(const SideStream& stream, const std::function<void()>& work);
  void launch() const;

  // What was captured (printed at each capture, on stderr, when graph_diagnostics() is on).
  struct Summary {
    size_t nodes = 0, kernels = 0, memory_nodes = 0;  // memory nodes: allocations and frees
    size_t edges = 0, programmatic_edges = 0;         // programmatic: from an early start
  };
  Summary summary() const;

 private:
  void reset();

  void* graph_ = nullptr;  // a cudaGraph_t, kept while its instantiation lives (it owns the
                           // allocation nodes' addresses)
  void* exec_ = nullptr;   // a cudaGraphExec_t
};

// LOCKSTEP_GRAPH_NODES=1: the captures print what they hold (CudaGraph::Summary, and the decode
// graphs their arena), on stderr.
bool graph_diagnostics();

}  // namespace lockstep
