// The null data plane: argument checks, this rank's own block copied where a collective would
// put it, and nothing sent anywhere.
#include "runtime/comm/null_communicator.hpp"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "runtime/comm/collective_math.hpp"

namespace troupe::comm {

namespace {

class null_communicator final : public communicator {
 public:
  explicit null_communicator(const comm_identity& id) : id_(id) {}

  const comm_identity& identity() const override { return id_; }

  void all_reduce(float* data, size_t count, reduce_op, const op_options&) override {
    usable("all_reduce", data != nullptr || count == 0);
  }

  void broadcast(void* data, size_t bytes, int root, const op_options&) override {
    usable("broadcast", (data != nullptr || bytes == 0) && root >= 0 && root < id_.size);
  }

  void barrier(const op_options&) override { usable("barrier", true); }

  void reduce_scatter(const float* in, float* out, size_t count, reduce_op,
                      const op_options&) override {
    usable("reduce_scatter", (in != nullptr && out != nullptr) || count == 0);
    own_block(in, out, count * sizeof(float), out_is_one_block);
  }

  void all_gather(const void* in, void* out, size_t bytes, const op_options&) override {
    usable("all_gather", (in != nullptr && out != nullptr) || bytes == 0);
    own_block(in, out, bytes, in_is_one_block);
  }

  void all_to_all(const void* in, void* out, size_t bytes_per_rank, const op_options&) override {
    usable("all_to_all", (in != nullptr && out != nullptr) || bytes_per_rank == 0);
    own_block(in, out, bytes_per_rank, both_hold_every_block);
  }

  void all_to_allv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes, const op_options&) override {
    const std::string bad =
        all_to_allv_argument_error(id_.rank, id_.size, in, send_bytes, out, recv_bytes);
    if (!bad.empty()) throw failure(comm_errc::invalid, "all_to_allv", bad);
    usable("all_to_allv", true);
    const auto r = static_cast<size_t>(id_.rank);
    size_t from = 0, to = 0;
    for (size_t j = 0; j < r; ++j) from += send_bytes[j], to += recv_bytes[j];
    if (send_bytes[r] > 0)
      std::memmove(static_cast<char*>(out) + to, static_cast<const char*>(in) + from,
                   send_bytes[r]);
  }

  void send(const void*, size_t bytes, int peer, uint32_t, const op_options&) override {
    point_to_point("send", bytes, peer);
  }

  void recv(void*, size_t bytes, int peer, uint32_t, const op_options&) override {
    point_to_point("recv", bytes, peer);
  }

  void send_recv(const void*, size_t send_bytes, int send_peer, void*, size_t recv_bytes,
                 int recv_peer, uint32_t, const op_options&) override {
    point_to_point("send_recv", send_bytes, send_peer);
    point_to_point("send_recv", recv_bytes, recv_peer);
  }

  void abort() override { aborted_.store(true); }
  bool aborted() const override { return aborted_.load(); }

  std::unique_ptr<communicator> shrink(const comm_identity& id,
                                       const std::vector<int>& kept) override {
    const bool fits = id.size == static_cast<int>(kept.size()) && id.rank >= 0 &&
                      id.rank < id.size && kept[static_cast<size_t>(id.rank)] == id_.rank &&
                      id.generation > id_.generation;
    if (!fits)
      throw failure(comm_errc::invalid, "shrink",
                    "the kept ranks must list this rank at the new rank, in a newer generation");
    for (int k : kept)
      if (k < 0 || k >= id_.size)
        throw failure(comm_errc::invalid, "shrink",
                      "kept rank " + std::to_string(k) + " is not a rank of this group");
    return make_null_communicator(id);
  }

 private:
  // Where this rank's block sits in a collective's buffers.
  enum block_layout { out_is_one_block, in_is_one_block, both_hold_every_block };

  comm_error failure(comm_errc code, const char* op, const std::string& why) const {
    return comm_error(code, std::string("null ") + op + " (group " + id_.group + ", generation " +
                                std::to_string(id_.generation) + ", rank " +
                                std::to_string(id_.rank) + " of " + std::to_string(id_.size) +
                                "): " + why);
  }

  void usable(const char* op, bool arguments_fit) const {
    if (aborted_.load()) throw failure(comm_errc::aborted, op, "the communicator was aborted");
    if (!arguments_fit) throw failure(comm_errc::invalid, op, "null buffer or bad root");
  }

  void own_block(const void* in, void* out, size_t bytes, block_layout layout) const {
    if (bytes == 0) return;
    const size_t at = static_cast<size_t>(id_.rank) * bytes;
    const char* from = static_cast<const char*>(in) + (layout == in_is_one_block ? 0 : at);
    char* to = static_cast<char*>(out) + (layout == out_is_one_block ? 0 : at);
    std::memmove(to, from, bytes);
  }

  void point_to_point(const char* op, size_t bytes, int peer) const {
    usable(op, peer >= 0 && peer < id_.size);
    if (bytes == 0) return;
    throw failure(comm_errc::invalid, op,
                  "the null data plane (TROUPE_TRANSPORT=null) carries no bytes between ranks, so "
                  "nothing that needs a peer's data (a state transfer, a pipeline stage) can run "
                  "on it; use a layout and faults that need none");
  }

  comm_identity id_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::unique_ptr<communicator> make_null_communicator(const comm_identity& id) {
  if (id.size < 1 || id.rank < 0 || id.rank >= id.size || id.group.empty())
    throw comm_error(comm_errc::invalid, "null connect (group " + id.group + ", rank " +
                                             std::to_string(id.rank) + " of " +
                                             std::to_string(id.size) + "): invalid identity");
  static std::once_flag warned;
  std::call_once(warned, [] {
    // The data plane sits below monitoring/ (docs/ARCHITECTURE.md, The floors): straight to
    // stderr, which the agent's log captures as it does a worker's log lines.
    std::fputs(
        "troupe worker: warn: null data plane: collectives do nothing (control-plane "
        "tests only)\n",
        stderr);
  });
  return std::make_unique<null_communicator>(id);
}

}  // namespace troupe::comm
