#pragma once
// Internal to the shared-memory backend: the segment's layout and the communicator class
// shared by its two translation units (shm_communicator.cpp: rendezvous, failure, send/recv;
// shm_collectives.cpp: the collectives, built from rounds), and the templates both use to run
// an operation and to wait.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/comm/collective_math.hpp"
#include "runtime/comm/shm_communicator.hpp"
#include "runtime/comm/shm_staging.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

namespace troupe::comm::shm_detail {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

constexpr uint64_t segment_magic = 0x74726f7570657368ull;  // "troupesh"
constexpr size_t cache_line = 64;

/// The segment's first bytes, written by rank 0 before it publishes the segment.
struct alignas(cache_line) segment_header {
  uint64_t magic;
  uint64_t nonce;  ///< random, also in the store: proves the path led to this group's segment
  uint64_t size;   ///< ranks
  uint64_t chunk_bytes;
  uint64_t p2p_chunk_bytes;
  uint64_t total_bytes;
  /// Bumped by every rank after it publishes progress; sleepers futex-wait on it.
  alignas(cache_line) std::atomic<uint32_t> bell;
  /// Threads now asleep on `bell`; a rank only makes the wake-up system call when non-zero.
  alignas(cache_line) std::atomic<uint32_t> sleepers;
};

/// Publishes progress: bumps the bell, and wakes its sleepers if there are any.
inline void ring(segment_header& h) {
  h.bell.fetch_add(1);
  if (h.sleepers.load() > 0) {
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&h.bell), FUTEX_WAKE, INT_MAX, nullptr,
              nullptr, 0);
  }
}

constexpr uint32_t joined_mapped = 1;       ///< mapped the segment, published pid and staging
constexpr uint32_t joined_can_read = 2;     ///< and can read every peer's memory
constexpr uint32_t joined_cannot_read = 3;  ///< and cannot read some peer's memory

/// One per rank, written only by that rank.
struct alignas(cache_line) rank_block {
  /// Rounds this rank has published: round k's data is in its region once arrived > k.
  std::atomic<uint64_t> arrived;
  /// What round k was part of, at [k % 2]: ranks in different collectives notice.
  std::atomic<uint64_t> shape[2];
  std::atomic<int32_t> pid;
  /// Where this rank mapped the segment (peers probe single-copy reads with it).
  std::atomic<uint64_t> base_addr;
  /// Where the peers find this rank's staging (two halves of chunk_bytes; shm_staging.hpp).
  std::atomic<int32_t> staging_fd;
  std::atomic<uint64_t> staging_nonce;
  /// How far this rank's connect went (joined_*): the last steps of a connect meet here.
  std::atomic<uint32_t> joined;
  /// The caller's buffer of round k at [k % 2], for single-copy collectives.
  std::atomic<uint64_t> addr[2];
  /// Set when this rank's communicator failed, was aborted or destroyed: it takes no part
  /// in anything any more, so whoever waits for it fails with peer_lost at once. The value
  /// is that communicator's generation + 1 (see gone_mark): a group shrunk to a newer
  /// generation on this segment ignores what its ranks' older communicators left here.
  std::atomic<uint32_t> gone;
};

/// Sender-to-receiver channel of send/recv: two staging slots used in turn.
struct alignas(cache_line) channel {
  struct slot_meta {
    uint32_t tag;
    uint64_t total;  ///< bytes of the whole message the chunk belongs to
    uint64_t len;    ///< bytes of this chunk
    /// Non-zero: the whole message, not staged; the receiver reads it at this address of the
    /// sender's process (single-copy groups, messages of single_copy_bytes or more).
    uint64_t direct;
  };
  std::atomic<uint64_t> head;                      ///< chunks the sender has written
  slot_meta slots[2];                              ///< written by the sender before it bumps head
  alignas(cache_line) std::atomic<uint64_t> tail;  ///< chunks the receiver has taken
};

/// Offsets of everything in the segment, a pure function of the sizes.
struct segment_layout {
  size_t size;
  size_t chunk_bytes;
  size_t p2p_chunk_bytes;
  size_t blocks;    ///< rank_block[size]
  size_t channels;  ///< channel[size * size], [from * size + to]
  size_t p2p;       ///< page-aligned: each channel's two slots of p2p_chunk_bytes
  size_t total;

