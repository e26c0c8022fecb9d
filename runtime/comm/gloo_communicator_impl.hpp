#pragma once
// Internal to the gloo backend: the communicator class shared by its two translation units
// (gloo_communicator.cpp: transport plumbing, all-reduce, broadcast, barrier, the rings;
// gloo_collectives.cpp: reduce-scatter, all-gather, all-to-all(v), send/recv).

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/comm/collective_math.hpp"
#include "runtime/comm/gloo_communicator.hpp"

namespace troupe::comm::gloo_detail {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;
using ubuf = gloo::transport::UnboundBuffer;

class gloo_communicator final : public communicator {
 public:
  gloo_communicator(comm_identity id, gloo_options opts,
                    std::shared_ptr<gloo::transport::Device> device,
                    std::shared_ptr<gloo::rendezvous::Context> context)
      : id_(std::move(id)),
        opts_(std::move(opts)),
        device_(std::move(device)),
        context_(std::move(context)) {
    start_watch();
  }

  ~gloo_communicator() override {
    if (watcher_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(m_);
        stopping_ = true;
        if (probe_buf_) probe_buf_->abortWaitRecv();
        watch_cv_.notify_all();
      }
      watcher_.join();
    }
    std::lock_guard<std::mutex> lock(m_);
    close_locked();
  }

  const comm_identity& identity() const override { return id_; }

  void all_reduce(float* data, size_t count, reduce_op op, const op_options& opts) override {
    if (count > 0 && data == nullptr) invalid("all_reduce", "null data with a non-zero count");
    run("all_reduce", op_kind::all_reduce, count, opts, [&](const op_ctx& ctx) {
      if (count == 0 || id_.size == 1) return;  // average over one rank is the identity
      if (count * sizeof(float) <= opts_.small_all_reduce_bytes) {
        all_reduce_small(ctx, data, count, op);
      } else {
        all_reduce_ring(ctx, data, count, op);
      }
    });
  }

  void broadcast(void* data, size_t bytes, int root, const op_options& opts) override {
    if (root < 0 || root >= id_.size) {
      invalid("broadcast", "root " + std::to_string(root) + " is not a rank of the group");
    }
    if (bytes > 0 && data == nullptr) invalid("broadcast", "null data with a non-zero size");
    run("broadcast", op_kind::broadcast, bytes * 131 + static_cast<uint64_t>(root), opts,
        [&](const op_ctx& ctx) {
          if (bytes == 0 || id_.size == 1) return;
          if (bytes <= opts_.small_broadcast_bytes || id_.size == 2) {
            broadcast_star(ctx, static_cast<char*>(data), bytes, root);
          } else {
            broadcast_chain(ctx, static_cast<char*>(data), bytes, root);
          }
        });
  }

  void barrier(const op_options& opts) override {
    run("barrier", op_kind::barrier, 0, opts, [&](const op_ctx& ctx) {
      if (id_.size > 1) barrier_dissemination(ctx);
    });
  }

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

  void abort() override {
    aborted_.store(true);
    std::lock_guard<std::mutex> lock(m_);
    // A wait in progress returns false at once; a later wait on the same buffer does too,
    // because gloo keeps the abort flag until a wait consumes it.
    for (auto* b : live_) {
      b->abortWaitRecv();
      b->abortWaitSend();
    }
    // With nothing in flight, tell the peers now; otherwise the failing op does it.
    if (!in_flight_) close_locked();
  }

  bool aborted() const override { return aborted_.load(); }

 private:
  /// One collective in progress.
  struct op_ctx {
    const char* name;
    clock_type::time_point deadline;
    milliseconds timeout;
    uint64_t slot;  ///< base slot; an op uses slot .. slot + 255
  };

  /// Part of every slot, with a tag of the op's shape, so that ranks that disagree on which op
  /// comes next (or on its size or root) wait and time out instead of delivering one op's bytes
  /// into another's buffers (which gloo answers by failing an assertion on its I/O thread).
  enum class op_kind : uint64_t {
    all_reduce = 1,
    broadcast = 2,
    barrier = 3,
    reduce_scatter = 4,
    all_gather = 5,
    all_to_all = 6,
    all_to_allv = 7,
    all_reduce_tree = 8,
    reduce_scatter_tree = 9,
  };

