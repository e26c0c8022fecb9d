#pragma once
// Arithmetic every CPU backend's collectives share: how a buffer is cut into pieces, the
// vectorisable sum, the average, and the argument checks of all_to_allv.

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "runtime/balanced_split.hpp"

namespace troupe::comm {

/// A run of elements [begin, begin + len).
struct extent {
  size_t begin;
  size_t len;
};

/// Piece `i` of `n` elements cut into `parts` consecutive pieces whose lengths differ by at
/// most one (the first n % parts are the longer ones).
inline extent piece(size_t n, size_t parts, size_t i) {
  const balanced_run r = balanced_part(n, parts, i);
  return {r.offset, r.count};
}

inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/// The sum of the squares of `n` values, in double: eight running sums over the elements in
/// turn, added in a fixed order at the end, so the bits depend only on the values (every rank
/// holding the same reduced gradients gets the same norm), and the sums are independent chains
/// the CPU overlaps (one chain waits on each addition: 4x slower on a 3-million-value model).
inline double sum_of_squares(const float* values, size_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (size_t k = 0; k < 8; ++k) s[k] += static_cast<double>(values[i + k]) * values[i + k];
  for (; i < n; ++i) s[i % 8] += static_cast<double>(values[i]) * values[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/// dst += src. The fixed-width inner loop is vectorised even at -O2's cheap cost model.
inline void add_into(float* __restrict dst, const float* __restrict src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (size_t j = 0; j < 16; ++j) dst[i + j] += src[i + j];
  }
  for (; i < n; ++i) dst[i] += src[i];
}

/// dst = a + b, elementwise (dst may be a or b: each element is read before it is written).
/// Vectorised as add_into is; the bits are those of the scalar loop (one rounding per element).
inline void add_pair(float* dst, const float* a, const float* b, size_t n) {
  if (dst == a) return add_into(dst, b, n);
  if (dst == b) return add_into(dst, a, n);  // addition is commutative: the same bits
  const auto sum = [](float* __restrict d, const float* __restrict x, const float* __restrict y,
                      size_t len) {
    size_t i = 0;
    for (; i + 16 <= len; i += 16) {
      for (size_t j = 0; j < 16; ++j) d[i + j] = x[i + j] + y[i + j];
    }
    for (; i < len; ++i) d[i] = x[i] + y[i];
  };
  sum(dst, a, b, n);
}

/// Average is the sum divided by the group size, exactly as a reference would compute it.
inline void divide(float* p, size_t n, float d) {
  for (size_t i = 0; i < n; ++i) p[i] /= d;
}

/// all_to_allv's block offsets: offsets[j] where the block for rank j starts in the send
/// buffer, offsets[p + j] where the block from rank j starts in the receive buffer.
inline void all_to_allv_offsets(const std::vector<size_t>& send_bytes,
                                const std::vector<size_t>& recv_bytes,
                                std::vector<size_t>& offsets) {
  const size_t p = send_bytes.size();
  offsets.resize(2 * p);
  size_t s = 0;
  size_t d = 0;
  for (size_t j = 0; j < p; ++j) {
    offsets[j] = s;
    offsets[p + j] = d;
    s += send_bytes[j];
    d += recv_bytes[j];
  }
}

/// What is wrong with all_to_allv's arguments on rank `rank` of `size`, or "" when nothing.
std::string all_to_allv_argument_error(int rank, int size, const void* in,
                                       const std::vector<size_t>& send_bytes, const void* out,
                                       const std::vector<size_t>& recv_bytes);

}  // namespace troupe::comm
