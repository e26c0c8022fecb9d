// gloo_communicator: the collectives are written here over gloo's unbound buffers, not taken
// from gloo's algorithm classes, because every wait must be bounded by the op's deadline and
// cancellable from another thread (gloo's AllreduceRing blocked on a hung peer is not).
// This file holds the all-reduce, broadcast, barrier and the two ring phases other ops reuse,
// and the connect: gloo's full mesh, bounded by one deadline, cancellable, and explained
// (which peer at which address could not be reached, and why) when it fails.
#include "runtime/comm/gloo_communicator.hpp"

#include <arpa/inet.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "runtime/comm/gloo_communicator_impl.hpp"
#include "runtime/comm/gloo_store.hpp"
#include "runtime/comm/tcp_signature.hpp"

namespace troupe::comm {
namespace gloo_detail {

// ---- all-reduce ----

/// Every rank sends its whole buffer to every other and sums the P contributions in rank
/// order, so all ranks get bit-identical results in one round trip.
void gloo_communicator::all_reduce_small(const op_ctx& op, float* data, size_t count,
                                         reduce_op rop) {
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
  ubuf* mine = user_buffer(data, bytes);
  std::vector<ubuf*> bufs{mine};
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
void gloo_communicator::all_reduce_ring(const op_ctx& op, float* data, size_t count,
                                        reduce_op rop) {
  ubuf* mine = user_buffer(data, count * sizeof(float));
  exposure seen(*this, op, {mine});
  size_t sends = 0;
  ring_reduce_scatter(op, op.slot, data, count, *mine, 0, sends);
  if (rop == reduce_op::average) {
    const extent b = piece(count, id_.size, static_cast<size_t>((id_.rank + 1) % id_.size));
    divide(data + b.begin, b.len, static_cast<float>(id_.size));
  }
  ring_all_gather(op, op.slot + 1, count, sizeof(float), *mine, 0, sends);
  for (size_t i = 0; i < sends; ++i) wait_send(op, *mine, (id_.rank + 1) % id_.size);
}

void gloo_communicator::all_reduce_ring_into(const op_ctx& op, const float* input, float* out,
                                             size_t count) {
  ubuf* mine = user_buffer(out, count * sizeof(float));
  ring_source source{input, user_buffer(const_cast<float*>(input), count * sizeof(float)), 0};
  exposure seen(*this, op, {mine, source.buffer});
  size_t sends = 0;
  ring_reduce_scatter(op, op.slot, out, count, *mine, 0, sends, &source);
  ring_all_gather(op, op.slot + 1, count, sizeof(float), *mine, 0, sends);
  const int next = (id_.rank + 1) % id_.size;
  for (size_t i = 0; i < source.sends; ++i) wait_send(op, *source.buffer, next);
  for (size_t i = 0; i < sends; ++i) wait_send(op, *mine, next);
}

void gloo_communicator::ensure_ring_scratch(size_t seg_bytes, size_t depth) {
  const size_t floats = depth * ceil_div(seg_bytes, sizeof(float));
  if (ring_scratch_.size() < floats) {
    ring_buf_.reset();
    ring_scratch_.assign(floats, 0.0f);
    ring_buf_ = make_buffer(ring_scratch_.data(), ring_scratch_.size() * sizeof(float));
  }
}

void gloo_communicator::ring_reduce_scatter(const op_ctx& op, uint64_t slot, float* data,
                                            size_t count, ubuf& mine, long shift, size_t& sends,
                                            ring_source* source) {
  const int p = id_.size;
  const long r = id_.rank + shift;
  const int next = (id_.rank + 1) % p;
  const int prev = (id_.rank + p - 1) % p;
  auto block_of = [p](long b) { return static_cast<size_t>(((b % p) + p) % p); };
  const size_t seg_elems = std::max<size_t>(1, opts_.segment_bytes / sizeof(float));
  const size_t nseg = std::max<size_t>(1, ceil_div(ceil_div(count, p), seg_elems));
  const size_t depth = static_cast<size_t>(std::max(1, opts_.pipeline_depth));
  const size_t units = static_cast<size_t>(p - 1) * nseg;
  ensure_ring_scratch(seg_elems * sizeof(float), depth);
  exposure seen(*this, op, {ring_buf_.get()});
  auto seg = [&](size_t block, size_t k) {
    const extent b = piece(count, p, block);
    const extent s = piece(b.len, nseg, k);
    return extent{b.begin + s.begin, s.len};
  };
  // Both sides skip empty segments, so sends and receives still pair up in order.
  // The first step sends this rank's own block: from `source` when its values are there.
  auto send = [&](size_t block, size_t k, bool own) {
    const extent s = seg(block, k);
    if (s.len == 0) return;
    if (own && source) {
      post_send(op, *source->buffer, next, slot, s.begin * sizeof(float), s.len * sizeof(float));
      ++source->sends;
      return;
    }
    post_send(op, mine, next, slot, s.begin * sizeof(float), s.len * sizeof(float));
    ++sends;
  };
  // Step s sends block r-s and receives block r-s-1 into scratch, then adds it in; after p-1
  // steps block r+1 holds the full sum.
  auto recv = [&](size_t u) {
    const extent s = seg(block_of(r - static_cast<long>(u / nseg) - 1), u % nseg);
    if (s.len == 0) return;
    post_recv(op, *ring_buf_, prev, slot, (u % depth) * seg_elems * sizeof(float),
              s.len * sizeof(float));
  };
  for (size_t u = 0; u < std::min(depth, units); ++u) recv(u);
  for (size_t k = 0; k < nseg; ++k) send(block_of(r), k, true);
  for (size_t u = 0; u < units; ++u) {
    const size_t step = u / nseg;
    const size_t k = u % nseg;
    const size_t block = block_of(r - static_cast<long>(step) - 1);
    const extent s = seg(block, k);
    if (s.len > 0) {
      wait_recv(op, *ring_buf_, prev);
      // Each block but this rank's own is received once: the first sum into `data`.
      const float* received = ring_scratch_.data() + (u % depth) * seg_elems;
      if (source)
        add_pair(data + s.begin, source->values + s.begin, received, s.len);
      else
        add_into(data + s.begin, received, s.len);
    }
    if (u + depth < units) recv(u + depth);
    if (step + 2 < static_cast<size_t>(p)) send(block, k, false);
  }
}

void gloo_communicator::ring_all_gather(const op_ctx& op, uint64_t slot, size_t elems,
                                        size_t elem_size, ubuf& mine, long shift, size_t& sends) {
  const int p = id_.size;
  const long r = id_.rank + shift;
  const int next = (id_.rank + 1) % p;
  const int prev = (id_.rank + p - 1) % p;
  auto block_of = [p](long b) { return static_cast<size_t>(((b % p) + p) % p); };
  const size_t seg_elems = std::max<size_t>(1, opts_.segment_bytes / elem_size);
  const size_t nseg = std::max<size_t>(1, ceil_div(ceil_div(elems, p), seg_elems));
  const size_t depth = static_cast<size_t>(std::max(1, opts_.pipeline_depth));
  const size_t units = static_cast<size_t>(p - 1) * nseg;
  auto seg = [&](size_t block, size_t k) {
    const extent b = piece(elems, p, block);
    const extent s = piece(b.len, nseg, k);
    return extent{(b.begin + s.begin) * elem_size, s.len * elem_size};
  };
  auto send = [&](size_t block, size_t k) {
    const extent s = seg(block, k);
    if (s.len == 0) return;
    post_send(op, mine, next, slot, s.begin, s.len);
    ++sends;
  };
  // Step s sends block r+1-s and receives block r-s straight into place.
  auto recv = [&](size_t u) {
    const extent s = seg(block_of(r - static_cast<long>(u / nseg)), u % nseg);
    if (s.len == 0) return;
    post_recv(op, mine, prev, slot, s.begin, s.len);
  };
  for (size_t u = 0; u < std::min(depth, units); ++u) recv(u);
  for (size_t k = 0; k < nseg; ++k) send(block_of(r + 1), k);
  for (size_t u = 0; u < units; ++u) {
    const size_t step = u / nseg;
    const size_t k = u % nseg;
    const size_t block = block_of(r - static_cast<long>(step));
    if (seg(block, k).len > 0) wait_recv(op, mine, prev);
    if (u + depth < units) recv(u + depth);
    if (step + 2 < static_cast<size_t>(p)) send(block, k);
  }
}

// ---- broadcast ----

void gloo_communicator::broadcast_star(const op_ctx& op, char* data, size_t bytes, int root) {
  ubuf* buf = user_buffer(data, bytes);
  exposure seen(*this, op, {buf});
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
void gloo_communicator::broadcast_chain(const op_ctx& op, char* data, size_t bytes, int root) {
  const int p = id_.size;
  const int r = id_.rank;
  const int next = (r + 1) % p;
  const int prev = (r + p - 1) % p;
  const bool last = (r - root + p) % p == p - 1;
  const size_t nseg = ceil_div(bytes, std::max<size_t>(1, opts_.segment_bytes));
  const size_t depth = static_cast<size_t>(std::max(1, opts_.pipeline_depth));
  ubuf* buf = user_buffer(data, bytes);
  exposure seen(*this, op, {buf});
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
void gloo_communicator::barrier_dissemination(const op_ctx& op) {
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

// A slot no operation uses (an op's slots start at sequence number 1, shifted left by 24), so
// the probe receives posted on it never match a message.
constexpr uint64_t probe_slot = 1;

void gloo_communicator::start_watch() {
  if (id_.size == 1) return;
  broken_.assign(static_cast<size_t>(id_.size), std::string());
  if (!arm_probe()) return;
  watcher_ = std::thread([this] { watch_pairs(); });
}

bool gloo_communicator::arm_probe() {
  auto probe = context_->createUnboundBuffer(&probe_byte_, 1);
  std::vector<std::pair<int, std::string>> found;
  int armed = 0;
  for (int j = 0; j < id_.size; ++j) {
    if (j == id_.rank) continue;
    {
      std::lock_guard<std::mutex> lock(m_);
      if (!broken_[static_cast<size_t>(j)].empty()) continue;
    }
    try {
      probe->recv(j, probe_slot, 0, 1);  // throws at once on a broken pair
      ++armed;
    } catch (const std::exception& e) {
      found.emplace_back(j, e.what());
    }
  }
  std::lock_guard<std::mutex> lock(m_);
  if (probe_buf_) spent_probes_.push_back(std::move(probe_buf_));
  probe_buf_ = std::move(probe);
  armed_ = armed;
  for (auto& [j, why] : found)
    broken_[static_cast<size_t>(j)] =
        "the connection to rank " + std::to_string(j) + " broke: " + why;
  if (!found.empty() && watched_broken_locked() >= 0) look_ = true;
  return !stopping_ && !closed_;
}

void gloo_communicator::look_after_grace() {
  constexpr milliseconds grace{100};
  std::unique_lock<std::mutex> lock(m_);
  look_ = false;
  if (watched_broken_locked() < 0) return;
  const uint64_t seq = wait_seq_;
  watch_cv_.wait_for(lock, grace, [&] { return stopping_ || wait_seq_ != seq; });
  if (stopping_ || wait_seq_ != seq || !in_flight_ || lost_) return;
  const int j = watched_broken_locked();
  if (j < 0) return;
  lost_ = broken_[static_cast<size_t>(j)];
  for (auto* b : live_) {
    b->abortWaitRecv();
    b->abortWaitSend();
  }
}

void gloo_communicator::watch_pairs() {
  // gloo treats the end of a wait's timeout as the failure of every pair; this one only ends
  // when a pair fails, or when abortWaitRecv() asks the watcher to look or to stop.
  constexpr auto forever = std::chrono::hours(24 * 365 * 50);
  for (;;) {
    ubuf* probe = nullptr;
    {
      std::unique_lock<std::mutex> lock(m_);
      if (stopping_) return;
      // With every pair broken there is no probe to wait on: only requests to look remain.
      if (!look_ && armed_ == 0) watch_cv_.wait(lock, [&] { return stopping_ || look_; });
      if (stopping_) return;
      if (!look_) probe = probe_buf_.get();
    }
    bool broke = false;
    if (probe != nullptr) {
      try {
        if (probe->waitRecv(nullptr, forever))
          return;  // a message on the probe's slot: not expected
      } catch (const std::exception&) {
        broke = true;
      }
    }
    {
      std::lock_guard<std::mutex> lock(m_);
      if (stopping_ || closed_) return;  // our own close ends the pairs: nothing to tell
    }
    if (broke && !arm_probe()) return;
    look_after_grace();
  }
}
}  // namespace gloo_detail

namespace {

using gloo_detail::clock_type;

void ignore_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
  });
}

std::string host_text(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw =
      a.ss_family == AF_INET
          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in&>(a).sin_addr)
          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr);
  if ((a.ss_family != AF_INET && a.ss_family != AF_INET6) ||
      ::inet_ntop(a.ss_family, raw, text, sizeof text) == nullptr)
    return "an address of family " + std::to_string(a.ss_family);
  return text;
}

std::string address_text(const sockaddr_storage& a) {
  const uint16_t port = a.ss_family == AF_INET
                            ? ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port)
                            : ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return a.ss_family == AF_INET6 ? "[" + host_text(a) + "]:" + std::to_string(port)
                                 : host_text(a) + ":" + std::to_string(port);
}

