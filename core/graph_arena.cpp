// core/graph_arena.cpp — core/graph_arena.h; the CUDA part compiles only with LOCKSTEP_HAS_CUDA.
#include "core/graph_arena.h"

#include <iterator>

#if LOCKSTEP_HAS_CUDA
#include "core/cuda_check.h"
#endif

namespace lockstep {

namespace {
constexpr size_t kAlign = 256;  // cudaMalloc's alignment: more than any kernel asks
thread_local GraphArena* active = nullptr;
}  // namespace

RangeAllocator::RangeAllocator(size_t size, size_t align) : size_(size / align * align), align_(align) {
  LOCKSTEP_CHECK(align > 0 && size_ > 0, "RangeAllocator: ", size, " bytes in units of ", align);
  free_[0] = size_;
}

std::optional<size_t> RangeAllocator::allocate(size_t bytes) {
  bytes = (bytes == 0 ? align_ : (bytes + align_ - 1) / align_ * align_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const auto [offset, size] = *it;
    if (size < bytes) continue;
    free_.erase(it);
    if (size > bytes) free_[offset + bytes] = size - bytes;
    used_[offset] = bytes;
    if (offset + bytes > high_water_) high_water_ = offset + bytes;
    return offset;
  }
  return std::nullopt;
}

void RangeAllocator::release(size_t offset) {
  const auto used = used_.find(offset);
  LOCKSTEP_CHECK(used != used_.end(), "RangeAllocator: offset ", offset, " was not handed out, or was released twice");
  size_t size = used->second;
  used_.erase(used);
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + size == next->first) {  // merge with the free range after
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // and with the one before
    const auto before = std::prev(next);
    if (before->first + before->second == offset) {
      before->second += size;
      return;
    }
  }
  free_[offset] = size;
}

#if LOCKSTEP_HAS_CUDA
GraphArena::GraphArena(size_t bytes) : ranges_(bytes + kAlign - 1, kAlign) {
  void* p = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaMalloc(&p, ranges_.size()));
  base_ = static_cast<char*>(p);
}

GraphArena::~GraphArena() { cudaFree(base_); }  // not checked: runs in destructors
#else
GraphArena::GraphArena(size_t bytes) : ranges_(bytes + kAlign - 1, kAlign) {
  fail("lockstep was built without CUDA (no nvcc at configure time): a graph arena needs a GPU");
}

GraphArena::~GraphArena() = default;
#endif

void* GraphArena::allocate(size_t bytes) {
  const std::optional<size_t> offset = ranges_.allocate(bytes);
  if (!offset) throw Full(detail::concat("graph arena: no free range of ", bytes, " bytes in ", capacity()));
  return base_ + *offset;
}

bool GraphArena::release(void* p) {
  const char* c = static_cast<const char*>(p);
  if (c < base_ || c >= base_ + capacity()) return false;
  ranges_.release(size_t(c - base_));
  return true;
}

ArenaScope::ArenaScope(GraphArena& arena) : previous_(active) { active = &arena; }
ArenaScope::~ArenaScope() { active = previous_; }

GraphArena* active_graph_arena() { return active; }

}  // namespace lockstep
