// Memory warmed once and freed stays in the process: a later allocation of that size is
// written without page faults, and so is one made after an engine-sized buffer was freed.

#include "runtime/sys/warm_memory.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>
#include <vector>

namespace troupe::sys {
namespace {

long minor_faults() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Page faults taken while allocating and writing `bytes` in 4 MiB vectors (like an engine's
// parameter, gradient and moment buffers), which are then freed.
long faults_to_fill(size_t bytes) {
  const long before = minor_faults();
  {
    std::vector<std::vector<float>> buffers;
    for (size_t done = 0; done < bytes; done += size_t{4} << 20)
      buffers.emplace_back((size_t{4} << 20) / sizeof(float), 1.0f);
  }
  return minor_faults() - before;
}

// One process: mallopt settings are global, so every step is one test in order.
TEST(WarmMemory, WarmedAndFreedMemoryIsReusedWithoutPageFaults) {
  retain_freed_memory();
  constexpr size_t bytes = size_t{64} << 20;
  const long pages = static_cast<long>(bytes / 4096);
  const long cold = faults_to_fill(bytes);
  EXPECT_GT(cold, pages / 2) << "fresh memory is faulted in page by page";
  EXPECT_LT(faults_to_fill(bytes), pages / 20) << "the freed buffers were kept for reuse";

  EXPECT_EQ(warm_heap(0, 0).populated, 0u);
  const warmed all = warm_heap(2 * bytes + 12345, bytes);
  const size_t slack = 9 * 2 * 4096;  // whole pages of each of the 9 blocks only
  EXPECT_GE(all.populated, 2 * bytes + 12345 - slack);
  EXPECT_LE(all.populated, 2 * bytes + 12345);
  EXPECT_GE(all.written, bytes - slack);
  EXPECT_LE(all.written, bytes);
  EXPECT_LT(faults_to_fill(2 * bytes), pages / 10) << "warmed memory needs no fault";
}

// Warming in idle time stops as soon as it is told to, and says how far it got.
TEST(WarmMemory, WritingStopsWhenAskedTo) {
  constexpr size_t bytes = size_t{48} << 20;
  int asked = 0;
  const warmed part = warm_heap(bytes, bytes, [&] { return ++asked <= 3; });
  EXPECT_GT(part.written, size_t{4} << 20) << "three 2 MiB pieces, then stop";
  EXPECT_LE(part.written, size_t{6} << 20);
  EXPECT_EQ(part.populated, part.written);
  const warmed none = warm_heap(bytes, bytes, [] { return false; });
  EXPECT_EQ(none.populated, 0u) << "only marked";
  const warmed whole = warm_heap(bytes, bytes, [] { return true; });
  EXPECT_GE(whole.written, bytes - 4 * 4096);
}

}  // namespace
}  // namespace troupe::sys
