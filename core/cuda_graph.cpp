// core/cuda_graph.cpp — the CUDA part compiles only with LOCKSTEP_HAS_CUDA.
#include "core/cuda_graph.h"

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "core/error.h"

#if LOCKSTEP_HAS_CUDA
#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#endif

namespace lockstep {

#if LOCKSTEP_HAS_CUDA

namespace {
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// The nodes of `graph` by kind and its edges.
CudaGraph::Summary summarize(cudaGraph_t graph) {
  CudaGraph::Summary s;
  LOCKSTEP_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &s.nodes));
  std::vector<cudaGraphNode_t> nodes(s.nodes);
  LOCKSTEP_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &s.nodes));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    LOCKSTEP_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    s.kernels += type == cudaGraphNodeTypeKernel;
    s.memory_nodes += type == cudaGraphNodeTypeMemAlloc || type == cudaGraphNodeTypeMemFree;
  }
  LOCKSTEP_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &s.edges));
  std::vector<cudaGraphNode_t> from(s.edges), to(s.edges);
  std::vector<cudaGraphEdgeData> data(s.edges);
  LOCKSTEP_CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &s.edges));
  for (const cudaGraphEdgeData& e : data) s.programmatic_edges += e.type == cudaGraphDependencyTypeProgrammatic;
  return s;
}
}  // namespace

SideStream::SideStream() {
  cudaStream_t s = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
}

SideStream::~SideStream() { cudaStreamDestroy(as_stream(stream_)); }

void SideStream::synchronize() const {
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_)));
}

CurrentStream::CurrentStream(const SideStream& stream) : previous_(current_stream()) {
  set_current_stream(as_stream(stream.handle()));
}

CurrentStream::~CurrentStream() { set_current_stream(as_stream(previous_)); }

namespace {
void queue_wait(cudaStream_t waiter, cudaStream_t signaler) {
  cudaEvent_t e = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  LOCKSTEP_CUDA_CHECK(cudaEventRecord(e, signaler));
  LOCKSTEP_CUDA_CHECK(cudaStreamWaitEvent(waiter, e, 0));
  cudaEventDestroy(e);  // released once the wait has used it
}
}  // namespace

void side_stream_waits_for_current(const SideStream& later) {
  queue_wait(as_stream(later.handle()), current_stream());
}

void current_stream_waits_for(const SideStream& earlier) {
  queue_wait(current_stream(), as_stream(earlier.handle()));
}

CudaGraph CudaGraph::capture(const SideStream& stream, const std::function<void()>& work) {
  const CurrentStream on(stream);
  const cudaStream_t s = as_stream(stream.handle());
  LOCKSTEP_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    work();
  } catch (...) {
    // End the capture (it may have been invalidated: the graph is then null) before unwinding on.
    if (cudaStreamEndCapture(s, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  LOCKSTEP_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  CudaGraph g;
  g.graph_ = graph;
  if (graph_diagnostics()) {
    const Summary s = g.summary();
    std::fprintf(stderr, "CUDA graph: %zu nodes (%zu kernels, %zu allocations and frees), %zu edges (%zu programmatic)\n",
                 s.nodes, s.kernels, s.memory_nodes, s.edges, s.programmatic_edges);
  }
  cudaGraphExec_t exec = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  g.exec_ = exec;
  return g;
}

CudaGraph::Summary CudaGraph::summary() const {
  LOCKSTEP_CHECK(graph_, "CudaGraph::summary: nothing was captured");
  return summarize(static_cast<cudaGraph_t>(graph_));
}

void CudaGraph::launch() const {
  LOCKSTEP_CHECK(exec_, "CudaGraph::launch: nothing was captured");
  LOCKSTEP_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), current_stream()));
}

void CudaGraph::reset() {
  // Not checked: runs in destructors. An instantiation still running is freed when it completes.
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  exec_ = graph_ = nullptr;
}

#else

namespace {
[[noreturn]] void no_cuda() {
  fail("lockstep was built without CUDA (no nvcc at configure time): CUDA graphs need a GPU");
}
}  // namespace

SideStream::SideStream() { no_cuda(); }
SideStream::~SideStream() = default;
void SideStream::synchronize() const {}
CurrentStream::CurrentStream(const SideStream&) : previous_(nullptr) {}
CurrentStream::~CurrentStream() = default;
void side_stream_waits_for_current(const SideStream&) { no_cuda(); }
void current_stream_waits_for(const SideStream&) { no_cuda(); }
CudaGraph CudaGraph::capture(const SideStream&, const std::function<void()>&) { no_cuda(); }
void CudaGraph::launch() const { no_cuda(); }
CudaGraph::Summary CudaGraph::summary() const { no_cuda(); }
void CudaGraph::reset() {}

#endif

bool graph_diagnostics() {
  const char* env = std::getenv("LOCKSTEP_GRAPH_NODES");
  return env && *env == '1';
}

CudaGraph::CudaGraph(CudaGraph&& other) noexcept
    : graph_(std::exchange(other.graph_, nullptr)), exec_(std::exchange(other.exec_, nullptr)) {}

CudaGraph& CudaGraph::operator=(CudaGraph&& other) noexcept {
  if (this != &other) {
    reset();
    graph_ = std::exchange(other.graph_, nullptr);
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

CudaGraph::~CudaGraph() { reset(); }

}  // namespace lockstep
