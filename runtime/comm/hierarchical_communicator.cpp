// hierarchical_communicator: collectives of a group across nodes, as three stages over the
// groups underneath it: one shm group per node ("local"), gloo groups across nodes ("rails":
// rail l joins local rank l of every node, its rank being the node's number; rail 0 is the
// node leaders), and a flat gloo group of every rank for the operations kept flat.
//
// All-reduce, large (the bandwidth path), when every node holds L ranks:
//   1. shm reduce-scatter: local rank l holds the node's sum of slice l (1/L of the buffer);
//   2. on rail l, the slice is cut into N pieces: an all-to-all hands node k every node's
//      sum of piece k, node k adds them in node order (and divides, for an average), and an
//      all-gather returns every piece to every node. Each node sends 2(N-1)/N of its buffer
//      across the network, split over its L ranks: its share once, each way;
//   3. shm all-gather: every local rank gets every slice.
//   The last count % L elements (which L slices of equal length cannot hold) ride along at
//   the end of every rank's slice after an shm all-reduce of their own: a few floats.
// All-reduce, large, nodes of different sizes: shm all-reduce, the leaders run step 2 on the
//   whole buffer, shm broadcast from the leader.
// All-reduce, small (the latency path): shm all-reduce, the leaders all-gather their node
//   sums (one network round) and add them in node order, shm broadcast from the leader.
// Every path adds the same way: node sums in rank order (shm's order), then those in node
// order; so every rank and every size gets the bits of that reference.
#include "runtime/comm/hierarchical_communicator.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "runtime/comm/collective_math.hpp"

namespace troupe::comm {

// ---- node_layout ----

node_layout node_layout::of_hosts(const std::vector<std::string>& hosts) {
  node_layout l;
  // Indexed: the coordinator numbers the nodes of every generation's ranks, thousands of them.
  std::unordered_map<std::string, int> node_of_host;
  l.node_of.reserve(hosts.size());
  for (const auto& h : hosts)
    l.node_of.push_back(
        node_of_host.try_emplace(h, static_cast<int>(node_of_host.size())).first->second);
  return l;
}

node_layout node_layout::parse(const std::string& s) {
  node_layout l;
  if (!s.empty() && s.back() == ',') return {};
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty() || item.size() > 9 ||
        item.find_first_not_of("0123456789") != std::string::npos)
      return {};
    l.node_of.push_back(std::stoi(item));
  }
  if (!l.valid()) return {};
  return l;
}

std::string node_layout::to_string() const {
  std::string s;
  for (size_t r = 0; r < node_of.size(); ++r) s += (r ? "," : "") + std::to_string(node_of[r]);
  return s;
}

int node_layout::nodes() const {
  int n = 0;
  for (int k : node_of) n = std::max(n, k + 1);
  return n;
}

std::vector<int> node_layout::members(int node) const {
  std::vector<int> m;
  for (size_t r = 0; r < node_of.size(); ++r)
    if (node_of[r] == node) m.push_back(static_cast<int>(r));
  return m;
}

bool node_layout::valid() const {
  int next = 0;  // numbered by first appearance: each new node is the next number
  for (int k : node_of) {
    if (k < 0 || k > next) return false;
    if (k == next) ++next;
  }
  return !node_of.empty();
}

bool node_layout::worth_a_hierarchy() const {
  return valid() && nodes() > 1 && nodes() < static_cast<int>(node_of.size());
}

bool node_layout::uniform() const {
  const int n = nodes();
  for (int k = 1; k < n; ++k)
    if (members(k).size() != members(0).size()) return false;
  return true;
}

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s + "]";
}

/// dst = sum over k = 0..n-1, in order, of src + k * stride, over `len` floats.
void sum_in_node_order(float* dst, const float* src, size_t stride, int n, size_t len) {
  constexpr size_t block = 2048;  // the accumulator stays in cache
  for (size_t at = 0; at < len; at += block) {
    const size_t l = std::min(block, len - at);
    std::memmove(dst + at, src + at, l * sizeof(float));
    for (int k = 1; k < n; ++k) add_into(dst + at, src + static_cast<size_t>(k) * stride + at, l);
  }
}

class hierarchical_communicator final : public communicator {
 public:
  /// What a stage runs on, for errors: which group underneath and which group ranks it holds.
  struct sub {
    std::unique_ptr<communicator> comm;
    std::string what;  ///< e.g. "node 1's shm group (group ranks [2,3])"
  };

