// core/dependent_launch.cuh — the device side of an early start (core/early_start.h,
// LaunchConfig::early_start): PTX griddepcontrol. Both calls are no-ops in a kernel that was not
// launched with an early start, or whose next kernel is not.
//
// A kernel that may be launched early calls wait_for_previous_kernel() before it reads anything
// the kernels before it wrote or writes anything they read, and let_next_kernel_start() only after
// that wait: then, by induction, every kernel queued before an early-started one has ended once its
// wait returns, however many early starts are chained.
#pragma once

namespace lockstep {

// Blocks until the kernel queued before this one on the stream has ended and its writes are visible.
__device__ __forceinline__ void wait_for_previous_kernel() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// Lets the next kernel on the stream start (when it was launched early) once every CTA of this one
// has called this or ended; its CTAs then take the SM room this kernel's leave.
__device__ __forceinline__ void let_next_kernel_start() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

}  // namespace lockstep
