// The read side of a version 2 checkpoint: each rank reads, for every box it holds in its
// new layout, just the chunks of the saved boxes that overlap it, each verified against its
// hash. Independent of the layout that wrote the checkpoint.

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <span>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/durable_io.hpp"
#include "checkpoint/format.hpp"
#include "checkpoint/manifest.hpp"

namespace troupe::ckpt {

namespace fs = std::filesystem;

namespace {

using piece_index = std::map<std::pair<int, std::string>, std::vector<const saved_piece*>>;

piece_index index_pieces(const manifest& m) {
  piece_index out;
  for (const saved_piece& p : m.pieces) out[{p.array, p.tensor}].push_back(&p);
  return out;
}

/// Every chunk a restore reads, in reading order, and how many row-runs use each.
struct read_plan {
  std::vector<chunk_key> order;
  std::map<chunk_key, size_t> uses;
};

/// Decoded chunks of one restore, so a chunk that several boxes need is read once. A chunk
/// leaves after its last use and its buffer serves the next chunk (fresh memory is slow to
/// touch the first time); everything is dropped if the cache still grows past a budget.
class chunk_cache {
 public:
  chunk_cache(const std::string& run_dir, const manifest& m, restore_stats& stats,
              const memory_source& memory, read_plan plan)
      : run_dir_(run_dir), m_(m), stats_(stats), memory_(memory), plan_(std::move(plan)) {
    for (size_t i = 0; i < plan_.order.size(); ++i) position_.emplace(plan_.order[i], i);
  }

  /// One use of chunk `key` is over; after its last one its buffer is kept for reuse.
  void done(const chunk_key& key) {
    const auto uses = plan_.uses.find(key);
    if (uses == plan_.uses.end() || uses->second == 0 || --uses->second > 0) return;
    const auto it = cache_.find(key);
    if (it == cache_.end()) return;
    held_ -= it->second.size();
    spare_.push_back(std::move(it->second));
    cache_.erase(it);
  }

  const std::vector<float>& get(const saved_piece& p, size_t index) {
    const chunk_key& key = p.chunks[index];
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    announce_from(key);
    const chunk_extent extent = extent_of(p, index, m_.chunk_floats);
    if (held_ + extent.max_floats > budget_floats) {
      for (auto& [k, v] : cache_) spare_.push_back(std::move(v));  // their memory is reused
      cache_.clear();
      held_ = 0;
    }
    const std::string context = m_.array_name(p.array) + " of " + p.tensor + ", chunk " +
                                std::to_string(index) + " of the piece of rank " +
                                std::to_string(p.rank) + ", checkpoint step " +
                                std::to_string(m_.step);
    std::vector<float> buffer;
    if (!spare_.empty()) {
      buffer = std::move(spare_.back());
      spare_.pop_back();
    } else {
      buffer.reserve(m_.chunk_floats);  // big enough for any chunk it will hold next
    }
    const bool from_memory = memory_.fetch && memory_.fetch(key, buffer) &&
                             buffer.size() >= extent.min_floats &&
                             buffer.size() <= extent.max_floats &&
                             key_of(buffer.data(), buffer.size() * sizeof(float)) == key;
    if (from_memory)
      stats_.bytes_from_memory += buffer.size() * sizeof(float);
    else
      chunk_file::read_range_into(run_dir_, key, extent.min_floats, extent.max_floats, context,
                                  buffer);
    auto [it, inserted] = cache_.emplace(key, std::move(buffer));
    held_ += it->second.size();
    stats_.bytes_read += it->second.size() * sizeof(float);
    ++stats_.chunks_read;
    return it->second;
  }

 private:
  // Tells the memory source the next window of chunks, from `key` on, once the fetches reach
  // what it was told last: one round trip per window instead of one per chunk.
  void announce_from(const chunk_key& key) {
    if (!memory_.prefetch) return;
    const auto at = position_.find(key);
    if (at == position_.end() || at->second < announced_) return;
    size_t end = at->second + 1;
    size_t floats = m_.chunk_floats;
    while (end < plan_.order.size() && floats + m_.chunk_floats <= budget_floats) {
      floats += m_.chunk_floats;
      ++end;
    }
    memory_.prefetch(std::span(plan_.order).subspan(at->second, end - at->second));
    announced_ = end;
  }

