#pragma once
// A communicator decorator that adds up the wall time spent inside collectives, so a
// step's time can be split into compute and communication even when the collectives run
// inside the model (tensor parallelism).

#include <chrono>
#include <memory>
#include <utility>

#include "runtime/comm/communicator.hpp"

namespace troupe::comm {

class timed_communicator final : public communicator {
 public:
  explicit timed_communicator(std::unique_ptr<communicator> inner) : inner_(std::move(inner)) {}

  /// Seconds spent in collectives since the last call; resets the count. Call it from the
  /// thread that runs the collectives.
  double take_seconds() { return std::exchange(seconds_, 0.0); }

  const comm_identity& identity() const override { return inner_->identity(); }
  void all_reduce(float* data, size_t count, reduce_op op, const op_options& opts) override {
    timed([&] { inner_->all_reduce(data, count, op, opts); });
  }
  void broadcast(void* data, size_t bytes, int root, const op_options& opts) override {
    timed([&] { inner_->broadcast(data, bytes, root, opts); });
  }
  void barrier(const op_options& opts) override {
    timed([&] { inner_->barrier(opts); });
  }
  void reduce_scatter(const float* in, float* out, size_t count, reduce_op op,
                      const op_options& opts) override {
    timed([&] { inner_->reduce_scatter(in, out, count, op, opts); });
  }
  void all_gather(const void* in, void* out, size_t bytes, const op_options& opts) override {
    timed([&] { inner_->all_gather(in, out, bytes, opts); });
  }
  void all_to_all(const void* in, void* out, size_t bytes_per_rank,
                  const op_options& opts) override {
    timed([&] { inner_->all_to_all(in, out, bytes_per_rank, opts); });
  }
  void all_to_allv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes, const op_options& opts) override {
    timed([&] { inner_->all_to_allv(in, send_bytes, out, recv_bytes, opts); });
  }
  void all_reduce_tree(const tree_sum_parts& parts, size_t begin, size_t end, float* out,
                       const op_options& opts) override {
    timed([&] { inner_->all_reduce_tree(parts, begin, end, out, opts); });
  }
  void reduce_scatter_tree(const tree_sum_parts& parts, std::span<const extent> owned, float* out,
                           const op_options& opts) override {
    timed([&] { inner_->reduce_scatter_tree(parts, owned, out, opts); });
  }
  void send(const void* data, size_t bytes, int peer, uint32_t tag,
            const op_options& opts) override {
    timed([&] { inner_->send(data, bytes, peer, tag, opts); });
  }
  void recv(void* data, size_t bytes, int peer, uint32_t tag, const op_options& opts) override {
    timed([&] { inner_->recv(data, bytes, peer, tag, opts); });
  }
  void send_recv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                 size_t recv_bytes, int recv_peer, uint32_t tag, const op_options& opts) override {
    timed([&] {
      inner_->send_recv(send_data, send_bytes, send_peer, recv_data, recv_bytes, recv_peer, tag,
                        opts);
    });
  }
  void abort() override { inner_->abort(); }
  bool aborted() const override { return inner_->aborted(); }
  /// The inner communicator's, untimed: whoever keeps it wraps it again.
  std::unique_ptr<communicator> shrink(const comm_identity& id,
                                       const std::vector<int>& kept) override {
    return inner_->shrink(id, kept);
  }

 private:
  template <class F>
  void timed(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      f();
    } catch (...) {
      seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      throw;
    }
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  std::unique_ptr<communicator> inner_;
  double seconds_ = 0;
};

}  // namespace troupe::comm
