// The gloo backend's reduce-scatter, all-gather, all-to-all(v) and point-to-point send/recv,
// built from the same abortable, deadline-bounded steps as its all-reduce.
#include <cstring>

#include "runtime/comm/gloo_communicator_impl.hpp"

namespace troupe::comm::gloo_detail {
namespace {

/// 8 well-mixed bits of a message size. Both sides of a transfer put it into the slot, so a
/// sender and receiver that disagree on the size wait (and time out) instead of handing gloo
/// a message larger than the posted receive, which it treats as fatal on its I/O thread.
uint64_t size_tag(size_t bytes) { return (bytes * 0x9E3779B97F4A7C15ull) >> 56; }

}  // namespace

/// Reduce-scatter is the first half of the ring all-reduce run with blocks shifted by one, so
/// that rank r ends up owning block r. The ring works in place, hence the copy of `in` (cheap
/// next to the transfer: memory moves an order of magnitude faster than loopback TCP).
void gloo_communicator::reduce_scatter(const float* in, float* out, size_t count, reduce_op op,
                                       const op_options& opts) {
  if (count > 0 && (in == nullptr || out == nullptr)) {
    invalid("reduce_scatter", "null buffer with a non-zero count");
  }
  run("reduce_scatter", op_kind::reduce_scatter, count, opts, [&](const op_ctx& ctx) {
    if (count == 0) return;
    const auto p = static_cast<size_t>(id_.size);
    const auto r = static_cast<size_t>(id_.rank);
    if (p == 1) {
      std::memmove(out, in, count * sizeof(float));
      return;
    }
    const size_t total = count * p;
    if (work_.size() < total) work_.assign(total, 0.0f);
    std::copy_n(in, total, work_.data());
    ubuf* mine = user_buffer(work_.data(), total * sizeof(float));
    exposure seen(*this, ctx, {mine});
    size_t sends = 0;
    ring_reduce_scatter(ctx, ctx.slot, work_.data(), total, *mine, -1, sends);
    for (size_t i = 0; i < sends; ++i) wait_send(ctx, *mine, (id_.rank + 1) % id_.size);
    std::copy_n(work_.data() + r * count, count, out);
    if (op == reduce_op::average) divide(out, count, static_cast<float>(p));
  });
}

/// The second half of the ring all-reduce, on bytes, received straight into `out`.
void gloo_communicator::all_gather(const void* in, void* out, size_t bytes,
                                   const op_options& opts) {
  if (bytes > 0 && (in == nullptr || out == nullptr)) {
    invalid("all_gather", "null buffer with a non-zero size");
  }
  run("all_gather", op_kind::all_gather, bytes, opts, [&](const op_ctx& ctx) {
    if (bytes == 0) return;
    const auto p = static_cast<size_t>(id_.size);
    auto* dst = static_cast<char*>(out);
    std::memmove(dst + static_cast<size_t>(id_.rank) * bytes, in, bytes);  // in may alias out
    if (p == 1) return;
    ubuf* mine = user_buffer(dst, p * bytes);
    exposure seen(*this, ctx, {mine});
    size_t sends = 0;
    ring_all_gather(ctx, ctx.slot, p * bytes, 1, *mine, -1, sends);
    for (size_t i = 0; i < sends; ++i) wait_send(ctx, *mine, (id_.rank + 1) % id_.size);
  });
}

void gloo_communicator::all_to_all(const void* in, void* out, size_t bytes_per_rank,
                                   const op_options& opts) {
  if (bytes_per_rank > 0 && (in == nullptr || out == nullptr)) {
    invalid("all_to_all", "null buffer with a non-zero size");
  }
  if (in == out && bytes_per_rank > 0 && id_.size > 1) {
    invalid("all_to_all", "in and out must not be the same buffer");
  }
  run("all_to_all", op_kind::all_to_all, bytes_per_rank, opts, [&](const op_ctx& ctx) {
    const auto p = static_cast<size_t>(id_.size);
    offsets_.resize(2 * p);
    for (size_t j = 0; j < p; ++j) offsets_[j] = bytes_per_rank;
    for (size_t j = 0; j < p; ++j) offsets_[p + j] = j * bytes_per_rank;
    exchange(ctx, static_cast<const char*>(in), offsets_.data(), offsets_.data() + p,
             static_cast<char*>(out), offsets_.data(), offsets_.data() + p);
  });
}

void gloo_communicator::all_to_allv(const void* in, const std::vector<size_t>& send_bytes,
                                    void* out, const std::vector<size_t>& recv_bytes,
                                    const op_options& opts) {
  const auto p = static_cast<size_t>(id_.size);
  if (auto why = all_to_allv_argument_error(id_.rank, id_.size, in, send_bytes, out, recv_bytes);
      !why.empty()) {
    invalid("all_to_allv", why);
  }
  // The shape tag cannot name the sizes (each rank's differ); each transfer's slot does.
  run("all_to_allv", op_kind::all_to_allv, 0, opts, [&](const op_ctx& ctx) {
    all_to_allv_offsets(send_bytes, recv_bytes, offsets_);
    exchange(ctx, static_cast<const char*>(in), send_bytes.data(), offsets_.data(),
             static_cast<char*>(out), recv_bytes.data(), offsets_.data() + p);
  });
}

/// Every transfer is posted at once (the mesh has a connection per pair, so they proceed in
/// parallel); receives first, so no send waits on a receive that is not posted yet. Sends go
/// to rank+1, rank+2, ... so that not every rank starts with the same destination.
void gloo_communicator::exchange(const op_ctx& op, const char* in, const size_t* send_bytes,
                                 const size_t* send_off, char* out, const size_t* recv_bytes,
                                 const size_t* recv_off) {
  const int p = id_.size;
  const int r = id_.rank;
  if (send_bytes[r] > 0) std::memcpy(out + recv_off[r], in + send_off[r], send_bytes[r]);
  if (p == 1) return;
  size_t in_total = 0;
  size_t out_total = 0;
  for (int j = 0; j < p; ++j) {
    if (j == r) continue;
    in_total = std::max(in_total, send_off[j] + send_bytes[j]);
    out_total = std::max(out_total, recv_off[j] + recv_bytes[j]);
  }
  ubuf* src = nullptr;
  ubuf* dst = nullptr;
  std::vector<ubuf*> bufs;
  if (in_total > 0) bufs.push_back(src = user_buffer(const_cast<char*>(in), in_total));
  if (out_total > 0) bufs.push_back(dst = user_buffer(out, out_total));
  exposure seen(*this, op, bufs);
  size_t recvs = 0;
  size_t sends = 0;
  for (int s = 1; s < p; ++s) {
    const int from = (r - s + p) % p;
    if (recv_bytes[from] == 0) continue;
    post_recv(op, *dst, from, op.slot + size_tag(recv_bytes[from]), recv_off[from],
              recv_bytes[from]);
    ++recvs;
  }
  for (int s = 1; s < p; ++s) {
    const int to = (r + s) % p;
    if (send_bytes[to] == 0) continue;
    post_send(op, *src, to, op.slot + size_tag(send_bytes[to]), send_off[to], send_bytes[to]);
    ++sends;
  }
  // The receives share one buffer, so a wait that runs out cannot name its peer. gloo says
  // the source of each completed wait, but keeps only the latest: when two completions come
  // before a wait, one source is reported twice and the other never. The error then gives
  // the count alone rather than a list that may name a rank that did send.
  arrived_.assign(static_cast<size_t>(p), false);  // no allocation once sized
  size_t done = 0;
  bool exact = true;
  try {
    for (; done < recvs; ++done) {
      // The watcher looks only at the peers still owed a message: one that sent its share
      // and left is no reason to fail. Once the sources are unsure it looks at none.
      pending_from_.clear();
      for (int j = 0; exact && j < p; ++j)
        if (j != r && recv_bytes[j] > 0 && !arrived_[static_cast<size_t>(j)])
          pending_from_.push_back(j);
      int source = -1;
      wait_recv(op, *dst, -1, &source, &pending_from_);
      if (source < 0 || source >= p || arrived_[static_cast<size_t>(source)])
        exact = false;
      else
        arrived_[static_cast<size_t>(source)] = true;
    }
  } catch (const comm_error& e) {
    std::string missing;
    for (int j = 0; exact && j < p; ++j) {
      if (j != r && recv_bytes[j] > 0 && !arrived_[static_cast<size_t>(j)])
        missing += (missing.empty() ? "" : ", ") + std::to_string(j);
    }
    throw comm_error(e.code(),
                     std::string(e.what()) + "; " +
                         (exact ? "no message yet from rank(s) " + missing
                                : std::to_string(recvs - done) + " of " + std::to_string(recvs) +
                                      " messages not yet received"));
  }
  // As for the receives: the watcher looks at the peers whose sends are not complete yet.
  delivered_.assign(static_cast<size_t>(p), false);
  bool sure = true;
  for (size_t i = 0; i < sends; ++i) {
    pending_to_.clear();
    for (int j = 0; sure && j < p; ++j)
      if (j != r && send_bytes[j] > 0 && !delivered_[static_cast<size_t>(j)])
        pending_to_.push_back(j);
    int dest = -1;
    wait_send(op, *src, -1, &dest, &pending_to_);
    if (dest < 0 || dest >= p || delivered_[static_cast<size_t>(dest)])
      sure = false;
    else
      delivered_[static_cast<size_t>(dest)] = true;
  }
}

/// Point-to-point slots live apart from the collectives' (bit 63 set), since only two ranks
/// take part: [63] 1, [61..30] tag, [29..8] message number on (peer, tag), [7..0] size tag.
uint64_t gloo_communicator::p2p_slot(std::map<std::pair<int, uint32_t>, uint64_t>& seqs, int peer,
                                     uint32_t tag, size_t bytes) {
  const uint64_t seq = seqs[{peer, tag}]++;
  return (uint64_t{1} << 63) | (uint64_t{tag} << 30) | ((seq & 0x3fffff) << 8) | size_tag(bytes);
}

void gloo_communicator::check_peer(const char* name, int peer) const {
  if (peer < 0 || peer >= id_.size || peer == id_.rank) {
    invalid(name, "peer " + std::to_string(peer) + " is not another rank of the group");
  }
}

void gloo_communicator::send(const void* data, size_t bytes, int peer, uint32_t tag,
                             const op_options& opts) {
  check_peer("send", peer);
  if (bytes > 0 && data == nullptr) invalid("send", "null data with a non-zero size");
  run_at(
      "send", [&] { return p2p_slot(sent_seq_, peer, tag, bytes); }, opts,
      [&](const op_ctx& ctx) {
        if (bytes == 0) return;
        ubuf* b = user_buffer(const_cast<void*>(data), bytes);
        exposure seen(*this, ctx, {b});
        post_send(ctx, *b, peer, ctx.slot, 0, bytes);
        wait_send(ctx, *b, peer);
      });
}

void gloo_communicator::recv(void* data, size_t bytes, int peer, uint32_t tag,
                             const op_options& opts) {
  check_peer("recv", peer);
  if (bytes > 0 && data == nullptr) invalid("recv", "null data with a non-zero size");
  run_at(
      "recv", [&] { return p2p_slot(recv_seq_, peer, tag, bytes); }, opts,
      [&](const op_ctx& ctx) {
        if (bytes == 0) return;
        ubuf* b = user_buffer(data, bytes);
        exposure seen(*this, ctx, {b});
        post_recv(ctx, *b, peer, ctx.slot, 0, bytes);
        wait_recv(ctx, *b, peer);
      });
}

void gloo_communicator::send_recv(const void* send_data, size_t send_bytes, int send_peer,
                                  void* recv_data, size_t recv_bytes, int recv_peer, uint32_t tag,
                                  const op_options& opts) {
  check_peer("send_recv", send_peer);
  check_peer("send_recv", recv_peer);
  if ((send_bytes > 0 && send_data == nullptr) || (recv_bytes > 0 && recv_data == nullptr))
    invalid("send_recv", "null data with a non-zero size");
  uint64_t recv_slot = 0;
  run_at(
      "send_recv",
      [&] {
        recv_slot = p2p_slot(recv_seq_, recv_peer, tag, recv_bytes);
        return p2p_slot(sent_seq_, send_peer, tag, send_bytes);
      },
      opts,
      [&](const op_ctx& ctx) {
        ubuf* out =
            send_bytes > 0 ? user_buffer(const_cast<void*>(send_data), send_bytes) : nullptr;
        ubuf* in = recv_bytes > 0 ? user_buffer(recv_data, recv_bytes) : nullptr;
        std::vector<ubuf*> live;
        if (out != nullptr) live.push_back(out);
        if (in != nullptr) live.push_back(in);
        exposure seen(*this, ctx, live);
        if (in != nullptr) post_recv(ctx, *in, recv_peer, recv_slot, 0, recv_bytes);
        if (out != nullptr) post_send(ctx, *out, send_peer, ctx.slot, 0, send_bytes);
        if (in != nullptr) wait_recv(ctx, *in, recv_peer);
        if (out != nullptr) wait_send(ctx, *out, send_peer);
      });
}

}  // namespace troupe::comm::gloo_detail