bool is_loopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr) >> 24) == 127;
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&x) || (IN6_IS_ADDR_V4MAPPED(&x) && x.s6_addr[12] == 127);
  }
  return false;
}

/// Whether `host` (the address the pairs listen on) is a loopback address.
bool host_is_loopback(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return false;
  sockaddr_storage a{};
  std::memcpy(&a, found->ai_addr, std::min<size_t>(found->ai_addrlen, sizeof a));
  ::freeaddrinfo(found);
  return is_loopback(a);
}

/// What make_gloo_communicator learns while gloo connects the pairs, to explain a failure:
/// every peer's pair address for this rank, and which peer gloo connects now.
struct connect_progress {
  std::map<int, sockaddr_storage> peer_address;  // peer rank -> its pair's address for us
  int current = -1;  // the peer whose addresses gloo read last: it connects that pair next
};

/// gloo publishes under "<rank>" the listening addresses of that rank's pairs, one
/// tcp::Address after another (a sockaddr_storage and a sequence number each), in the order
/// of the ranks it pairs with; gloo reads a peer's just before it connects their pair.
/// Connects to them are the ones to sign; a loopback address on one side of a pair and not on
/// the other can never connect (the ranks are on different hosts), so it fails at once.
void on_pair_addresses(connect_progress& progress, tcp_signature_scope* signing,
                       const comm_identity& id, bool loopback_here, const std::string& bind_host,
                       const std::string& where, const std::string& key,
                       const std::vector<char>& value) {
  if (key.empty() || key.find_first_not_of("0123456789") != std::string::npos) return;
  constexpr size_t entry = sizeof(sockaddr_storage) + sizeof(ssize_t);
  if (value.size() != entry * static_cast<size_t>(id.size - 1)) {
    throw comm_error(comm_errc::internal,
                     "gloo published " + std::to_string(value.size()) + " address bytes for rank " +
                         key + ", expected " + std::to_string(entry * (id.size - 1)) +
                         " (a gloo whose address format troupe does not know)");
  }
  const int peer = std::stoi(key);
  if (peer < 0 || peer >= id.size || peer == id.rank) return;
  for (size_t at = 0; at < value.size(); at += entry) {
    sockaddr_storage address;
    std::memcpy(&address, value.data() + at, sizeof(address));
    if (signing) signing->allow_peer(address);
  }
  const size_t mine = static_cast<size_t>(id.rank > peer ? id.rank - 1 : id.rank);
  sockaddr_storage address;
  std::memcpy(&address, value.data() + mine * entry, sizeof(address));
  progress.peer_address[peer] = address;
  progress.current = peer;
  if (is_loopback(address) != loopback_here) {
    const std::string them = "rank " + key + " listens on " + address_text(address);
    throw connect_error(
        comm_errc::invalid, connect_failure::loopback, host_text(address),
        where + ": " + them + " and this rank on " + bind_host +
            ": one of them is a loopback address, which a rank on another host cannot reach; "
            "start that node's agent with --iface NAME or --advertise ADDR (or have it reach "
            "the coordinator by an address the other hosts use)");
  }
}