  /// Slot layout: [63..24] op sequence number, [23..12] shape tag, [11..8] kind, [7..0] step.
  /// Bit 63 is never set here (2^39 ops): it marks point-to-point slots (p2p_slot()), which
  /// only two ranks number, so they cannot take part in the group-wide sequence.
  static uint64_t slot_of(uint64_t seq, op_kind kind, uint64_t shape) {
    const uint64_t tag = (shape * 0x9E3779B97F4A7C15ull) >> 52;  // 12 well-mixed bits
    return (seq << 24) | (tag << 12) | (static_cast<uint64_t>(kind) << 8);
  }

  /// Makes buffers visible to abort() for the lifetime of this object (and checks for an abort
  /// that came before they were visible). Declare it after the buffers it names.
  class exposure {
   public:
    exposure(gloo_communicator& c, const op_ctx& op, const std::vector<ubuf*>& bufs)
        : c_(c), n_(bufs.size()) {
      {
        std::lock_guard<std::mutex> lock(c_.m_);
        c_.live_.insert(c_.live_.end(), bufs.begin(), bufs.end());
      }
      if (c_.aborted_) {
        release();
        c_.fail(op, comm_errc::aborted, -1, "aborted");
      }
    }
    ~exposure() { release(); }
    exposure(const exposure&) = delete;
    exposure& operator=(const exposure&) = delete;

   private:
    void release() {
      std::lock_guard<std::mutex> lock(c_.m_);
      c_.live_.resize(c_.live_.size() - n_);  // exposures nest, so theirs are the last n_
      n_ = 0;
    }
    gloo_communicator& c_;
    size_t n_;
  };

  std::string context_string(int peer) const {
    std::string s = "group " + id_.group + ", generation " + std::to_string(id_.generation) +
                    ", rank " + std::to_string(id_.rank) + " of " + std::to_string(id_.size);
    if (peer >= 0) s += ", peer " + std::to_string(peer);
    return s;
  }

  [[noreturn]] void invalid(const char* name, const std::string& detail) const {
    throw comm_error(comm_errc::invalid, std::string("gloo ") + name + " invalid: " + detail +
                                             " (" + context_string(-1) + ")");
  }

  [[noreturn]] void fail(const op_ctx& op, comm_errc code, int peer,
                         const std::string& detail) const {
    throw comm_error(code, std::string("gloo ") + op.name + " " + to_string(code) + ": " + detail +
                               " (" + context_string(peer) + ")");
  }

  /// Turns a gloo exception from an operation with `peer` into our error. Our own abort and
  /// deadline explain it first; anything else means a connection broke.
  [[noreturn]] void fail_from_gloo(const op_ctx& op, int peer, const std::string& action,
                                   const char* what) const {
    const std::string detail = action + ": " + what;
    if (aborted_) fail(op, comm_errc::aborted, peer, detail);
    if (clock_type::now() >= op.deadline ||
        std::string_view(what).find("Timed out") != std::string_view::npos) {
      fail(op, comm_errc::timeout, peer,
           "no progress within " + std::to_string(op.timeout.count()) + " ms; " + detail);
    }
    fail(op, comm_errc::peer_lost, peer, detail);
  }

  std::string peer_name(int peer) const {
    return peer >= 0 ? "rank " + std::to_string(peer) : "a peer";
  }

  /// Runs one collective: refuses on a dead communicator, numbers its slots, and on any
  /// failure marks the communicator dead and closes its connections so peers blocked on this
  /// rank fail promptly instead of waiting for their deadlines.
  template <class Body>
  void run(const char* name, op_kind kind, uint64_t shape, const op_options& opts, Body&& body) {
    run_at(
        name, [&] { return slot_of(next_op_++, kind, shape); }, opts, std::forward<Body>(body));
  }

