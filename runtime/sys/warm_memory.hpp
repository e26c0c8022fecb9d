#pragma once
// Memory that a new generation's engine finds already touched. In this kind of VM the first
// write to a fresh page costs a trap to the hypervisor (~0.3-0.4 GB/s), while asking the
// kernel to fault a whole range in at once runs at several GB/s and reused heap memory at
// memcpy speed. A worker keeps the memory its old engines free, and fills its heap once,
// off the recovery's critical path, before its first engine is built.

#include <cstddef>

namespace troupe::sys {

/// Makes freed memory stay in this process for reuse: one malloc arena (every thread's
/// engine buffers come from the same heap), heap allocations up to 32 MiB, and no trimming.
/// Call once at process start, before other threads exist.
void retain_freed_memory();

/// Faults `bytes` of heap in (MADV_POPULATE_WRITE, page by page where the kernel lacks it)
/// and frees it again, so the next allocations of that size are already backed. Returns the
/// bytes warmed (blocks of at most 16 MiB; 0 when `bytes` is 0).
size_t warm_heap(size_t bytes);

}  // namespace troupe::sys
