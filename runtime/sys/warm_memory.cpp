#include "runtime/sys/warm_memory.hpp"

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace troupe::sys {
namespace {

constexpr size_t block_bytes = size_t{16} << 20;

constexpr size_t check_bytes = size_t{1} << 20;

// Two levels of faults: the guest kernel's page tables, which MADV_POPULATE_WRITE (Linux
// 5.14) fills in one call at several GB/s, and then the hypervisor's mapping of each page,
// made on the first write from user space (~0.9 GB/s here, ~0.44 GB/s when both come at once,
// page by page). One written byte per page leaves the whole range fast for later writes.
// Returns the bytes written, fewer than `write_bytes` when `keep_going` said stop.
size_t populate(void* block, size_t bytes, size_t write_bytes,
                const std::function<bool()>& keep_going) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(block) + page - 1) & ~(page - 1);
  const auto end = (reinterpret_cast<uintptr_t>(block) + bytes) & ~(page - 1);
  // Huge pages where the kernel has them (THP "madvise" mode): one fault per 2 MiB instead
  // of 512, which here makes first touch 20-50x faster. Only the aligned middle of the block.
  const uintptr_t huge = uintptr_t{2} << 20;
  const uintptr_t huge_begin = (begin + huge - 1) & ~(huge - 1), huge_end = end & ~(huge - 1);
  if (huge_end > huge_begin)
    (void)::madvise(reinterpret_cast<void*>(huge_begin), huge_end - huge_begin, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_WRITE
  if (end > begin)
    (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
#endif
  const uintptr_t write_end = std::min(end, begin + write_bytes);
  for (uintptr_t at = begin; at < write_end;) {
    if (keep_going && !keep_going()) return at - begin;
    const uintptr_t stop = std::min(write_end, at + check_bytes);
    for (; at < stop; at += page) *reinterpret_cast<volatile char*>(at) = 0;
  }
  return write_bytes;
}

}  // namespace

void retain_freed_memory() {
  ::mallopt(M_ARENA_MAX, 1);
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: bigger blocks are mapped anyway
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

warmed warm_heap(size_t bytes, size_t written_bytes, const std::function<bool()>& keep_going) {
  std::vector<void*> blocks;
  warmed out;
  bool stopped = false;
  while (out.populated < bytes && !stopped) {
    const size_t n = std::min(block_bytes, bytes - out.populated);
    void* block = std::malloc(n);
    if (block == nullptr) break;
    const size_t to_write =
        out.populated < written_bytes ? std::min(n, written_bytes - out.populated) : 0;
    const size_t wrote = populate(block, n, to_write, keep_going);
    stopped = wrote < to_write;
    blocks.push_back(block);
    out.populated += n;
    out.written += wrote;
  }
  for (void* block : blocks) std::free(block);
  return out;
}

}  // namespace troupe::sys