  /// run() with the slot chosen by `slot_for` (called under the lock, once the op is admitted).
  template <class SlotFor, class Body>
  void run_at(const char* name, SlotFor&& slot_for, const op_options& opts, Body&& body) {
    if (opts.timeout.count() <= 0) invalid(name, "timeout must be positive");
    op_ctx op{name, clock_type::now() + opts.timeout, opts.timeout, 0};
    {
      std::lock_guard<std::mutex> lock(m_);
      if (!dead_ && aborted_) {
        dead_.emplace(comm_errc::aborted, "abort() was called (" + context_string(-1) + ")");
      }
      if (dead_) {
        throw comm_error(dead_->code(),
                         std::string("gloo ") + name +
                             ": communicator is dead after an earlier failure: " + dead_->what());
      }
      in_flight_ = true;
      op.slot = slot_for();
    }
    try {
      try {
        body(op);
      } catch (const comm_error&) {
        throw;
      } catch (const gloo::IoException& e) {
        fail_from_gloo(op, -1, "transport error", e.what());
      } catch (const std::exception& e) {
        fail(op, comm_errc::internal, -1, e.what());
      }
    } catch (const comm_error& e) {
      std::lock_guard<std::mutex> lock(m_);
      in_flight_ = false;
      if (!dead_) dead_.emplace(e);
      close_locked();
      throw;
    }
    std::lock_guard<std::mutex> lock(m_);
    in_flight_ = false;
  }

  void close_locked() {
    if (closed_) return;
    closed_ = true;
    try {
      context_->closeConnections();
    } catch (const std::exception&) {
      // Closing is best effort; the pairs die with the context anyway.
    }
  }

  // ---- point-to-point steps, each converting gloo's failures ----

  void post_send(const op_ctx& op, ubuf& b, int peer, uint64_t slot, size_t offset, size_t nbytes) {
    try {
      b.send(peer, slot, offset, nbytes);
    } catch (const gloo::IoException& e) {
      fail_from_gloo(op, peer, "send to " + peer_name(peer), e.what());
    }
  }

  void post_recv(const op_ctx& op, ubuf& b, int peer, uint64_t slot, size_t offset, size_t nbytes) {
    try {
      b.recv(peer, slot, offset, nbytes);
    } catch (const gloo::IoException& e) {
      fail_from_gloo(op, peer, "receive from " + peer_name(peer), e.what());
    }
  }

  /// Time left for one gloo wait. gloo treats its own timeout as fatal for the whole context
  /// (it closes every pair), which is what we want at the op's deadline.
  milliseconds left(const op_ctx& op, int peer, const char* action) const {
    const auto rest = op.deadline - clock_type::now();
    if (rest <= clock_type::duration::zero()) {
      fail(op, comm_errc::timeout, peer,
           "no progress within " + std::to_string(op.timeout.count()) + " ms waiting to " + action +
               " " + peer_name(peer));
    }
    return std::max(milliseconds(1), std::chrono::ceil<milliseconds>(rest));
  }

  /// `source`, when given, receives the rank whose message completed the wait. A wait on any
  /// peer (-1) names in `among` the peers it may still hear from (default: every peer).
  void wait_recv(const op_ctx& op, ubuf& b, int peer, int* source = nullptr,
                 const std::vector<int>* among = nullptr) {
    bool ok = false;
    {
      watching w(*this, peer, among);
      try {
        ok = b.waitRecv(source, left(op, peer, "receive from"));
      } catch (const gloo::IoException& e) {
        fail_from_gloo(op, peer, "receive from " + peer_name(peer), e.what());
      }
    }
    if (!ok || aborted_) fail_woken(op, peer, "receiving");
  }

  /// A wait for a send to any peer (-1) names in `among` the peers whose sends are not yet
  /// complete (none are watched without it); `dest`, when given, receives the completed one's.
  void wait_send(const op_ctx& op, ubuf& b, int peer, int* dest = nullptr,
                 const std::vector<int>* among = nullptr) {
    static const std::vector<int> none;
    bool ok = false;
    {
      watching w(*this, peer, peer < 0 && among == nullptr ? &none : among);
      try {
        ok = b.waitSend(dest, left(op, peer, "send to"));
      } catch (const gloo::IoException& e) {
        fail_from_gloo(op, peer, "send to " + peer_name(peer), e.what());
      }
    }
    if (!ok || aborted_) fail_woken(op, peer, "sending");
  }

