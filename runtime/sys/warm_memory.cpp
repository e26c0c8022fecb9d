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

// Two levels of faults: the guest kernel's page tables, which MADV_POPULATE_WRITE (Linux
// 5.14) fills in one call at several GB/s, and then the hypervisor's mapping of each page,
// made on the first write from user space (~0.9 GB/s here, ~0.44 GB/s when both come at once,
// page by page). One written byte per page leaves the whole range fast for later writes.
void populate(void* block, size_t bytes, bool write) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(block) + page - 1) & ~(page - 1);
  const auto end = (reinterpret_cast<uintptr_t>(block) + bytes) & ~(page - 1);
#ifdef MADV_POPULATE_WRITE
  if (end > begin)
    (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
#endif
  if (write)
    for (uintptr_t at = begin; at < end; at += page) *reinterpret_cast<volatile char*>(at) = 0;
}

}  // namespace

void retain_freed_memory() {
  ::mallopt(M_ARENA_MAX, 1);
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: bigger blocks are mapped anyway
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

size_t warm_heap(size_t bytes, size_t written_bytes) {
  std::vector<void*> blocks;
  size_t warmed = 0;
  while (warmed < bytes) {
    const size_t n = std::min(block_bytes, bytes - warmed);
    void* block = std::malloc(n);
    if (block == nullptr) break;
    populate(block, n, warmed < written_bytes);
    blocks.push_back(block);
    warmed += n;
  }
  for (void* block : blocks) std::free(block);
  return warmed;
}

}  // namespace troupe::sys
