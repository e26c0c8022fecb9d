// State maps of the backends.

#include "strategies/state_layout.hpp"

namespace troupe::strategies {

namespace {

int64_t cols_of(const std::vector<int64_t>& shape) { return ckpt::as_matrix(shape).second; }

}  // namespace

std::vector<ckpt::placed_piece> pieces_of(const tensor_parallel::tp_gpt& model, int dp,
                                          int dp_index) {
  std::vector<ckpt::placed_piece> out;
  const int tp = model.tp_size();
  for (const tensor_parallel::shard_tensor& s : model.shard_table()) {
    const bool tied_copy = model.holds_tied_copy() && s.local.name == "wte.weight";
    const int64_t local_cols = cols_of(s.local.shape);
    for (const tensor_parallel::shard_box& b : s.boxes) {
      ckpt::placed_piece p;
      p.tensor = s.local.name;
      p.replicas = s.replicated ? dp * tp : dp;
      p.replica_index = s.replicated ? model.tp_rank() * dp + dp_index : dp_index;
      p.saved = !tied_copy;
      const size_t base = s.local.offset + b.local_offset;
      if (b.cols == local_cols) {  // rows lie one after another: one contiguous piece
        p.where = {b.row, b.col, b.rows, b.cols};
        p.local_offset = base;
        out.push_back(p);
        continue;
      }
      for (int64_t i = 0; i < b.rows; ++i) {  // a column slice of a wider local tensor
        p.where = {b.row + i, b.col, 1, b.cols};
        p.local_offset = base + static_cast<size_t>(i * local_cols);
        out.push_back(p);
      }
    }
  }
  return out;
}

std::vector<ckpt::placed_piece> pieces_of(const gpt& model, int holders, int index) {
  std::vector<ckpt::placed_piece> out;
  for (const param_tensor& t : model.param_table()) {
    const auto [rows, cols] = ckpt::as_matrix(t.shape);
    if (t.numel == 0) continue;
    out.push_back({t.name, {0, 0, rows, cols}, t.offset, holders, index, true});
  }
  return out;
}

ckpt::state_map replicated_state_map(std::vector<ckpt::placed_piece> params) {
  ckpt::state_map map;
  map.arrays[1] = params;
  map.arrays[2] = params;
  map.arrays[0] = std::move(params);
  return map;
}

ckpt::state_map zero_state_map(std::vector<ckpt::placed_piece> params, size_t offset, size_t count,
                               int dp) {
  ckpt::state_map map;
  std::vector<ckpt::placed_piece> moments = ckpt::restrict_to(params, offset, count);
  for (ckpt::placed_piece& p : moments) {
    p.replicas /= dp;
    p.replica_index /= dp;
  }
  map.arrays[1] = moments;
  map.arrays[2] = std::move(moments);
  map.arrays[0] = std::move(params);
  return map;
}

std::vector<ckpt::tensor_shape> tensor_table(const model_config& cfg) {
  std::vector<ckpt::tensor_shape> out;
  const gpt whole(cfg);
  for (const param_tensor& t : whole.param_table()) out.push_back({t.name, t.shape, t.offset});
  return out;
}

}  // namespace troupe::strategies
