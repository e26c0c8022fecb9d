#pragma once
// The data plane's one interface: collectives over a group of ranks, each with its own
// deadline, abortable from another thread, belonging to exactly one generation.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/comm/collective_math.hpp"
#include "runtime/comm/tree_sum.hpp"

namespace troupe::comm {

/// Why a collective failed. Every failure of the data plane is one of these.
enum class comm_errc : uint8_t {
  timeout = 1,  ///< the deadline passed before the collective finished
  peer_lost,    ///< a peer's connection closed (the process died or aborted)
  aborted,      ///< abort() was called on this communicator
  invalid,      ///< bad arguments (sizes, ranks, root)
  internal,     ///< the backend failed in a way none of the above describes
};

const char* to_string(comm_errc code);

/// Typed error thrown by every communicator operation. Carries the context a log
/// line needs: the operation, the group, the generation and this rank.
class comm_error : public std::runtime_error {
 public:
  comm_error(comm_errc code, const std::string& what) : std::runtime_error(what), code_(code) {}
  comm_errc code() const { return code_; }

 private:
  comm_errc code_;
};

enum class reduce_op : uint8_t { sum, average };

/// Options every collective takes. There is no global timeout: each call says its own.
struct op_options {
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
};

/// Identity of a communicator: which group of which generation, and where this rank sits.
struct comm_identity {
  uint64_t generation = 0;
  std::string group = "world";  ///< e.g. "world", "dp0", "tp1"
  int rank = 0;                 ///< rank within the group
  int size = 1;                 ///< group size
};

/// What the portable tree sum (all_reduce_tree, reduce_scatter_tree) keeps between calls, so
/// that a step's sums allocate nothing once warm. One per caller; backends that read their
/// peers' pieces in place use only `combine`.
struct tree_sum_buffers {
  std::vector<float> send, recv, mine, gathered;
  tree_scratch combine;
};

/// One tree sum over a group (runtime/comm/tree_sum.hpp): the tree of M leaves, every rank's
/// canonical pieces of it (together they tile [0, M); the same list on every rank) and this
/// rank's pieces' values, buffers of one common length.
struct tree_sum_parts {
  int M = 1;
  const std::vector<std::vector<tree_node>>* pieces = nullptr;  ///< per rank, in rank order
  std::span<const float* const> values;  ///< this rank's pieces' values, as pieces[rank()]
  /// The most floats of a piece the portable path sends to one rank at once: it holds about
  /// (pieces x round_floats) floats of buffers. Backends that read in place ignore it.
  size_t round_floats = size_t{1} << 20;
  tree_sum_buffers* buffers = nullptr;  ///< reused between calls; nullptr: fresh ones
};

/// A group communicator. Collectives are blocking and called from one thread;
/// abort() may be called from any thread and makes a blocked collective throw
/// comm_error{aborted} promptly. After abort() or a peer_lost/timeout error the
/// communicator is dead: every later call throws, and the owner replaces it with
/// one of the next generation.
class communicator {
 public:
  virtual ~communicator() = default;

  virtual const comm_identity& identity() const = 0;
  int rank() const { return identity().rank; }
  int size() const { return identity().size; }
  uint64_t generation() const { return identity().generation; }

  /// In-place all-reduce of `count` floats.
  virtual void all_reduce(float* data, size_t count, reduce_op op, const op_options& opts) = 0;
  /// In-place broadcast of `bytes` bytes from `root` (a rank within the group).
  virtual void broadcast(void* data, size_t bytes, int root, const op_options& opts) = 0;
  /// Returns once every rank of the group has entered the barrier.
  virtual void barrier(const op_options& opts) = 0;

  /// `in` holds size() blocks of `count` floats; block j of the result (reduced over all
  /// ranks) lands in this rank's `out` when j == rank(). `out` holds `count` floats.
  virtual void reduce_scatter(const float* in, float* out, size_t count, reduce_op op,
                              const op_options& opts) = 0;
  /// Every rank's `bytes` of `in`, concatenated in rank order into `out` (size() * bytes).
  virtual void all_gather(const void* in, void* out, size_t bytes, const op_options& opts) = 0;
  /// Block j (`bytes_per_rank` bytes) of `in` goes to rank j; block j of `out` came from rank j.
  virtual void all_to_all(const void* in, void* out, size_t bytes_per_rank,
                          const op_options& opts) = 0;
  /// Uneven all-to-all. `in` packs, in rank order, send_bytes[j] bytes for each rank j; `out`
  /// receives, in rank order, recv_bytes[j] bytes from each rank j. Both vectors have size()
  /// entries, and recv_bytes[j] must equal what rank j sends here (exchange counts first).
  virtual void all_to_allv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                           const std::vector<size_t>& recv_bytes, const op_options& opts) = 0;
  /// Floats [begin, end) of the tree sum of `parts` into the same floats of `out`: each is the
  /// sum of its pieces' values in the tree's order, so every rank gets the bits one rank
  /// holding every leaf would compute, whatever the group's size and whoever holds which
  /// leaves (--reduction exact, issue 42). The pieces' buffers must not change until every
  /// rank has returned. The default is portable: per round an all_to_allv of each owner's
  /// share of every piece, the owner's combine, an all_gather; the shared-memory and gloo
  /// backends have their own (shm_tree_sum.cpp reads the pieces in place, gloo_tree_sum.cpp
  /// streams them to each slice's owner).
  virtual void all_reduce_tree(const tree_sum_parts& parts, size_t begin, size_t end, float* out,
                               const op_options& opts);
  /// The same sum, each rank only its `owned[rank()]` floats of the pieces' buffers, into
  /// `out` (owned[rank()].len floats); `owned` has one extent per rank, the same on every rank.
  virtual void reduce_scatter_tree(const tree_sum_parts& parts, std::span<const extent> owned,
                                   float* out, const op_options& opts);

