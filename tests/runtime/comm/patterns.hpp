#pragma once
// Test support: the data every rank contributes to a collective and the answers to check
// against, computed locally. Values are small integers, so sums are exact in float and every
// correct algorithm must match bit for bit.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/comm/communicator.hpp"

namespace troupe::test {

/// Rank `rank`'s contribution at index i.
inline float contribution(int rank, size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>((i * 7 + 3) % 13));
}

/// The all-reduce of contribution() over `size` ranks, as a reference computes it.
inline float reduced(int size, size_t i, comm::reduce_op op) {
  float sum = 0;
  for (int r = 0; r < size; ++r) sum += contribution(r, i);
  return op == comm::reduce_op::sum ? sum : sum / static_cast<float>(size);
}

/// The byte a broadcast from `root` carries at index i.
inline char broadcast_byte(int root, size_t i) {
  return static_cast<char>((root * 31 + i * 7 + 1) & 0xff);
}

/// Empty if `got` is the all-reduce of contribution() over `size` ranks; else the first
/// mismatch, described.
inline std::string check_reduced(const std::vector<float>& got, int size, comm::reduce_op op) {
  for (size_t i = 0; i < got.size(); ++i) {
    const float want = reduced(size, i, op);
    if (got[i] != want) {
      return "index " + std::to_string(i) + " of " + std::to_string(got.size()) + ": got " +
             std::to_string(got[i]) + ", want " + std::to_string(want);
    }
  }
  return {};
}

inline std::vector<float> contributions(int rank, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = contribution(rank, i);
  return v;
}

/// The element counts every collective test covers: empty, one, fewer than the ranks or not
/// divisible by them, small-message path, and a pipelined ring with a ragged tail.
inline const std::vector<size_t>& test_counts() {
  static const std::vector<size_t> counts{0, 1, 7, 1000, (size_t{1} << 20) + 3};
  return counts;
}

/// The byte rank `from` sends rank `to` at index i of an all-to-all block (also used for
/// all-gather with to = -1 and for send/recv with the tag folded into `to`).
inline char exchange_byte(int from, int to, size_t i) {
  return static_cast<char>((from * 61 + to * 17 + i * 13 + 5) & 0xff);
}

/// Bytes rank `from` sends rank `to` in the uneven all-to-all tests: zero for about a quarter
/// of the pairs (including some from a rank to itself), otherwise odd-ish sizes around `base`.
inline size_t uneven_bytes(int from, int to, size_t base) {
  if ((from * 3 + to * 5) % 4 == 0) return 0;
  return base + static_cast<size_t>(from * 7 + to * 13);
}

/// Empty if `got` matches exchange_byte(from, to, i) over [0, n); else the first mismatch.
inline std::string check_exchange(const char* got, size_t n, int from, int to) {
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != exchange_byte(from, to, i)) {
      return "byte " + std::to_string(i) + " of " + std::to_string(n) + " from rank " +
             std::to_string(from) + " is wrong";
    }
  }
  return {};
}

}  // namespace troupe::test