  hierarchical_communicator(comm_identity id, node_layout layout, hierarchical_options opts,
                            sub local, sub rail, sub flat)
      : id_(std::move(id)),
        layout_(std::move(layout)),
        opts_(opts),
        local_(std::move(local)),
        rail_(std::move(rail)),
        flat_(std::move(flat)) {
    nodes_ = layout_.nodes();
    node_ = layout_.node_of[static_cast<size_t>(id_.rank)];
    const auto mine = layout_.members(node_);
    local_rank_ = static_cast<int>(std::find(mine.begin(), mine.end(), id_.rank) - mine.begin());
    local_size_ = static_cast<int>(mine.size());
    uniform_ = layout_.uniform();
    for (int k = 0; k < nodes_; ++k) members_.push_back(layout_.members(k));
  }

  ~hierarchical_communicator() override = default;

  const comm_identity& identity() const override { return id_; }

  void all_reduce(float* data, size_t count, reduce_op op, const op_options& opts) override {
    if (count > 0 && data == nullptr) invalid("all_reduce", "null data with a non-zero count");
    run("all_reduce", opts, [&](op_ctx& ctx) {
      if (count == 0 || id_.size == 1) return;
      if (count * sizeof(float) <= opts_.small_all_reduce_bytes) {
        all_reduce_small(ctx, data, count, op);
      } else if (uniform_) {
        all_reduce_rails(ctx, data, count, op);
      } else {
        all_reduce_leaders(ctx, data, count, op);
      }
    });
  }

  /// The root's node shares the buffer inside (shm), the leaders across nodes, then each other
  /// node inside: each node receives it once.
  void broadcast(void* data, size_t bytes, int root, const op_options& opts) override {
    if (root < 0 || root >= id_.size)
      invalid("broadcast", "root " + std::to_string(root) + " is not a rank of the group");
    if (bytes > 0 && data == nullptr) invalid("broadcast", "null data with a non-zero size");
    run("broadcast", opts, [&](op_ctx& ctx) {
      if (bytes == 0 || id_.size == 1) return;
      const int root_node = layout_.node_of[static_cast<size_t>(root)];
      const auto& there = members_[static_cast<size_t>(root_node)];
      const int root_local =
          static_cast<int>(std::find(there.begin(), there.end(), root) - there.begin());
      if (node_ == root_node)
        on_local(ctx, [&](auto& c, auto o) { c.broadcast(data, bytes, root_local, o); });
      if (local_rank_ == 0)
        on_rail(ctx, [&](auto& c, auto o) { c.broadcast(data, bytes, root_node, o); });
      if (node_ != root_node)
        on_local(ctx, [&](auto& c, auto o) { c.broadcast(data, bytes, 0, o); });
    });
  }

  void barrier(const op_options& opts) override {
    run("barrier", opts, [&](op_ctx& ctx) {
      // In, then the leaders once every rank of their node is in, then out.
      on_local(ctx, [&](auto& c, auto o) { c.barrier(o); });
      if (local_rank_ == 0) on_rail(ctx, [&](auto& c, auto o) { c.barrier(o); });
      on_local(ctx, [&](auto& c, auto o) { c.barrier(o); });
    });
  }

  void reduce_scatter(const float* in, float* out, size_t count, reduce_op op,
                      const op_options& opts) override {
    if (count > 0 && (in == nullptr || out == nullptr))
      invalid("reduce_scatter", "null buffer with a non-zero count");
    run("reduce_scatter", opts, [&](op_ctx& ctx) {
      if (!uniform_) {
        on_flat(ctx, [&](auto& c, auto o) { c.reduce_scatter(in, out, count, op, o); });
        return;
      }
      if (count == 0) return;
      reduce_scatter_rails(ctx, in, out, count, op);
    });
  }

  void all_gather(const void* in, void* out, size_t bytes, const op_options& opts) override {
    if (bytes > 0 && (in == nullptr || out == nullptr))
      invalid("all_gather", "null buffer with a non-zero size");
    run("all_gather", opts, [&](op_ctx& ctx) {
      if (!uniform_) {
        on_flat(ctx, [&](auto& c, auto o) { c.all_gather(in, out, bytes, o); });
        return;
      }
      if (bytes == 0) return;
      all_gather_rails(ctx, in, out, bytes);
    });
  }

  void all_to_all(const void* in, void* out, size_t bytes_per_rank,
                  const op_options& opts) override {
    run("all_to_all", opts, [&](op_ctx& ctx) {
      on_flat(ctx, [&](auto& c, auto o) { c.all_to_all(in, out, bytes_per_rank, o); });
    });
  }

