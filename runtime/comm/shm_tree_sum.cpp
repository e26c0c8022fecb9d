// The shared-memory backend's tree sums (--reduction exact, issue 42). The owner of each slice
// combines every rank's pieces of it in the tree's order, reading them where they lie: in the
// peers' staging, or in their own memory (process_vm_readv). The exact sum then touches memory
// as often as the all-reduce does, where the portable path (communicator.cpp) packs the pieces,
// copies them through all_to_allv and gathers the slices in separate collectives.
#include <algorithm>
#include <cstring>

#include "runtime/comm/shm_communicator_impl.hpp"

namespace troupe::comm::shm_detail {
namespace {

constexpr size_t whole_range_bytes = size_t{4} << 20;

size_t most_pieces(const tree_sum_parts& parts) {
  size_t most = 0;
  for (const auto& p : *parts.pieces) most = std::max(most, p.size());
  return most;
}

}  // namespace

void shm_communicator::all_reduce_tree(const tree_sum_parts& parts, size_t begin, size_t end,
                                       float* out, const op_options& opts) {
  if (auto why = tree_sum_argument_error(id_.rank, id_.size, parts, begin, end, out); !why.empty())
    invalid("all_reduce_tree", why);
  const size_t len = end - begin;
  run("all_reduce_tree", shape_of(op_kind::all_reduce_tree, tree_sum_shape(parts, begin, end)),
      opts, [&](const op_ctx& ctx) {
        if (len == 0) return;
        if (id_.size == 1) {
          combine_alone(parts, begin, len, out + begin, tree_scratch_);
          return;
        }
        const size_t staged = most_pieces(parts) * len * sizeof(float);
        if (staged <= std::min(opts_.small_all_reduce_bytes, layout_.chunk_bytes)) {
          tree_small(ctx, parts, begin, len, out);
          return;
        }
        if (len * sizeof(float) < opts_.single_copy_bytes || !single_copy(ctx)) {
          tree_sliced(ctx, parts, begin, len, out);
          return;
        }
        // Round 1 shares where everything lies; each rank combines its slice from the pieces
        // in place; round 2 says every slice is done, and each rank reads the others' from
        // their owners' `out`; round 3 keeps every buffer still until nobody reads it.
        const auto p = static_cast<size_t>(id_.size);
        const auto r = static_cast<size_t>(id_.rank);
        const auto addresses = share_tree_addresses(ctx, parts, out);
        if (p == 2 && (*parts.pieces)[0].size() <= 1 && (*parts.pieces)[1].size() <= 1 &&
            len * sizeof(float) < whole_range_bytes) {
          // Two ranks with a piece at most each: each reads the other's whole piece once (what
          // it would read of its piece and its result) and combines the whole range, so the
          // result's second read and a round go. Only up to a few MiB: combining everything
          // twice costs more memory traffic than the round saves on larger sums.
          combine_pulled(ctx, parts, addresses, {begin, len}, out + begin);
          complete_round(ctx, next_round());
          return;
        }
        const extent mine = piece(len, p, r);
        combine_pulled(ctx, parts, addresses, {begin + mine.begin, mine.len},
                       out + begin + mine.begin);
        complete_round(ctx, next_round());
        for (size_t j = 0; j < p; ++j) {
          const extent theirs = piece(len, p, j);
          if (j == r || theirs.len == 0) continue;
          const size_t at = begin + theirs.begin;
          pull(ctx, static_cast<int>(j), addresses[j][0] + at * sizeof(float), out + at,
               theirs.len * sizeof(float));
        }
        complete_round(ctx, next_round());
      });
}

void shm_communicator::reduce_scatter_tree(const tree_sum_parts& parts,
                                           std::span<const extent> owned, float* out,
                                           const op_options& opts) {
  if (auto why = tree_sum_argument_error(id_.rank, id_.size, parts, owned, out); !why.empty())
    invalid("reduce_scatter_tree", why);
  size_t longest = 0;
  uint64_t detail = 0;
  for (const extent& e : owned) {
    longest = std::max(longest, e.len);
    detail = detail * 31 + tree_sum_shape(parts, e.begin, e.len);
  }
  bool portable = false;
  run("reduce_scatter_tree", shape_of(op_kind::reduce_scatter_tree, detail), opts,
      [&](const op_ctx& ctx) {
        if (longest == 0) return;
        const extent mine = owned[static_cast<size_t>(id_.rank)];
        if (id_.size == 1) {
          combine_alone(parts, mine.begin, mine.len, out, tree_scratch_);
          return;
        }
        // Small shards go the portable way (one all_to_allv); large ones are read in place.
        if (longest * sizeof(float) < opts_.single_copy_bytes || !single_copy(ctx)) {
          portable = true;
          return;
        }
        const auto addresses = share_tree_addresses(ctx, parts, nullptr);
        combine_pulled(ctx, parts, addresses, mine, out);
        complete_round(ctx, next_round());  // nobody reads this rank's pieces any more
      });
  if (portable) communicator::reduce_scatter_tree(parts, owned, out, opts);
}

/// One round: every rank stages all its pieces' floats, and every rank combines the whole
/// range from everyone's staging (the same tree, so the same bits everywhere).
void shm_communicator::tree_small(const op_ctx& op, const tree_sum_parts& parts, size_t begin,
                                  size_t len, float* out) {
  const uint64_t k = next_round();
  auto* staged = reinterpret_cast<float*>(half(id_.rank, k));
  for (size_t t = 0; t < parts.values.size(); ++t)
    std::memcpy(staged + t * len, parts.values[t] + begin, len * sizeof(float));
  complete_round(op, k);
  tree_pieces_.clear();
  for (int j = 0; j < id_.size; ++j) {
    const auto* theirs = reinterpret_cast<const float*>(half(j, k));
    const auto& nodes = (*parts.pieces)[static_cast<size_t>(j)];
    for (size_t t = 0; t < nodes.size(); ++t) tree_pieces_.push_back({nodes[t], theirs + t * len});
  }
  combine_pieces(parts.M, tree_pieces_, len, out + begin, tree_scratch_);
}

/// Per chunk, two rounds: each rank stages, in owner j's sub-region, its pieces' floats of
/// slice j; owner r combines slice r straight from everyone's sub-region r and stages the
/// result; everyone copies the other slices.
void shm_communicator::tree_sliced(const op_ctx& op, const tree_sum_parts& parts, size_t begin,
                                   size_t len, float* out) {
  const auto p = static_cast<size_t>(id_.size);
  const auto r = static_cast<size_t>(id_.rank);
  const size_t sub = layout_.chunk_bytes / p / cache_line * cache_line;
  const size_t per_owner = std::max<size_t>(1, sub / sizeof(float) / most_pieces(parts));
  const size_t chunk = per_owner * p;
  for (size_t at = 0; at < len; at += chunk) {
    const size_t clen = std::min(chunk, len - at);
    const uint64_t k = next_round();
    for (size_t j = 0; j < p; ++j) {
      const extent e = piece(clen, p, j);
      auto* staged = reinterpret_cast<float*>(half(id_.rank, k) + j * sub);
      for (size_t t = 0; t < parts.values.size(); ++t)
        std::memcpy(staged + t * e.len, parts.values[t] + begin + at + e.begin,
                    e.len * sizeof(float));
    }
    complete_round(op, k);
    const extent mine = piece(clen, p, r);
    float* part = out + begin + at;
    if (mine.len > 0) {
      tree_pieces_.clear();
      for (size_t j = 0; j < p; ++j) {
        const auto* theirs = reinterpret_cast<const float*>(half(static_cast<int>(j), k) + r * sub);
        const auto& nodes = (*parts.pieces)[j];
        for (size_t t = 0; t < nodes.size(); ++t)
          tree_pieces_.push_back({nodes[t], theirs + t * mine.len});
      }
      combine_pieces(parts.M, tree_pieces_, mine.len, part + mine.begin, tree_scratch_);
    }
    const uint64_t k2 = next_round();
    std::memcpy(reinterpret_cast<float*>(half(id_.rank, k2)) + mine.begin, part + mine.begin,
                mine.len * sizeof(float));
    complete_round(op, k2);
    for (size_t j = 0; j < p; ++j) {
      if (j == r) continue;
      const extent theirs = piece(clen, p, j);
      std::memcpy(part + theirs.begin,
                  reinterpret_cast<const float*>(half(static_cast<int>(j), k2)) + theirs.begin,
                  theirs.len * sizeof(float));
    }
  }
}

std::vector<std::vector<uint64_t>> shm_communicator::share_tree_addresses(
    const op_ctx& op, const tree_sum_parts& parts, const float* out) {
  const uint64_t k = next_round();
  auto* mine = reinterpret_cast<uint64_t*>(half(id_.rank, k));
  mine[0] = reinterpret_cast<uint64_t>(out);
  for (size_t t = 0; t < parts.values.size(); ++t)
    mine[1 + t] = reinterpret_cast<uint64_t>(parts.values[t]);
  complete_round(op, k);
  std::vector<std::vector<uint64_t>> all(static_cast<size_t>(id_.size));
  for (int j = 0; j < id_.size; ++j) {
    const auto* theirs = reinterpret_cast<const uint64_t*>(half(j, k));
    all[static_cast<size_t>(j)].assign(theirs,
                                       theirs + 1 + (*parts.pieces)[static_cast<size_t>(j)].size());
  }
  return all;
}

void shm_communicator::combine_pulled(const op_ctx& op, const tree_sum_parts& parts,
                                      const std::vector<std::vector<uint64_t>>& addresses,
                                      extent range, float* out) {
  constexpr size_t block_elems = size_t{32} << 10;  // 128 KiB per piece: the block stays in L2
  size_t pulled = 0;
  for (int j = 0; j < id_.size; ++j)
    if (j != id_.rank) pulled += (*parts.pieces)[static_cast<size_t>(j)].size();
  if (scratch_.size() < pulled * block_elems) scratch_.assign(pulled * block_elems, 0.0f);
  for (size_t at = 0; at < range.len; at += block_elems) {
    const size_t len = std::min(block_elems, range.len - at);
    const size_t from = range.begin + at;
    tree_pieces_.clear();
    size_t slot = 0;
    for (int j = 0; j < id_.size; ++j) {
      const auto& nodes = (*parts.pieces)[static_cast<size_t>(j)];
      for (size_t t = 0; t < nodes.size(); ++t) {
        if (j == id_.rank) {
          tree_pieces_.push_back({nodes[t], parts.values[t] + from});
          continue;
        }
        float* into = scratch_.data() + slot++ * block_elems;
        pull(op, j, addresses[static_cast<size_t>(j)][1 + t] + from * sizeof(float), into,
             len * sizeof(float));
        tree_pieces_.push_back({nodes[t], into});
      }
    }
    combine_pieces(parts.M, tree_pieces_, len, out + at, tree_scratch_);
  }
}

}  // namespace troupe::comm::shm_detail
