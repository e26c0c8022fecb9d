#pragma once
// Memory that a new generation's engine finds already touched. In this kind of VM the first
// write to a fresh page traps to the hypervisor (~0.44 GB/s when the guest's page tables are
// filled at the same time), while memory the process already wrote is reused at memcpy speed.
// A worker keeps the memory its old engines free, and fills its heap once, before its first
// engine is built.

#include <cstddef>

namespace troupe::sys {

/// Makes freed memory stay in this process for reuse: one malloc arena (every thread's
/// engine buffers come from the same heap), heap allocations up to 32 MiB, and no trimming.
/// Call once at process start, before other threads exist.
void retain_freed_memory();

/// Faults `bytes` of heap in (MADV_POPULATE_WRITE) and frees it again, so that the next
/// allocations of that size are already backed; the first `written_bytes` of it (the blocks
/// the allocator hands out first) also get one write per page, which the hypervisor's mapping
/// needs as well. Returns the bytes warmed (blocks of at most 16 MiB; 0 when `bytes` is 0).
size_t warm_heap(size_t bytes, size_t written_bytes);

}  // namespace troupe::sys
