// The tree summation of issue 42: the pieces a rank holds, and that every split of the
// micro-batches among ranks gives the bits one rank gives, on ordinary and adversarial values
// (huge and tiny magnitudes, cancellations, denormals, signed zeros), within the pairwise
// bound of an exact sum.

#include "runtime/comm/tree_sum.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <boost/multiprecision/cpp_int.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <vector>

namespace troupe::comm {
namespace {

using exact = boost::multiprecision::cpp_int;

// Every split of [0, M) into `parts` contiguous non-empty ranges: the shares of `parts` ranks.
void for_each_split(int M, int parts, const std::function<void(const std::vector<int>&)>& f) {
  std::vector<int> cuts;  // the starts of parts 1.., strictly increasing in (0, M)
  std::function<void(int, int)> place = [&](int from, int left) {
    if (left == 0) {
      std::vector<int> bounds{0};
      bounds.insert(bounds.end(), cuts.begin(), cuts.end());
      bounds.push_back(M);
      f(bounds);
      return;
    }
    for (int c = from; c <= M - left; ++c) {
      cuts.push_back(c);
      place(c + 1, left - 1);
      cuts.pop_back();
    }
  };
  place(1, parts - 1);
}

// leaves[i] is micro-batch i's gradient of n floats; `bounds` cut [0, M) among ranks.
std::vector<float> tree_sum_split(const std::vector<std::vector<float>>& leaves,
                                  const std::vector<int>& bounds) {
  const int M = static_cast<int>(leaves.size());
  const size_t n = leaves[0].size();
  std::vector<tree_accumulator> ranks;
  std::vector<tree_piece> pieces;
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    ranks.emplace_back(M, bounds[r], bounds[r + 1] - bounds[r], n);
    for (int i = bounds[r]; i < bounds[r + 1]; ++i)
      ranks.back().add_leaf(i, leaves[static_cast<size_t>(i)]);
  }
  for (const tree_accumulator& acc : ranks) {
    EXPECT_EQ(acc.nodes().size(), acc.values().size());
    for (size_t k = 0; k < acc.nodes().size(); ++k)
      pieces.push_back({acc.nodes()[k], acc.values()[k].data()});
  }
  std::vector<float> out(n, 123.0f);
  combine_pieces(M, pieces, n, out.data());
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A finite float as an integer number of 2^-149 (the smallest denormal): exact.
exact scaled(float x) {
  int e = 0;
  const float m = std::frexp(std::fabs(x), &e);                    // |x| = m * 2^e, m in [0.5, 1)
  const auto mantissa = static_cast<uint32_t>(std::ldexp(m, 24));  // |x| = mantissa * 2^(e-24)
  exact v = mantissa;
  const int shift = e - 24 + 149;
  v = shift >= 0 ? exact(v << shift) : exact(v >> -shift);
  return x < 0 ? exact(-v) : v;
}

TEST(TreeSum, CanonicalPiecesTileTheRangeWithTheLargestNodes) {
  for (int M = 1; M <= 16; ++M) {
    for (int a = 0; a < M; ++a) {
      for (int b = a + 1; b <= M; ++b) {
        const auto pieces = canonical_pieces(M, a, b);
        int x = a;
        for (const tree_node& p : pieces) {
          ASSERT_EQ(p.lo, x) << "M " << M << " [" << a << ", " << b << ")";
          ASSERT_EQ(p.lo % p.size, 0);
          x = std::min(p.lo + p.size, M);
          // Maximal: its parent's real leaves leave [a, b).
          const int parent_lo = p.lo - p.lo % (2 * p.size);
          if (2 * p.size <= tree_width(M)) {
            EXPECT_TRUE(parent_lo < a || std::min(parent_lo + 2 * p.size, M) > b)
                << "M " << M << " [" << a << ", " << b << "): node " << p.lo << "+" << p.size;
          }
        }
        EXPECT_EQ(x, b);
      }
    }
  }
  EXPECT_EQ(canonical_pieces(3, 0, 3), (std::vector<tree_node>{{0, 4}}));
  EXPECT_EQ(canonical_pieces(8, 3, 6), (std::vector<tree_node>{{3, 1}, {4, 2}}));
  EXPECT_THROW(canonical_pieces(4, 2, 2), std::invalid_argument);
}

TEST(TreeSum, EverySplitGivesTheBitsOfOneRank) {
  for (int M = 1; M <= 12; ++M) {
    std::vector<std::vector<float>> leaves(static_cast<size_t>(M), std::vector<float>(5));
    uint64_t h = 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(M);
    for (auto& leaf : leaves)
      for (float& v : leaf) {
        h = h * 6364136223846793005ULL + 1442695040888963407ULL;
        v = std::ldexp(static_cast<float>(static_cast<int32_t>(h >> 40)) / 8388608.0f,
                       static_cast<int>(h % 40) - 20);
      }
    const std::vector<float> one = tree_sum_split(leaves, {0, M});
    for (int parts = 2; parts <= std::min(M, 4); ++parts)
      for_each_split(M, parts, [&](const std::vector<int>& bounds) {
        EXPECT_TRUE(same_bits(tree_sum_split(leaves, bounds), one))
            << "M " << M << ", " << parts << " ranks";
      });
  }
}

// take_leaf (the trainer's path: the model's gradient buffer is swapped in, a spare one comes
// back) gives add_leaf's bits, step after step through reset(), and allocates nothing once the
// first step has filled the pool.
TEST(TreeSum, TakenLeavesAndResetGiveTheBitsOfCopiedOnes) {
  const int M = 8;
  std::vector<std::vector<float>> leaves(M, std::vector<float>(7));
  for (int i = 0; i < M; ++i)
    for (size_t j = 0; j < 7; ++j)
      leaves[static_cast<size_t>(i)][j] =
          std::ldexp(1.0f + 0.1f * static_cast<float>(i), -i) - 0.3f * static_cast<float>(j);
  tree_accumulator copied(M, 3, 5, 7);
  for (int i = 3; i < 8; ++i) copied.add_leaf(i, leaves[static_cast<size_t>(i)]);
  tree_accumulator taken(M, 3, 5, 7);
  for (int step = 0; step < 3; ++step) {
    taken.reset();
    for (int i = 3; i < 8; ++i) {
      std::vector<float> buffer = leaves[static_cast<size_t>(i)];
      taken.take_leaf(i, buffer);
      ASSERT_EQ(buffer.size(), 7u) << "a buffer of n floats comes back";
    }
    ASSERT_EQ(taken.nodes(), copied.nodes());
    for (size_t k = 0; k < copied.values().size(); ++k)
      EXPECT_TRUE(same_bits(taken.values()[k], copied.values()[k])) << "step " << step;
  }
  EXPECT_EQ(canonical_pieces(M, 3, 8), copied.nodes());
  std::vector<float> wrong(6);
  taken.reset();
  EXPECT_THROW(taken.take_leaf(3, wrong), std::invalid_argument);
  EXPECT_THROW(taken.take_leaf(4, leaves[4]), std::invalid_argument) << "out of order";
}

// A GPipe stage's backward passes come from the last micro-batch down: leaves added in
// descending order give the same canonical pieces, in index order, with the same bits, for
// every range of every tree up to 16 leaves (and again after reset).
TEST(TreeSum, DescendingLeavesGiveTheBitsOfAscendingOnes) {
  for (int M = 1; M <= 16; ++M) {
    std::vector<std::vector<float>> leaves(static_cast<size_t>(M), std::vector<float>(3));
    for (int i = 0; i < M; ++i)
      for (size_t j = 0; j < 3; ++j)
        leaves[static_cast<size_t>(i)][j] = std::ldexp(1.0f + 0.37f * static_cast<float>(i + j),
                                                       (i * 7 + static_cast<int>(j)) % 19 - 9);
    for (int a = 0; a < M; ++a)
      for (int b = a + 1; b <= M; ++b) {
        tree_accumulator up(M, a, b - a, 3), down(M, a, b - a, 3, true);
        for (int i = a; i < b; ++i) up.add_leaf(i, leaves[static_cast<size_t>(i)]);
        for (int step = 0; step < 2; ++step) {
          down.reset();
          for (int i = b - 1; i >= a; --i) {
            std::vector<float> buffer = leaves[static_cast<size_t>(i)];
            down.take_leaf(i, buffer);
          }
          ASSERT_EQ(down.nodes(), up.nodes()) << "M " << M << " [" << a << ", " << b << ")";
          for (size_t k = 0; k < up.values().size(); ++k)
            EXPECT_TRUE(same_bits(down.values()[k], up.values()[k]))
                << "M " << M << " [" << a << ", " << b << ") piece " << k;
        }
      }
  }
  tree_accumulator down(8, 2, 4, 3, true);
  EXPECT_THROW(down.add_leaf(2, std::vector<float>(3)), std::invalid_argument) << "5 comes first";
}

// What the planner and the preflight count (exact_sum_buffers) is what the accumulator
// allocates: the buffers that pass through take_leaf, in the worse of the two orders, over two
// steps (the second allocates nothing new).
TEST(TreeSum, TheMemoryEstimateCountsTheBuffersTakeLeafAllocates) {
  for (int M = 1; M <= 16; ++M)
    for (int a = 0; a < M; ++a)
      for (int b = a + 1; b <= M; ++b) {
        size_t most = 0;
        for (const bool descending : {false, true}) {
          tree_accumulator acc(M, a, b - a, 2, descending);
          std::vector<float> buffer(2);  // the backend's leaf_
          std::set<const float*> seen{buffer.data()};
          for (int step = 0; step < 2; ++step) {
            acc.reset();
            for (int k = 0; k < b - a; ++k) {
              acc.take_leaf(descending ? b - 1 - k : a + k, buffer);
              seen.insert(buffer.data());
            }
            for (const auto& v : acc.values()) seen.insert(v.data());
          }
          most = std::max(most, seen.size());
        }
        EXPECT_EQ(most, static_cast<size_t>(exact_sum_buffers(M, a, b - a)))
            << "M " << M << " [" << a << ", " << b << ")";
      }
}

TEST(TreeSum, AdversarialValuesGiveTheSameBitsAndStayWithinTheBoundOfAnExactSum) {
  const float huge = std::ldexp(1.0f, 126), tiny = std::numeric_limits<float>::denorm_min();
  const float u = std::ldexp(1.0f, -24);
  // One column per case, eight micro-batches each.
  const std::vector<std::vector<float>> columns = {
      {huge, -huge, 1.0f, tiny, -1.0f, -tiny, 0.0f, -0.0f},             // cancellations, ±0
      {-0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f},         // -0 stays -0
      {1.0f, u, u, u, u, u, u, u},                                      // absorbed one by one
      {tiny, tiny, tiny, -tiny, 3 * tiny, tiny, -2 * tiny, tiny},       // denormals only
      {huge, huge / 3, -huge, 1e-30f, -huge / 3, 7.0f, 1e30f, -1e30f},  // magnitudes apart
      {1e8f, 1.0f, -1e8f, 1.0f, 1e8f, 1.0f, -1e8f, 1.0f},               // catastrophic cancellation
  };
  const int M = 8;
  std::vector<std::vector<float>> leaves(M, std::vector<float>(columns.size()));
  for (size_t c = 0; c < columns.size(); ++c)
    for (int i = 0; i < M; ++i)
      leaves[static_cast<size_t>(i)][c] = columns[c][static_cast<size_t>(i)];
  const std::vector<float> one = tree_sum_split(leaves, {0, M});
  for (int parts = 2; parts <= 5; ++parts)
    for_each_split(M, parts, [&](const std::vector<int>& bounds) {
      EXPECT_TRUE(same_bits(tree_sum_split(leaves, bounds), one)) << parts << " ranks";
    });
  // Each column against the exact sum: exact where the tree's additions are exact, within
  // the pairwise bound depth * u * sum |x| (plus a denormal's rounding per level) elsewhere.
  const int depth = 3;  // log2 8
  for (size_t c = 0; c < columns.size(); ++c) {
    exact sum = 0, magnitude = 0;
    for (float x : columns[c]) {
      sum += scaled(x);
      magnitude += scaled(std::fabs(x));
    }
    ASSERT_TRUE(std::isfinite(one[c])) << "column " << c;
    const exact error = boost::multiprecision::abs(scaled(one[c]) - sum);
    const exact bound = magnitude * depth / (exact(1) << 24) + depth;
    EXPECT_LE(error, bound) << "column " << c << ": " << one[c];
  }
  EXPECT_EQ(one[0], 0.0f);            // huge - huge, 1 + tiny - 1 - tiny, 0 - 0
  EXPECT_TRUE(std::signbit(one[1]));  // -0 + -0 + ... = -0 on every split
  EXPECT_EQ(one[2], 1.0f + 6 * u);    // one u is lost to the 1, six meet each other first
  EXPECT_EQ(one[3], 5 * tiny);        // denormal additions are exact
  EXPECT_EQ(one[5], 0.0f);            // each 1 is lost to a 1e8 first: 0, the exact sum 4
}

// The test would pass vacuously if the old order gave the same bits: it does not.
TEST(TreeSum, TheRankOrderFoldDiffersFromTheTree) {
  const float u = std::ldexp(1.0f, -24);
  const std::vector<std::vector<float>> leaves = {{1.0f}, {u}, {u}, {u}};
  float fold = 0.0f;
  for (const auto& leaf : leaves) fold += leaf[0];
  EXPECT_EQ(fold, 1.0f);  // each u is absorbed by the 1 before it
  EXPECT_NE(tree_sum_split(leaves, {0, 4})[0], fold);
}

TEST(TreeSum, MisuseIsRefused) {
  tree_accumulator acc(4, 1, 2, 1);
  const float one = 1.0f;
  EXPECT_THROW(acc.add_leaf(2, {&one, 1}), std::invalid_argument);  // out of order
  acc.add_leaf(1, {&one, 1});
  EXPECT_THROW(acc.add_leaf(2, {}), std::invalid_argument);  // wrong size
  EXPECT_THROW(tree_accumulator(4, 3, 2, 1), std::invalid_argument);
  float out = 0;
  const tree_piece gap[] = {{{0, 2}, &one}};  // [2, 4) missing
  EXPECT_THROW(combine_pieces(4, gap, 1, &out), std::invalid_argument);
  const tree_piece twice[] = {{{0, 4}, &one}, {{0, 4}, &one}};
  EXPECT_THROW(combine_pieces(4, twice, 1, &out), std::invalid_argument);
  const tree_piece unaligned[] = {{{1, 2}, &one}, {{0, 1}, &one}, {{3, 1}, &one}};
  EXPECT_THROW(combine_pieces(4, unaligned, 1, &out), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::comm
