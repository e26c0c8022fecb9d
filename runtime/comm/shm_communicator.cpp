// shm_communicator: rendezvous (rank 0's memfd segment, opened by the others through
// /proc/<pid>/fd), the segment's layout, the failure plumbing (peers watched through the
// segment's "gone" flags and through pidfds, abort, the error messages) and send/recv.
#include "runtime/comm/shm_communicator.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <functional>
#include <new>
#include <optional>
#include <random>
#include <sstream>

#include "runtime/comm/shm_communicator_impl.hpp"

namespace troupe::comm {
namespace shm_detail {
namespace {

size_t round_up(size_t v, size_t to) { return ceil_div(v, to) * to; }

constexpr size_t page = 4096;

}  // namespace

segment_layout segment_layout::of(size_t size, size_t chunk_bytes, size_t p2p_chunk_bytes) {
  segment_layout l{};
  l.size = size;
  l.chunk_bytes = chunk_bytes;
  l.p2p_chunk_bytes = p2p_chunk_bytes;
  l.blocks = round_up(sizeof(segment_header), cache_line);
  l.channels = l.blocks + size * sizeof(rank_block);
  l.p2p = round_up(l.channels + size * size * sizeof(channel), page);
  l.total = l.p2p + size * size * 2 * p2p_chunk_bytes;
  return l;
}

namespace {

std::shared_ptr<void> own_mapping(void* base, size_t bytes) {
  if (base == nullptr) return nullptr;
  return std::shared_ptr<void>(base, [bytes](void* p) { ::munmap(p, bytes); });
}

std::vector<int> every_slot(int size) {
  std::vector<int> slots(static_cast<size_t>(size));
  for (int j = 0; j < size; ++j) slots[static_cast<size_t>(j)] = j;
  return slots;
}

}  // namespace

shm_communicator::shm_communicator(comm_identity id, shm_options opts, void* base,
                                   segment_layout layout, group_staging staging,
                                   std::vector<int> pidfds, std::optional<bool> single_copy)
    : shm_communicator(id, opts, own_mapping(base, layout.total), layout, std::move(staging),
                       std::move(pidfds), every_slot(id.size), single_copy, false) {}

shm_communicator::shm_communicator(comm_identity id, shm_options opts,
                                   std::shared_ptr<void> mapping, segment_layout layout,
                                   group_staging staging, std::vector<int> pidfds,
                                   std::vector<int> slots, std::optional<bool> single_copy,
                                   bool shrunk)
    : id_(std::move(id)),
      opts_(opts),
      mapping_(std::move(mapping)),
      base_(mapping_.get()),
      layout_(layout),
      slot_(std::move(slots)),
      shrunk_(shrunk),
      staging_(std::move(staging)),
      pidfds_(std::move(pidfds)),
      pids_(static_cast<size_t>(id_.size), 0),
      round_(first_round_of(id_.generation, shrunk_)),
      single_copy_(single_copy) {
  if (base_ != nullptr) {
    for (int j = 0; j < id_.size; ++j) pids_[j] = block(j).pid.load();
  }
}

shm_communicator::~shm_communicator() {
  if (staging_.own.data != nullptr) {
    auto& pool = staging_pool::process();
    pool.release(staging_.own.slot, this);  // nothing when a shrunk group took it over
    for (const auto& peer : staging_.peers) {
      if (peer.pid != 0) pool.detach(peer);
    }
  }
  // Peers still waiting for this rank fail at once instead of at their deadlines; those that
  // only needed what it already published see that first. The segment is unmapped with the
  // last communicator on it (a shrunk group shares it).
  if (base_ != nullptr) mark_gone();
}

std::unique_ptr<communicator> shm_communicator::shrink(const comm_identity& id,
                                                       const std::vector<int>& kept) {
  const std::string what =
      "shrink to group " + id.group + ", generation " + std::to_string(id.generation);
  const auto refuse = [&](const std::string& why) { invalid("shrink", what + ": " + why); };
  if (id.size < 1 || kept.size() != static_cast<size_t>(id.size) || id.rank < 0 ||
      id.rank >= id.size || id.group.empty() || id.group.find('/') != std::string::npos)
    refuse("the identity does not match the list of kept ranks");
  if (kept[static_cast<size_t>(id.rank)] != id_.rank)
    refuse("rank " + std::to_string(id.rank) + " of the new group must be this rank (" +
           std::to_string(id_.rank) + "), not rank " +
           std::to_string(kept[static_cast<size_t>(id.rank)]));
  std::vector<bool> seen(static_cast<size_t>(id_.size), false);
  for (int j : kept) {
    if (j < 0 || j >= id_.size || seen[static_cast<size_t>(j)])
      refuse("kept ranks must be distinct ranks of this group of " + std::to_string(id_.size));
    seen[static_cast<size_t>(j)] = true;
  }
  // Rounds and gone marks tell the groups on one segment apart by their generations.
  if (id.generation <= id_.generation || id.generation >= (uint64_t{1} << 23))
    refuse("the generation must be newer than " + std::to_string(id_.generation) +
           " (and below 2^23)");
  {
    std::lock_guard<std::mutex> lock(m_);
    if (in_op_) refuse("an operation of this group is still running");
  }
  if (base_ == nullptr)  // a group of one stays one
    return std::make_unique<shm_communicator>(id, opts_, nullptr, segment_layout{}, group_staging{},
                                              std::vector<int>{-1}, false);
  auto& pool = staging_pool::process();
  const size_t staging_bytes = 2 * opts_.chunk_bytes;
  const auto n = static_cast<size_t>(id.size);
  group_staging staging;
  staging.own = staging_.own;
  staging.of_rank.assign(n, nullptr);
  staging.peers.assign(n, staging_address{});
  std::vector<int> pidfds(n, -1), slots(n, 0);
  try {
    for (size_t i = 0; i < n; ++i) {
      const auto j = static_cast<size_t>(kept[i]);
      slots[i] = slot_[j];
      staging.of_rank[i] = staging_.of_rank[j];
      if (staging_.peers[j].pid == 0) continue;  // this rank
      // Mapped here already: the pool only counts one more use (and throws peer_lost for a
      // kept peer whose process is gone).
      const auto view = pool.attach(staging_.peers[j], staging_bytes);
      staging.peers[i] = staging_.peers[j];
      pidfds[i] = view.pidfd;
    }
  } catch (...) {
    for (const auto& peer : staging.peers)
      if (peer.pid != 0) pool.detach(peer);
    throw;
  }
  auto c = std::unique_ptr<shm_communicator>(
      new shm_communicator(id, opts_, mapping_, layout_, std::move(staging), std::move(pidfds),
                           std::move(slots), single_copy_, true));
  // The staging goes with the ranks that stay; this group's release of it becomes a no-op.
  if (staging_.own.data != nullptr) pool.hand_over(staging_.own.slot, this, c.get());
  return c;
}

bool shm_communicator::single_copy(const op_ctx& op) {
  if (!single_copy_) {
    auto published = [&] {
      for (int j = 0; j < id_.size; ++j) {
        if (block(j).joined.load() < joined_can_read) return false;
      }
      return true;
    };
    wait_for(op, -1, "learn whether every rank can read the others' memory", published);
    bool all = true;
    for (int j = 0; j < id_.size; ++j) all = all && block(j).joined.load() == joined_can_read;
    single_copy_ = all;
  }
  return *single_copy_;
}

void shm_communicator::mark_gone() {
  if (base_ == nullptr) return;
  // Never lowered: this rank's newer group (shrunk from this one) may have marked it first,
  // and its peers must go on seeing that.
  auto& gone = block(id_.rank).gone;
  uint32_t seen = gone.load();
  while (seen < gone_mark() && !gone.compare_exchange_weak(seen, gone_mark())) {
  }
  ring_bell();
}

void shm_communicator::ring_bell() const { ring(header()); }

bool shm_communicator::give_up_staging() {
  std::lock_guard<std::mutex> lock(m_);
  if (in_op_ || !(aborted_.load() || dead_)) return false;
  if (!dead_) dead_.emplace(comm_errc::aborted, "abort() was called (" + context_string(-1) + ")");
  return true;
}

void shm_communicator::abort() {
  aborted_.store(true);
  // Wakes this rank's own sleeping wait (it then sees aborted_) and tells the peers.
  mark_gone();
}

void shm_communicator::check_peer_alive(const op_ctx& op, int j, bool check_process,
                                        const char* action) {
  if (block(j).gone.load() > gone_mark() - 1) {
    fail(op, comm_errc::peer_lost, j,
         std::string(action) + " rank " + std::to_string(j) +
             ": it left the group (its communicator failed, was aborted or destroyed)");
  }
  if (!check_process) return;
  bool exited = false;
  if (pidfds_[j] >= 0) {
    pollfd p{pidfds_[j], POLLIN, 0};
    exited = ::poll(&p, 1, 0) > 0;
  } else {
    exited = ::kill(pids_[j], 0) != 0 && errno == ESRCH;
  }
  if (exited) {
    fail(op, comm_errc::peer_lost, j,
         std::string(action) + " rank " + std::to_string(j) + ": its process (pid " +
             std::to_string(pids_[j]) + ") exited");
  }
}

void shm_communicator::pull(const op_ctx& op, int j, uint64_t remote, void* local, size_t bytes) {
  auto* dst = static_cast<char*>(local);
  while (bytes > 0) {
    iovec l{dst, bytes};
    iovec r{reinterpret_cast<void*>(remote), bytes};
    const ssize_t n = ::process_vm_readv(pids_[j], &l, 1, &r, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      const bool gone = n == 0 || errno == ESRCH;
      fail(op, gone ? comm_errc::peer_lost : comm_errc::internal, j,
           "reading rank " + std::to_string(j) + "'s buffer: " +
               (gone ? std::string("its process exited") : std::string(std::strerror(errno))));
    }
    dst += n;
    remote += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

std::string shm_communicator::context_string(int peer) const {
  std::string s = "group " + id_.group + ", generation " + std::to_string(id_.generation) +
                  ", rank " + std::to_string(id_.rank) + " of " + std::to_string(id_.size);
  if (peer >= 0) s += ", peer " + std::to_string(peer);
  return s;
}

void shm_communicator::invalid(const char* name, const std::string& detail) const {
  throw comm_error(comm_errc::invalid, std::string("shm ") + name + " invalid: " + detail + " (" +
                                           context_string(-1) + ")");
}

void shm_communicator::fail(const op_ctx& op, comm_errc code, int peer,
                            const std::string& detail) const {
  throw comm_error(code, std::string("shm ") + op.name + " " + to_string(code) + ": " + detail +
                             " (" + context_string(peer) + ")");
}

// ---- point-to-point ----

void shm_communicator::check_peer_arg(const char* name, int peer) const {
  if (peer < 0 || peer >= id_.size || peer == id_.rank) {
    invalid(name, "peer " + std::to_string(peer) + " is not another rank of the group");
  }
  if (shrunk_)
    invalid(name,
            "point-to-point needs a connected group: a channel of the group this one was shrunk "
            "from may still hold an aborted message");
}

void shm_communicator::put_chunk(int peer, uint64_t h, const char* src, size_t len, size_t total,
                                 uint32_t tag) {
  channel& ch = chan(id_.rank, peer);
  std::memcpy(p2p_slot(id_.rank, peer, h), src, len);
  ch.slots[h % 2] = {tag, total, len, 0};
  ch.head.store(h + 1);
  ring_bell();
}

void shm_communicator::take_chunk(const op_ctx& op, int peer, uint64_t t, char* dst, size_t len,
                                  size_t total, uint32_t tag, const char* what) {
  channel& ch = chan(peer, id_.rank);
  const channel::slot_meta meta = ch.slots[t % 2];
  if (meta.total != total || meta.len != len || meta.direct != 0) {
    fail(op, comm_errc::invalid, peer,
         "rank " + std::to_string(peer) + " sends " + std::to_string(meta.total) +
             " bytes with tag " + std::to_string(tag) + "; this " + what + " expects " +
             std::to_string(total));
  }
  std::memcpy(dst, p2p_slot(peer, id_.rank, t), len);
  ch.tail.store(t + 1);
  ring_bell();
}

/// Chunks go through the (this rank, peer) channel's two slots; the send returns once the
/// receiver has taken the last one, so it pairs with recv exactly as gloo's does.
void shm_communicator::send(const void* data, size_t bytes, int peer, uint32_t tag,
                            const op_options& opts) {
  check_peer_arg("send", peer);
  if (bytes > 0 && data == nullptr) invalid("send", "null data with a non-zero size");
  run("send", 0, opts, [&](const op_ctx& ctx) {
    if (bytes == 0) return;
    channel& ch = chan(id_.rank, peer);
    const size_t c = layout_.p2p_chunk_bytes;
    const auto* src = static_cast<const char*>(data);
    uint64_t h = ch.head.load(std::memory_order_relaxed);
    const bool direct = direct_p2p(ctx, bytes);
    if (direct) {
      // One slot names the buffer, the receiver copies it in one read: two hand-offs instead
      // of one per chunk, each of which can cost a scheduler slice on a busy machine.
      wait_for(ctx, peer, "send to",
               [&] { return h - ch.tail.load(std::memory_order_acquire) < 2; });
      ch.slots[h % 2] = {tag, bytes, bytes, reinterpret_cast<uint64_t>(src)};
      ch.head.store(++h);
      ring_bell();
    }
    for (size_t at = direct ? bytes : 0; at < bytes; at += c) {
      const size_t len = std::min(c, bytes - at);
      wait_for(ctx, peer, "send to",
               [&] { return h - ch.tail.load(std::memory_order_acquire) < 2; });
      put_chunk(peer, h++, src + at, len, bytes, tag);
    }
    wait_for(ctx, peer, "send to", [&] { return ch.tail.load(std::memory_order_acquire) == h; });
  });
}

/// Takes chunks from the (peer, this rank) channel once its head message carries `tag`; a
/// message with another tag stays where it is (and the wait ends at the deadline).
void shm_communicator::recv(void* data, size_t bytes, int peer, uint32_t tag,
                            const op_options& opts) {
  check_peer_arg("recv", peer);
  if (bytes > 0 && data == nullptr) invalid("recv", "null data with a non-zero size");
  run("recv", 0, opts, [&](const op_ctx& ctx) {
    if (bytes == 0) return;
    channel& ch = chan(peer, id_.rank);
    const size_t c = layout_.p2p_chunk_bytes;
    auto* dst = static_cast<char*>(data);
    uint64_t t = ch.tail.load(std::memory_order_relaxed);
    if (direct_p2p(ctx, bytes)) {
      wait_for(ctx, peer, "receive from", [&] {
        return ch.head.load(std::memory_order_acquire) > t && ch.slots[t % 2].tag == tag;
      });
      const channel::slot_meta meta = ch.slots[t % 2];
      if (meta.total != bytes || meta.direct == 0) {
        fail(ctx, comm_errc::invalid, peer,
             "rank " + std::to_string(peer) + " sends " + std::to_string(meta.total) +
                 " bytes with tag " + std::to_string(tag) + "; this recv expects " +
                 std::to_string(bytes));
      }
      pull(ctx, peer, meta.direct, dst, bytes);
      ch.tail.store(++t);
      ring_bell();
      return;
    }
    for (size_t at = 0; at < bytes; at += c) {
      const size_t len = std::min(c, bytes - at);
      wait_for(ctx, peer, "receive from", [&] {
        return ch.head.load(std::memory_order_acquire) > t && ch.slots[t % 2].tag == tag;
      });
      take_chunk(ctx, peer, t++, dst + at, len, bytes, tag, "recv");
    }
  });
}

/// Both halves advance in one loop, whichever can: a chunk goes out when the (this rank,
/// send_peer) channel has a free slot, a chunk comes in when (recv_peer, this rank)'s head
/// carries `tag`; so two ranks sending to each other cannot deadlock. Returns when the whole
/// message has been received and the whole message sent has been taken, as send() does.
void shm_communicator::send_recv(const void* send_data, size_t send_bytes, int send_peer,
                                 void* recv_data, size_t recv_bytes, int recv_peer, uint32_t tag,
                                 const op_options& opts) {
  check_peer_arg("send_recv", send_peer);
  check_peer_arg("send_recv", recv_peer);
  if ((send_bytes > 0 && send_data == nullptr) || (recv_bytes > 0 && recv_data == nullptr)) {
    invalid("send_recv", "null data with a non-zero size");
  }
  run("send_recv", 0, opts, [&](const op_ctx& ctx) {
    const size_t c = layout_.p2p_chunk_bytes;
    channel& out = chan(id_.rank, send_peer);
    channel& in = chan(recv_peer, id_.rank);
    const auto* src = static_cast<const char*>(send_data);
    auto* dst = static_cast<char*>(recv_data);
    uint64_t h = out.head.load(std::memory_order_relaxed);
    uint64_t t = in.tail.load(std::memory_order_relaxed);
    const uint64_t h_end = h + ceil_div(send_bytes, c);
    const uint64_t t_end = t + ceil_div(recv_bytes, c);
    size_t sent = 0;
    size_t got = 0;
    auto can_send = [&] { return h < h_end && h - out.tail.load(std::memory_order_acquire) < 2; };
    auto can_recv = [&] {
      return t < t_end && in.head.load(std::memory_order_acquire) > t && in.slots[t % 2].tag == tag;
    };
    auto done = [&] {
      return h == h_end && t == t_end && out.tail.load(std::memory_order_acquire) == h_end;
    };
    while (!done()) {
      if (!can_send() && !can_recv()) {
        wait_for(
            ctx, send_peer, "send_recv with", [&] { return can_send() || can_recv() || done(); },
            recv_peer);
        continue;
      }
      if (can_send()) {
        const size_t len = std::min(c, send_bytes - sent);
        put_chunk(send_peer, h++, src + sent, len, send_bytes, tag);
        sent += len;
      }
      if (can_recv()) {
        const size_t len = std::min(c, recv_bytes - got);
        take_chunk(ctx, recv_peer, t++, dst + got, len, recv_bytes, tag, "send_recv");
        got += len;
      }
    }
  });
}

}  // namespace shm_detail

namespace {

using shm_detail::clock_type;
using shm_detail::random_nonce;
using shm_detail::segment_header;
using shm_detail::segment_layout;

/// Stands for the communicator being connected while it holds staging from the pool.
struct connecting_holder final : shm_detail::staging_holder {
  bool give_up_staging() override { return false; }
};

/// Owns a mapping, descriptors and staging until the communicator takes them.
struct rendezvous_state {
  int fd = -1;
  void* base = nullptr;
  size_t bytes = 0;
  connecting_holder holder;
  std::optional<shm_detail::group_staging> staging;
  ~rendezvous_state() {
    if (base != nullptr) ::munmap(base, bytes);
    if (fd >= 0) ::close(fd);
    if (staging) {
      auto& pool = shm_detail::staging_pool::process();
      pool.release(staging->own.slot, &holder);
      for (const auto& peer : staging->peers) {
        if (peer.pid != 0) pool.detach(peer);
      }
    }
  }
};

/// Sleeps on the segment's bell until `ready(joined)` holds for every rank's block; timeout
/// at the deadline, naming the ranks that are missing.
template <class Ready>
void await_every_rank(segment_header& h, const shm_detail::rank_block* blocks, size_t n,
                      clock_type::time_point deadline, const cancel_check& cancelled,
                      const std::string& where, const char* what, Ready&& ready) {
  for (;;) {
    if (cancelled && cancelled())
      throw comm_error(comm_errc::aborted, where + ": cancelled while waiting for the ranks to " +
                                               what + " (a newer generation began)");
    h.sleepers.fetch_add(1);
    const uint32_t seen = h.bell.load();
    std::string missing;
    for (size_t j = 0; j < n; ++j) {
      if (!ready(blocks[j].joined.load())) missing += " " + std::to_string(j);
    }
    const auto now = clock_type::now();
    if (missing.empty() || now >= deadline) {
      h.sleepers.fetch_sub(1);
      if (missing.empty()) return;
      throw comm_error(comm_errc::timeout, where + ": ranks" + missing + " did not " + what +
                                               " within the connect timeout");
    }
    // Woken by a peer's progress, or after a while to look at `cancelled` again.
    const auto until =
        cancelled ? std::min(deadline, now + std::chrono::milliseconds(50)) : deadline;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(until - now).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&h.bell), FUTEX_WAIT, seen, &ts, nullptr, 0);
    h.sleepers.fetch_sub(1);
  }
}

std::chrono::milliseconds left_until(clock_type::time_point deadline) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::ceil<std::chrono::milliseconds>(deadline - clock_type::now()));
}

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace

namespace {

// The rendezvous behind make_shm_communicator and connect_if_shm: `meet` and `key` carry rank
// 0's word to the others ("shm <pid> <fd> <nonce> <bytes>", or a verdict that is not shm);
// `decide` (rank 0, may be empty: always shm) is asked once the segment exists.
std::unique_ptr<communicator> rendezvous(kv_store& meet, const std::string& key,
                                         const comm_identity& id, const shm_options& opts_in,
                                         const std::function<std::string()>& decide,
                                         std::string& verdict) {
  const std::string where = "shm connect (group " + id.group + ", generation " +
                            std::to_string(id.generation) + ", rank " + std::to_string(id.rank) +
                            " of " + std::to_string(id.size) + ")";
  if (id.size < 1 || id.rank < 0 || id.rank >= id.size || id.group.empty() ||
      id.group.find('/') != std::string::npos || opts_in.connect_timeout.count() <= 0 ||
      opts_in.chunk_bytes < 256 * static_cast<size_t>(id.size) || opts_in.p2p_chunk_bytes < 64 ||
      opts_in.liveness_interval.count() <= 0) {
    throw comm_error(comm_errc::invalid, where + ": invalid identity or options");
  }
  // Whole pages, so that every region and slot starts page- (and cache-line-) aligned.
  shm_options opts = opts_in;
  opts.chunk_bytes = ceil_div(opts.chunk_bytes, 4096) * 4096;
  opts.p2p_chunk_bytes = ceil_div(opts.p2p_chunk_bytes, 4096) * 4096;
  const auto n = static_cast<size_t>(id.size);
  verdict = "shm";
  if (id.size == 1) {
    return std::make_unique<shm_detail::shm_communicator>(id, opts, nullptr, segment_layout{},
                                                          shm_detail::group_staging{},
                                                          std::vector<int>{-1}, false);
  }
  const auto deadline = clock_type::now() + opts.connect_timeout;
  const segment_layout layout = segment_layout::of(n, opts.chunk_bytes, opts.p2p_chunk_bytes);
  rendezvous_state st;
  st.bytes = layout.total;
  try {
    uint64_t nonce = 0;
    if (id.rank == 0) {
      st.fd = static_cast<int>(::syscall(
          SYS_memfd_create, ("troupe-g" + std::to_string(id.generation) + "-" + id.group).c_str(),
          MFD_CLOEXEC));
      if (st.fd < 0)
        throw comm_error(comm_errc::internal, where + ": " + errno_text("memfd_create"));
      if (::ftruncate(st.fd, static_cast<off_t>(layout.total)) != 0) {
        throw comm_error(comm_errc::internal, where + ": " + errno_text("ftruncate"));
      }
    } else {
      const std::string word = meet.get_string(key, left_until(deadline));
      if (word.rfind("shm ", 0) != 0) {  // rank 0 decided against shared memory
        verdict = word;
        return nullptr;
      }
      std::istringstream in(word.substr(4));
      int32_t pid = 0;
      int fd = -1;
      size_t total = 0;
      in >> pid >> fd >> nonce >> total;
      if (!in || total != layout.total) {
        throw comm_error(comm_errc::invalid,
                         where +
                             ": rank 0's segment does not match this rank's options "
                             "(size, chunk_bytes and p2p_chunk_bytes must agree)");
      }
      const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
      st.fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (st.fd < 0) {
        const bool gone = errno == ENOENT || errno == ESRCH;
        throw comm_error(gone ? comm_errc::peer_lost : comm_errc::internal,
                         where + ": " + errno_text("open rank 0's segment " + path) +
                             (gone ? " (rank 0 went away)"
                                   : " (every rank must run on this host, in one pid namespace, "
                                     "as the same user)"));
      }
    }
    // MAP_POPULATE for the header, the rank blocks and the channels, which every wait reads.
    // The point-to-point slots are faulted in by the pairs that use them: mapping a page
    // costs ~1.3 us here, and populating every slot of a large group cost rank 0 10-16 ms of
    // every rebuild after a failure, with every other rank waiting. The staging of the
    // collectives is not in the segment at all (shm_staging.hpp).
    st.base = ::mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, st.fd, 0);
    if (st.base == MAP_FAILED) {
      st.base = nullptr;
      throw comm_error(comm_errc::internal, where + ": " + errno_text("mmap"));
    }
    if (::mmap(st.base, layout.p2p, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE,
               st.fd, 0) == MAP_FAILED)
      throw comm_error(comm_errc::internal, where + ": " + errno_text("mmap (populate)"));
    auto* hdr = static_cast<segment_header*>(st.base);
    if (id.rank == 0) {
      nonce = random_nonce();
      new (hdr) segment_header{};
      hdr->magic = shm_detail::segment_magic;
      hdr->nonce = nonce;
      hdr->size = n;
      hdr->chunk_bytes = opts.chunk_bytes;
      hdr->p2p_chunk_bytes = opts.p2p_chunk_bytes;
      hdr->total_bytes = layout.total;
      auto* base = static_cast<char*>(st.base);
      for (size_t j = 0; j < n; ++j)
        new (base + layout.blocks + j * sizeof(shm_detail::rank_block)) shm_detail::rank_block{};
      for (size_t j = 0; j < n * n; ++j)
        new (base + layout.channels + j * sizeof(shm_detail::channel)) shm_detail::channel{};
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (decide) verdict = decide();
      if (verdict != "shm") {
        meet.set_string(key, verdict);
        return nullptr;
      }
      meet.set_string(key, "shm " + std::to_string(::getpid()) + " " + std::to_string(st.fd) + " " +
                               std::to_string(nonce) + " " + std::to_string(layout.total));
    } else if (hdr->magic != shm_detail::segment_magic || hdr->nonce != nonce || hdr->size != n ||
               hdr->chunk_bytes != opts.chunk_bytes ||
               hdr->p2p_chunk_bytes != opts.p2p_chunk_bytes) {
      throw comm_error(comm_errc::invalid,
                       where +
                           ": the segment rank 0 published is not this group's, or its "
                           "options differ from this rank's");
    }
    auto* blocks =
        reinterpret_cast<shm_detail::rank_block*>(static_cast<char*>(st.base) + layout.blocks);
    auto& pool = shm_detail::staging_pool::process();
    const size_t staging_bytes = 2 * opts.chunk_bytes;
    st.staging.emplace();
    st.staging->own =
        pool.acquire(id.group.substr(0, id.group.find('.')), staging_bytes, &st.holder);
    st.staging->of_rank.assign(n, nullptr);
    st.staging->peers.assign(n, shm_detail::staging_address{});
    auto& me = blocks[id.rank];
    me.pid.store(::getpid());
    me.base_addr.store(reinterpret_cast<uint64_t>(st.base));
    me.staging_fd.store(st.staging->own.address.fd);
    me.staging_nonce.store(st.staging->own.address.nonce);
    // The ranks meet once more, in the segment rather than in the store (a round trip of
    // every rank through the store costs a rebuilt 64-rank group 10-20 ms): after this, every
    // rank has mapped it and published its pid and staging.
    me.joined.store(shm_detail::joined_mapped);
    shm_detail::ring(*hdr);
    await_every_rank(*hdr, blocks, n, deadline, opts.cancelled, where, "map the segment",
                     [](uint32_t joined) { return joined >= shm_detail::joined_mapped; });
    // Every rank has the segment mapped: the descriptor is not needed any more, and once rank
    // 0 closes its own, the memory lives exactly as long as some rank maps it.
    ::close(st.fd);
    st.fd = -1;
    std::vector<int> pidfds(n, -1);
    // Single-copy reads need every rank to be able to read every other's memory: each probes
    // the peers it has not met by reading their pid through their own mapping of the segment,
    // and all go by the verdicts of all.
    bool can_read = opts.single_copy_bytes != SIZE_MAX;
    for (int j = 0; j < id.size; ++j) {
      if (j == id.rank) {
        st.staging->of_rank[j] = st.staging->own.data;
        continue;
      }
      const shm_detail::staging_address peer{blocks[j].pid.load(), blocks[j].staging_fd.load(),
                                             blocks[j].staging_nonce.load()};
      // attach() may throw: only what it returned is detached on the way out.
      const auto view = pool.attach(peer, staging_bytes);
      st.staging->of_rank[j] = const_cast<char*>(view.data);
      st.staging->peers[j] = peer;
      pidfds[j] = view.pidfd;
      if (!can_read || view.readable == 1) continue;
      int32_t got = 0;
      const uint64_t offset = static_cast<uint64_t>(reinterpret_cast<char*>(&blocks[j].pid) -
                                                    static_cast<char*>(st.base));
      iovec l{&got, sizeof(got)};
      iovec r{reinterpret_cast<void*>(blocks[j].base_addr.load() + offset), sizeof(got)};
      can_read = ::process_vm_readv(peer.pid, &l, 1, &r, 1, 0) == sizeof(got) && got == peer.pid;
      pool.note_readable(peer, can_read);
    }
    // Published without waiting for the others' verdicts: the first operation that needs the
    // group's answer waits for them (shm_communicator::single_copy), by which time they are in.
    me.joined.store(can_read ? shm_detail::joined_can_read : shm_detail::joined_cannot_read);
    shm_detail::ring(*hdr);
    const auto single_copy = can_read ? std::nullopt : std::optional<bool>(false);
    auto c = std::make_unique<shm_detail::shm_communicator>(id, opts, st.base, layout, *st.staging,
                                                            std::move(pidfds), single_copy);
    st.base = nullptr;
    pool.hand_over(st.staging->own.slot, &st.holder, c.get());
    st.staging.reset();
    return c;
  } catch (const store_error& e) {
    throw as_connect_error(e, where);
  } catch (const comm_error&) {
    throw;
  } catch (const std::exception& e) {
    throw comm_error(comm_errc::internal, where + ": " + e.what());
  }
}

}  // namespace

std::unique_ptr<communicator> make_shm_communicator(kv_store& store, const comm_identity& id,
                                                    const shm_options& opts) {
  prefix_store scoped(store, "g" + std::to_string(id.generation) + "/" + id.group + "/shm");
  std::string verdict;
  auto c = rendezvous(scoped, "segment", id, opts, {}, verdict);
  if (!c)  // only a rank 0 that asked `decide` publishes anything but a segment
    throw comm_error(comm_errc::invalid, "shm connect (group " + id.group + ", generation " +
                                             std::to_string(id.generation) +
                                             "): rank 0 published no segment but '" + verdict +
                                             "'");
  return c;
}

namespace shm_detail {

std::unique_ptr<communicator> connect_if_shm(kv_store& meet, const std::string& key,
                                             const comm_identity& id, const shm_options& opts,
                                             const std::function<std::string()>& decide,
                                             std::string& verdict) {
  return rendezvous(meet, key, id, opts, decide, verdict);
}

}  // namespace shm_detail

}  // namespace troupe::comm
