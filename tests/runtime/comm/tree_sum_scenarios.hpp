#pragma once
// comm_peer's scenario for the tree sums of --reduction exact (communicator::all_reduce_tree and
// reduce_scatter_tree, issue 42): leaves split among real processes in even, uneven and empty
// shares (one piece or several per rank), at sizes that take each backend's every path (shm:
// one staged round, sliced rounds, single-copy reads; gloo: one and many segments), and the
// portable path beside the backend's own. Every result must have the bits of one process
// summing every leaf along the tree.

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/comm/store.hpp"
#include "runtime/comm/tree_sum.hpp"
#include "tests/runtime/comm/backend.hpp"
#include "tests/runtime/comm/collective_scenarios.hpp"
#include "tests/runtime/comm/tree_leaves.hpp"

namespace troupe::test {

/// The leaves' split among `size` ranks that this scenario checks (counts per rank).
inline std::vector<std::vector<int>> tree_splits(int size) {
  switch (size) {
    case 2:
      return {{1, 1}, {5, 3}, {0, 4}};
    case 3:
      return {{1, 1, 1}, {3, 3, 2}, {1, 6, 1}};
    case 4:
      return {{1, 1, 1, 1}, {2, 0, 1, 1}, {3, 1, 3, 1}};
    default:
      return {std::vector<int>(static_cast<size_t>(size), 1)};
  }
}

/// Whether floats [begin, end) of `got` are `want`'s bits; "" or what differs.
inline std::string same_tree_bits(const std::vector<float>& got, const float* want, size_t begin,
                                  size_t end, const std::string& what) {
  if (end > begin &&
      std::memcmp(got.data() + begin, want + begin, (end - begin) * sizeof(float)) != 0)
    return what + ": not the bits of one rank's tree sum";
  return {};
}

inline int tree_sums(comm::kv_store& store, int rank, int size) {
  auto c = connect(store, {1, "world", rank, size});
  const comm::op_options op{60s};
  const auto up = static_cast<size_t>(size);
  // 1001: shm's one staged round; 100003: its sliced rounds (below single_copy_bytes);
  // 3 MiB + 5: its single-copy reads (and whole-shard reads for reduce_scatter at 2-3 ranks);
  // gloo: one segment, then several.
  for (const size_t n : {size_t{1001}, size_t{100003}, (size_t{3} << 20) / sizeof(float) + 5}) {
    for (const auto& counts : tree_splits(size)) {
      int M = 0, first = 0;
      for (size_t j = 0; j < counts.size(); ++j) {
        if (static_cast<int>(j) == rank) first = M;
        M += counts[j];
      }
      const int mine = counts[static_cast<size_t>(rank)];
      comm::tree_accumulator whole(M, 0, M, n);  // one rank's sum of every leaf: the reference
      for (int i = 0; i < M; ++i) whole.add_leaf(i, tree_leaf(i, n));
      const float* want = whole.values()[0].data();

      std::vector<std::vector<comm::tree_node>> pieces;
      for (int at = 0; const int k : counts) {
        pieces.push_back(k > 0 ? comm::canonical_pieces(M, at, at + k)
                               : std::vector<comm::tree_node>{});
        at += k;
      }
      std::optional<comm::tree_accumulator> acc;
      std::vector<const float*> values;
      if (mine > 0) {
        acc.emplace(M, first, mine, n);
        for (int i = first; i < first + mine; ++i) acc->add_leaf(i, tree_leaf(i, n));
        for (const auto& v : acc->values()) values.push_back(v.data());
      }
      comm::tree_sum_buffers buffers;
      const comm::tree_sum_parts parts{M, &pieces, values, size_t{1} << 16, &buffers};
      const std::string where = "n " + std::to_string(n) + ", M " + std::to_string(M) + ", " +
                                std::to_string(mine) + " leaves here";

      for (const bool portable : {false, true}) {
        const std::string how = where + (portable ? ", portable path" : ", backend's path");
        std::vector<float> out(n, -1.0f);
        if (portable)
          c->communicator::all_reduce_tree(parts, 0, n, out.data(), op);
        else
          c->all_reduce_tree(parts, 0, n, out.data(), op);
        if (int rc = report(rank, same_tree_bits(out, want, 0, n, "all_reduce_tree, " + how));
            rc != 0)
          return rc;

        // A region only (the tied embedding of a ZeRO pipeline stage): the rest stays as it is.
        const size_t lo = 17, hi = n - 5;
        std::fill(out.begin(), out.end(), -1.0f);
        if (portable)
          c->communicator::all_reduce_tree(parts, lo, hi, out.data(), op);
        else
          c->all_reduce_tree(parts, lo, hi, out.data(), op);
        std::string err = same_tree_bits(out, want, lo, hi, "all_reduce_tree of a region, " + how);
        if (err.empty() && (out[lo - 1] != -1.0f || out[hi] != -1.0f))
          err = "all_reduce_tree of a region wrote outside it, " + how;
        if (int rc = report(rank, err); rc != 0) return rc;

        // ZeRO's shards: blocks of ceil(n / size), the last shorter.
        const size_t block = (n + up - 1) / up;
        std::vector<comm::extent> owned(up);
        for (size_t j = 0; j < up; ++j) {
          const size_t b = std::min(n, j * block);
          owned[j] = {b, std::min(n, b + block) - b};
        }
        const comm::extent shard = owned[static_cast<size_t>(rank)];
        std::vector<float> got(shard.len + 1, -1.0f);
        if (portable)
          c->communicator::reduce_scatter_tree(parts, owned, got.data(), op);
        else
          c->reduce_scatter_tree(parts, owned, got.data(), op);
        err = shard.len > 0 &&
                      std::memcmp(got.data(), want + shard.begin, shard.len * sizeof(float)) != 0
                  ? "reduce_scatter_tree, " + how + ": not the bits of one rank's tree sum"
                  : std::string();
        if (err.empty() && got[shard.len] != -1.0f)
          err = "reduce_scatter_tree wrote past its shard, " + how;
        if (int rc = report(rank, err); rc != 0) return rc;
      }
    }
  }
  // Pieces that do not tile the tree are refused before anything is sent (no peer waits).
  std::vector<std::vector<comm::tree_node>> gap(up);
  gap[0] = {{1, 1}};
  std::vector<float> buf(8, 0.0f), out(8);
  const float* own[] = {buf.data()};
  const comm::tree_sum_parts bad{
      2, &gap, rank == 0 ? std::span<const float* const>(own, 1) : std::span<const float* const>(),
      16, nullptr};
  try {
    c->all_reduce_tree(bad, 0, 8, out.data(), op);
    return report(rank, "pieces that leave leaf 0 out were accepted");
  } catch (const comm::comm_error& e) {
    if (e.code() != comm::comm_errc::invalid)
      return report(rank, std::string("refused as ") + comm::to_string(e.code()) + ": " + e.what());
  }
  // An output over the rank's own piece is refused too: the sum would overwrite the piece
  // before it is read (an owner combines its slice into the output as the pieces arrive).
  std::vector<std::vector<comm::tree_node>> one_each(up);
  for (int r = 0; r < size; ++r) one_each[static_cast<size_t>(r)] = {{r, 1}};
  const comm::tree_sum_parts in_place{size, &one_each, std::span<const float* const>(own, 1), 16,
                                      nullptr};
  try {
    c->all_reduce_tree(in_place, 0, 8, buf.data(), op);
    return report(rank, "an output over the rank's own piece was accepted");
  } catch (const comm::comm_error& e) {
    if (e.code() != comm::comm_errc::invalid ||
        std::string(e.what()).find("overlaps") == std::string::npos)
      return report(rank, std::string("refused as ") + comm::to_string(e.code()) + ": " + e.what());
  }
  c->barrier({30s});
  return 0;
}

}  // namespace troupe::test