  static segment_layout of(size_t size, size_t chunk_bytes, size_t p2p_chunk_bytes);
};

/// Staging taken for a communicator: this rank's own, and every rank's (its own included)
/// as mapped here.
struct group_staging {
  own_staging own;
  std::vector<char*> of_rank;
  std::vector<staging_address> peers;  ///< to detach; pid 0 for this rank
};

class shm_communicator final : public communicator, public staging_holder {
 public:
  /// Takes over a mapped segment (nullptr for a group of one) and the staging, and borrows
  /// the peers' pidfds from the staging pool (-1 where none could be opened; those peers are
  /// watched with kill(pid, 0)).
  shm_communicator(comm_identity id, shm_options opts, void* base, segment_layout layout,
                   group_staging staging, std::vector<int> pidfds, std::optional<bool> single_copy);
  ~shm_communicator() override;
  shm_communicator(const shm_communicator&) = delete;
  shm_communicator& operator=(const shm_communicator&) = delete;

  const comm_identity& identity() const override { return id_; }

  void all_reduce(float* data, size_t count, reduce_op op, const op_options& opts) override;
  void broadcast(void* data, size_t bytes, int root, const op_options& opts) override;
  void barrier(const op_options& opts) override;
  void reduce_scatter(const float* in, float* out, size_t count, reduce_op op,
                      const op_options& opts) override;
  void all_gather(const void* in, void* out, size_t bytes, const op_options& opts) override;
  void all_to_all(const void* in, void* out, size_t bytes_per_rank,
                  const op_options& opts) override;
  void all_to_allv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes, const op_options& opts) override;
  void all_reduce_tree(const tree_sum_parts& parts, size_t begin, size_t end, float* out,
                       const op_options& opts) override;
  void reduce_scatter_tree(const tree_sum_parts& parts, std::span<const extent> owned, float* out,
                           const op_options& opts) override;
  void send(const void* data, size_t bytes, int peer, uint32_t tag,
            const op_options& opts) override;
  void recv(void* data, size_t bytes, int peer, uint32_t tag, const op_options& opts) override;
  void send_recv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                 size_t recv_bytes, int recv_peer, uint32_t tag, const op_options& opts) override;

  void abort() override;
  bool aborted() const override { return aborted_.load(); }

  /// The kept ranks go on in this segment, each in its rank block and staging of before: no
  /// store, no new mapping, no page touched for the first time. The new group's rounds start
  /// past any of this one's (first_round_of), and the older groups' gone marks mean nothing
  /// to it, so what the ranks left behind in the aborted group cannot mix with the new one.
  /// Point-to-point operations are refused in a shrunk group: a channel may still hold a
  /// message of the aborted one.
  std::unique_ptr<communicator> shrink(const comm_identity& id,
                                       const std::vector<int>& kept) override;

  bool give_up_staging() override;

 private:
  /// One operation in progress.
  struct op_ctx {
    const char* name;
    clock_type::time_point deadline;
    milliseconds timeout;
    uint64_t shape;  ///< what every rank's rounds of this op carry (collectives only)
  };

  enum class op_kind : uint64_t {
    all_reduce = 1,
    broadcast,
    barrier,
    reduce_scatter,
    all_gather,
    all_to_all,
    all_to_allv,
    all_reduce_tree,
    reduce_scatter_tree,
  };

  static uint64_t shape_of(op_kind kind, uint64_t detail) {
    return (static_cast<uint64_t>(kind) << 56) ^ ((detail * 0x9E3779B97F4A7C15ull) >> 8);
  }

  std::string context_string(int peer) const;
  [[noreturn]] void invalid(const char* name, const std::string& detail) const;
  [[noreturn]] void fail(const op_ctx& op, comm_errc code, int peer,
                         const std::string& detail) const;

  /// Runs one operation: refuses on a dead communicator and, on any failure, marks it dead
  /// and tells the peers (gone), so that they fail promptly instead of at their deadlines.
  template <class Body>
  void run(const char* name, uint64_t shape, const op_options& opts, Body&& body);

  /// The shrunk group's communicator: `slots` maps its ranks to rank blocks of the segment.
  shm_communicator(comm_identity id, shm_options opts, std::shared_ptr<void> mapping,
                   segment_layout layout, group_staging staging, std::vector<int> pidfds,
                   std::vector<int> slots, std::optional<bool> single_copy, bool shrunk);

  /// The first round of a group of generation g on a segment: past every round of the
  /// groups of older generations it was shrunk from (each has fewer than 2^40).
  static uint64_t first_round_of(uint64_t generation, bool shrunk) {
    return shrunk ? generation << 40 : 0;
  }
  /// What this communicator writes into `gone` when it leaves; a peer's mark counts for it
  /// when above its own generation.
  uint32_t gone_mark() const {
    return static_cast<uint32_t>(std::min<uint64_t>(id_.generation, UINT32_MAX - 1) + 1);
  }

  // ---- the segment ----

  segment_header& header() const { return *static_cast<segment_header*>(base_); }
  rank_block& block(int r) const {
    return reinterpret_cast<rank_block*>(static_cast<char*>(base_) +
                                         layout_.blocks)[slot_[static_cast<size_t>(r)]];
  }
  channel& chan(int from, int to) const {
    return reinterpret_cast<channel*>(static_cast<char*>(base_) +
                                      layout_.channels)[from * id_.size + to];
  }
  /// Rank r's staging half for round k (read-only memory unless r is this rank).
  char* half(int r, uint64_t k) const {
    return staging_.of_rank[static_cast<size_t>(r)] + (k % 2) * layout_.chunk_bytes;
  }
  char* p2p_slot(int from, int to, uint64_t i) const {
    return static_cast<char*>(base_) + layout_.p2p +
           ((static_cast<size_t>(from) * id_.size + to) * 2 + i % 2) * layout_.p2p_chunk_bytes;
  }

  // ---- rounds: the step every collective is made of ----
  //
  // In round k each rank writes its half(rank, k), publishes (arrived = k + 1), waits until
  // every rank has published round k, then reads any rank's half(j, k). A rank writes
  // half(., k + 2) only after the wait of round k + 1, which every rank enters only after
  // its reads of round k: two halves are enough, with one wait per round.

  /// Starts a round: returns its number (this rank's half(rank, k) is free to write).
  uint64_t next_round() { return round_++; }
  /// Publishes round k and waits until every rank has published it with the same shape.
  void complete_round(const op_ctx& op, uint64_t k);

  /// Publishes progress to sleepers.
  void ring_bell() const;
  /// Waits until ready() holds: polls, yields, then sleeps on the bell. Fails on abort, at the
  /// deadline, and with peer_lost if `peer` (or any rank when peer < 0) is gone or dead.
  template <class Ready>
  void wait_for(const op_ctx& op, int peer, const char* action, Ready&& ready, int peer2 = -2);
  /// peer_lost if rank j is gone or its process exited (`check_process` makes the system
  /// call; it is rate-limited by the caller).
  void check_peer_alive(const op_ctx& op, int j, bool check_process, const char* action);
  void mark_gone();

  // ---- algorithms (shm_collectives.cpp) ----

  void all_reduce_small(const op_ctx& op, float* data, size_t count, reduce_op rop);
  void all_reduce_sliced(const op_ctx& op, float* data, size_t count, reduce_op rop);
  void all_reduce_single_copy(const op_ctx& op, float* data, size_t count, reduce_op rop);
  // The tree sums (shm_tree_sum.cpp).
  void tree_small(const op_ctx& op, const tree_sum_parts& parts, size_t begin, size_t len,
                  float* out);
  void tree_sliced(const op_ctx& op, const tree_sum_parts& parts, size_t begin, size_t len,
                   float* out);
  /// Publishes this rank's pieces (and `out`, whose slices the peers may read later) in round
  /// k's staging; returns every rank's addresses: [j][0] its out, [j][1 + t] its piece t.
  std::vector<std::vector<uint64_t>> share_tree_addresses(const op_ctx& op,
                                                          const tree_sum_parts& parts,
                                                          const float* out);
  /// Floats `range` of the tree sum into `out` (range.len floats), reading the peers' pieces
  /// at `addresses` block by block (process_vm_readv).
  void combine_pulled(const op_ctx& op, const tree_sum_parts& parts,
                      const std::vector<std::vector<uint64_t>>& addresses, extent range,
                      float* out);
  /// Publishes `p` as this rank's buffer of round k (call before complete_round(op, k)).
  void publish_addr(uint64_t k, const void* p) {
    block(id_.rank).addr[k % 2].store(reinterpret_cast<uint64_t>(p), std::memory_order_relaxed);
  }
  /// Whether send/recv of `bytes` hand over the sender's buffer instead of staging it (both
  /// sides decide the same: same options, same group verdict, same size).
  bool direct_p2p(const op_ctx& op, size_t bytes) {
    return bytes >= opts_.single_copy_bytes && single_copy(op);
  }
  /// Whether every rank can read every other's memory (process_vm_readv), so that large
  /// collectives may copy once, straight from the peer's buffer. The ranks publish their
  /// verdicts at connect without waiting for each other; the first operation that asks waits
  /// for all of them (by then they are long published), and every rank gets the same answer.
  bool single_copy(const op_ctx& op);
  /// Copies `bytes` at address `remote` in rank j's process to `local` (process_vm_readv).
  void pull(const op_ctx& op, int j, uint64_t remote, void* local, size_t bytes);
  void exchange(const op_ctx& op, const char* in, const size_t* send_bytes, const size_t* send_off,
                char* out, const size_t* recv_bytes, const size_t* recv_off, size_t max_pair_bytes);
  void check_peer_arg(const char* name, int peer) const;
  /// Writes chunk `h` (`len` bytes of a `total`-byte message with `tag`) into the (this rank,
  /// peer) channel, whose slot must be free, and publishes it.
  void put_chunk(int peer, uint64_t h, const char* src, size_t len, size_t total, uint32_t tag);
  /// Takes chunk `t` (`len` bytes of an expected `total`) from the (peer, this rank) channel,
  /// whose head must carry it; a size the sender disagrees on fails the op as `invalid`.
  void take_chunk(const op_ctx& op, int peer, uint64_t t, char* dst, size_t len, size_t total,
                  uint32_t tag, const char* what);

  comm_identity id_;
  shm_options opts_;
  std::shared_ptr<void> mapping_;  ///< the segment, unmapped with its last communicator
  void* base_;                     ///< mapping_'s address; nullptr for a group of one
  segment_layout layout_;
  std::vector<int> slot_;  ///< per rank, its rank block (and channels) in the segment
  bool shrunk_ = false;
  group_staging staging_;
  std::vector<int> pidfds_;  ///< per rank, the staging pool's; -1 for this rank
  std::vector<int32_t> pids_;
  uint64_t round_ = 0;  ///< rounds this rank has started; touched by the calling thread only
  uint64_t waiting_round_ = 0;           ///< the round complete_round() waits for (for messages)
  bool in_round_wait_ = false;           ///< complete_round() is waiting (see wait_for's polls)
  std::vector<size_t> offsets_;          ///< all_to_all(v)'s block offsets: send then receive
  std::optional<bool> single_copy_;      ///< see single_copy(); unknown until an operation asks
  std::vector<float> scratch_;           ///< single-copy all-reduce: accumulator and incoming block
  std::vector<tree_piece> tree_pieces_;  ///< the tree sums' pieces of one block, reused
  tree_scratch tree_scratch_;            ///< the tree sums' inner nodes, reused

  std::atomic<bool> aborted_{false};
  mutable std::mutex m_;
  std::optional<comm_error> dead_;  ///< the first failure; guarded by m_
  bool in_op_ = false;              ///< an operation is running; guarded by m_
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

