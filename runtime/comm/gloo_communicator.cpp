// gloo_communicator: the collectives are written here over gloo's unbound buffers, not taken
// from gloo's algorithm classes, because every wait must be bounded by the op's deadline and
// cancellable from another thread (gloo's AllreduceRing blocked on a hung peer is not).
// This file holds the all-reduce, broadcast, barrier and the two ring phases other ops reuse.
#include "runtime/comm/gloo_communicator.hpp"

#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <sys/socket.h>

#include <cstring>
#include <optional>

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

void gloo_communicator::ensure_ring_scratch(size_t seg_bytes, size_t depth) {
  const size_t floats = depth * ceil_div(seg_bytes, sizeof(float));
  if (ring_scratch_.size() < floats) {
    ring_buf_.reset();
    ring_scratch_.assign(floats, 0.0f);
    ring_buf_ = make_buffer(ring_scratch_.data(), ring_scratch_.size() * sizeof(float));
  }
}

void gloo_communicator::ring_reduce_scatter(const op_ctx& op, uint64_t slot, float* data,
                                            size_t count, ubuf& mine, long shift, size_t& sends) {
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
  auto send = [&](size_t block, size_t k) {
    const extent s = seg(block, k);
    if (s.len == 0) return;
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
  for (size_t k = 0; k < nseg; ++k) send(block_of(r), k);
  for (size_t u = 0; u < units; ++u) {
    const size_t step = u / nseg;
    const size_t k = u % nseg;
    const size_t block = block_of(r - static_cast<long>(step) - 1);
    const extent s = seg(block, k);
    if (s.len > 0) {
      wait_recv(op, *ring_buf_, prev);
      add_into(data + s.begin, ring_scratch_.data() + (u % depth) * seg_elems, s.len);
    }
    if (u + depth < units) recv(u + depth);
    if (step + 2 < static_cast<size_t>(p)) send(block, k);
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

/// gloo publishes under "<rank>" the listening addresses of that rank's pairs, one
/// tcp::Address after another (a sockaddr_storage and a sequence number each); connects to
/// them are the ones to sign.
void allow_pair_addresses(tcp_signature_scope& signing, const comm_identity& id,
                          const std::string& key, const std::vector<char>& value) {
  if (key.empty() || key.find_first_not_of("0123456789") != std::string::npos) return;
  constexpr size_t entry = sizeof(sockaddr_storage) + sizeof(ssize_t);
  if (value.size() != entry * static_cast<size_t>(id.size - 1)) {
    throw comm_error(comm_errc::internal,
                     "gloo published " + std::to_string(value.size()) + " address bytes for rank " +
                         key + ", expected " + std::to_string(entry * (id.size - 1)) +
                         " (a gloo whose address format troupe does not know)");
  }
  for (size_t at = 0; at < value.size(); at += entry) {
    sockaddr_storage address;
    std::memcpy(&address, value.data() + at, sizeof(address));
    signing.allow_peer(address);
  }
}

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
  std::optional<tcp_signature_scope> signing;
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
    }
    gloo_store_adapter rendezvous(scoped, deadline, [&](const std::string& key, const auto& v) {
      if (signing) allow_pair_addresses(*signing, id, key, v);
    });
    auto context = std::make_shared<gloo::rendezvous::Context>(id.rank, id.size);
    // gloo waits five times its timeout for a pair to connect; the store waits are bounded
    // by the adapter's deadline instead.
    context->setTimeout(std::max(std::chrono::milliseconds(1), opts.connect_timeout / 5));
    context->connectFullMesh(rendezvous, device);
    if (signing) {
      // Every pair is connected; drop the keys (signing each data segment would cost most of
      // the bandwidth), then wait until every rank has, so no signed segment meets an
      // unsigned socket or the other way round.
      if (!signing->unsign_connections()) {
        throw comm_error(comm_errc::internal, where + ": " + signing->error());
      }
      signing.reset();
      scoped.set_string("unsigned/" + std::to_string(id.rank), "1");
      std::vector<std::string> keys;
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
    throw as_connect_error(e, where);
  } catch (const gloo::IoException& e) {
    const std::string_view what(e.what());
    const bool late = clock_type::now() >= deadline ||
                      what.find("imeout") != std::string_view::npos ||
                      what.find("Timed out") != std::string_view::npos;
    std::string why = where + ": " + e.what();
    if (signing && !signing->error().empty()) {
      throw comm_error(comm_errc::invalid, why + " (" + signing->error() + ")");
    }
    if (late && signing)
      why +=
          " (pairs are signed: a process signing with another job's key, "
          "or none, is never answered)";
    throw comm_error(late ? comm_errc::timeout : comm_errc::peer_lost, why);
  } catch (const std::exception& e) {
    throw comm_error(comm_errc::internal, where + ": " + e.what());
  }
}

}  // namespace troupe::comm
