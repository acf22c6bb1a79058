// ops/forward_kernels.cpp
#include "ops/forward_kernels.h"

#include <atomic>

namespace lockstep {

namespace {
std::atomic<bool> g_exact{false};
}  // namespace

void set_exact_forward(bool on) { g_exact.store(on, std::memory_order_relaxed); }
bool exact_forward() { return g_exact.load(std::memory_order_relaxed); }

}  // namespace lockstep