  /// A wait returned without completing: abort() woke it, or the watcher did because a pair
  /// it needs broke.
  [[noreturn]] void fail_woken(const op_ctx& op, int peer, const char* doing) const {
    if (!aborted_) {
      std::unique_lock<std::mutex> lock(m_);
      if (lost_) {
        const std::string detail = *lost_;
        lock.unlock();
        fail(op, comm_errc::peer_lost, peer, detail);
      }
    }
    fail(op, comm_errc::aborted, peer, std::string("aborted while ") + doing);
  }

  // ---- noticing a broken pair that gloo does not tell the waiting buffer about ----
  //
  // gloo fails the buffers of a pair's pending operations when its connection breaks, but not
  // the one whose message it is reading at that moment (nor an unbound send it is still
  // writing): a peer killed in the middle of a large transfer left that wait blocked until
  // the op's deadline. So every working pair also holds a receive that never completes, into
  // a probe buffer, which gloo does fail with the pair. A thread of this communicator waits
  // on the probe; when it fails, the thread finds which pairs broke (posting to a broken pair
  // throws at once), and arms a new probe on the others. A wait that needs a broken pair,
  // whether it broke before or during the wait, is woken as abort() does if it is still the
  // same wait after a short grace: the op then fails with peer_lost. A pair that breaks when
  // no wait needs it (a peer that finished the op and left) fails nothing; so each wait names
  // only the peers it still needs.

  /// Publishes the peers one wait needs for the watcher while it lasts. If one of them is
  /// known broken already, the watcher is asked to look (after its grace).
  class watching {
   public:
    watching(gloo_communicator& c, int peer, const std::vector<int>* among) : c_(c) {
      std::lock_guard<std::mutex> lock(c_.m_);
      ++c_.wait_seq_;
      c_.watched_.clear();
      if (peer >= 0) {
        c_.watched_.push_back(peer);
      } else if (among != nullptr) {
        c_.watched_ = *among;
      } else {
        for (int j = 0; j < c_.id_.size; ++j)
          if (j != c_.id_.rank) c_.watched_.push_back(j);
      }
      if (c_.watched_broken_locked() >= 0) c_.request_look_locked();
    }
    ~watching() {
      std::lock_guard<std::mutex> lock(c_.m_);
      c_.watched_.clear();
    }
    watching(const watching&) = delete;
    watching& operator=(const watching&) = delete;

   private:
    gloo_communicator& c_;
  };

  /// A peer the wait in progress needs whose pair broke, or -1. Under m_.
  int watched_broken_locked() const {
    for (const int j : watched_)
      if (static_cast<size_t>(j) < broken_.size() && !broken_[static_cast<size_t>(j)].empty())
        return j;
    return -1;
  }
  /// Makes the watcher look at the wait in progress. Under m_.
  void request_look_locked() {
    look_ = true;
    if (probe_buf_) probe_buf_->abortWaitRecv();  // it may be blocked on the probe
    watch_cv_.notify_all();
  }
  /// After a grace, wakes the wait in progress if it is still the same one and still needs a
  /// broken pair. The grace spares a wait whose completion has come already (gloo counts it
  /// before the wait takes it) although the peer then finished and left.
  void look_after_grace();

  /// Starts the watcher (gloo_communicator.cpp).
  void start_watch();
  /// The watcher thread's body.
  void watch_pairs();
  /// Posts a new probe on every pair not yet known broken, recording those that are; wakes
  /// the wait in progress if it needs one of them. Returns false once the watcher must stop.
  bool arm_probe();

