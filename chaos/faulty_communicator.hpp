#pragma once
// Fault injection on the data plane: a communicator decorator that makes a chosen
// collective fail, stall or hang, so chaos tests can attack stage 3 of a step on purpose.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "runtime/comm/communicator.hpp"

namespace troupe::chaos {

/// What to do to one collective.
enum class comm_fault : uint8_t {
  none,
  fail,   ///< throw comm_error{internal} before touching the network (this rank's own failure)
  delay,  ///< sleep `delay` before running the collective (a straggler)
  hang,   ///< block until abort() or the op's deadline, as a silent peer would; then throw
          ///< comm_error{internal} (the fault is this rank's own)
};

/// A fault plan: the `at_call`-th collective (1-based, counted over every kind of
/// collective) on this communicator suffers `kind`; with `every`, every later one too.
struct fault_plan {
  comm_fault kind = comm_fault::none;
  uint64_t at_call = 1;
  bool every = false;
  std::chrono::milliseconds delay{0};
};

/// Parses "fail@3", "hang@10", "delay@1,every,delay:250" style plans
/// (kind@call[,every][,delay:MS]; a delay needs delay:MS above 0, the others take none).
/// Returns nullopt for an empty string; throws std::invalid_argument naming the bad part.
std::optional<fault_plan> parse_fault_plan(const std::string& text);

/// Wraps a real communicator; every call goes to it unless the plan says otherwise.
class faulty_communicator final : public comm::communicator {
 public:
  faulty_communicator(std::unique_ptr<comm::communicator> inner, fault_plan plan);

  const comm::comm_identity& identity() const override { return inner_->identity(); }
  void all_reduce(float* data, size_t count, comm::reduce_op op,
                  const comm::op_options& opts) override;
  void broadcast(void* data, size_t bytes, int root, const comm::op_options& opts) override;
  void barrier(const comm::op_options& opts) override;
  void reduce_scatter(const float* in, float* out, size_t count, comm::reduce_op op,
                      const comm::op_options& opts) override;
  void all_gather(const void* in, void* out, size_t bytes, const comm::op_options& opts) override;
  void all_to_all(const void* in, void* out, size_t bytes_per_rank,
                  const comm::op_options& opts) override;
  void all_to_allv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes, const comm::op_options& opts) override;
  void all_reduce_tree(const comm::tree_sum_parts& parts, size_t begin, size_t end, float* out,
                       const comm::op_options& opts) override;
  void reduce_scatter_tree(const comm::tree_sum_parts& parts, std::span<const comm::extent> owned,
                           float* out, const comm::op_options& opts) override;
  void send(const void* data, size_t bytes, int peer, uint32_t tag,
            const comm::op_options& opts) override;
  void recv(void* data, size_t bytes, int peer, uint32_t tag,
            const comm::op_options& opts) override;
  void send_recv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data,
                 size_t recv_bytes, int recv_peer, uint32_t tag,
                 const comm::op_options& opts) override;
  void abort() override;
  bool aborted() const override { return inner_->aborted(); }
  /// The inner communicator's, without faults: the caller injects them again, as it does
  /// into every communicator it connects.
  std::unique_ptr<comm::communicator> shrink(const comm::comm_identity& id,
                                             const std::vector<int>& kept) override {
    return inner_->shrink(id, kept);
  }

  /// Collectives started so far.
  uint64_t calls() const { return calls_.load(); }

 private:
  void before_collective(const char* op, const comm::op_options& opts);

  std::unique_ptr<comm::communicator> inner_;
  fault_plan plan_;
  std::atomic<uint64_t> calls_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool aborted_ = false;
};

/// Wraps `inner` when the environment variable TROUPE_CHAOS_RANK<rank> holds a plan
/// (e.g. TROUPE_CHAOS_RANK1=hang@5); returns `inner` unchanged otherwise. This is how
/// the chaos tests reach a worker process that an agent started.
std::unique_ptr<comm::communicator> inject_from_environment(
    std::unique_ptr<comm::communicator> inner, int rank);

}  // namespace troupe::chaos
