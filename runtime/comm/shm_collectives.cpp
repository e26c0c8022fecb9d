// The shared-memory backend's operations. Every collective is a sequence of rounds (see
// shm_communicator_impl.hpp): each rank stages its part in its own half of the segment,
// publishes, waits for everyone, and reads what it needs from the others' halves. Sums are
// taken in rank order, so every rank gets the same bits as a single-process reference.
#include <cstring>

#include "runtime/comm/shm_communicator_impl.hpp"

namespace troupe::comm::shm_detail {
namespace {

/// dst = sum over ranks j in order of src(j)[0..n), in blocks that stay in cache.
template <class Src>
void sum_in_rank_order(float* dst, int ranks, size_t n, Src&& src) {
  constexpr size_t block = 2048;
  for (size_t at = 0; at < n; at += block) {
    const size_t len = std::min(block, n - at);
    std::memcpy(dst + at, src(0) + at, len * sizeof(float));
    for (int j = 1; j < ranks; ++j) add_into(dst + at, src(j) + at, len);
  }
}

}  // namespace

void shm_communicator::complete_round(const op_ctx& op, uint64_t k) {
  if (base_ == nullptr) return;
  auto& me = block(id_.rank);
  me.shape[k % 2].store(op.shape, std::memory_order_relaxed);
  me.arrived.store(k + 1);
  auto everyone_arrived = [&] {
    for (int j = 0; j < id_.size; ++j) {
      if (block(j).arrived.load(std::memory_order_acquire) <= k) return false;
    }
    return true;
  };
  // Only the last rank to arrive wakes the sleepers: nobody sleeping on this round can go on
  // before that, and on a machine with more ranks than cores every useless wake-up takes a
  // core from a rank that still has work. (Stores and loads are sequentially consistent, so
  // of two ranks arriving at once at least one sees the other and rings.)
  if (everyone_arrived()) ring_bell();
  waiting_round_ = k;
  struct round_wait {
    bool& flag;
    explicit round_wait(bool& f) : flag(f) { flag = true; }
    ~round_wait() { flag = false; }
  } waiting{in_round_wait_};
  wait_for(op, -1, "hear from", everyone_arrived);
  for (int j = 0; j < id_.size; ++j) {
    if (block(j).shape[k % 2].load(std::memory_order_relaxed) != op.shape) {
      fail(op, comm_errc::invalid, j,
           "rank " + std::to_string(j) +
               " is in another collective, or this one with another size or root: every rank "
               "must call the same collectives in the same order");
    }
  }
}

// ---- all-reduce ----

void shm_communicator::all_reduce(float* data, size_t count, reduce_op op, const op_options& opts) {
  if (count > 0 && data == nullptr) invalid("all_reduce", "null data with a non-zero count");
  const uint64_t shape = shape_of(op_kind::all_reduce, count * 2 + (op == reduce_op::average));
  run("all_reduce", shape, opts, [&](const op_ctx& ctx) {
    if (count == 0 || id_.size == 1) return;  // average over one rank is the identity
    if (count * sizeof(float) <= std::min(opts_.small_all_reduce_bytes, layout_.chunk_bytes)) {
      all_reduce_small(ctx, data, count, op);
    } else if (count * sizeof(float) >= opts_.single_copy_bytes && single_copy(ctx)) {
      all_reduce_single_copy(ctx, data, count, op);
    } else {
      all_reduce_sliced(ctx, data, count, op);
    }
  });
}

/// One round: every rank stages its whole buffer and sums all of them in rank order.
void shm_communicator::all_reduce_small(const op_ctx& op, float* data, size_t count,
                                        reduce_op rop) {
  const uint64_t k = next_round();
  std::memcpy(half(id_.rank, k), data, count * sizeof(float));
  complete_round(op, k);
  sum_in_rank_order(data, id_.size, count,
                    [&](int j) { return reinterpret_cast<const float*>(half(j, k)); });
  if (rop == reduce_op::average) divide(data, count, static_cast<float>(id_.size));
}

/// Per chunk, two rounds: everyone stages the chunk; rank r reduces slice r of it (in rank
/// order) and stages the result; everyone copies the other slices' results.
void shm_communicator::all_reduce_sliced(const op_ctx& op, float* data, size_t count,
                                         reduce_op rop) {
  const int p = id_.size;
  const int r = id_.rank;
  const size_t chunk = layout_.chunk_bytes / sizeof(float);
  for (size_t at = 0; at < count; at += chunk) {
    const size_t len = std::min(chunk, count - at);
    float* part = data + at;
    const uint64_t k = next_round();
    std::memcpy(half(r, k), part, len * sizeof(float));
    complete_round(op, k);
    const extent mine = piece(len, static_cast<size_t>(p), static_cast<size_t>(r));
    sum_in_rank_order(part + mine.begin, p, mine.len, [&](int j) {
      return reinterpret_cast<const float*>(half(j, k)) + mine.begin;
    });
    if (rop == reduce_op::average) divide(part + mine.begin, mine.len, static_cast<float>(p));
    const uint64_t k2 = next_round();
    std::memcpy(reinterpret_cast<float*>(half(r, k2)) + mine.begin, part + mine.begin,
                mine.len * sizeof(float));
    complete_round(op, k2);
    for (int j = 0; j < p; ++j) {
      if (j == r) continue;
      const extent theirs = piece(len, static_cast<size_t>(p), static_cast<size_t>(j));
      std::memcpy(part + theirs.begin, reinterpret_cast<const float*>(half(j, k2)) + theirs.begin,
                  theirs.len * sizeof(float));
    }
  }
}

/// Three rounds for the whole buffer: (1) everyone publishes its buffer's address; rank r
/// reads slice r of every peer's buffer (process_vm_readv, block by block) and sums it in rank
/// order in place; (2) everyone reads the other slices straight from their owners' buffers;
/// (3) nobody returns (and lets its caller touch the buffer) before everyone has read it.
/// Rank j changes only slice j of its buffer before round 2, and nobody reads slice j of it
/// before round 2, so no read sees a half-written slice.
void shm_communicator::all_reduce_single_copy(const op_ctx& op, float* data, size_t count,
                                              reduce_op rop) {
  const int p = id_.size;
  const int r = id_.rank;
  const uint64_t k = next_round();
  publish_addr(k, data);
  complete_round(op, k);
  std::vector<uint64_t> addr(static_cast<size_t>(p));
  for (int j = 0; j < p; ++j) addr[j] = block(j).addr[k % 2].load(std::memory_order_relaxed);
  constexpr size_t block_elems = size_t{32} << 10;  // 128 KiB: the accumulator stays in L2
  if (scratch_.size() < 2 * block_elems) scratch_.assign(2 * block_elems, 0.0f);
  float* acc = scratch_.data();
  float* incoming = scratch_.data() + block_elems;
  const extent mine = piece(count, static_cast<size_t>(p), static_cast<size_t>(r));
  for (size_t at = mine.begin; at < mine.begin + mine.len; at += block_elems) {
    const size_t len = std::min(block_elems, mine.begin + mine.len - at);
    auto contribution = [&](int j, float* into) -> const float* {
      if (j == r) return data + at;
      pull(op, j, addr[j] + at * sizeof(float), into, len * sizeof(float));
      return into;
    };
    const float* first = contribution(0, acc);
    if (first != acc) std::memcpy(acc, first, len * sizeof(float));
    for (int j = 1; j < p; ++j) add_into(acc, contribution(j, incoming), len);
    if (rop == reduce_op::average) divide(acc, len, static_cast<float>(p));
    std::memcpy(data + at, acc, len * sizeof(float));
  }
  const uint64_t k2 = next_round();
  complete_round(op, k2);
  for (int j = 0; j < p; ++j) {
    if (j == r) continue;
    const extent theirs = piece(count, static_cast<size_t>(p), static_cast<size_t>(j));
    if (theirs.len > 0) {
      pull(op, j, addr[j] + theirs.begin * sizeof(float), data + theirs.begin,
           theirs.len * sizeof(float));
    }
  }
  complete_round(op, next_round());
}

// ---- broadcast, barrier ----

void shm_communicator::broadcast(void* data, size_t bytes, int root, const op_options& opts) {
  if (root < 0 || root >= id_.size) {
    invalid("broadcast", "root " + std::to_string(root) + " is not a rank of the group");
  }
  if (bytes > 0 && data == nullptr) invalid("broadcast", "null data with a non-zero size");
  const uint64_t shape = shape_of(op_kind::broadcast, bytes * 131 + static_cast<uint64_t>(root));
  run("broadcast", shape, opts, [&](const op_ctx& ctx) {
    if (bytes == 0 || id_.size == 1) return;
    auto* d = static_cast<char*>(data);
    for (size_t at = 0; at < bytes; at += layout_.chunk_bytes) {
      const size_t len = std::min(layout_.chunk_bytes, bytes - at);
      const uint64_t k = next_round();
      if (id_.rank == root) std::memcpy(half(root, k), d + at, len);
      complete_round(ctx, k);
      if (id_.rank != root) std::memcpy(d + at, half(root, k), len);
    }
  });
}

void shm_communicator::barrier(const op_options& opts) {
  run("barrier", shape_of(op_kind::barrier, 0), opts, [&](const op_ctx& ctx) {
    if (id_.size > 1) complete_round(ctx, next_round());
  });
}

// ---- reduce-scatter, all-gather ----

/// Per round, each rank stages the same chunk of every block, block j in sub-region j; rank r
/// sums sub-region r of every rank in rank order.
void shm_communicator::reduce_scatter(const float* in, float* out, size_t count, reduce_op op,
                                      const op_options& opts) {
  if (count > 0 && (in == nullptr || out == nullptr)) {
    invalid("reduce_scatter", "null buffer with a non-zero count");
  }
  const uint64_t shape = shape_of(op_kind::reduce_scatter, count * 2 + (op == reduce_op::average));
  run("reduce_scatter", shape, opts, [&](const op_ctx& ctx) {
    if (count == 0) return;
    const int p = id_.size;
    const int r = id_.rank;
    if (p == 1) {
      std::memmove(out, in, count * sizeof(float));
      return;
    }
    const auto* in_end = in + count * static_cast<size_t>(p);
    const bool overlaps = out < in_end && in < out + count;
    if (!overlaps && count * sizeof(float) * p >= opts_.single_copy_bytes && single_copy(ctx)) {
      // Rank r reads block r of every peer's input directly and sums in rank order.
      const uint64_t k = next_round();
      publish_addr(k, in);
      complete_round(ctx, k);
      constexpr size_t block_elems = size_t{32} << 10;
      if (scratch_.size() < block_elems) scratch_.assign(block_elems, 0.0f);
      const size_t mine = static_cast<size_t>(r) * count;
      for (size_t at = 0; at < count; at += block_elems) {
        const size_t len = std::min(block_elems, count - at);
        const size_t bytes = len * sizeof(float);
        auto from = [&](int j) {
          return block(j).addr[k % 2].load(std::memory_order_relaxed) + (mine + at) * sizeof(float);
        };
        // Rank 0's part straight into place, then the others' added in rank order.
        if (r == 0) {
          std::memcpy(out + at, in + mine + at, bytes);
        } else {
          pull(ctx, 0, from(0), out + at, bytes);
        }
        for (int j = 1; j < p; ++j) {
          if (j == r) {
            add_into(out + at, in + mine + at, len);
          } else {
            pull(ctx, j, from(j), scratch_.data(), bytes);
            add_into(out + at, scratch_.data(), len);
          }
        }
        if (op == reduce_op::average) divide(out + at, len, static_cast<float>(p));
      }
      complete_round(ctx, next_round());  // nobody reads this rank's input any more
      return;
    }
    const size_t sub = layout_.chunk_bytes / static_cast<size_t>(p) / cache_line * cache_line;
    const size_t sub_elems = sub / sizeof(float);
    for (size_t at = 0; at < count; at += sub_elems) {
      const size_t len = std::min(sub_elems, count - at);
      const uint64_t k = next_round();
      for (int j = 0; j < p; ++j) {
        std::memcpy(half(r, k) + j * sub, in + static_cast<size_t>(j) * count + at,
                    len * sizeof(float));
      }
      complete_round(ctx, k);
      sum_in_rank_order(out + at, p, len, [&](int j) {
        return reinterpret_cast<const float*>(half(j, k) + static_cast<size_t>(r) * sub);
      });
      if (op == reduce_op::average) divide(out + at, len, static_cast<float>(p));
    }
  });
}

void shm_communicator::all_gather(const void* in, void* out, size_t bytes, const op_options& opts) {
  if (bytes > 0 && (in == nullptr || out == nullptr)) {
    invalid("all_gather", "null buffer with a non-zero size");
  }
  run("all_gather", shape_of(op_kind::all_gather, bytes), opts, [&](const op_ctx& ctx) {
    if (bytes == 0) return;
    const int p = id_.size;
    const int r = id_.rank;
    auto* dst = static_cast<char*>(out);
    const char* own = dst + static_cast<size_t>(r) * bytes;
    std::memmove(dst + static_cast<size_t>(r) * bytes, in, bytes);  // in may alias out
    if (p == 1) return;
    if (opts_.single_copy_gathers && bytes * static_cast<size_t>(p) >= opts_.single_copy_bytes &&
        single_copy(ctx)) {
      // Everyone reads block j straight from rank j's output (rank j writes only the others).
      const uint64_t k = next_round();
      publish_addr(k, dst);
      complete_round(ctx, k);
      for (int j = 0; j < p; ++j) {
        if (j == r) continue;
        pull(ctx, j,
             block(j).addr[k % 2].load(std::memory_order_relaxed) + static_cast<size_t>(j) * bytes,
             dst + static_cast<size_t>(j) * bytes, bytes);
      }
      complete_round(ctx, next_round());
      return;
    }
    for (size_t at = 0; at < bytes; at += layout_.chunk_bytes) {
      const size_t len = std::min(layout_.chunk_bytes, bytes - at);
      const uint64_t k = next_round();
      std::memcpy(half(r, k), own + at, len);
      complete_round(ctx, k);
      for (int j = 0; j < p; ++j) {
        if (j != r) std::memcpy(dst + static_cast<size_t>(j) * bytes + at, half(j, k), len);
      }
    }
  });
}

// ---- all-to-all(v) ----

void shm_communicator::all_to_all(const void* in, void* out, size_t bytes_per_rank,
                                  const op_options& opts) {
  if (bytes_per_rank > 0 && (in == nullptr || out == nullptr)) {
    invalid("all_to_all", "null buffer with a non-zero size");
  }
  if (in == out && bytes_per_rank > 0 && id_.size > 1) {
    invalid("all_to_all", "in and out must not be the same buffer");
  }
  run("all_to_all", shape_of(op_kind::all_to_all, bytes_per_rank), opts, [&](const op_ctx& ctx) {
    const auto p = static_cast<size_t>(id_.size);
    if (opts_.single_copy_gathers && p > 1 && bytes_per_rank * p >= opts_.single_copy_bytes &&
        single_copy(ctx)) {
      // Rank r reads block r of every peer's input straight into block j of its output.
      const auto r = static_cast<size_t>(id_.rank);
      const auto* src = static_cast<const char*>(in);
      auto* dst = static_cast<char*>(out);
      std::memcpy(dst + r * bytes_per_rank, src + r * bytes_per_rank, bytes_per_rank);
      const uint64_t k = next_round();
      publish_addr(k, in);
      complete_round(ctx, k);
      for (size_t j = 0; j < p; ++j) {
        if (j == r) continue;
        pull(ctx, static_cast<int>(j),
             block(static_cast<int>(j)).addr[k % 2].load(std::memory_order_relaxed) +
                 r * bytes_per_rank,
             dst + j * bytes_per_rank, bytes_per_rank);
      }
      complete_round(ctx, next_round());
      return;
    }
    offsets_.resize(2 * p);
    for (size_t j = 0; j < p; ++j) offsets_[j] = bytes_per_rank;
    for (size_t j = 0; j < p; ++j) offsets_[p + j] = j * bytes_per_rank;
    exchange(ctx, static_cast<const char*>(in), offsets_.data(), offsets_.data() + p,
             static_cast<char*>(out), offsets_.data(), offsets_.data() + p, bytes_per_rank);
  });
}

void shm_communicator::all_to_allv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                                   const std::vector<size_t>& recv_bytes, const op_options& opts) {
  const auto p = static_cast<size_t>(id_.size);
  const auto r = static_cast<size_t>(id_.rank);
  if (auto why = all_to_allv_argument_error(id_.rank, id_.size, in, send_bytes, out, recv_bytes);
      !why.empty()) {
    invalid("all_to_allv", why);
  }
  run("all_to_allv", shape_of(op_kind::all_to_allv, 0), opts, [&](const op_ctx& ctx) {
    all_to_allv_offsets(send_bytes, recv_bytes, offsets_);
    size_t max_pair = 0;
    if (p > 1) {
      // A first round of counts: every rank must know how many rounds the largest pair needs,
      // and a rank that expects other sizes than its peers send is caught here.
      const uint64_t k = next_round();
      std::memcpy(half(id_.rank, k), send_bytes.data(), p * sizeof(size_t));
      complete_round(ctx, k);
      for (size_t i = 0; i < p; ++i) {
        const auto* theirs = reinterpret_cast<const size_t*>(half(static_cast<int>(i), k));
        for (size_t j = 0; j < p; ++j) {
          if (i != j) max_pair = std::max(max_pair, theirs[j]);
        }
        if (i != r && theirs[r] != recv_bytes[i]) {
          fail(ctx, comm_errc::invalid, static_cast<int>(i),
               "rank " + std::to_string(i) + " sends " + std::to_string(theirs[r]) +
                   " bytes here but recv_bytes says " + std::to_string(recv_bytes[i]));
        }
      }
    }
    exchange(ctx, static_cast<const char*>(in), send_bytes.data(), offsets_.data(),
             static_cast<char*>(out), recv_bytes.data(), offsets_.data() + p, max_pair);
  });
}

