// bench/kernel_trace.cpp — a CUDA injection library that records every kernel's GPU start and end
// through CUPTI's activity API, the kernels of CUDA graphs included, and writes them as CSV when
// the process exits. It gives the timeline of a graph-replayed decode step — kernel durations in
// flow and the gaps between them — where the GPU machine has no Nsight Systems and ncu serializes
// the kernels it measures. scripts/dev/kernel_trace_steps.py sums it per decode step.
//
// Usage: LOCKSTEP_KERNEL_TRACE=trace.csv CUDA_INJECTION64_PATH=liblockstep_kernel_trace.so PROGRAM
// (LOCKSTEP_KERNEL_TRACE unset: kernel_trace.csv in the working directory).
// CSV columns: start_ns, end_ns (GPU timestamps), stream, graph_node (0 outside graphs), grid x/y/z,
// kernel (demangled, its parameter list and anonymous namespaces dropped).
#include <cupti.h>
#include <cxxabi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct KernelRecord {
  uint64_t start, end, graph_node;
  uint32_t stream;
  int32_t grid[3];
  std::string name;
};

std::mutex g_mutex;
std::vector<KernelRecord> g_records;
constexpr size_t kBufferBytes = size_t(16) << 20;

void check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return;
  const char* message = nullptr;
  cuptiGetResultString(result, &message);
  std::fprintf(stderr, "kernel_trace: %s failed: %s\n", what, message ? message : "?");
  std::exit(1);
}

std::string demangled(const char* name) {
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && plain ? plain : name;
  std::free(plain);
  for (size_t at; (at = out.find("(anonymous namespace)::")) != std::string::npos;) out.erase(at, 23);
  const size_t paren = out.find('(');
  return paren == std::string::npos ? out : out.substr(0, paren);
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
  std::lock_guard lock(g_mutex);
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    g_records.push_back({k->start, k->end, k->graphNodeId, k->streamId, {k->gridX, k->gridY, k->gridZ},
                         demangled(k->name)});
  }
  std::free(buffer);
}

// At exit (where exit() may not be called again): a failed flush is reported, and what arrived is written.
void write_trace() {
  if (cuptiActivityFlushAll(1) != CUPTI_SUCCESS) std::fprintf(stderr, "kernel_trace: cuptiActivityFlushAll failed\n");
  const char* env = std::getenv("LOCKSTEP_KERNEL_TRACE");
  const char* path = env ? env : "kernel_trace.csv";
  FILE* f = std::fopen(path, "w");
  if (!f) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", path);
    return;
  }
  std::lock_guard lock(g_mutex);
  std::fprintf(f, "start_ns,end_ns,stream,graph_node,grid_x,grid_y,grid_z,kernel\n");
  for (const KernelRecord& r : g_records) {
    std::string name = r.name;
    for (char& c : name)
      if (c == ',' || c == '"') c = ';';  // one CSV field
    std::fprintf(f, "%llu,%llu,%u,%llu,%d,%d,%d,%s\n", (unsigned long long)r.start, (unsigned long long)r.end,
                 r.stream, (unsigned long long)r.graph_node, r.grid[0], r.grid[1], r.grid[2], name.c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "kernel_trace: %zu kernels written to %s\n", g_records.size(), path);
}

}  // namespace

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
extern "C" int InitializeInjection() {
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  std::atexit(write_trace);
  return 1;
}
