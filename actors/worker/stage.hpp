#pragma once
// The `stage` actor of a pipeline-parallel rank: the control plane of the schedule. After each
// pass the rank tells the neighbouring stage, through its stage actor, that the pass's output
// is ready ("F3's activation", "B3's gradient"); before a pass that needs a neighbour's
// output the rank waits for that notice, then takes the tensor from the data plane. Backward
// notices carry credits: a stage never sends an activation the next stage has no slot for.
// A stalled pipeline is therefore named precisely: which stage waits for which pass of which
// neighbour.

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>

#include "actors/wire/messages.hpp"
#include "runtime/comm/store.hpp"
#include "strategies/pipeline_parallel/pipeline_executor.hpp"

namespace troupe::actors {

/// The notices a stage has received, shared by its stage actor (which posts them) and the
/// rank's step loop (which waits on them). Thread-safe.
class notice_board {
 public:
  void post(const pipe_notice& n);
  /// Waits until the notice (step, micro_batch, backward) from `from_stage` is posted, and
  /// consumes it. Spins briefly before sleeping (a notice usually arrives within a few
  /// hundred microseconds). False at the deadline or once closed.
  bool take(int64_t step, int micro_batch, bool backward,
            std::chrono::steady_clock::time_point deadline);
  /// Wakes every waiter for good (the generation ends, or a neighbour is gone: `why`).
  void close(const std::string& why);
  std::string why_closed();
  /// The previous stage's actor, as it introduced itself (see stage_link).
  void introduce(const caf::actor& prev);
  /// Waits for introduce(); a null handle at the deadline or once closed.
  caf::actor await_prev(std::chrono::steady_clock::time_point deadline);

 private:
  using key = std::tuple<int64_t, int, bool>;
  std::mutex m_;
  std::condition_variable cv_;
  std::set<key> posted_;
  bool closed_ = false;
  std::string why_;
  caf::actor prev_;
};

/// A rank's stage of one pipeline: its actor, published so that the neighbouring stages'
/// actors can reach it, and the observer the pipeline executor calls around every pass.
class stage_link final : public strategies::pipeline_observer {
 public:
  /// Spawns the stage actor of stage `stage` of `stages` in pipeline `group` and links it to
  /// its neighbours' (waiting up to `timeout` for them). Each pair shares one middleman
  /// connection, opened by the earlier stage: a stage with a predecessor publishes its actor
  /// and registers the address in `store`; the predecessor connects to it and introduces its
  /// own actor over that connection. (Two nodes that connect to each other at the same time
  /// end up with a duplicate connection, and CAF closing one reports the peer as unreachable.)
  /// `next_slots` is how many activations this stage may have sent that the next stage has not yet
  /// finished backward for (its credits). Throws std::runtime_error naming the neighbour that
  /// cannot be reached.
  stage_link(caf::actor_system& sys, comm::kv_store& store, uint64_t generation,
             const std::string& group, int stage, int stages, int next_slots,
             std::chrono::milliseconds timeout, const std::string& advertise = "127.0.0.1");
  ~stage_link() override;
  stage_link(const stage_link&) = delete;
  stage_link& operator=(const stage_link&) = delete;

  /// The step the next passes belong to.
  void begin_step(int64_t step);
  /// Wakes a pass waiting for a notice, for good (the generation is aborted). Thread-safe.
  void abort(const std::string& why) { board_->close(why); }

  // pipeline_observer
  void waiting(const strategies::pipe_op& op) override;
  void done(const strategies::timed_op& op) override;

 private:
  caf::actor_system& sys_;
  uint64_t generation_;
  int stage_, stages_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<notice_board> board_;
  caf::actor self_, prev_, next_;
  uint16_t port_ = 0;
  int64_t step_ = 0;
  int credits_ = 0;  // activation slots of the next stage this stage may still fill
};

}  // namespace troupe::actors
