// The gloo backend's tree sums (--reduction exact, issue 42). Each rank sends every owner its
// pieces' floats of the owner's slice straight from the pieces, in segments; the owner combines
// a segment in the tree's order as soon as all of it has arrived, and (for the all-reduce)
// sends the combined segment on to everyone while later segments are still in flight, as the
// ring all-reduce overlaps its steps. The bytes are the all-reduce's whenever each rank holds
// one piece; the portable path (communicator.cpp) packed the pieces, waited for a whole
// all_to_allv before combining and gathered in a second collective.
#include <algorithm>
#include <climits>

#include "runtime/comm/gloo_communicator_impl.hpp"

namespace troupe::comm::gloo_detail {
void gloo_communicator::all_reduce_tree(const tree_sum_parts& parts, size_t begin, size_t end,
                                        float* out, const op_options& opts) {
  if (auto why = tree_sum_argument_error(id_.rank, id_.size, parts, begin, end, out); !why.empty())
    invalid("all_reduce_tree", why);
  run("all_reduce_tree", op_kind::all_reduce_tree, tree_sum_shape(parts, begin, end), opts,
      [&](const op_ctx& ctx) {
        const size_t len = end - begin;
        if (len == 0) return;
        if (id_.size == 1) return combine_alone(parts, begin, len, out + begin, tree_scratch_);
        const auto p = static_cast<size_t>(id_.size);
        if (p == 2 && (*parts.pieces)[0].size() == 1 && (*parts.pieces)[1].size() == 1 &&
            len * sizeof(float) <= (size_t{2} << 20)) {
          // Two pieces make one addition per float, whatever its order: the ring all-reduce's
          // sum of two ranks (x0 + x1 per block) has the tree's bits, and on small sums its
          // two steps beat the exchange below. The piece is read where it is.
          all_reduce_ring_into(ctx, parts.values[0] + begin, out + begin, len);
          return;
        }
        // Two ranks that hold a piece at most each send one another what a reduce-scatter
        // and an all-gather would (the whole range, one way or both) in one exchange instead
        // of two: each owns the whole range and combines it all.
        const bool whole_range =
            p == 2 && (*parts.pieces)[0].size() <= 1 && (*parts.pieces)[1].size() <= 1;
        std::vector<extent> slices(p);
        for (size_t j = 0; j < p; ++j) {
          const extent e = whole_range ? extent{0, len} : piece(len, p, j);
          slices[j] = {begin + e.begin, e.len};
        }
        tree_exchange(ctx, parts, slices, out, 0, !whole_range);
      });
}

void gloo_communicator::reduce_scatter_tree(const tree_sum_parts& parts,
                                            std::span<const extent> owned, float* out,
                                            const op_options& opts) {
  if (auto why = tree_sum_argument_error(id_.rank, id_.size, parts, owned, out); !why.empty())
    invalid("reduce_scatter_tree", why);
  const extent mine = owned[static_cast<size_t>(id_.rank)];
  uint64_t shape = 0;
  for (const extent& e : owned) shape = shape * 31 + tree_sum_shape(parts, e.begin, e.len);
  run("reduce_scatter_tree", op_kind::reduce_scatter_tree, shape, opts, [&](const op_ctx& ctx) {
    if (id_.size == 1) return combine_alone(parts, mine.begin, mine.len, out, tree_scratch_);
    tree_exchange(ctx, parts, {owned.begin(), owned.end()}, out, mine.begin, false);
  });
}

void gloo_communicator::tree_exchange(const op_ctx& op, const tree_sum_parts& parts,
                                      const std::vector<extent>& slices, float* out,
                                      size_t out_offset, bool gather) {
  const int p = id_.size;
  const int r = id_.rank;
  const auto& pieces = *parts.pieces;
  size_t total_pieces = 0, longest = 0, lo = SIZE_MAX, hi = 0;
  for (const auto& v : pieces) total_pieces += v.size();
  for (const extent& e : slices) {
    longest = std::max(longest, e.len);
    if (e.len == 0) continue;
    lo = std::min(lo, e.begin);
    hi = std::max(hi, e.begin + e.len);
  }
  if (longest == 0) return;
  // Segments: the ring's size, smaller where many pieces would make the receive buffers
  // (depth x every peer's pieces x a segment) larger than 8 MiB. The same on every rank.
  const auto depth = static_cast<size_t>(std::max(1, opts_.pipeline_depth));
  constexpr size_t recv_budget = (size_t{8} << 20) / sizeof(float);
  const size_t seg = std::max<size_t>(
      1024, std::min(opts_.segment_bytes / sizeof(float), recv_budget / (depth * total_pieces)));
  const size_t nseg = ceil_div(longest, seg);
  const auto seg_of = [&](int j, size_t k) {
    const extent& slice = slices[static_cast<size_t>(j)];
    const extent s = piece(slice.len, nseg, k);
    return extent{slice.begin + s.begin, s.len};
  };

  // Buffers: this rank's pieces (sent from, over every slice), one receive region per peer,
  // and `out` (the all-reduce sends its combined segments from it and gathers into it).
  if (tree_recv_.size() != static_cast<size_t>(p)) {
    tree_recv_.assign(static_cast<size_t>(p), {});
    tree_recv_bufs_.clear();
    tree_recv_bufs_.resize(static_cast<size_t>(p));
  }
  std::vector<ubuf*> live;
  for (int j = 0; j < p; ++j) {
    if (j == r) continue;
    const size_t floats = depth * pieces[static_cast<size_t>(j)].size() * seg;
    auto& region = tree_recv_[static_cast<size_t>(j)];
    if (floats == 0) continue;
    if (region.size() < floats || !tree_recv_bufs_[static_cast<size_t>(j)]) {
      tree_recv_bufs_[static_cast<size_t>(j)].reset();
      region.assign(std::max(region.size(), floats), 0.0f);
      tree_recv_bufs_[static_cast<size_t>(j)] =
          make_buffer(region.data(), region.size() * sizeof(float));
    }
    live.push_back(tree_recv_bufs_[static_cast<size_t>(j)].get());
  }
  std::vector<ubuf*> from_piece;
  for (const float* v : parts.values) {
    from_piece.push_back(user_buffer(const_cast<float*>(v) + lo, (hi - lo) * sizeof(float)));
    live.push_back(from_piece.back());
  }
  ubuf* whole = nullptr;  // out over every slice: the all-reduce's
  if (gather) {
    whole = user_buffer(out + (lo - out_offset), (hi - lo) * sizeof(float));
    live.push_back(whole);
  }
  exposure seen(*this, op, live);
  const uint64_t scatter_slot = op.slot;
  const uint64_t gather_slot = op.slot + 1;

  const auto post_pieces_recv = [&](size_t k) {
    const extent e = seg_of(r, k);
    if (e.len == 0) return;
    for (int s = 1; s < p; ++s) {
      const int j = (r - s + p) % p;
      const size_t count = pieces[static_cast<size_t>(j)].size();
      for (size_t t = 0; t < count; ++t)
        post_recv(op, *tree_recv_bufs_[static_cast<size_t>(j)], j, scatter_slot,
                  ((k % depth) * count + t) * seg * sizeof(float), e.len * sizeof(float));
    }
  };
  // Everything received is posted before anything is sent (the pieces first: they are needed
  // first); peers' slices straight into place.
  for (size_t k = 0; k < std::min(depth, nseg); ++k) post_pieces_recv(k);
  size_t gathered = 0;
  if (gather) {
    for (int s = 1; s < p; ++s) {
      const int j = (r - s + p) % p;
      for (size_t k = 0; k < nseg; ++k) {
        const extent e = seg_of(j, k);
        if (e.len == 0) continue;
        post_recv(op, *whole, j, gather_slot, (e.begin - lo) * sizeof(float),
                  e.len * sizeof(float));
        ++gathered;
      }
    }
  }
  // Every segment of every owner's slice, from each piece; gloo sends each once its receive
  // is posted, so the owners' receive regions bound what is in flight.
  std::vector<size_t> piece_sends(parts.values.size(), 0);
  for (size_t k = 0; k < nseg; ++k)
    for (int s = 1; s < p; ++s) {
      const int j = (r + s) % p;
      const extent e = seg_of(j, k);
      if (e.len == 0) continue;
      for (size_t t = 0; t < parts.values.size(); ++t) {
        post_send(op, *from_piece[t], j, scatter_slot, (e.begin - lo) * sizeof(float),
                  e.len * sizeof(float));
        ++piece_sends[t];
      }
    }

  size_t out_sends = 0;
  for (size_t k = 0; k < nseg; ++k) {
    const extent e = seg_of(r, k);
    if (e.len > 0) {
      tree_pieces_.clear();
      for (int j = 0; j < p; ++j) {
        const auto& nodes = pieces[static_cast<size_t>(j)];
        for (size_t t = 0; t < nodes.size(); ++t) {
          if (j == r) {
            tree_pieces_.push_back({nodes[t], parts.values[t] + e.begin});
            continue;
          }
          // A peer's messages on one slot arrive in the order they were posted.
          wait_recv(op, *tree_recv_bufs_[static_cast<size_t>(j)], j);
          tree_pieces_.push_back({nodes[t], tree_recv_[static_cast<size_t>(j)].data() +
                                                ((k % depth) * nodes.size() + t) * seg});
        }
      }
      combine_pieces(parts.M, tree_pieces_, e.len, out + (e.begin - out_offset), tree_scratch_);
    }
    if (k + depth < nseg) post_pieces_recv(k + depth);
    if (gather && e.len > 0) {
      for (int s = 1; s < p; ++s) {
        post_send(op, *whole, (r + s) % p, gather_slot, (e.begin - lo) * sizeof(float),
                  e.len * sizeof(float));
        ++out_sends;
      }
    }
  }
  for (size_t i = 0; i < gathered; ++i) wait_recv(op, *whole, -1);
  for (size_t t = 0; t < piece_sends.size(); ++t)
    for (size_t i = 0; i < piece_sends[t]; ++i) wait_send(op, *from_piece[t], -1);
  for (size_t i = 0; i < out_sends; ++i) wait_send(op, *whole, -1);
}

}  // namespace troupe::comm::gloo_detail