/// Ends the pairs' connect from a thread of its own: once `cancelled` says so, or at the
/// deadline (gloo waits for each pair in turn, each wait as long as the whole deadline).
class connect_guard {
 public:
  enum class ended : uint8_t { no, cancelled, deadline };

  connect_guard(connect_watch& watch, cancel_check cancelled, clock_type::time_point deadline)
      : watch_(watch), cancelled_(std::move(cancelled)), deadline_(deadline) {
    thread_ = std::thread([this] { run(); });
  }
  ~connect_guard() { stop(); }
  connect_guard(const connect_guard&) = delete;
  connect_guard& operator=(const connect_guard&) = delete;

  void stop() {
    {
      std::lock_guard<std::mutex> lock(m_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  ended why() const { return why_.load(); }

 private:
  void run() {
    constexpr auto poll = std::chrono::milliseconds(20);
    std::unique_lock<std::mutex> lock(m_);
    while (!done_) {
      if (cancelled_ && cancelled_()) {
        why_ = ended::cancelled;
      } else if (clock_type::now() >= deadline_) {
        why_ = ended::deadline;
      } else {
        cv_.wait_until(lock, std::min(clock_type::now() + poll, deadline_));
        continue;
      }
      watch_.interrupt();
      return;
    }
  }

  connect_watch& watch_;
  cancel_check cancelled_;
  clock_type::time_point deadline_;
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::atomic<ended> why_{ended::no};
  std::thread thread_;
};

/// The errno a failed pair connect ended with: what connect() said at once, or what gloo
/// quotes from SO_ERROR ("connect [addr]:port: Connection refused"); 0 if neither.
int connect_errno_of(std::string_view what, const connect_watch& watch,
                     const sockaddr_storage* peer) {
  if (peer != nullptr) {
    if (const int e = watch.connect_errno(*peer)) return e;
  }
  if (what.find("connect") == std::string_view::npos) return 0;
  for (const int e : {ECONNREFUSED, ENETUNREACH, EHOSTUNREACH, EACCES, EPERM, ETIMEDOUT})
    if (what.find(std::strerror(e)) != std::string_view::npos) return e;
  return 0;
}

/// Throws the comm_error for gloo's failure to connect a pair: the peer, its address and why.
[[noreturn]] void throw_connect_failure(const std::string& where, std::string_view what,
                                        const connect_progress& progress,
                                        const connect_watch& watch, connect_guard::ended ended,
                                        bool signed_pairs, long signature_drops_before,
                                        const gloo_options& opts, bool late) {
  const auto known = progress.peer_address.find(progress.current);
  const sockaddr_storage* peer = known != progress.peer_address.end() ? &known->second : nullptr;
  const std::string host = peer ? host_text(*peer) : std::string("an unknown address");
  const std::string who =
      peer ? "rank " + std::to_string(known->first) + " at " + address_text(*peer)
           : std::string("a peer");
  if (ended == connect_guard::ended::cancelled)
    throw comm_error(comm_errc::aborted,
                     where + ": a newer generation began while connecting to " + who);
  const int err = connect_errno_of(what, watch, peer);
  if (ended != connect_guard::ended::deadline && err == ECONNREFUSED)
    throw connect_error(comm_errc::peer_lost, connect_failure::refused, host,
                        where + ": " + who +
                            " refused the connection (Connection refused: nothing listens "
                            "there; its process is gone, or it listens on another address)");
  if (ended != connect_guard::ended::deadline &&
      (err == ENETUNREACH || err == EHOSTUNREACH || err == EACCES || err == EPERM))
    throw connect_error(comm_errc::peer_lost, connect_failure::unreachable, host,
                        where + ": cannot reach " + who + " (" + std::strerror(err) +
                            "): check the address that node advertises (troupe agent "
                            "--iface NAME or --advertise ADDR) and the routes between the "
                            "nodes");
  late = late || ended == connect_guard::ended::deadline || err == ETIMEDOUT ||
         what.find("imeout") != std::string_view::npos;
  if (!late)
    throw comm_error(comm_errc::peer_lost,
                     where + ": " + std::string(what) + (peer ? " (" + who + ")" : ""));
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f s",
                std::chrono::duration<double>(opts.connect_timeout).count());
  const long drops = signed_pairs ? tcp_signature_drops() : -1;
  if (signed_pairs && signature_drops_before >= 0 && drops > signature_drops_before)
    throw connect_error(
        comm_errc::timeout, connect_failure::signature, host,
        where + ": no connection with " + who + " within " + seconds + ": this host dropped " +
            std::to_string(drops - signature_drops_before) +
            " TCP segments signed with another key, or not signed, meanwhile (a process "
            "without this job's key, or of another job, is at that address)");
  const std::string signed_too =
      signed_pairs ? "; or its pairs are signed with another job's key" : "";
  if (peer && watch.connected_to(*peer))
    throw connect_error(comm_errc::timeout, connect_failure::timed_out, host,
                        where + ": no answer from " + who + " within " + seconds +
                            " (timed out: that address routes nowhere from this host, or a "
                            "firewall drops the connection" +
                            signed_too + ")");
  throw connect_error(comm_errc::timeout, connect_failure::timed_out, host,
                      where + ": " + who + " did not connect to this rank, which listens on " +
                          opts.bind_host + ", within " + seconds + " (timed out: it cannot reach " +
                          opts.bind_host + ", or it is gone" + signed_too + ")");
}

}  // namespace

const char* to_string(connect_failure f) {
  switch (f) {
    case connect_failure::refused:
      return "refused";
    case connect_failure::unreachable:
      return "unreachable";
    case connect_failure::timed_out:
      return "timed-out";
    case connect_failure::signature:
      return "signature";
    case connect_failure::loopback:
      return "loopback";
  }
  return "unknown";
}

void rethrow_with_context(const comm_error& e, const std::string& context) {
  if (const auto* failed = dynamic_cast<const connect_error*>(&e))
    throw connect_error(failed->code(), failed->why(), failed->address(), context + e.what());
  throw comm_error(e.code(), context + e.what());
}

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
  std::optional<tcp_signature_scope> signing;
  // Kept outside the try: a failure is explained with what they saw.
  connect_progress progress;
  std::optional<connect_watch> watch;
  std::optional<connect_guard> guard;
  long signature_drops_before = -1;
  const bool loopback_here = host_is_loopback(opts.bind_host);
  auto ended = [&] { return guard ? guard->why() : connect_guard::ended::no; };
  try {
    prefix_store scoped(store, "g" + std::to_string(id.generation) + "/" + id.group);
    gloo::transport::tcp::attr attr;
    attr.hostname = opts.bind_host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    // Signing starts after the device is made: resolving the host binds probe sockets.
    if (!opts.pair_key.empty()) {
      if (opts.pair_key.size() > 80) {
        throw comm_error(comm_errc::invalid, where + ": the pair key has over 80 bytes");
      }
      signing.emplace(opts.pair_key);
      signature_drops_before = tcp_signature_drops();
    }
    gloo_store_adapter rendezvous(scoped, deadline, [&](const std::string& key, const auto& v) {
      on_pair_addresses(progress, signing ? &*signing : nullptr, id, loopback_here, opts.bind_host,
                        where, key, v);
    });
    auto context = std::make_shared<gloo::rendezvous::Context>(id.rank, id.size);
    // gloo waits five times its timeout for a pair to connect, each pair in turn; the guard
    // ends the whole connect at the deadline, and the store waits end there too (adapter).
    context->setTimeout(std::max(std::chrono::milliseconds(1), opts.connect_timeout / 5));
    watch.emplace();
    guard.emplace(*watch, opts.cancelled, deadline);
    context->connectFullMesh(rendezvous, device);
    guard->stop();
    if (guard->why() != connect_guard::ended::no) {
      // Interrupted just as the last pair connected: the pairs are whole, but say what the
      // guard saw, as the caller expects.
      if (guard->why() == connect_guard::ended::cancelled)
        throw comm_error(comm_errc::aborted,
                         where + ": a newer generation began while the pairs connected");
    }
    guard.reset();
    watch.reset();
    if (signing) {
      // Every pair is connected; drop the keys (signing each data segment would cost most of
      // the bandwidth), then wait until every rank has, so no signed segment meets an
      // unsigned socket or the other way round. Before that, every rank waits until what it
      // sent while connecting is acknowledged, and for every other rank to have: on a lossy
      // link a segment resent after its sender dropped the keys (or an acknowledgement sent
      // after its receiver did) is dropped by the side that still signs, forever.
      if (!signing->await_acknowledged(deadline, opts.cancelled)) {
        if (opts.cancelled && opts.cancelled())
          throw comm_error(comm_errc::aborted,
                           where + ": a newer generation began while the pairs connected");
        throw comm_error(comm_errc::timeout, where + ": " + signing->error());
      }
      scoped.set_string("acknowledged/" + std::to_string(id.rank), "1");
      std::vector<std::string> acknowledged;
      acknowledged.reserve(static_cast<size_t>(id.size));
      for (int j = 0; j < id.size; ++j) acknowledged.push_back("acknowledged/" + std::to_string(j));
      scoped.wait(acknowledged, std::max(std::chrono::milliseconds(1),
                                         std::chrono::duration_cast<std::chrono::milliseconds>(
                                             deadline - clock_type::now())));
      if (!signing->unsign_connections()) {
        throw comm_error(comm_errc::internal, where + ": " + signing->error());
      }
      signing.reset();
      scoped.set_string("unsigned/" + std::to_string(id.rank), "1");
      std::vector<std::string> keys;
      keys.reserve(static_cast<size_t>(id.size));
      for (int j = 0; j < id.size; ++j) keys.push_back("unsigned/" + std::to_string(j));
      scoped.wait(keys, std::max(std::chrono::milliseconds(1),
                                 std::chrono::duration_cast<std::chrono::milliseconds>(
                                     deadline - clock_type::now())));
    }
    return std::make_unique<gloo_detail::gloo_communicator>(id, opts, std::move(device),
                                                            std::move(context));
  } catch (const comm_error&) {
    throw;
  } catch (const store_error& e) {
    if (ended() == connect_guard::ended::cancelled)
      throw comm_error(comm_errc::aborted,
                       where + ": a newer generation began while connecting: " + e.what());
    throw as_connect_error(e, where);
  } catch (const gloo::IoException& e) {
    if (signing && !signing->error().empty()) {
      throw comm_error(comm_errc::invalid, where + ": " + e.what() + " (" + signing->error() + ")");
    }
    if (guard) guard->stop();
    if (watch) {
      throw_connect_failure(where, e.what(), progress, *watch, ended(), signing.has_value(),
                            signature_drops_before, opts, clock_type::now() >= deadline);
    }
    throw comm_error(comm_errc::peer_lost, where + ": " + e.what());
  } catch (const std::exception& e) {
    throw comm_error(comm_errc::internal, where + ": " + e.what());
  }
}

}  // namespace troupe::comm
