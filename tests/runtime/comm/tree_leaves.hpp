#pragma once
// Leaves for tests of the exact reduction's tree sums (issue 42): values of mixed magnitudes
// and signs, so that any other order of addition shows in the bits.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace troupe::test {

/// Leaf i's `n` values, the same in every process.
inline std::vector<float> tree_leaf(int i, size_t n) {
  std::vector<float> v(n);
  uint64_t h = 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(i + 1);
  for (float& x : v) {
    h = h * 6364136223846793005ULL + 1442695040888963407ULL;
    x = std::ldexp(static_cast<float>(static_cast<int32_t>(h >> 40)) / 8388608.0f,
                   static_cast<int>(h % 30) - 15);
  }
  return v;
}

}  // namespace troupe::test
