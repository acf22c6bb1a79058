// core/device.cpp — host and CUDA memory; the CUDA part compiles only with LOCKSTEP_HAS_CUDA.
#include "core/device.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"
#include "core/graph_arena.h"

#if LOCKSTEP_HAS_CUDA
#include <cstdint>
#include <mutex>

#include "core/cuda_check.h"
#include "core/cuda_stream.h"
#endif

namespace lockstep {

#if LOCKSTEP_HAS_CUDA
namespace {
// CUDA memory comes from the device's stream-ordered pool (cudaMallocAsync), told to keep what
// is freed instead of returning it to the driver: after the first training step every tensor of a
// step reuses pooled memory, so a steady-state step makes no cudaMalloc. The pool also counts the
// bytes in use and their high-water mark (device_memory_stats; a graph arena's bytes are not in them).
cudaMemPool_t memory_pool() {
  static cudaMemPool_t pool = [] {
    int device = 0;
    LOCKSTEP_CUDA_CHECK(cudaGetDevice(&device));
    cudaMemPool_t p = nullptr;
    LOCKSTEP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&p, device));
    uint64_t keep_all = UINT64_MAX;
    LOCKSTEP_CUDA_CHECK(cudaMemPoolSetAttribute(p, cudaMemPoolAttrReleaseThreshold, &keep_all));
    return p;
  }();
  return pool;
}
}  // namespace
#else
namespace {
[[noreturn]] void no_cuda() {
  fail("lockstep was built without CUDA (no nvcc at configure time); this operation needs a GPU");
}
}  // namespace
#endif

bool built_with_cuda() {
#if LOCKSTEP_HAS_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#if LOCKSTEP_HAS_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

void select_cuda_device(int index) {
  const int n = cuda_device_count();
  LOCKSTEP_CHECK(index >= 0 && index < n, "GPU ", index, " asked for, but ", n,
                 n == 1 ? " GPU is" : " GPUs are", " visible (CUDA_VISIBLE_DEVICES, nvidia-smi)");
#if LOCKSTEP_HAS_CUDA
  LOCKSTEP_CUDA_CHECK(cudaSetDevice(index));
#endif
}

bool cuda_device_available() {
#if LOCKSTEP_HAS_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
#else
  return false;
#endif
}

namespace {
thread_local const MemoryPurpose* innermost_purpose = nullptr;

std::string gib(size_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GiB", double(bytes) / double(size_t(1) << 30));
  return s;
}
}  // namespace

MemoryPurpose::MemoryPurpose(std::string what, std::string remedy)
    : outer_(innermost_purpose), what_(std::move(what)), remedy_(std::move(remedy)) {
  innermost_purpose = this;
}

MemoryPurpose::~MemoryPurpose() { innermost_purpose = outer_; }

const MemoryPurpose* MemoryPurpose::current() { return innermost_purpose; }

std::string out_of_memory_message(size_t bytes, const DeviceMemoryStats& stats, size_t reserved) {
  const MemoryPurpose* purpose = MemoryPurpose::current();
  return detail::concat(
      "GPU out of memory: ", gib(bytes), " asked for ",
      purpose ? purpose->what() : std::string("a tensor"), "; ", gib(stats.free), " free of ",
      gib(stats.total), " (this process: ", gib(stats.in_use), " in live tensors, ", gib(reserved),
      " held by its memory pool); ",
      purpose ? purpose->remedy() : std::string("a smaller batch, KV cache or model needs less"));
}

void* device_alloc(Device d, size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (d == Device::cpu) {
    // 64-byte alignment: whole cache lines, and every SIMD load width.
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return p;
  }
#if LOCKSTEP_HAS_CUDA
  if (GraphArena* arena = active_graph_arena()) return arena->allocate(bytes);
  void* p = nullptr;
  const cudaError_t status = cudaMallocFromPoolAsync(&p, bytes, memory_pool(), current_stream());
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: the process can go on (and report)
    uint64_t reserved = 0;
    (void)cudaMemPoolGetAttribute(memory_pool(), cudaMemPoolAttrReservedMemCurrent, &reserved);
    fail(out_of_memory_message(bytes, device_memory_stats(), size_t(reserved)));
  }
  LOCKSTEP_CUDA_CHECK(status);
  return p;
#else
  no_cuda();
#endif
}

void device_free(Device d, void* p) {
  if (!p) return;
  if (d == Device::cpu) return std::free(p);
#if LOCKSTEP_HAS_CUDA
  // Not checked: runs in destructors, possibly during unwinding. Freed in the order of the current
  // stream: work queued before on this stream may still read p.
  if (GraphArena* arena = active_graph_arena(); arena && arena->release(p)) return;
  cudaFreeAsync(p, current_stream());
#endif
}