  void all_to_allv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes, const op_options& opts) override {
    if (auto why = all_to_allv_argument_error(id_.rank, id_.size, in, send_bytes, out, recv_bytes);
        !why.empty())
      invalid("all_to_allv", why);
    run("all_to_allv", opts, [&](op_ctx& ctx) {
      on_flat(ctx, [&](auto& c, auto o) { c.all_to_allv(in, send_bytes, out, recv_bytes, o); });
    });
  }

  void send(const void* data, size_t bytes, int peer, uint32_t tag,
            const op_options& opts) override {
    check_peer("send", peer);
    run("send", opts, [&](op_ctx& ctx) {
      on_flat(ctx, [&](auto& c, auto o) { c.send(data, bytes, peer, tag, o); });
    });
  }

  void recv(void* data, size_t bytes, int peer, uint32_t tag, const op_options& opts) override {
    check_peer("recv", peer);
    run("recv", opts, [&](op_ctx& ctx) {
      on_flat(ctx, [&](auto& c, auto o) { c.recv(data, bytes, peer, tag, o); });
    });
  }

  void send_recv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                 size_t recv_bytes, int recv_peer, uint32_t tag, const op_options& opts) override {
    check_peer("send_recv", send_peer);
    check_peer("send_recv", recv_peer);
    run("send_recv", opts, [&](op_ctx& ctx) {
      on_flat(ctx, [&](auto& c, auto o) {
        c.send_recv(send_data, send_bytes, send_peer, recv_data, recv_bytes, recv_peer, tag, o);
      });
    });
  }

  /// Aborts every group underneath: a stage in flight in any of them returns at once, and
  /// the peers waiting on this rank there learn it (shm's gone mark, gloo's closed pairs).
  void abort() override {
    aborted_.store(true);
    abort_subs();
  }

  bool aborted() const override { return aborted_.load(); }

 private:
  struct op_ctx {
    const char* name;
    clock_type::time_point deadline;
    milliseconds timeout;
  };

  std::string context_string() const {
    return "group " + id_.group + ", generation " + std::to_string(id_.generation) + ", rank " +
           std::to_string(id_.rank) + " of " + std::to_string(id_.size) + ", node " +
           std::to_string(node_) + " of " + std::to_string(nodes_);
  }

  [[noreturn]] void invalid(const char* name, const std::string& detail) const {
    throw comm_error(comm_errc::invalid, std::string("hier ") + name + " invalid: " + detail +
                                             " (" + context_string() + ")");
  }

  void check_peer(const char* name, int peer) const {
    if (peer < 0 || peer >= id_.size || peer == id_.rank)
      invalid(name, "peer " + std::to_string(peer) + " is not another rank of the group");
  }

  void abort_subs() {
    for (auto* s : {&local_, &rail_, &flat_})
      if (s->comm) s->comm->abort();
  }

  /// Runs one operation: refuses on a dead communicator; on any failure marks it dead and
  /// aborts every group underneath, so that every rank waiting on this one, in whichever
  /// group, fails promptly instead of at its deadline.
  template <class Body>
  void run(const char* name, const op_options& opts, Body&& body) {
    if (opts.timeout.count() <= 0) invalid(name, "timeout must be positive");
    op_ctx ctx{name, clock_type::now() + opts.timeout, opts.timeout};
    {
      std::lock_guard<std::mutex> lock(m_);
      if (!dead_ && aborted_)
        dead_.emplace(comm_errc::aborted, "abort() was called (" + context_string() + ")");
      if (dead_)
        throw comm_error(dead_->code(),
                         std::string("hier ") + name +
                             ": communicator is dead after an earlier failure: " + dead_->what());
    }
    try {
      try {
        body(ctx);
      } catch (const comm_error&) {
        throw;
      } catch (const std::exception& e) {
        throw comm_error(comm_errc::internal, std::string("hier ") + name + " internal: " +
                                                  e.what() + " (" + context_string() + ")");
      }
    } catch (const comm_error& e) {
      {
        std::lock_guard<std::mutex> lock(m_);
        if (!dead_) dead_.emplace(e);
      }
      abort_subs();
      throw;
    }
  }

  /// What is left of the op's deadline for its next stage; a timeout once none is.
  op_options left(const op_ctx& ctx, const sub& s) const {
    const auto rest = ctx.deadline - clock_type::now();
    if (rest <= clock_type::duration::zero())
      throw comm_error(comm_errc::timeout,
                       std::string("hier ") + ctx.name + " timeout: no progress within " +
                           std::to_string(ctx.timeout.count()) + " ms, before a stage on " +
                           s.what + " (" + context_string() + ")");
    return {std::max(milliseconds(1), std::chrono::ceil<milliseconds>(rest))};
  }

  /// Runs one stage on `s`; its failure comes back as this op's, with the stage named.
  template <class Stage>
  void on(const op_ctx& ctx, const sub& s, Stage&& stage) {
    if (!s.comm)  // a path that sends a non-leader of uneven nodes across: a bug here
      throw comm_error(comm_errc::internal, std::string("hier ") + ctx.name +
                                                " internal: this rank takes no part in the "
                                                "groups across nodes (" +
                                                context_string() + ")");
    const op_options o = left(ctx, s);
    try {
      stage(*s.comm, o);
    } catch (const comm_error& e) {
      const comm_errc code = aborted_ ? comm_errc::aborted : e.code();
      throw comm_error(code, std::string("hier ") + ctx.name + " " + to_string(code) +
                                 ": stage on " + s.what + " failed: " + e.what() + " (" +
                                 context_string() + ")");
    }
  }
  template <class Stage>
  void on_local(const op_ctx& ctx, Stage&& stage) {
    if (local_size_ > 1) on(ctx, local_, std::forward<Stage>(stage));
  }
  template <class Stage>
  void on_rail(const op_ctx& ctx, Stage&& stage) {
    on(ctx, rail_, std::forward<Stage>(stage));
  }
  template <class Stage>
  void on_flat(const op_ctx& ctx, Stage&& stage) {
    on(ctx, flat_, std::forward<Stage>(stage));
  }

  static void grow(std::vector<float>& v, size_t n) {
    // Kept between ops and only grown: first touch of fresh memory is slow here.
    if (v.size() < n) v.resize(n, 0.0f);
  }

  // ---- all-reduce ----

  /// On rail_ (whose members all call it with the same n): `buf` holds this node's sums of
  /// n floats, padded to N pieces of m floats (the padding is summed and thrown away). Ends
  /// with buf's first n floats the sums over nodes, in node order, divided for an average.
  void across_nodes(const op_ctx& ctx, float* buf, size_t n, reduce_op op) {
    const auto N = static_cast<size_t>(nodes_);
    const size_t m = ceil_div(n, N);
    grow(across_, N * m);
    on_rail(ctx, [&](auto& c, auto o) { c.all_to_all(buf, across_.data(), m * sizeof(float), o); });
    float* mine = buf + static_cast<size_t>(node_) * m;
    sum_in_node_order(mine, across_.data(), m, nodes_, m);
    if (op == reduce_op::average) divide(mine, m, static_cast<float>(id_.size));
    on_rail(ctx, [&](auto& c, auto o) { c.all_gather(mine, buf, m * sizeof(float), o); });
  }

  void all_reduce_small(const op_ctx& ctx, float* data, size_t count, reduce_op op) {
    const size_t bytes = count * sizeof(float);
    on_local(ctx, [&](auto& c, auto o) { c.all_reduce(data, count, reduce_op::sum, o); });
    if (local_rank_ == 0) {
      grow(across_, count * static_cast<size_t>(nodes_));
      on_rail(ctx, [&](auto& c, auto o) { c.all_gather(data, across_.data(), bytes, o); });
      sum_in_node_order(data, across_.data(), count, nodes_, count);
      if (op == reduce_op::average) divide(data, count, static_cast<float>(id_.size));
    }
    on_local(ctx, [&](auto& c, auto o) { c.broadcast(data, bytes, 0, o); });
  }

  void all_reduce_leaders(const op_ctx& ctx, float* data, size_t count, reduce_op op) {
    on_local(ctx, [&](auto& c, auto o) { c.all_reduce(data, count, reduce_op::sum, o); });
    if (local_rank_ == 0) {
      const size_t padded = ceil_div(count, static_cast<size_t>(nodes_)) * nodes_;
      grow(slice_, padded);
      std::memcpy(slice_.data(), data, count * sizeof(float));
      across_nodes(ctx, slice_.data(), count, op);
      std::memcpy(data, slice_.data(), count * sizeof(float));
    }
    on_local(ctx, [&](auto& c, auto o) { c.broadcast(data, count * sizeof(float), 0, o); });
  }

  void all_reduce_rails(const op_ctx& ctx, float* data, size_t count, reduce_op op) {
    const auto L = static_cast<size_t>(local_size_);
    const size_t b = count / L;  // slice of each local rank
    const size_t t = count % L;  // the tail every rail carries
    const size_t n = b + t;
    grow(slice_, ceil_div(n, static_cast<size_t>(nodes_)) * nodes_);
    float* tail = slice_.data() + b;
    if (t > 0) {
      std::memcpy(tail, data + L * b, t * sizeof(float));
      on_local(ctx, [&](auto& c, auto o) { c.all_reduce(tail, t, reduce_op::sum, o); });
    }
    if (b > 0) {
      if (L > 1) {
        on_local(ctx, [&](auto& c, auto o) {
          c.reduce_scatter(data, slice_.data(), b, reduce_op::sum, o);
        });
      } else {
        std::memcpy(slice_.data(), data, b * sizeof(float));
      }
    }
    across_nodes(ctx, slice_.data(), n, op);
    if (b > 0) {
      if (L > 1) {
        on_local(ctx,
                 [&](auto& c, auto o) { c.all_gather(slice_.data(), data, b * sizeof(float), o); });
      } else {
        std::memcpy(data, slice_.data(), b * sizeof(float));
      }
    }
    if (t > 0) std::memcpy(data + L * b, tail, t * sizeof(float));
  }

  // ---- reduce-scatter, all-gather (nodes of equal size) ----

  int rank_at(int node, int local) const {
    return members_[static_cast<size_t>(node)][static_cast<size_t>(local)];
  }

  /// Local rank l sums, inside the node, the blocks of the ranks on rail l (one per node, in
  /// node order); an all-to-all on the rail hands each rank every node's sum of its own block,
  /// added in node order. Each node sends (N-1)/N of its input across the network, once.
  void reduce_scatter_rails(const op_ctx& ctx, const float* in, float* out, size_t count,
                            reduce_op op) {
    const auto N = static_cast<size_t>(nodes_);
    const auto L = static_cast<size_t>(local_size_);
    const size_t row = N * count;  // what one rail carries
    grow(gathered_, L * row);
    for (size_t l = 0; l < L; ++l)
      for (size_t k = 0; k < N; ++k)
        std::memcpy(
            gathered_.data() + l * row + k * count,
            in + static_cast<size_t>(rank_at(static_cast<int>(k), static_cast<int>(l))) * count,
            count * sizeof(float));
    grow(slice_, row);
    if (L > 1) {
      on_local(ctx, [&](auto& c, auto o) {
        c.reduce_scatter(gathered_.data(), slice_.data(), row, reduce_op::sum, o);
      });
    } else {
      std::memcpy(slice_.data(), gathered_.data(), row * sizeof(float));
    }
    grow(across_, row);
    on_rail(ctx, [&](auto& c, auto o) {
      c.all_to_all(slice_.data(), across_.data(), count * sizeof(float), o);
    });
    sum_in_node_order(out, across_.data(), count, nodes_, count);
    if (op == reduce_op::average) divide(out, count, static_cast<float>(id_.size));
  }

  /// The rail gathers its ranks' blocks across nodes, the node gathers its rails' rows, and
  /// the blocks are put in group rank order.
  void all_gather_rails(const op_ctx& ctx, const void* in, void* out, size_t bytes) {
    const auto N = static_cast<size_t>(nodes_);
    const auto L = static_cast<size_t>(local_size_);
    const size_t row = N * bytes;
    grow(across_, ceil_div(row, sizeof(float)));
    auto* row_buf = reinterpret_cast<char*>(across_.data());
    on_rail(ctx, [&](auto& c, auto o) { c.all_gather(in, row_buf, bytes, o); });
    grow(gathered_, ceil_div(L * row, sizeof(float)));
    auto* all = reinterpret_cast<char*>(gathered_.data());
    if (L > 1) {
      on_local(ctx, [&](auto& c, auto o) { c.all_gather(row_buf, all, row, o); });
    } else {
      std::memcpy(all, row_buf, row);
    }
    auto* dst = static_cast<char*>(out);
    for (size_t l = 0; l < L; ++l)
      for (size_t k = 0; k < N; ++k)
        std::memcpy(
            dst + static_cast<size_t>(rank_at(static_cast<int>(k), static_cast<int>(l))) * bytes,
            all + l * row + k * bytes, bytes);
  }

  comm_identity id_;
  node_layout layout_;
  hierarchical_options opts_;
  sub local_;  ///< this node's ranks over shared memory
  sub rail_;   ///< local rank l of every node (rail l); null for non-leaders of uneven nodes
  sub flat_;   ///< every rank over gloo, for the operations kept flat
  int nodes_ = 1;
  int node_ = 0;
  int local_rank_ = 0;
  int local_size_ = 1;
  bool uniform_ = true;
  std::vector<std::vector<int>> members_;  ///< per node, its group ranks ascending

  // Scratch, kept between ops (touched by the calling thread only).
  std::vector<float> slice_;     ///< this rank's slice of the node's sums, padded to N pieces
  std::vector<float> across_;    ///< what the rail's all-to-all or all-gather brings in
  std::vector<float> gathered_;  ///< reduce-scatter's reordered input, all-gather's rows

  std::atomic<bool> aborted_{false};
  std::mutex m_;
  std::optional<comm_error> dead_;  ///< the first failure; guarded by m_
};

}  // namespace

