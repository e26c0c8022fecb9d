#include "runtime/sys/warm_memory.hpp"

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace troupe::sys {
namespace {

constexpr size_t block_bytes = size_t{16} << 20;

// MADV_POPULATE_WRITE is Linux 5.14; older kernels refuse it and the block is touched by hand.
void populate(void* block, size_t bytes) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(block) + page - 1) & ~(page - 1);
  const auto end = (reinterpret_cast<uintptr_t>(block) + bytes) & ~(page - 1);
#ifdef MADV_POPULATE_WRITE
  if (end > begin &&
      ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) == 0)
    return;
#endif
  std::memset(block, 0, bytes);
}

}  // namespace

void retain_freed_memory() {
  ::mallopt(M_ARENA_MAX, 1);
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: bigger blocks are mapped anyway
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

size_t warm_heap(size_t bytes) {
  std::vector<void*> blocks;
  size_t warmed = 0;
  while (warmed < bytes) {
    const size_t n = std::min(block_bytes, bytes - warmed);
    void* block = std::malloc(n);
    if (block == nullptr) break;
    populate(block, n);
    blocks.push_back(block);
    warmed += n;
  }
  for (void* block : blocks) std::free(block);
  return warmed;
}

}  // namespace troupe::sys