  static constexpr size_t budget_floats = size_t{4} << 20;  // 16 MiB, then reused
  const std::string& run_dir_;
  const manifest& m_;
  restore_stats& stats_;
  const memory_source& memory_;
  read_plan plan_;
  std::map<chunk_key, size_t> position_;  // in plan_.order
  size_t announced_ = 0;  // plan_.order[0, announced_) were told to the memory source
  std::map<chunk_key, std::vector<float>> cache_;
  std::vector<std::vector<float>> spare_;
  size_t held_ = 0;
};

/// Copies elements [first, first + count) of saved piece `q` (row-major) to `out`.
void copy_run(chunk_cache& cache, const saved_piece& q, size_t chunk_floats, size_t first,
              size_t count, float* out) {
  first += static_cast<size_t>(q.offset);  // the box's place in its chunks
  while (count > 0) {
    const size_t index = first / chunk_floats;
    const size_t within = first % chunk_floats;
    const std::vector<float>& chunk = cache.get(q, index);
    const size_t take = std::min(count, chunk.size() - within);
    std::memcpy(out, chunk.data() + within, take * sizeof(float));
    cache.done(q.chunks[index]);
    out += take;
    first += take;
    count -= take;
  }
}

}  // namespace

namespace {

/// Calls `run(q, first, count, out)` for every row-run of a saved piece `q` that one of `map`'s
/// pieces needs: elements [first, first + count) of q (row-major) go to `out` in `buffers`.
/// Throws when the checkpoint does not fit the map (another model, a piece not covered).
template <class Run>
void for_each_run(const manifest& m, const state_map& map, const piece_index& index,
                  std::span<const std::span<float>> buffers, const fs::path& where, Run run) {
  for (size_t a = 0; a < map.arrays.size(); ++a) {
    for (const placed_piece& p : map.arrays[a]) {
      const auto group = index.find({static_cast<int>(a), p.tensor});
      if (group == index.end()) {
        io::fail(error_kind::incompatible, where,
                 "has no " + m.array_name(static_cast<int>(a)) + " of tensor " + p.tensor +
                     ": it was written for another model. Resume with the checkpoint's config.");
      }
      if (p.local_offset + p.where.numel() > buffers[a].size())
        io::fail(error_kind::invalid_argument, where, "a box runs past its local buffer");
      size_t filled = 0;
      for (const saved_piece* q : group->second) {
        const auto overlap = intersect(p.where, q->where);
        if (!overlap) continue;
        for (int64_t r = overlap->row; r < overlap->row + overlap->rows; ++r) {
          const auto from = static_cast<size_t>((r - q->where.row) * q->where.cols +
                                                (overlap->col - q->where.col));
          const auto to = p.local_offset + static_cast<size_t>((r - p.where.row) * p.where.cols +
                                                               (overlap->col - p.where.col));
          run(*q, from, static_cast<size_t>(overlap->cols), buffers[a].data() + to);
        }
        filled += overlap->numel();
      }
      if (filled != p.where.numel())
        io::fail(error_kind::corrupt, where,
                 "does not cover the " + m.array_name(static_cast<int>(a)) + " of " + p.tensor +
                     " that this rank holds");
    }
  }
}

}  // namespace

restore_stats restore_into(const std::string& run_dir, const manifest& m, const state_map& map,
                           std::span<const std::span<float>> buffers, const memory_source& memory) {
  const fs::path where = format::step_dir(run_dir, m.step) / format::manifest_name;
  if (m.format_version != 2 && m.format_version != workload_format_version)
    io::fail(error_kind::invalid_argument, where, "restore_into reads format 2 and 3 checkpoints");
  manifest_json::validate(m, where, error_kind::invalid_argument);
  if (buffers.size() != map.arrays.size())
    io::fail(error_kind::invalid_argument, where, "the state has the wrong number of buffers");
  const piece_index index = index_pieces(m);
  // First the plan: which chunks, in which order, each used how often. A memory source that
  // can prefetch learns the order; the cache frees each chunk after its last use.
  read_plan plan;
  for_each_run(m, map, index, buffers, where,
               [&](const saved_piece& q, size_t first, size_t count, float*) {
                 if (count == 0) return;
                 first += static_cast<size_t>(q.offset);
                 const size_t last = (first + count - 1) / m.chunk_floats;
                 for (size_t c = first / m.chunk_floats; c <= last && c < q.chunks.size(); ++c)
                   if (plan.uses[q.chunks[c]]++ == 0) plan.order.push_back(q.chunks[c]);
               });
  restore_stats stats;
  chunk_cache cache(run_dir, m, stats, memory, std::move(plan));
  for_each_run(m, map, index, buffers, where,
               [&](const saved_piece& q, size_t first, size_t count, float* out) {
                 copy_run(cache, q, m.chunk_floats, first, count, out);
               });
  return stats;
}

state_map full_state_map(const manifest& m) {
  state_map map;
  const std::vector<std::string> arrays = m.state_arrays();
  for (size_t a = 0; a < map.arrays.size() && a < arrays.size(); ++a) {
    for (const tensor_entry& t : m.tensors) {
      if (!t.array.empty() && t.array != arrays[a]) continue;  // format 3: its own array only
      const auto [rows, cols] = t.matrix();
      if (rows * cols == 0) continue;
      map.arrays[a].push_back({t.name, {0, 0, rows, cols}, t.offset, 1, 0});
    }
  }
  return map;
}

std::vector<float> load_full_params(const std::string& run_dir, const manifest& m) {
  if (m.format_version == shard_format_version) return load_full_state(run_dir, m).params;
  state_map map = full_state_map(m);
  for (size_t a = 1; a < map.arrays.size(); ++a) map.arrays[a].clear();  // not the moments
  std::vector<float> params(m.global_numel, 0.0f);
  const std::array<std::span<float>, array_names.size()> buffers = {params, {}, {}};
  restore_into(run_dir, m, map, buffers);
  return params;
}

full_state load_full_state_v2(const std::string& run_dir, const manifest& m) {
  full_state out;
  out.step = m.step;
  out.seed = m.seed;
  out.rng_state = m.seed;
  out.adam_t = m.adam_t;
  out.params.assign(m.global_numel, 0.0f);
  out.exp_avg.assign(m.global_numel, 0.0f);
  out.exp_avg_sq.assign(m.global_numel, 0.0f);
  const std::span<float> buffers[] = {out.params, out.exp_avg, out.exp_avg_sq};
  restore_into(run_dir, m, full_state_map(m), buffers);
  return out;
}

}  // namespace troupe::ckpt
