#include "actors/worker/program_state.hpp"

#include <cstring>

namespace troupe::actors {
namespace {

size_t array_slot(const std::string& array) {
  for (size_t k = 0; k < ckpt::workload_array_names.size(); ++k)
    if (ckpt::workload_array_names[k] == array) return k;
  throw workload_error("state array '" + array + "' is not one of model, optim, extra");
}

ckpt::placed_piece piece_of(const placed_box& b, size_t offset, bool whole) {
  ckpt::placed_piece p;
  p.tensor = b.tensor;
  p.where = {b.where.row, b.where.col, b.where.rows, b.where.cols};
  p.local_offset = offset;
  p.replicas = whole ? 1 : b.replicas;
  p.replica_index = whole ? 0 : b.replica_index;
  p.saved = b.saved;
  return p;
}

}  // namespace

std::vector<std::span<const float>> packed_state::readable() const {
  return {words.begin(), words.end()};
}

std::vector<std::span<float>> packed_state::writable() { return {words.begin(), words.end()}; }

packed_state pack_program_state(const state_view& view, bool whole) {
  if (view.tensors.size() != view.regions.size())
    throw workload_error("a program's state has one region per tensor");
  packed_state out;
  std::array<size_t, ckpt::workload_array_names.size()> size{};
  for (const tensor_decl& t : view.tensors) size[array_slot(t.array)] += t.words();
  for (size_t k = 0; k < size.size(); ++k) out.words[k].assign(size[k], 0.0f);
  std::array<size_t, ckpt::workload_array_names.size()> at{};
  for (size_t i = 0; i < view.tensors.size(); ++i) {
    const tensor_decl& t = view.tensors[i];
    const state_region& r = view.regions[i];
    const size_t k = array_slot(t.array);
    if (r.bytes.size() < t.bytes())
      throw workload_error("tensor " + t.name + "'s memory is smaller than its shape");
    if (t.bytes() > 0) std::memcpy(out.words[k].data() + at[k], r.bytes.data(), t.bytes());
    for (const placed_box& b : r.pieces) out.map.arrays[k].push_back(piece_of(b, at[k], whole));
    at[k] += t.words();
  }
  return out;
}

ckpt::restore_stats restore_program_checkpoint(workload_generation& gen, const std::string& run_dir,
                                               const ckpt::manifest& man,
                                               const ckpt::memory_source& memory) {
  if (man.format_version < ckpt::workload_format_version)
    throw workload_error("checkpoint " + std::to_string(man.step) +
                         " holds the built-in model's state, not a program's: resume it "
                         "without `-- PROGRAM`, or start a new run directory");
  std::vector<tensor_decl> table;
  for (const ckpt::tensor_entry& t : man.tensors) {
    tensor_decl d;
    d.name = t.name;
    d.array = t.array;
    d.shape = t.shape;
    d.type = t.type;
    d.role = t.array == "optim"   ? tensor_role::optimizer
             : t.array == "extra" ? tensor_role::extra
                                  : tensor_role::parameter;
    table.push_back(std::move(d));
  }
  gen.begin_restore(table, man.extras_json);
  try {
    const state_view room = gen.state();
    packed_state packed = pack_program_state(room, true);
    const auto buffers = packed.writable();
    const ckpt::restore_stats stats = ckpt::restore_into(run_dir, man, packed.map, buffers, memory);
    std::array<size_t, ckpt::workload_array_names.size()> at{};
    for (size_t i = 0; i < room.tensors.size(); ++i) {
      const tensor_decl& t = room.tensors[i];
      const size_t k = array_slot(t.array);
      if (t.bytes() > 0)
        std::memcpy(room.regions[i].bytes.data(), packed.words[k].data() + at[k], t.bytes());
      at[k] += t.words();
    }
    gen.end_restore();
    return stats;
  } catch (...) {
    gen.cancel_restore();
    throw;
  }
}

}  // namespace troupe::actors
