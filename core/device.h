// core/device.h — where a tensor lives, and the few memory operations that differ between places.
// CUDA calls live only in device.cpp (and kernels), so code above core/ never includes CUDA headers.
#pragma once

#include <chrono>

#include <cstddef>
#include <string>
#include <string_view>

namespace lockstep {

enum class Device : unsigned char { cpu, cuda };

constexpr std::string_view device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }
// "cpu" or "cuda"; anything else is an error naming `what` (the flag or key that gave it).
Device parse_device(std::string_view name, std::string_view what);

bool built_with_cuda();
// True when built with CUDA and a GPU is visible (GPU tests skip otherwise).
bool cuda_device_available();
// Visible GPUs (0 without CUDA).
int cuda_device_count();
// Makes GPU `index` this process's device (one rank per GPU, dist/launch.h); before any other CUDA
// call. An error when there is no such GPU.
void select_cuda_device(int index);

// CUDA memory (zeros without CUDA or without a GPU): bytes held by live tensors now and at most since the last
// reset_peak_device_memory(), and the device's free and total memory (the pool keeps freed tensor
// memory for reuse, so `free` does not grow back when tensors die).
struct DeviceMemoryStats {
  size_t in_use = 0, peak = 0;
  size_t free = 0, total = 0;
};

// What GPU memory is being allocated for, and what lowers it: both named in the error when a GPU
// allocation fails (with the free and total memory). Scoped to the thread; the innermost holds.
//   MemoryPurpose purpose("the rollout's KV cache", "lower rollout.kv_cache_fraction");
class MemoryPurpose {
 public:
  MemoryPurpose(std::string what, std::string remedy);
  ~MemoryPurpose();
  MemoryPurpose(const MemoryPurpose&) = delete;
  MemoryPurpose& operator=(const MemoryPurpose&) = delete;
  // The innermost purpose on this thread, or null.
  static const MemoryPurpose* current();
  const std::string& what() const { return what_; }
  const std::string& remedy() const { return remedy_; }

 private:
  const MemoryPurpose* outer_;
  std::string what_, remedy_;
};

// The message of a failed GPU allocation of `bytes`: the size, the purpose (MemoryPurpose), the
// GPU's free and total memory, what this process holds, and the remedy.
std::string out_of_memory_message(size_t bytes, const DeviceMemoryStats& stats, size_t reserved);

// CUDA memory is stream-ordered (allocated and freed in the order of the current stream,
// core/cuda_stream.h) and pooled: see device.cpp; inside an ArenaScope it comes from that graph
// arena (core/graph_arena.h).
void* device_alloc(Device d, size_t bytes);
void device_free(Device d, void* p);
// Copies between any two places, on the current stream (core/cuda_stream.h); returns when the copy
// has ended where the host is one side (device to device: queued, as every kernel).
void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// Page-locked host memory (plain host memory without CUDA): what lets a copy between the host and
// the GPU run asynchronously.
void* pinned_alloc(size_t bytes);
void pinned_free(void* p);
// Copies queued on the current stream (core/cuda_stream.h): asynchronous with respect to the host
// when the host side is pinned (pageable host memory makes CUDA wait for the stream), so the
// memory must stay untouched until the stream has done them. The 2-D form copies `rows` rows of
// `row_bytes` bytes that start `dst_pitch` and `src_pitch` bytes apart.
void device_copy_async(void* dst, Device dst_device, const void* src, Device src_device,
                       size_t bytes);
void device_copy_2d_async(void* dst, size_t dst_pitch, Device dst_device, const void* src,
                          size_t src_pitch, Device src_device, size_t row_bytes, size_t rows);
// Waits for the current stream's queued work (nothing to wait for without CUDA).
void stream_synchronize();
void device_fill_bytes(Device d, void* p, unsigned char value, size_t bytes);  // on the current stream
// Waits for the GPU's queued work (nothing to wait for without one).
void device_synchronize();
// Seconds from t0 until the GPU's queued work is done (device_synchronize, then the clock): the
// time a phase of a step really took.
double device_seconds_since(std::chrono::steady_clock::time_point t0);
// The GPU's streaming multiprocessors (0 without CUDA), queried once: kernels size their grids by
// it. (One device per process, as everywhere in lockstep: the device current at the first call.)
int device_sm_count();
// The current GPU's name ("NVIDIA H200"); throws without CUDA.
std::string cuda_device_name();

DeviceMemoryStats device_memory_stats();
void reset_peak_device_memory();

}  // namespace lockstep
