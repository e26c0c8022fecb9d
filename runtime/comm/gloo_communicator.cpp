// gloo_communicator: the collectives are written here over gloo's unbound buffers, not taken
// from gloo's algorithm classes, because every wait must be bounded by the op's deadline and
// cancellable from another thread (gloo's AllreduceRing blocked on a hung peer is not).
#include "runtime/comm/gloo_communicator.hpp"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <signal.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "runtime/comm/gloo_store.hpp"

namespace troupe::comm {
namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;
using ubuf = gloo::transport::UnboundBuffer;

/// A run of elements [begin, begin + len).
struct extent {
  size_t begin;
  size_t len;
};

/// Piece `i` of `n` elements cut into `parts` consecutive pieces whose lengths differ by at
/// most one (the first n % parts are the longer ones).
extent piece(size_t n, size_t parts, size_t i) {
  const size_t base = n / parts;
  const size_t rem = n % parts;
  return {i * base + std::min(i, rem), base + (i < rem ? 1 : 0)};
}

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/// dst += src. The fixed-width inner loop is vectorised even at -O2's cheap cost model.
void add_into(float* __restrict dst, const float* __restrict src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (size_t j = 0; j < 16; ++j) dst[i + j] += src[i + j];
  }
  for (; i < n; ++i) dst[i] += src[i];
}

/// Average is the sum divided by the group size, exactly as a reference would compute it.
void divide(float* p, size_t n, float d) {
  for (size_t i = 0; i < n; ++i) p[i] /= d;
}

void ignore_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
  });
}

class gloo_communicator final : public communicator {
 public:
  gloo_communicator(comm_identity id, gloo_options opts,
                    std::shared_ptr<gloo::transport::Device> device,
                    std::shared_ptr<gloo::rendezvous::Context> context)
      : id_(std::move(id)),
        opts_(std::move(opts)),
        device_(std::move(device)),
        context_(std::move(context)) {}

