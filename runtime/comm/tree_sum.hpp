#pragma once
// One order of summation for a step's micro-batch gradients, whatever the world (issue 42):
// a fixed binary tree over the global micro-batch index. A rank that holds micro-batches
// [a, b) sums them along the tree into the tree's nodes that lie inside [a, b) (its canonical
// pieces); the pieces of every rank, combined in tree order, give the bits that one rank
// holding every micro-batch gives. Floating-point addition is commutative, so only the tree's
// shape decides the result, never which rank or operand comes first.
//
// The tree over M micro-batches: nodes are the dyadic intervals [lo, lo + size) of
// [0, 2^ceil(log2 M)), clipped to [0, M). A leaf is one micro-batch's gradient; an inner node
// is fl(left + right), elementwise; a node whose right half lies past M is its left child
// (no addition).

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace troupe::comm {

/// A node of the tree: the dyadic interval starting at `lo` of `size` (a power of two) leaves,
/// of which those below the tree's M are real.
struct tree_node {
  int lo = 0;
  int size = 1;
  bool operator==(const tree_node&) const = default;
};

/// The smallest power of two at least M (M >= 1): the tree's width.
int tree_width(int M);

/// The largest nodes of M's tree whose real leaves all lie in [a, b), in index order: what a
/// rank holding micro-batches [a, b) sums on its own. Throws std::invalid_argument unless
/// 0 <= a < b <= M.
std::vector<tree_node> canonical_pieces(int M, int a, int b);

/// The gradient-sized buffers the exact reduction adds to a rank that holds leaves
/// [first, first + count) of M's tree (count >= 1), beyond the model's own gradient: one to
/// swap each leaf out of the model, and the accumulator's deepest stack of partial sums
/// (counted as a leaf arrives, before it merges), in either order. Header-only, so that the
/// planner and the preflight memory estimate can use it (runtime/preflight.cpp).
inline int exact_sum_buffers(int M, int first, int count) {
  int width = 1;
  while (width < M) width *= 2;
  int deepest = 0;
  for (const bool descending : {false, true}) {
    std::vector<tree_node> stack;
    for (int k = 0; k < count; ++k) {
      stack.push_back({descending ? first + count - 1 - k : first + k, 1});
      deepest = std::max(deepest, static_cast<int>(stack.size()));
      for (;;) {  // as tree_accumulator merges
        tree_node& top = stack.back();
        if (top.size < width && top.lo % (2 * top.size) == 0 && top.lo + top.size >= M) {
          top.size *= 2;
          continue;
        }
        if (stack.size() < 2) break;
        const tree_node& below = stack[stack.size() - 2];
        const int left = std::min(below.lo, top.lo), right = std::max(below.lo, top.lo);
        if (below.size != top.size || left % (2 * top.size) != 0 || left + top.size != right) break;
        const tree_node parent{left, 2 * top.size};
        stack.pop_back();
        stack.back() = parent;
      }
    }
  }
  return 1 + deepest;
}

/// Sums a rank's leaves, given in ascending index order (or descending, as a GPipe stage's
/// backward passes come), into its canonical pieces: a stack of at most log2(width) + 1
/// partial sums, each merged with its sibling as soon as both exist. Either order gives the
/// same nodes and bits (the addition is commutative).
class tree_accumulator {
 public:
  /// The rank's leaves are micro-batches [first, first + count) of M; each is n floats; they
  /// come from the last down when `descending`.
  tree_accumulator(int M, int first, int count, size_t n, bool descending = false);

  /// Adds leaf `index` (the next one in order; std::invalid_argument otherwise).
  void add_leaf(int index, std::span<const float> gradient);
  /// The same without a copy: takes `gradient` (n floats) and leaves in its place a buffer of
  /// n floats with unspecified contents, reused from merged nodes, so that a step's leaves
  /// allocate nothing once the pool is warm.
  void take_leaf(int index, std::vector<float>& gradient);
  /// Starts over with the same leaves (the next step), keeping every buffer for reuse.
  void reset();

  /// After the last leaf: the canonical pieces, in index order, and their values.
  const std::vector<tree_node>& nodes() const { return nodes_; }
  const std::vector<std::vector<float>>& values() const { return values_; }

 private:
  void check_leaf(int index, size_t size) const;
  void promote_and_merge();
  void finish_if_last();

  int M_, next_, end_, width_;
  size_t n_;
  bool descending_;
  std::vector<tree_node> nodes_;            ///< the stack, bottom first
  std::vector<std::vector<float>> values_;  ///< one per node, n_ floats
  std::vector<std::vector<float>> spare_;   ///< buffers of merged nodes, for take_leaf
  int first_;
};

/// One piece of the whole sum, as a rank holds it.
struct tree_piece {
  tree_node node;
  const float* values = nullptr;  ///< n floats
};

/// Buffers combine_pieces may keep between calls (one per level of the tree it needs), so
/// that a step's combines allocate nothing once warm.
struct tree_scratch {
  std::vector<std::vector<float>> levels;
};

/// The tree's root value (n floats into `out`) from pieces that tile [0, M) exactly (every
/// rank's canonical pieces, in any order): each inner node above them is the sum of its two
/// children, so the result has the bits of one accumulator over [0, M). Each inner node is
/// written once, from its children where they lie (no copies of the pieces). Throws
/// std::invalid_argument when the pieces do not tile [0, M) with nodes of M's tree.
void combine_pieces(int M, std::span<const tree_piece> pieces, size_t n, float* out,
                    tree_scratch& scratch);
void combine_pieces(int M, std::span<const tree_piece> pieces, size_t n, float* out);

}  // namespace troupe::comm