  /// Point-to-point, matched by (peer, tag) on both sides and, per (peer, tag), in call order;
  /// for pipeline stages. Both sides must give the same size. Only the two ranks take part.
  /// A zero-byte transfer completes at once without contacting the peer. A send may wait
  /// until the peer posts the matching recv (gloo's does), so two ranks must not both send to
  /// each other before receiving; pipeline schedules order their pairs (or use even/odd).
  virtual void send(const void* data, size_t bytes, int peer, uint32_t tag,
                    const op_options& opts) = 0;
  /// The receiving side of send(): `bytes` bytes from `peer` with `tag` into `data`.
  virtual void recv(void* data, size_t bytes, int peer, uint32_t tag, const op_options& opts) = 0;
  /// A send and a recv posted together and both waited for, so two ranks that each send to
  /// the other (a pipeline stage passing an activation forward while its neighbour passes a
  /// gradient back) cannot deadlock. The peers may differ. Each half matches a plain send or
  /// recv (or the other half of a send_recv) on its peer, as if issued alone.
  virtual void send_recv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                         size_t recv_bytes, int recv_peer, uint32_t tag, const op_options& opts);

  /// Makes any collective in flight (and every later one) fail with comm_errc::aborted.
  /// Thread-safe and idempotent.
  virtual void abort() = 0;
  virtual bool aborted() const = 0;

  /// The ranks that go on after a failure, as a communicator of the newer generation
  /// `id.generation` built on this one's connections instead of new ones: `kept` lists, in
  /// the new group's rank order, the ranks of this group that stay, this rank at `id.rank`.
  /// Every kept rank calls it with the same identity (but its own rank) and list, after its
  /// last operation here has returned; abort() before is what it is for. The kept ranks'
  /// collectives then behave exactly as in a newly connected group of `kept.size()` ranks.
  /// Backends that cannot do this return nullptr (the caller connects a new group); bad
  /// arguments throw comm_error{invalid}, a kept peer found dead comm_error{peer_lost}.
  virtual std::unique_ptr<communicator> shrink(const comm_identity& id,
                                               const std::vector<int>& kept);
};

/// What is wrong with a tree sum's arguments on rank `rank` of `size`, or "" when nothing: the
/// pieces' list and their tiling of [0, M), this rank's values, and all_reduce_tree's range
/// [begin, end) and `out`, or reduce_scatter_tree's `owned` extents (one per rank) and `out`.
std::string tree_sum_argument_error(int rank, int size, const tree_sum_parts& parts, size_t begin,
                                    size_t end, const float* out);
std::string tree_sum_argument_error(int rank, int size, const tree_sum_parts& parts,
                                    std::span<const extent> owned, const float* out);
/// What a tree sum's shape adds to a backend's check that every rank runs the same op: M and
/// the positions `a`, `b` (a range, or an owned extent's begin and length).
uint64_t tree_sum_shape(const tree_sum_parts& parts, size_t a, size_t b);

/// A group of one's tree sum: floats [begin, begin + len) of its pieces' buffers combined into
/// `out` (len floats).
void combine_alone(const tree_sum_parts& parts, size_t begin, size_t len, float* out,
                   tree_scratch& scratch);

/// `opts` with its timeout cut to what remains of `deadline` (at least 1 ms): for several
/// collectives that share one deadline.
op_options remaining(std::chrono::steady_clock::time_point deadline, const op_options& opts);

/// The sum of one double per rank, the same bits on every rank: the values are all-gathered
/// and added in rank order (an all-reduce of floats would round them, and its order may
/// differ by rank). Collective.
double sum_in_rank_order(communicator& c, double value, const op_options& opts);

}  // namespace troupe::comm
