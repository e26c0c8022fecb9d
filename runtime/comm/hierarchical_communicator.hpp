#pragma once
// The data plane for a group that spans nodes with several ranks on some of them: reduce
// inside each node over shared memory, cross the network once per node, share the result
// inside the node again (as NCCL does), built from an shm group per node and gloo groups
// across nodes.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/shm_communicator.hpp"
#include "runtime/comm/store.hpp"

namespace troupe::comm {

/// The nodes of a group: node_of[r] is the node of group rank r. Nodes are numbered
/// 0, 1, ... in the order their first rank appears in the group (rank 0's node is node 0),
/// so every rank derives the same numbering from the same hosts.
struct node_layout {
  std::vector<int> node_of;

  /// Numbers the distinct values of `hosts` (one per rank) by first appearance.
  static node_layout of_hosts(const std::vector<std::string>& hosts);
  /// Parses "0,0,1,1" (to_string()'s output); nullopt-like empty layout on anything else.
  static node_layout parse(const std::string& s);
  std::string to_string() const;

  int nodes() const;
  /// Group ranks on `node`, ascending (their order is the node's local rank order).
  std::vector<int> members(int node) const;
  /// Whether the group is laid out as its numbering says (ranks 0..size-1 each on a node, nodes
  /// numbered by first appearance without gaps).
  bool valid() const;
  /// More than one node, and more than one rank on some node: the layout where reducing inside
  /// nodes first saves network traffic. (One node is shm's case; one rank per node is a
  /// plain network group.)
  bool worth_a_hierarchy() const;
  /// Every node has the same number of ranks: each local rank then carries its own slice of
  /// the node's data across the network ("rails"); otherwise only each node's first rank
  /// does ("leaders").
  bool uniform() const;
};

/// Knobs of the hierarchical collectives, each with its default.
struct hierarchical_options {
  /// All-reduces of at most this many bytes take the latency path: an shm all-reduce, the
  /// node leaders all-gather their node's sums (one network round) and add them, an shm
  /// broadcast. Larger ones take the bandwidth path (see hierarchical_communicator.cpp).
  size_t small_all_reduce_bytes = size_t{64} << 10;
};

/// Connects rank `id.rank` of group `id` whose ranks run on the nodes of `layout`, through
/// `store` (keys under "g<generation>/<group>.node<k>/", ".rail<l>/" and the group's own, the
/// last for a flat gloo group of all ranks that the operations without a hierarchical form
/// use: all_to_all(v), send, recv, send_recv, and reduce_scatter/all_gather when the nodes
/// hold different numbers of ranks). `gloo` configures the gloo groups (its connect_timeout
/// bounds the whole connect, its cancelled check every wait of it), `shm` the node's group.
/// Every rank of the group calls it with the same identity (but its rank), layout and options.
///
/// Results: every rank gets the same bits. An all-reduce sums element e as
///   sum over nodes k = 0..N-1, in order, of (sum over node k's ranks, in rank order, of x[e])
/// (each sum a left fold), then divides by the group size for an average; the same order on
/// every path and size. A reduce-scatter sums in the same order.
///
/// Failures: an op's deadline covers all its stages. A failure in any stage (a node lost,
/// a timeout, abort()) aborts every group underneath, so the ranks waiting on this one in
/// any of them fail at once too; the error keeps the stage's code and names the stage, its
/// group, and which group ranks its ranks are. shrink() is not offered (nullptr: the caller
/// connects a new group). Throws comm_error as make_gloo_communicator does.
std::unique_ptr<communicator> make_hierarchical_communicator(kv_store& store,
                                                             const comm_identity& id,
                                                             const node_layout& layout,
                                                             const gloo_options& gloo = {},
                                                             const shm_options& shm = {},
                                                             const hierarchical_options& opts = {});

}  // namespace troupe::comm
