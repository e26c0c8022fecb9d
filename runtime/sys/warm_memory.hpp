#pragma once
// Memory that a new generation's engine finds already touched. In this kind of VM the first
// write to a fresh page traps to the hypervisor (~0.44 GB/s when the guest's page tables are
// filled at the same time), while memory the process already wrote is reused at memcpy speed.
// Transparent huge pages take one such trap per 2 MiB: faulted in that way, the heap fills at
// 10-20 GB/s here. A worker keeps the memory its old engines free, and fills its heap once,
// before its first engine is built.

#include <cstddef>
#include <functional>

namespace troupe::sys {

/// Makes freed memory stay in this process for reuse: one malloc arena (every thread's
/// engine buffers come from the same heap), heap allocations up to 32 MiB, and no trimming.
/// Call once at process start, before other threads exist.
void retain_freed_memory();

struct warmed {
  size_t populated = 0;  // bytes faulted in
  size_t written = 0;    // of those, bytes that also got one write per page
};

/// Marks `bytes` of heap for transparent huge pages, faults it in (MADV_POPULATE_WRITE) and
/// frees it again, so that the next allocations of that size are already backed; the first
/// `written_bytes` of it (the blocks the allocator hands out first) also get one write per
/// page, which the hypervisor's mapping needs as well. Blocks of at most 16 MiB, whole pages.
/// A process that warms in its idle time passes `keep_going`: asked before each 2 MiB, it
/// stops the faulting and writing as soon as it says no (a message waits), though the whole
/// range is still marked; a later call redoes the done part at memcpy speed and goes on.
warmed warm_heap(size_t bytes, size_t written_bytes, const std::function<bool()>& keep_going = {});

}  // namespace troupe::sys
