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

constexpr uintptr_t huge_bytes = uintptr_t{2} << 20;

// A block's pages, whole pages only.
struct page_range {
  uintptr_t begin, end;
};

page_range pages_of(void* block, size_t bytes) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  return {(reinterpret_cast<uintptr_t>(block) + page - 1) & ~(page - 1),
          (reinterpret_cast<uintptr_t>(block) + bytes) & ~(page - 1)};
}

// Huge pages where the kernel has them (THP "madvise" mode): one fault per 2 MiB instead of
// 512, which here makes first touch 20-50x faster. Only the aligned middle of the block. The
// mark stays on the heap's address range after free(), so the engines that reuse it later
// fault in huge pages even where nothing was populated ahead.
void mark_huge(page_range r) {
  const uintptr_t b = (r.begin + huge_bytes - 1) & ~(huge_bytes - 1), e = r.end & ~(huge_bytes - 1);
  if (e > b) (void)::madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
}

// Two levels of faults: the guest kernel's page tables, which MADV_POPULATE_WRITE (Linux
// 5.14) fills at several GB/s, and then the hypervisor's mapping of each page, made on the
// first write from user space (~0.9 GB/s here for small pages, ~0.44 GB/s when both come at
// once, page by page; with huge pages both are fast). One written byte per page leaves the
// range fast for later writes. Works in 2 MiB pieces, asking keep_going before each; returns
// the bytes done.
struct done_bytes {
  size_t populated = 0, written = 0;
  bool stopped = false;
};
done_bytes populate(page_range r, size_t write_bytes, const std::function<bool()>& keep_going) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  done_bytes out;
  for (uintptr_t at = r.begin; at < r.end;) {
    if (keep_going && !keep_going()) {
      out.stopped = true;
      break;
    }
    const uintptr_t stop = std::min(r.end, at + huge_bytes);
#ifdef MADV_POPULATE_WRITE
    (void)::madvise(reinterpret_cast<void*>(at), stop - at, MADV_POPULATE_WRITE);
#endif
    out.populated += stop - at;
    if (at - r.begin < write_bytes) {
      const uintptr_t write_stop = std::min(stop, r.begin + write_bytes);
      for (uintptr_t p = at; p < write_stop; p += page) *reinterpret_cast<volatile char*>(p) = 0;
      out.written += write_stop - at;
    }
    at = stop;
  }
  return out;
}

}  // namespace

void retain_freed_memory() {
  ::mallopt(M_ARENA_MAX, 1);
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: bigger blocks are mapped anyway
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

warmed warm_heap(size_t bytes, size_t written_bytes, const std::function<bool()>& keep_going) {
  std::vector<std::pair<void*, size_t>> blocks;
  for (size_t taken = 0; taken < bytes;) {
    const size_t n = std::min(block_bytes, bytes - taken);
    void* block = std::malloc(n);
    if (block == nullptr) break;
    blocks.emplace_back(block, n);
    mark_huge(pages_of(block, n));
    taken += n;
  }
  warmed out;
  size_t offset = 0;  // of the block in the whole, for the written part
  for (const auto& [block, n] : blocks) {
    const size_t write_here = offset < written_bytes ? std::min(n, written_bytes - offset) : 0;
    const done_bytes d = populate(pages_of(block, n), write_here, keep_going);
    out.populated += d.populated;
    out.written += d.written;
    offset += n;
    if (d.stopped) break;
  }
  for (const auto& [block, n] : blocks) std::free(block);
  return out;
}

}  // namespace troupe::sys