std::unique_ptr<communicator> make_hierarchical_communicator(
    kv_store& store, const comm_identity& id, const node_layout& layout, const gloo_options& gloo,
    const shm_options& shm, const hierarchical_options& opts) {
  const std::string where = "hier connect (group " + id.group + ", generation " +
                            std::to_string(id.generation) + ", rank " + std::to_string(id.rank) +
                            " of " + std::to_string(id.size) + ")";
  if (id.size < 1 || id.rank < 0 || id.rank >= id.size || id.group.empty() ||
      id.group.find('/') != std::string::npos || gloo.connect_timeout.count() <= 0 ||
      !layout.valid() || layout.node_of.size() != static_cast<size_t>(id.size) ||
      opts.small_all_reduce_bytes < sizeof(float)) {
    throw comm_error(comm_errc::invalid, where + ": invalid identity, node layout or options");
  }
  const auto deadline = clock_type::now() + gloo.connect_timeout;
  const auto left = [&] {
    return std::max(milliseconds(1),
                    std::chrono::duration_cast<milliseconds>(deadline - clock_type::now()));
  };
  const int node = layout.node_of[static_cast<size_t>(id.rank)];
  const auto mine = layout.members(node);
  const int local_rank =
      static_cast<int>(std::find(mine.begin(), mine.end(), id.rank) - mine.begin());
  const int nodes = layout.nodes();
  // Which group ranks each group underneath holds, for errors and for readers of logs.
  std::string rail_ranks;
  const bool on_rail = layout.uniform() || local_rank == 0;
  if (on_rail) {
    std::vector<int> r;
    for (int k = 0; k < nodes; ++k) r.push_back(layout.members(k)[static_cast<size_t>(local_rank)]);
    rail_ranks = rank_list(r);
  }
  const auto connect = [&](const char* stage, auto&& make) {
    try {
      return make();
    } catch (const comm_error& e) {
      rethrow_with_context(e, where + ": " + stage + ": ");  // a connect_error stays one
    } catch (const store_error& e) {
      throw as_connect_error(e, where + ": " + stage);
    }
  };
  hierarchical_communicator::sub local, rail, flat;
  local.what =
      "node " + std::to_string(node) + "'s shm group (group ranks " + rank_list(mine) + ")";
  local.comm = connect("node group", [&] {
    shm_options s = shm;
    s.connect_timeout = left();
    if (!s.cancelled) s.cancelled = gloo.cancelled;
    return make_shm_communicator(store,
                                 {id.generation, id.group + ".node" + std::to_string(node),
                                  local_rank, static_cast<int>(mine.size())},
                                 s);
  });
  if (on_rail) {
    rail.what = "rail " + std::to_string(local_rank) +
                " across nodes (gloo; its rank k is node k, group ranks " + rail_ranks + ")";
    rail.comm = connect("rail across nodes", [&] {
      gloo_options g = gloo;
      g.connect_timeout = left();
      return make_gloo_communicator(
          store, {id.generation, id.group + ".rail" + std::to_string(local_rank), node, nodes}, g);
    });
  }
  flat.what = "the flat group (gloo, every rank)";
  flat.comm = connect("flat group", [&] {
    gloo_options g = gloo;
    g.connect_timeout = left();
    return make_gloo_communicator(store, id, g);
  });
  return std::make_unique<hierarchical_communicator>(id, layout, opts, std::move(local),
                                                     std::move(rail), std::move(flat));
}

}  // namespace troupe::comm
