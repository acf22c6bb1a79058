// core/early_start.cpp — core/early_start.h.
#include "core/early_start.h"

namespace lockstep {

namespace {
thread_local bool enabled = false;
}  // namespace

EarlyStartScope::EarlyStartScope() : previous_(enabled) { enabled = true; }
EarlyStartScope::~EarlyStartScope() { enabled = previous_; }

bool early_start_enabled() { return enabled; }

}  // namespace lockstep