  /// The unbound buffer over caller memory [p, p + bytes), kept across ops: a receive posted
  /// on a buffer gloo has just created takes milliseconds longer to complete than one on a
  /// buffer it has used before (measured: 4 KiB all-to-all, 3.8 ms against 0.7 ms), and
  /// training passes the same gradient and activation buffers step after step.
  ubuf* user_buffer(void* p, size_t bytes) {
    ++buffer_clock_;
    for (auto& c : user_bufs_) {
      if (c.p == p && c.bytes == bytes) {
        c.last_use = buffer_clock_;
        return c.buf.get();
      }
    }
    if (user_bufs_.size() < max_user_buffers) {
      user_bufs_.push_back({p, bytes, buffer_clock_, make_buffer(p, bytes)});
      return user_bufs_.back().buf.get();
    }
    // An op uses at most a few buffers and each got the newest stamp, so the least recently
    // used one is never part of the op in progress.
    auto& victim =
        *std::min_element(user_bufs_.begin(), user_bufs_.end(),
                          [](const auto& a, const auto& b) { return a.last_use < b.last_use; });
    victim.buf.reset();
    victim = {p, bytes, buffer_clock_, make_buffer(p, bytes)};
    return victim.buf.get();
  }

  std::unique_ptr<ubuf> make_buffer(void* p, size_t bytes) {
    return context_->createUnboundBuffer(p, bytes);
  }

  // ---- algorithms (gloo_communicator.cpp: all-reduce, broadcast, barrier, rings) ----

  void all_reduce_small(const op_ctx& op, float* data, size_t count, reduce_op rop);
  void all_reduce_ring(const op_ctx& op, float* data, size_t count, reduce_op rop);
  /// The ring's sum of `input` (this rank's `count` floats, left as they are) into `out`: the
  /// same bits as copying `input` to `out` and summing in place, without the copy.
  void all_reduce_ring_into(const op_ctx& op, const float* input, float* out, size_t count);
  /// Where a ring reduce-scatter reads this rank's own values when they are not in `data`:
  /// `values` (covered by `buffer` from its first float) stands in for `data` until each block
  /// is first summed into `data`; `sends` counts what went from `buffer`.
  struct ring_source {
    const float* values = nullptr;
    ubuf* buffer = nullptr;
    size_t sends = 0;
  };
  /// Ring reduce-scatter over `count` floats cut into size() blocks (piece()), in place; `mine`
  /// covers `data`. Rank r ends up owning block r + 1 + shift, fully reduced. Adds the sends it
  /// posts to `sends` (the caller waits for them). With `source`, this rank's own values come
  /// from there rather than from `data` (whose blocks are written before they are read).
  void ring_reduce_scatter(const op_ctx& op, uint64_t slot, float* data, size_t count, ubuf& mine,
                           long shift, size_t& sends, ring_source* source = nullptr);
  /// Ring all-gather over `elems` elements of `elem_size` bytes cut into size() blocks, in
  /// place; rank r starts owning block r + 1 + shift. Adds its sends to `sends`.
  void ring_all_gather(const op_ctx& op, uint64_t slot, size_t elems, size_t elem_size, ubuf& mine,
                       long shift, size_t& sends);
  /// Grows the ring's receive scratch to `depth` segments of `seg_bytes` (kept between ops).
  void ensure_ring_scratch(size_t seg_bytes, size_t depth);
  void broadcast_star(const op_ctx& op, char* data, size_t bytes, int root);
  void broadcast_chain(const op_ctx& op, char* data, size_t bytes, int root);
  void barrier_dissemination(const op_ctx& op);

  // ---- the rest of the set (gloo_collectives.cpp) ----

  /// Posts every receive and send of an exchange in which this rank sends send_bytes[j] bytes at
  /// send_off[j] of `in` to rank j and receives recv_bytes[j] at recv_off[j] of `out` from it.
  void exchange(const op_ctx& op, const char* in, const size_t* send_bytes, const size_t* send_off,
                char* out, const size_t* recv_bytes, const size_t* recv_off);
  /// The tree sums (gloo_tree_sum.cpp): rank j owns floats `slices[j]` of the pieces'
  /// buffers; every rank sends each owner its pieces' floats of that slice, segment by segment,
  /// and the owner combines each segment as soon as all of it has arrived, into `out` (where
  /// float x of the buffers lands at out[x - out_offset]). With `gather`, each combined segment
  /// goes on to every rank at once, received in place (an all-reduce; out_offset 0).
  void tree_exchange(const op_ctx& op, const tree_sum_parts& parts,
                     const std::vector<extent>& slices, float* out, size_t out_offset, bool gather);
  uint64_t p2p_slot(std::map<std::pair<int, uint32_t>, uint64_t>& seqs, int peer, uint32_t tag,
                    size_t bytes);
  void check_peer(const char* name, int peer) const;

