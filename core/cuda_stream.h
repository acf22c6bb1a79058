// core/cuda_stream.h — the stream every CUDA op of this thread launches on (default: the legacy
// stream). Set it to capture a CUDA graph or to overlap work. Include only from CUDA sources.
#pragma once

#include <cuda_runtime.h>

namespace lockstep {

inline cudaStream_t& current_stream_slot() {
  thread_local cudaStream_t stream = nullptr;
  return stream;
}
inline cudaStream_t current_stream() { return current_stream_slot(); }
inline void set_current_stream(cudaStream_t s) { current_stream_slot() = s; }

}  // namespace lockstep