  ~gloo_communicator() override {
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
  enum class op_kind : uint64_t { all_reduce = 1, broadcast = 2, barrier = 3 };

  /// Slot layout: [63..24] op sequence number, [23..12] shape tag, [11..8] kind, [7..0] step.
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
      op.slot = slot_of(next_op_++, kind, shape);
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

  void wait_recv(const op_ctx& op, ubuf& b, int peer) {
    bool ok = false;
    try {
      ok = b.waitRecv(nullptr, left(op, peer, "receive from"));
    } catch (const gloo::IoException& e) {
      fail_from_gloo(op, peer, "receive from " + peer_name(peer), e.what());
    }
    if (!ok || aborted_) fail(op, comm_errc::aborted, peer, "aborted while receiving");
  }

  void wait_send(const op_ctx& op, ubuf& b, int peer) {
    bool ok = false;
    try {
      ok = b.waitSend(nullptr, left(op, peer, "send to"));
    } catch (const gloo::IoException& e) {
      fail_from_gloo(op, peer, "send to " + peer_name(peer), e.what());
    }
    if (!ok || aborted_) fail(op, comm_errc::aborted, peer, "aborted while sending");
  }

  std::unique_ptr<ubuf> make_buffer(void* p, size_t bytes) {
    return context_->createUnboundBuffer(p, bytes);
  }

  // ---- all-reduce ----

  /// Every rank sends its whole buffer to every other and sums the P contributions in rank
  /// order, so all ranks get bit-identical results in one round trip.
  void all_reduce_small(const op_ctx& op, float* data, size_t count, reduce_op rop) {
    const int p = id_.size;
    const int r = id_.rank;
    const size_t bytes = count * sizeof(float);
    const size_t region = opts_.small_all_reduce_bytes / sizeof(float);
    if (small_bufs_.empty()) {
      small_scratch_.assign(region * static_cast<size_t>(p - 1), 0.0f);
      for (int j = 0; j + 1 < p; ++j) {
        small_bufs_.push_back(
            make_buffer(small_scratch_.data() + region * j, region * sizeof(float)));
      }
    }
    auto from = [&](int j) -> ubuf& { return *small_bufs_[j < r ? j : j - 1]; };
    auto contribution = [&](int j) -> const float* {
      return j == r ? data : small_scratch_.data() + region * (j < r ? j : j - 1);
    };
    auto mine = make_buffer(data, bytes);
    std::vector<ubuf*> bufs{mine.get()};
    for (auto& b : small_bufs_) bufs.push_back(b.get());
    exposure seen(*this, op, bufs);

    for (int j = 0; j < p; ++j) {
      if (j != r) post_recv(op, from(j), j, op.slot, 0, bytes);
    }
    for (int j = 0; j < p; ++j) {
      if (j != r) post_send(op, *mine, j, op.slot, 0, bytes);
    }
    for (int j = 0; j < p; ++j) {
      if (j != r) wait_recv(op, from(j), j);
    }
    for (int j = 0; j + 1 < p; ++j) wait_send(op, *mine, -1);

    constexpr size_t block = 1024;
    std::array<float, block> acc;
    for (size_t at = 0; at < count; at += block) {
      const size_t n = std::min(block, count - at);
      std::copy_n(contribution(0) + at, n, acc.data());
      for (int j = 1; j < p; ++j) add_into(acc.data(), contribution(j) + at, n);
      std::copy_n(acc.data(), n, data + at);
    }
    if (rop == reduce_op::average) divide(data, count, static_cast<float>(p));
  }

  /// Ring reduce-scatter then ring all-gather, each block cut into segments so that step s+1
  /// of a segment starts as soon as step s of it is done. The all-gather receives in place.
  void all_reduce_ring(const op_ctx& op, float* data, size_t count, reduce_op rop) {
    const int p = id_.size;
    const int r = id_.rank;
    const int next = (r + 1) % p;
    const int prev = (r + p - 1) % p;
    auto block_of = [p](long b) { return static_cast<size_t>(((b % p) + p) % p); };
    const size_t seg_elems = std::max<size_t>(1, opts_.segment_bytes / sizeof(float));
    const size_t nseg = std::max<size_t>(1, ceil_div(ceil_div(count, p), seg_elems));
    const size_t depth = static_cast<size_t>(std::max(1, opts_.pipeline_depth));
    const size_t units = static_cast<size_t>(p - 1) * nseg;  // per phase
    if (ring_scratch_.size() < depth * seg_elems) {
      ring_buf_.reset();
      ring_scratch_.assign(depth * seg_elems, 0.0f);
      ring_buf_ = make_buffer(ring_scratch_.data(), ring_scratch_.size() * sizeof(float));
    }
    auto seg = [&](size_t block, size_t k) {
      const extent b = piece(count, p, block);
      const extent s = piece(b.len, nseg, k);
      return extent{b.begin + s.begin, s.len};
    };
    auto mine = make_buffer(data, count * sizeof(float));
    exposure seen(*this, op, {mine.get(), ring_buf_.get()});

    // Both sides skip empty segments, so sends and receives still pair up in order.
    size_t sends = 0;
    auto send = [&](size_t block, size_t k, uint64_t slot) {
      const extent s = seg(block, k);
      if (s.len == 0) return;
      post_send(op, *mine, next, slot, s.begin * sizeof(float), s.len * sizeof(float));
      ++sends;
    };

    // Reduce-scatter: step s sends block r-s and receives block r-s-1 into scratch, then adds
    // it in; after p-1 steps block r+1 holds the full sum.
    const uint64_t rs_slot = op.slot;
    auto rs_recv = [&](size_t u) {
      const extent s = seg(block_of(r - static_cast<long>(u / nseg) - 1), u % nseg);
      if (s.len == 0) return;
      post_recv(op, *ring_buf_, prev, rs_slot, (u % depth) * seg_elems * sizeof(float),
                s.len * sizeof(float));
    };
    for (size_t u = 0; u < std::min(depth, units); ++u) rs_recv(u);
    for (size_t k = 0; k < nseg; ++k) send(block_of(r), k, rs_slot);
    for (size_t u = 0; u < units; ++u) {
      const size_t step = u / nseg;
      const size_t k = u % nseg;
      const size_t block = block_of(r - static_cast<long>(step) - 1);
      const extent s = seg(block, k);
      if (s.len > 0) {
        wait_recv(op, *ring_buf_, prev);
        add_into(data + s.begin, ring_scratch_.data() + (u % depth) * seg_elems, s.len);
      }
      if (u + depth < units) rs_recv(u + depth);
      if (step + 2 < static_cast<size_t>(p)) send(block, k, rs_slot);
    }

    const size_t owned = block_of(r + 1);
    if (rop == reduce_op::average) {
      const extent b = piece(count, p, owned);
      divide(data + b.begin, b.len, static_cast<float>(p));
    }

    // All-gather: step s sends block r+1-s and receives block r-s straight into place.
    const uint64_t ag_slot = op.slot + 1;
    auto ag_recv = [&](size_t u) {
      const extent s = seg(block_of(r - static_cast<long>(u / nseg)), u % nseg);
      if (s.len == 0) return;
      post_recv(op, *mine, prev, ag_slot, s.begin * sizeof(float), s.len * sizeof(float));
    };
    for (size_t u = 0; u < std::min(depth, units); ++u) ag_recv(u);
    for (size_t k = 0; k < nseg; ++k) send(owned, k, ag_slot);
    for (size_t u = 0; u < units; ++u) {
      const size_t step = u / nseg;
      const size_t k = u % nseg;
      const size_t block = block_of(r - static_cast<long>(step));
      if (seg(block, k).len > 0) wait_recv(op, *mine, prev);
      if (u + depth < units) ag_recv(u + depth);
      if (step + 2 < static_cast<size_t>(p)) send(block, k, ag_slot);
    }
    for (size_t i = 0; i < sends; ++i) wait_send(op, *mine, next);
  }

  // ---- broadcast ----

  void broadcast_star(const op_ctx& op, char* data, size_t bytes, int root) {
    auto buf = make_buffer(data, bytes);
    exposure seen(*this, op, {buf.get()});
    if (id_.rank != root) {
      post_recv(op, *buf, root, op.slot, 0, bytes);
      wait_recv(op, *buf, root);
      return;
    }
    for (int j = 0; j < id_.size; ++j) {
      if (j != root) post_send(op, *buf, j, op.slot, 0, bytes);
    }
    for (int j = 0; j + 1 < id_.size; ++j) wait_send(op, *buf, -1);
  }

  /// root -> root+1 -> ... in segments: each rank forwards a segment as soon as it has it, so
  /// the time is about one link's transfer time plus (size-1) segment hops.
  void broadcast_chain(const op_ctx& op, char* data, size_t bytes, int root) {
    const int p = id_.size;
    const int r = id_.rank;
    const int next = (r + 1) % p;
    const int prev = (r + p - 1) % p;
    const bool last = (r - root + p) % p == p - 1;
    const size_t nseg = ceil_div(bytes, std::max<size_t>(1, opts_.segment_bytes));
    const size_t depth = static_cast<size_t>(std::max(1, opts_.pipeline_depth));
    auto buf = make_buffer(data, bytes);
    exposure seen(*this, op, {buf.get()});
    size_t sends = 0;
    auto send = [&](size_t k) {
      const extent s = piece(bytes, nseg, k);
      post_send(op, *buf, next, op.slot, s.begin, s.len);
      ++sends;
    };
    auto recv = [&](size_t k) {
      const extent s = piece(bytes, nseg, k);
      post_recv(op, *buf, prev, op.slot, s.begin, s.len);
    };
    if (r == root) {
      for (size_t k = 0; k < nseg; ++k) send(k);
    } else {
      for (size_t k = 0; k < std::min(depth, nseg); ++k) recv(k);
      for (size_t k = 0; k < nseg; ++k) {
        wait_recv(op, *buf, prev);
        if (!last) send(k);
        if (k + depth < nseg) recv(k + depth);
      }
    }
    for (size_t i = 0; i < sends; ++i) wait_send(op, *buf, next);
  }

  // ---- barrier ----

  /// Dissemination barrier: in round k each rank signals rank+2^k and waits for rank-2^k;
  /// after ceil(log2 P) rounds every rank has heard, transitively, from every other.
  void barrier_dissemination(const op_ctx& op) {
    if (!barrier_rx_buf_) {
      barrier_rx_buf_ = make_buffer(barrier_rx_.data(), barrier_rx_.size());
      barrier_tx_buf_ = make_buffer(&barrier_tx_, 1);
    }
    exposure seen(*this, op, {barrier_rx_buf_.get(), barrier_tx_buf_.get()});
    const int p = id_.size;
    size_t round = 0;
    for (int d = 1; d < p; d *= 2, ++round) {
      const int to = (id_.rank + d) % p;
      const int from = (id_.rank - d + p) % p;
      post_recv(op, *barrier_rx_buf_, from, op.slot + round, round, 1);
      post_send(op, *barrier_tx_buf_, to, op.slot + round, 0, 1);
      wait_recv(op, *barrier_rx_buf_, from);
      wait_send(op, *barrier_tx_buf_, to);
    }
  }

  comm_identity id_;
  gloo_options opts_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint64_t next_op_ = 1;  ///< touched only by the calling thread (under m_ for clarity)

  // Scratch memory is allocated on first use and kept: first touch of memory is slow here.
  std::vector<float> ring_scratch_;
  std::unique_ptr<ubuf> ring_buf_;
  std::vector<float> small_scratch_;
  std::vector<std::unique_ptr<ubuf>> small_bufs_;
  std::array<char, 64> barrier_rx_{};
  char barrier_tx_ = 0;
  std::unique_ptr<ubuf> barrier_rx_buf_;
  std::unique_ptr<ubuf> barrier_tx_buf_;

  std::atomic<bool> aborted_{false};
  mutable std::mutex m_;
  std::vector<ubuf*> live_;         ///< buffers abort() must wake; guarded by m_
  bool in_flight_ = false;          ///< guarded by m_
  bool closed_ = false;             ///< guarded by m_
  std::optional<comm_error> dead_;  ///< the first failure; guarded by m_
};

}  // namespace