/// Per round, rank r stages the next piece of its block for rank j in sub-region j of its
/// half, and takes its own pieces from sub-region r of everyone's.
void shm_communicator::exchange(const op_ctx& op, const char* in, const size_t* send_bytes,
                                const size_t* send_off, char* out, const size_t* recv_bytes,
                                const size_t* recv_off, size_t max_pair_bytes) {
  const int p = id_.size;
  const int r = id_.rank;
  if (send_bytes[r] > 0) std::memcpy(out + recv_off[r], in + send_off[r], send_bytes[r]);
  if (p == 1) return;
  const size_t sub = layout_.chunk_bytes / static_cast<size_t>(p) / cache_line * cache_line;
  for (size_t at = 0; at < max_pair_bytes; at += sub) {
    const uint64_t k = next_round();
    for (int j = 0; j < p; ++j) {
      if (j != r && send_bytes[j] > at) {
        std::memcpy(half(r, k) + static_cast<size_t>(j) * sub, in + send_off[j] + at,
                    std::min(sub, send_bytes[j] - at));
      }
    }
    complete_round(op, k);
    for (int j = 0; j < p; ++j) {
      if (j != r && recv_bytes[j] > at) {
        std::memcpy(out + recv_off[j] + at, half(j, k) + static_cast<size_t>(r) * sub,
                    std::min(sub, recv_bytes[j] - at));
      }
    }
  }
}

}  // namespace troupe::comm::shm_detail
