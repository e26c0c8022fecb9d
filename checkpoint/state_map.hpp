#pragma once
// Where a rank's training state sits in the single-rank model. A checkpoint is written and
// read in these terms, so that no rank gathers the full model to save it and any layout can
// restore any other's: each rank saves the boxes it holds, and a restore reads, for each box
// it needs, only the saved boxes that overlap it.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::ckpt {

/// A rectangle of a global tensor viewed as 2-D: [rows, cols] for a matrix (cols = the
/// product of the trailing dimensions), [1, n] for a vector. Its elements, row after row, are
/// what a piece of state holds.
struct box {
  int64_t row = 0;
  int64_t col = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  [[nodiscard]] size_t numel() const {
    return static_cast<size_t>(rows) * static_cast<size_t>(cols);
  }
  friend bool operator==(const box&, const box&) = default;
};

/// The overlap of two boxes of the same tensor, nullopt when they do not meet.
std::optional<box> intersect(const box& a, const box& b);

/// Elements [first, first + count) of `b` in row-major order as at most three boxes (a
/// partial first row, whole rows, a partial last row). Requires first + count <= numel.
std::vector<box> sub_boxes(const box& b, size_t first, size_t count);

/// The state arrays every rank holds, in the order of its local buffers.
inline constexpr std::array<std::string_view, 3> array_names = {"params", "exp_avg", "exp_avg_sq"};
/// The index of `name` in array_names, nullopt for another name.
std::optional<int> array_index(std::string_view name);

/// A box of one global tensor held contiguously (row-major, rows of `where.cols`) in a local
/// buffer at `local_offset`. Ranks holding the same values (dp replicas, tp ranks of a
/// replicated tensor) are `replicas` in number; each writes its balanced share of the box, so
/// a checkpoint holds every value once and the work is spread over all of them.
struct placed_piece {
  std::string tensor;  ///< name in the single-rank model
  box where;
  size_t local_offset = 0;
  int replicas = 1;
  int replica_index = 0;
  bool saved = true;  ///< false: restored but never written (a copy another rank saves)
};

/// A rank's state map: for each of its local buffers (array_names order), the pieces in it.
/// The pieces of a buffer need not cover it (e.g. the tied copy of wte on the last pipeline
/// stage is left out: the first stage saves and restores it, and the copy is re-synchronised
/// on the first step).
struct state_map {
  std::array<std::vector<placed_piece>, array_names.size()> arrays;
};

/// The pieces of `whole` (the params map) that fall in local elements [offset, offset +
/// count), moved down by `offset`: the map of a ZeRO-1 shard of the optimizer moments.
std::vector<placed_piece> restrict_to(const std::vector<placed_piece>& whole, size_t offset,
                                      size_t count);

/// A tensor of the single-rank model, as the manifest records it.
struct tensor_shape {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;  ///< first element in the single-rank flat layout
};

/// [rows, cols] of a tensor's 2-D view (a scalar or vector is one row).
std::pair<int64_t, int64_t> as_matrix(std::span<const int64_t> shape);

/// Copies every saved piece of `map` from a rank's `buffers` into `full` (array_names order,
/// each the single-rank flat layout that `tensors` describes). With every rank's state placed
/// this way, `full` is the whole model: what tests compare and what a replica rebuilds.
/// Throws std::invalid_argument for a piece of an unknown tensor or outside a buffer.
void place_into_full(const state_map& map, std::span<const std::span<const float>> buffers,
                     std::span<const tensor_shape> tensors, std::span<const std::span<float>> full);

}  // namespace troupe::ckpt
