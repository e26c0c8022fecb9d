#pragma once
// The runtime's gradient reduction for workloads that leave it to the runtime
// (reduction::by_runtime, docs/WORKLOAD.md "Gradients: reduced in place, overlapped with
// backward"): the workload's float32 buckets are summed over the data-parallel group in place,
// each as one all-reduce, on a thread of the reducer's own, while backward still produces the
// buckets after them.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/workload/workload.hpp"

namespace troupe::strategies {

/// What one step's reduction measured, for the vote.
struct reduced_step {
  /// L2 norm of every reduced gradient of this rank (all buckets, in index order, summed in
  /// double): the vote's local_grad_norm.
  double grad_norm = 0;
  /// Wall seconds inside the all-reduces (overlapped with backward or not).
  double collective_s = 0;
  /// Wall seconds finish() waited for the reduction after compute returned: the part of the
  /// reduction that backward did not hide (the vote's comm_s).
  double wait_s = 0;
};

/// One generation's reducer: sums `buckets` over `comm` step after step. The step driver
/// calls begin_step() before compute, hands the reducer to compute as its gradient_sink, and
/// calls finish() when compute returned (or failed); any thread may call abort().
///
/// Order. Bucket k's all-reduce starts only once buckets 0..k are all announced, and buckets
/// are reduced one at a time in index order, so every rank issues the same sequence of
/// collectives whatever order its backward finishes them in. Buckets are summed, not averaged:
/// the workload scales its gradients so that their sum over ranks is the global gradient.
///
/// Memory. A bucket may be read and written by the reducer's thread from the moment it is
/// announced until finish() or abort() returns; the workload must not touch it meanwhile. No
/// thread of the reducer touches bucket memory after finish() or abort() has returned.
///
/// The communicator. Between begin_step() and finish() the reducer's thread is the only user
/// of `comm`'s collectives (communicators are single-threaded); outside a step its owner may
/// use it (state transfer, evaluation). It must outlive the reducer.
class bucket_reducer final : public gradient_sink {
 public:
  /// `comm`: the data-parallel group; null (or a group of one) means a single replica, whose
  /// buckets are already the sum (the norm is still measured). `op_timeout`: the deadline of
  /// one collective and, once finish() is called, of everything the step still has to reduce
  /// (finish() returns within about op_timeout of its call). Starts the reducer's thread.
  bucket_reducer(comm::communicator* comm, std::vector<gradient_bucket> buckets,
                 std::chrono::milliseconds op_timeout);
  /// Stops the thread. A step still in flight (begun, neither finished nor aborted) is
  /// aborted first, which aborts `comm` too: otherwise the destructor could wait a whole
  /// deadline for a collective that no peer will join.
  ~bucket_reducer() override;

  bucket_reducer(const bucket_reducer&) = delete;
  bucket_reducer& operator=(const bucket_reducer&) = delete;

  /// Opens a step: no bucket announced yet. Throws std::logic_error while the previous step
  /// is open (finish() not called), unless it was aborted.
  void begin_step();

  /// Bucket `bucket` is final for this step (gradient_sink). Any thread, any order; never
  /// blocks and never allocates. A bucket announced twice, or an index out of range, is
  /// recorded and fails the step in finish(); the reducer still reduces every bucket, so the
  /// peers' collectives are matched and they fail by the vote rather than by a timeout.
  /// Ignored outside a step (before begin_step(), after finish()).
  void ready(size_t bucket) override;

  /// Compute returned: announces every bucket not yet announced (unused gradients, a rank with
  /// no samples: its zeros still take part), waits until every bucket is reduced, and returns
  /// what the step measured. Throws the step's first failure: workload_error naming the bucket
  /// for a misuse of ready(), else the comm::comm_error of a collective (aborted after
  /// abort()). Either way the step is over and the reducer's thread no longer touches the
  /// buckets. Throws std::logic_error outside a step.
  reduced_step finish();

  /// Makes the reduction in flight fail promptly: aborts the communicator (which stays dead:
  /// the generation is over) and stops launching buckets. Any thread, idempotent; returns once
  /// the reducer's thread has stopped touching the buckets. finish() then throws
  /// comm::comm_error{aborted}, and so does every later step.
  void abort() noexcept;

  /// The L2 norm of the last finished step's reduced gradients (finish()'s grad_norm), for the
  /// thread that calls finish().
  [[nodiscard]] double local_grad_norm() const { return last_.grad_norm; }
  [[nodiscard]] size_t bucket_count() const { return buckets_.size(); }
  /// Buckets whose all-reduce this step has started / finished, for tests and traces (an
  /// acquire read; exact once finish() has returned).
  [[nodiscard]] size_t launched() const { return launched_.load(std::memory_order_acquire); }
  [[nodiscard]] size_t reduced() const { return reduced_.load(std::memory_order_acquire); }

 private:
  void run() noexcept;
  void run_step();
  void wake() noexcept;
  /// Waits (futex, no spinning beyond the standard library's short one) until `done()`.
  template <class Pred>
  void await(Pred done);
  comm::op_options options_now() const;

  comm::communicator* comm_;
  const std::vector<gradient_bucket> buckets_;
  const std::chrono::milliseconds op_timeout_;

  /// announced_[k]: ready(k) (or finish()) was called this step. Reset by begin_step() while
  /// the thread is idle.
  const std::unique_ptr<std::atomic<uint8_t>[]> announced_;
  std::atomic<bool> step_open_{false};
  std::atomic<bool> aborted_{false};
  std::atomic<bool> stop_{false};
  /// The first misuse of ready() this step: kind in the top byte, the bucket below it.
  std::atomic<uint64_t> misuse_{0};
  /// steady_clock nanoseconds by which the step must be reduced, 0 until finish() sets it.
  std::atomic<int64_t> deadline_ns_{0};
  std::atomic<size_t> launched_{0};
  std::atomic<size_t> reduced_{0};
  /// Bumped after every change the thread may be waiting for (futex word of await()).
  std::atomic<uint32_t> wake_{0};
  /// Steps begun; the thread runs step `step_seq_` once it differs from `done_seq_`.
  std::atomic<uint64_t> step_seq_{0};

  std::mutex done_mu_;
  std::condition_variable done_cv_;
  uint64_t done_seq_ = 0;       // guarded by done_mu_: the last step the thread ended
  std::exception_ptr failure_;  // guarded by done_mu_: that step's first comm failure
  reduced_step result_;         // guarded by done_mu_: what it measured
  reduced_step last_;           // the last finished step's, for local_grad_norm()
  std::thread thread_;          // last: starts once every member above exists
};

}  // namespace troupe::strategies