template <class Body>
inline void shm_communicator::run(const char* name, uint64_t shape, const op_options& opts,
                                  Body&& body) {
  if (opts.timeout.count() <= 0) invalid(name, "timeout must be positive");
  const op_ctx op{name, clock_type::now() + opts.timeout, opts.timeout, shape};
  {
    std::lock_guard<std::mutex> lock(m_);
    if (!dead_ && aborted_) {
      dead_.emplace(comm_errc::aborted, "abort() was called (" + context_string(-1) + ")");
    }
    if (dead_) {
      throw comm_error(dead_->code(),
                       std::string("shm ") + name +
                           ": communicator is dead after an earlier failure: " + dead_->what());
    }
    in_op_ = true;
  }
  struct op_end {
    shm_communicator& c;
    ~op_end() {
      std::lock_guard<std::mutex> lock(c.m_);
      c.in_op_ = false;
    }
  } end{*this};
  try {
    try {
      body(op);
    } catch (const comm_error&) {
      throw;
    } catch (const std::exception& e) {
      fail(op, comm_errc::internal, -1, e.what());
    }
  } catch (const comm_error& e) {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (!dead_) dead_.emplace(e);
    }
    mark_gone();
    throw;
  }
}

template <class Ready>
inline void shm_communicator::wait_for(const op_ctx& op, int peer, const char* action,
                                       Ready&& ready, int peer2) {
  if (ready()) return;
  const auto spin_until = clock_type::now() + opts_.spin_time;
  for (unsigned i = 1;; ++i) {
    cpu_relax();
    if (ready()) return;
    if ((i & 63) == 0 && clock_type::now() >= spin_until) break;
  }
  const auto yield_until = clock_type::now() + opts_.yield_time;
  while (clock_type::now() < yield_until) {
    ::sched_yield();
    if (ready()) return;
  }
  auto& h = header();
  auto next_check = clock_type::now();
  for (;;) {
    const auto now = clock_type::now();
    if (aborted_.load()) {
      fail(op, comm_errc::aborted, peer, std::string("aborted while waiting to ") + action);
    }
    // A peer publishes its progress before it leaves, so re-check ready() before blaming it.
    const bool check_process = now >= next_check;
    if (check_process) next_check = now + opts_.liveness_interval;
    // Gone marks are memory reads, so every peer's is looked at; whether a process lives is
    // a system call per peer. With many ranks on few cores, every rank going to sleep in a
    // collective polled every other's pidfd (~4000 calls per collective at 64 ranks), so a
    // round polls only the first rank that has not arrived: a dead one becomes that as soon
    // as the live ones are in. Other waits for everyone poll them all.
    int poll_only = -1;
    if (check_process && peer == -1 && in_round_wait_) {
      for (int j = 0; j < id_.size && poll_only < 0; ++j)
        if (j != id_.rank && block(j).arrived.load(std::memory_order_relaxed) <= waiting_round_)
          poll_only = j;
    }
    try {
      for (int j = 0; j < id_.size; ++j) {
        if (j != id_.rank && (peer == -1 || j == peer || j == peer2)) {
          check_peer_alive(op, j, check_process && (poll_only < 0 || j == poll_only), action);
        }
      }
    } catch (const comm_error&) {
      if (ready()) return;
      throw;
    }
    if (now >= op.deadline) {
      if (ready()) return;
      std::string who = peer >= 0 ? "rank " + std::to_string(peer) : std::string("ranks");
      if (peer < 0) {
        for (int j = 0; j < id_.size; ++j) {
          if (block(j).arrived.load() <= waiting_round_) who += " " + std::to_string(j);
        }
      }
      fail(op, comm_errc::timeout, peer,
           "no progress within " + std::to_string(op.timeout.count()) + " ms waiting to " + action +
               " " + who);
    }
    h.sleepers.fetch_add(1);
    const uint32_t seen = h.bell.load();
    if (ready()) {
      h.sleepers.fetch_sub(1);
      return;
    }
    const auto nap = std::max(clock_type::duration::zero(),
                              std::min(op.deadline, next_check) - clock_type::now());
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(nap).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&h.bell), FUTEX_WAIT, seen, &ts, nullptr, 0);
    h.sleepers.fetch_sub(1);
    if (ready()) return;
  }
}

}  // namespace troupe::comm::shm_detail