std::unique_ptr<communicator> make_gloo_communicator(kv_store& store, const comm_identity& id,
                                                     const gloo_options& opts) {
  const std::string where = "gloo connect (group " + id.group + ", generation " +
                            std::to_string(id.generation) + ", rank " + std::to_string(id.rank) +
                            " of " + std::to_string(id.size) + ")";
  if (id.size < 1 || id.rank < 0 || id.rank >= id.size || id.group.empty() ||
      id.group.find('/') != std::string::npos || opts.connect_timeout.count() <= 0 ||
      opts.pipeline_depth < 1 || opts.segment_bytes < sizeof(float) ||
      opts.small_all_reduce_bytes < sizeof(float)) {
    throw comm_error(comm_errc::invalid, where + ": invalid identity or options");
  }
  ignore_sigpipe();
  const auto deadline = clock_type::now() + opts.connect_timeout;
  try {
    prefix_store scoped(store, "g" + std::to_string(id.generation) + "/" + id.group);
    gloo_store_adapter rendezvous(scoped, deadline);
    gloo::transport::tcp::attr attr;
    attr.hostname = opts.bind_host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(id.rank, id.size);
    context->setTimeout(opts.connect_timeout);
    context->connectFullMesh(rendezvous, device);
    return std::make_unique<gloo_communicator>(id, opts, std::move(device), std::move(context));
  } catch (const store_error& e) {
    throw comm_error(e.code() == store_errc::timeout ? comm_errc::timeout : comm_errc::internal,
                     where + ": store: " + e.what());
  } catch (const gloo::IoException& e) {
    const std::string_view what(e.what());
    const bool late = clock_type::now() >= deadline ||
                      what.find("imeout") != std::string_view::npos ||
                      what.find("Timed out") != std::string_view::npos;
    throw comm_error(late ? comm_errc::timeout : comm_errc::peer_lost, where + ": " + e.what());
  } catch (const std::exception& e) {
    throw comm_error(comm_errc::internal, where + ": " + e.what());
  }
}

}  // namespace troupe::comm
