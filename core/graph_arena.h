// core/graph_arena.h — device memory for the temporaries of CUDA graphs, handed out on the host
// while they are captured, so that a graph holds kernel nodes only.
//
// Why: under capture, the stream-ordered pool (core/device.cpp) makes every tensor the captured
// work allocates an allocation node and a free node between two kernels, and CUDA gives only edges
// from a kernel node to a kernel node a programmatic port: an early-started kernel
// (core/early_start.h) after such a node would wait for the full end of the kernel before it.
//
// While an ArenaScope is alive, this thread's device_alloc (core/device.h) takes CUDA memory from
// the arena and device_free gives it back. First fit, 256-byte aligned, a freed range merged with
// its free neighbours and reused at once: safe when the captured work is one stream's chain (each
// kernel after the one before), as the pool's reuse is. Every graph that shares an arena must be
// launched into one stream (their runs never overlap), and the arena must outlive them.
// allocate() throws GraphArena::Full when no free range is large enough: capture again with a
// larger arena.
#pragma once

#include <cstddef>
#include <map>
#include <optional>

#include "core/error.h"

namespace lockstep {

// The bookkeeping of a GraphArena: ranges of [0, size) in units of `align` bytes, first fit.
class RangeAllocator {
 public:
  RangeAllocator(size_t size, size_t align);

  std::optional<size_t> allocate(size_t bytes);  // the range's offset; none when nothing fits
  void release(size_t offset);                   // a range allocate() handed out and not yet released
  size_t size() const { return size_; }
  size_t high_water() const { return high_water_; }  // the largest end of a range ever handed out

 private:
  size_t size_, align_, high_water_ = 0;
  std::map<size_t, size_t> free_;  // offset → bytes: disjoint, never adjacent
  std::map<size_t, size_t> used_;  // offset → bytes
};

class GraphArena {
 public:
  struct Full : Error {
    using Error::Error;
  };

  explicit GraphArena(size_t bytes);  // cudaMalloc now: not under capture
  ~GraphArena();
  GraphArena(const GraphArena&) = delete;
  GraphArena& operator=(const GraphArena&) = delete;

  void* allocate(size_t bytes);
  bool release(void* p);  // false when p is not from this arena
  size_t capacity() const { return ranges_.size(); }
  size_t high_water() const { return ranges_.high_water(); }

 private:
  char* base_ = nullptr;
  RangeAllocator ranges_;
};

// Makes `arena` the one this thread's device_alloc and device_free use, until the scope ends.
class ArenaScope {
 public:
  explicit ArenaScope(GraphArena& arena);
  ~ArenaScope();
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;

 private:
  GraphArena* previous_;
};

GraphArena* active_graph_arena();  // this thread's; nullptr: none

}  // namespace lockstep
