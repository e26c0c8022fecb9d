#include "runtime/comm/tree_sum.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "runtime/comm/collective_math.hpp"

namespace troupe::comm {
namespace {

// The real leaves of `node` in M's tree: [lo, min(lo + size, M)).
int real_end(const tree_node& node, int M) { return std::min(node.lo + node.size, M); }

void add_into(std::vector<float>& left, const std::vector<float>& right) {
  comm::add_into(left.data(), right.data(), left.size());
}

}  // namespace

int tree_width(int M) {
  if (M < 1) throw std::invalid_argument("tree_width: M must be at least 1");
  int w = 1;
  while (w < M) w *= 2;
  return w;
}

std::vector<tree_node> canonical_pieces(int M, int a, int b) {
  if (!(0 <= a && a < b && b <= M))
    throw std::invalid_argument("canonical_pieces: need 0 <= a < b <= M, got a " +
                                std::to_string(a) + ", b " + std::to_string(b) + ", M " +
                                std::to_string(M));
  const int width = tree_width(M);
  std::vector<tree_node> out;
  for (int x = a; x < b;) {
    // The largest node starting at x (aligned to its size) whose real leaves end by b.
    int size = 1;
    while (size < width && x % (2 * size) == 0 && std::min(x + 2 * size, M) <= b) size *= 2;
    out.push_back({x, size});
    x = real_end(out.back(), M);
  }
  return out;
}

tree_accumulator::tree_accumulator(int M, int first, int count, size_t n, bool descending)
    : M_(M),
      next_(descending ? first + count - 1 : first),
      end_(first + count),
      width_(tree_width(M)),
      n_(n),
      descending_(descending),
      first_(first) {
  if (!(0 <= first && count > 0 && end_ <= M))
    throw std::invalid_argument("tree_accumulator: leaves [" + std::to_string(first) + ", " +
                                std::to_string(end_) + ") are not within [0, " + std::to_string(M) +
                                ")");
}

void tree_accumulator::check_leaf(int index, size_t size) const {
  if (index != next_ || index >= end_ || index < first_)
    throw std::invalid_argument("tree_accumulator: leaf " + std::to_string(index) +
                                " out of order (expected " + std::to_string(next_) + ")");
  if (size != n_)
    throw std::invalid_argument("tree_accumulator: a leaf of " + std::to_string(size) +
                                " floats, expected " + std::to_string(n_));
}

void tree_accumulator::add_leaf(int index, std::span<const float> gradient) {
  check_leaf(index, gradient.size());
  next_ += descending_ ? -1 : 1;
  nodes_.push_back({index, 1});
  if (spare_.empty()) {
    values_.emplace_back(gradient.begin(), gradient.end());
  } else {
    values_.push_back(std::move(spare_.back()));
    spare_.pop_back();
    std::copy(gradient.begin(), gradient.end(), values_.back().begin());
  }
  promote_and_merge();
}

void tree_accumulator::take_leaf(int index, std::vector<float>& gradient) {
  check_leaf(index, gradient.size());
  next_ += descending_ ? -1 : 1;
  nodes_.push_back({index, 1});
  std::vector<float> replacement;
  if (spare_.empty()) {
    replacement.resize(n_);
  } else {
    replacement = std::move(spare_.back());
    spare_.pop_back();
  }
  values_.push_back(std::move(gradient));
  gradient = std::move(replacement);
  promote_and_merge();
}

void tree_accumulator::reset() {
  for (auto& v : values_) spare_.push_back(std::move(v));
  values_.clear();
  nodes_.clear();
  next_ = descending_ ? end_ - 1 : first_;
}

void tree_accumulator::promote_and_merge() {
  for (;;) {
    tree_node& top = nodes_.back();
    // A left child whose sibling lies past M is its parent too: no addition, no new node.
    if (top.size < width_ && top.lo % (2 * top.size) == 0 && top.lo + top.size >= M_) {
      top.size *= 2;
      continue;
    }
    if (nodes_.size() < 2) return finish_if_last();
    const tree_node& below = nodes_[nodes_.size() - 2];
    // Ascending, the new node is the right sibling; descending, the left one.
    const int left = std::min(below.lo, top.lo), right = std::max(below.lo, top.lo);
    const bool siblings =
        below.size == top.size && left % (2 * top.size) == 0 && left + top.size == right;
    if (!siblings) return finish_if_last();
    const tree_node parent{left, 2 * top.size};
    add_into(values_[values_.size() - 2], values_.back());
    spare_.push_back(std::move(values_.back()));
    values_.pop_back();
    nodes_.pop_back();  // `top` with it
    nodes_.back() = parent;
  }
}

void tree_accumulator::finish_if_last() {
  // Descending, the stack holds the pieces from the last down: nodes() gives index order.
  if (descending_ && next_ < first_) {
    std::reverse(nodes_.begin(), nodes_.end());
    std::reverse(values_.begin(), values_.end());
  }
}

void combine_pieces(int M, std::span<const tree_piece> pieces, size_t n, float* out) {
  tree_scratch scratch;
  combine_pieces(M, pieces, n, out, scratch);
}

void combine_pieces(int M, std::span<const tree_piece> pieces, size_t n, float* out,
                    tree_scratch& scratch) {
  const int width = tree_width(M);
  std::map<int, tree_piece> by_lo;
  for (const tree_piece& p : pieces) {
    if (p.node.size < 1 || p.node.size > width || (p.node.size & (p.node.size - 1)) != 0 ||
        p.node.lo < 0 || p.node.lo % p.node.size != 0 || p.node.lo >= M ||
        !by_lo.emplace(p.node.lo, p).second)
      throw std::invalid_argument("combine_pieces: a piece at " + std::to_string(p.node.lo) +
                                  " of size " + std::to_string(p.node.size) +
                                  " is not a node of the tree over " + std::to_string(M) +
                                  " leaves, or is given twice");
  }
  for (int x = 0; x < M;) {
    const auto it = by_lo.find(x);
    if (it == by_lo.end())
      throw std::invalid_argument("combine_pieces: no piece starts at leaf " + std::to_string(x));
    x = real_end(it->second.node, M);
  }
  // Node (lo, size)'s value: a given piece where it lies, else the sum of its children
  // written into `dst`. The left child may use `dst` too (it is read before the sum lands
  // there, element by element); the right one uses this depth's scratch buffer, which no
  // node above it is still reading. The recursion is as deep as the tree (log2 of the width).
  auto eval = [&](auto&& self, int lo, int size, float* dst, size_t depth) -> const float* {
    if (const auto it = by_lo.find(lo); it != by_lo.end() && it->second.node.size == size)
      return it->second.values;
    if (size == 1)
      throw std::invalid_argument("combine_pieces: leaf " + std::to_string(lo) +
                                  " lies inside another piece");
    const int half = size / 2;
    const float* left = self(self, lo, half, dst, depth + 1);
    if (lo + half >= M) return left;  // the right half is past M: this node is its left child
    if (scratch.levels.size() <= depth) scratch.levels.resize(depth + 1);
    if (scratch.levels[depth].size() < n) scratch.levels[depth].resize(n);
    const float* right = self(self, lo + half, half, scratch.levels[depth].data(), depth + 1);
    add_pair(dst, left, right, n);
    return dst;
  };
  const float* root = eval(eval, 0, width, out, 0);
  if (root != out) std::copy_n(root, n, out);
}

}  // namespace troupe::comm
