// Box arithmetic of the state map.

#include "checkpoint/state_map.hpp"

#include <algorithm>
#include <stdexcept>

namespace troupe::ckpt {

std::optional<box> intersect(const box& a, const box& b) {
  const int64_t r0 = std::max(a.row, b.row), r1 = std::min(a.row + a.rows, b.row + b.rows);
  const int64_t c0 = std::max(a.col, b.col), c1 = std::min(a.col + a.cols, b.col + b.cols);
  if (r0 >= r1 || c0 >= c1) return std::nullopt;
  return box{r0, c0, r1 - r0, c1 - c0};
}

std::vector<box> sub_boxes(const box& b, size_t first, size_t count) {
  std::vector<box> out;
  if (count == 0 || b.cols <= 0) return out;
  if (first + count > b.numel()) throw std::logic_error("sub_boxes: range runs past the box");
  const auto cols = static_cast<size_t>(b.cols);
  size_t at = first;
  const size_t end = first + count;
  if (at % cols != 0) {  // a partial first row
    const size_t take = std::min(end - at, cols - at % cols);
    out.push_back({b.row + static_cast<int64_t>(at / cols), b.col + static_cast<int64_t>(at % cols),
                   1, static_cast<int64_t>(take)});
    at += take;
  }
  if (end - at >= cols) {  // whole rows
    const size_t rows = (end - at) / cols;
    out.push_back(
        {b.row + static_cast<int64_t>(at / cols), b.col, static_cast<int64_t>(rows), b.cols});
    at += rows * cols;
  }
  if (at < end) {  // a partial last row
    out.push_back(
        {b.row + static_cast<int64_t>(at / cols), b.col, 1, static_cast<int64_t>(end - at)});
  }
  return out;
}

std::optional<int> array_index(std::string_view name) {
  for (size_t i = 0; i < array_names.size(); ++i)
    if (array_names[i] == name) return static_cast<int>(i);
  return std::nullopt;
}

std::vector<placed_piece> restrict_to(const std::vector<placed_piece>& whole, size_t offset,
                                      size_t count) {
  std::vector<placed_piece> out;
  const size_t end = offset + count;
  for (const placed_piece& p : whole) {
    const size_t lo = std::max(offset, p.local_offset);
    const size_t hi = std::min(end, p.local_offset + p.where.numel());
    if (lo >= hi) continue;
    size_t local = lo - offset;
    for (const box& b : sub_boxes(p.where, lo - p.local_offset, hi - lo)) {
      placed_piece q = p;
      q.where = b;
      q.local_offset = local;
      local += b.numel();
      out.push_back(std::move(q));
    }
  }
  return out;
}

void place_into_full(const state_map& map, std::span<const std::span<const float>> buffers,
                     std::span<const tensor_shape> tensors,
                     std::span<const std::span<float>> full) {
  if (buffers.size() != map.arrays.size() || full.size() != map.arrays.size())
    throw std::invalid_argument("place_into_full: expected one buffer per state array");
  for (size_t a = 0; a < map.arrays.size(); ++a) {
    for (const placed_piece& p : map.arrays[a]) {
      if (!p.saved) continue;
      const auto t = std::find_if(tensors.begin(), tensors.end(),
                                  [&](const tensor_shape& x) { return x.name == p.tensor; });
      if (t == tensors.end())
        throw std::invalid_argument("place_into_full: no tensor named " + p.tensor);
      const int64_t cols = as_matrix(t->shape).second;
      if (p.local_offset + p.where.numel() > buffers[a].size())
        throw std::invalid_argument("place_into_full: a piece of " + p.tensor +
                                    " runs past its buffer");
      for (int64_t i = 0; i < p.where.rows; ++i) {
        const size_t from = p.local_offset + static_cast<size_t>(i * p.where.cols);
        const size_t to = t->offset + static_cast<size_t>((p.where.row + i) * cols + p.where.col);
        if (to + static_cast<size_t>(p.where.cols) > full[a].size())
          throw std::invalid_argument("place_into_full: " + p.tensor + " runs past the layout");
        std::copy_n(buffers[a].data() + from, p.where.cols, full[a].data() + to);
      }
    }
  }
}

std::pair<int64_t, int64_t> as_matrix(std::span<const int64_t> shape) {
  if (shape.empty()) return {1, 1};
  if (shape.size() == 1) return {1, shape[0]};
  int64_t cols = 1;
  for (size_t i = 1; i < shape.size(); ++i) cols *= shape[i];
  return {shape[0], cols};
}

}  // namespace troupe::ckpt