  comm_identity id_;
  gloo_options opts_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint64_t next_op_ = 1;  ///< touched only by the calling thread (under m_ for clarity)

  // Scratch memory is allocated on first use and kept: first touch of memory is slow here.
  std::vector<float> ring_scratch_;
  std::unique_ptr<ubuf> ring_buf_;
  std::vector<float> small_scratch_;
  std::vector<std::vector<float>> tree_recv_;          ///< per peer: its pieces' segments in flight
  std::vector<std::unique_ptr<ubuf>> tree_recv_bufs_;  ///< over tree_recv_, one per peer
  std::vector<tree_piece> tree_pieces_;                ///< one segment's pieces, reused
  tree_scratch tree_scratch_;                          ///< the combine's inner nodes, reused
  std::vector<std::unique_ptr<ubuf>> small_bufs_;
  std::array<char, 64> barrier_rx_{};
  char barrier_tx_ = 0;
  std::unique_ptr<ubuf> barrier_rx_buf_;
  std::unique_ptr<ubuf> barrier_tx_buf_;
  /// user_buffer()'s cache, least recently used first out.
  struct cached_buffer {
    void* p;
    size_t bytes;
    uint64_t last_use;
    std::unique_ptr<ubuf> buf;
  };
  static constexpr size_t max_user_buffers = 16;
  std::vector<cached_buffer> user_bufs_;
  uint64_t buffer_clock_ = 0;
  std::vector<float> work_;        ///< reduce_scatter's copy of its input (its ring runs in place)
  std::vector<size_t> offsets_;    ///< all_to_all(v)'s block offsets: send then receive
  std::vector<bool> arrived_;      ///< an exchange's sources seen so far (its error names the rest)
  std::vector<int> pending_from_;  ///< an exchange's sources not yet seen, for the watcher
  std::vector<bool> delivered_;    ///< an exchange's destinations whose sends completed
  std::vector<int> pending_to_;    ///< the others, for the watcher
  /// Messages sent to / received from (peer, tag) so far: the sequence part of p2p slots.
  std::map<std::pair<int, uint32_t>, uint64_t> sent_seq_;
  std::map<std::pair<int, uint32_t>, uint64_t> recv_seq_;

  std::atomic<bool> aborted_{false};
  mutable std::mutex m_;
  std::vector<ubuf*> live_;         ///< buffers abort() must wake; guarded by m_
  bool in_flight_ = false;          ///< guarded by m_
  bool closed_ = false;             ///< guarded by m_
  std::optional<comm_error> dead_;  ///< the first failure; guarded by m_

  // The watcher (see start_watch()); all guarded by m_ but the thread.
  std::vector<int> watched_;         ///< the peers the wait in progress needs
  std::vector<std::string> broken_;  ///< per peer: gloo's error once its pair broke, else empty
  std::optional<std::string> lost_;  ///< why the watcher woke the op in progress
  bool stopping_ = false;
  bool look_ = false;      ///< a wait began that needs a broken pair
  uint64_t wait_seq_ = 0;  ///< waits begun so far
  int armed_ = 0;          ///< pairs the current probe waits on
  std::condition_variable watch_cv_;
  char probe_byte_ = 0;
  std::unique_ptr<ubuf> probe_buf_;                  ///< the armed probe; never receives anything
  std::vector<std::unique_ptr<ubuf>> spent_probes_;  ///< earlier probes, which pairs still name
  std::thread watcher_;
};

}  // namespace troupe::comm::gloo_detail