void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::cpu && src_device == Device::cpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if LOCKSTEP_HAS_CUDA
  // On the current stream, as every CUDA op of the thread (not cudaMemcpy's legacy stream, which a
  // side stream's work is not ordered with: a copy inside a CurrentStream scope raced with the
  // work queued there before it).
  const cudaStream_t stream = current_stream();
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  if (dst_device == Device::cpu || src_device == Device::cpu) LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
#else
  no_cuda();
#endif
}

void* pinned_alloc(size_t bytes) {
#if LOCKSTEP_HAS_CUDA
  void* p = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaMallocHost(&p, bytes == 0 ? 1 : bytes));
  return p;
#else
  return device_alloc(Device::cpu, bytes);
#endif
}

void pinned_free(void* p) {
  if (!p) return;
#if LOCKSTEP_HAS_CUDA
  cudaFreeHost(p);  // not checked: runs in destructors
#else
  device_free(Device::cpu, p);
#endif
}

void device_copy_async(void* dst, Device dst_device, const void* src, Device src_device,
                       size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::cpu && src_device == Device::cpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if LOCKSTEP_HAS_CUDA
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, current_stream()));
#else
  no_cuda();
#endif
}

void device_copy_2d_async(void* dst, size_t dst_pitch, Device dst_device, const void* src,
                          size_t src_pitch, Device src_device, size_t row_bytes, size_t rows) {
  if (row_bytes == 0 || rows == 0) return;
  if (dst_device == Device::cpu && src_device == Device::cpu) {
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch,
                  static_cast<const char*>(src) + r * src_pitch, row_bytes);
    return;
  }
#if LOCKSTEP_HAS_CUDA
  LOCKSTEP_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                        cudaMemcpyDefault, current_stream()));
#else
  no_cuda();
#endif
}

void stream_synchronize() {
#if LOCKSTEP_HAS_CUDA
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
#endif
}

void device_fill_bytes(Device d, void* p, unsigned char value, size_t bytes) {
  if (d == Device::cpu) {
    std::memset(p, value, bytes);
    return;
  }
#if LOCKSTEP_HAS_CUDA
  LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(p, value, bytes, current_stream()));  // as device_copy
#else
  no_cuda();
#endif
}

DeviceMemoryStats device_memory_stats() {
  DeviceMemoryStats stats;
#if LOCKSTEP_HAS_CUDA
  if (!cuda_device_available()) return stats;  // a CUDA build on a machine without a GPU
  uint64_t used = 0, peak = 0;
  LOCKSTEP_CUDA_CHECK(cudaMemPoolGetAttribute(memory_pool(), cudaMemPoolAttrUsedMemCurrent, &used));
  LOCKSTEP_CUDA_CHECK(cudaMemPoolGetAttribute(memory_pool(), cudaMemPoolAttrUsedMemHigh, &peak));
  size_t free = 0, total = 0;
  LOCKSTEP_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  stats = {size_t(used), size_t(peak), free, total};
#endif
  return stats;
}

void reset_peak_device_memory() {
#if LOCKSTEP_HAS_CUDA
  if (!cuda_device_available()) return;
  uint64_t zero = 0;
  LOCKSTEP_CUDA_CHECK(cudaMemPoolSetAttribute(memory_pool(), cudaMemPoolAttrUsedMemHigh, &zero));
#endif
}

void device_synchronize() {
#if LOCKSTEP_HAS_CUDA
  static const bool has_device = cuda_device_available();  // a CUDA build on a machine without one
  if (has_device) LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

double device_seconds_since(std::chrono::steady_clock::time_point t0) {
  device_synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int device_sm_count() {
#if LOCKSTEP_HAS_CUDA
  static const int sms = [] {
    int device = 0, n = 0;
    LOCKSTEP_CUDA_CHECK(cudaGetDevice(&device));
    LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
  }();
  return sms;
#else
  return 0;
#endif
}

Device parse_device(std::string_view name, std::string_view what) {
  LOCKSTEP_CHECK(name == "cpu" || name == "cuda", what, ": expected cpu or cuda, got '", name, "'");
  return name == "cpu" ? Device::cpu : Device::cuda;
}

std::string cuda_device_name() {
#if LOCKSTEP_HAS_CUDA
  int device = 0;
  LOCKSTEP_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  LOCKSTEP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
#else
  no_cuda();
#endif
}

}  // namespace lockstep
