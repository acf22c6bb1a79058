// core/cuda_graph.cpp — the CUDA part compiles only with LOCKSTEP_HAS_CUDA.
#include "core/cuda_graph.h"

#include <cstdio>
#include <cstdlib>
#include <map>
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

// LOCKSTEP_GRAPH_NODES=1: one line on stderr per captured graph, its nodes by type (a diagnosis of
// what sits between the kernels of a graph).
void print_node_types(cudaGraph_t graph) {
  size_t count = 0;
  LOCKSTEP_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  LOCKSTEP_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  std::map<int, int> by_type;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    LOCKSTEP_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    ++by_type[int(type)];
  }
  size_t edges = 0;
  LOCKSTEP_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
  std::fprintf(stderr, "CUDA graph: %zu nodes, %zu edges; by cudaGraphNodeType:", count, edges);
  for (const auto& [type, n] : by_type) std::fprintf(stderr, " %d:%d", type, n);
  std::fprintf(stderr, "\n");
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
  if (const char* env = std::getenv("LOCKSTEP_GRAPH_NODES"); env && *env == '1') print_node_types(graph);
  CudaGraph g;
  g.graph_ = graph;
  cudaGraphExec_t exec = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  g.exec_ = exec;
  return g;
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
CudaGraph CudaGraph::capture(const SideStream&, const std::function<void()>&) { no_cuda(); }
void CudaGraph::launch() const { no_cuda(); }
void CudaGraph::reset() {}

#endif

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
