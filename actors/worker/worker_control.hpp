#pragma once
// The parts of a worker process that must work while its step loop is busy: the state the
// loop shares with them, the `control` actor that aborts a collective in flight, and the
// heartbeat thread that tells the coordinator the process is alive and notices when the
// coordinator is not.

#include <atomic>
#include <caf/actor.hpp>
#include <caf/event_based_actor.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "actors/wire/messages.hpp"
#include "actors/wire/welcome_verdict.hpp"
#include "actors/worker/stage.hpp"
#include "runtime/workload/workload.hpp"

namespace troupe::actors {

/// What the rank actor, the control actor and the heartbeat thread share. Thread-safe.
class worker_shared {
 public:
  /// The workload generation (and pipeline stage) now running. One whose generation was
  /// superseded meanwhile is aborted at once.
  void attach(workload_generation* work, stage_link* stage, uint64_t generation);
  void detach();
  /// Aborts the running generation's data plane if `generation` (the one being formed) is
  /// newer, or whatever runs when `final` (the job ends).
  void abort_older_than(uint64_t generation, bool final, const std::string& why);
  /// Whether an abort for a newer generation than `generation` (or a final one) has come:
  /// a member still connecting `generation` gives up (see enter_generation).
  bool superseded(uint64_t generation) const { return newest_abort_.load() > generation; }
  std::atomic<uint64_t>& generation() { return generation_; }
  std::atomic<int64_t>& step() { return step_; }
  /// The coordinator was heard from now.
  void coordinator_seen();
  /// Seconds since the coordinator was last heard from.
  double coordinator_silence() const;
  /// This process lost the coordinator: from now on it tells the coordinator nothing (no
  /// vote, no report) and starts no checkpoint write, and it is about to exit. Whatever it
  /// would say belongs to a generation that the job, if it still runs, has left.
  void fence() { fenced_.store(true); }
  bool fenced() const { return fenced_.load(); }
  /// Aborts whatever generation runs (its collectives and stage link) without recording an
  /// abort: the coordinator that ran it is lost, and the generations the next leader opens
  /// must not count as superseded by this.
  void abort_running(const std::string& why);
  /// The newest leadership epoch this member follows (0 without etcd); messages of an older
  /// coordinator are dropped against it.
  std::atomic<int64_t>& epoch_seen() { return epoch_seen_; }
  /// Set while this member has lost its coordinator and looks for the leader (HA mode): what
  /// it would say now is meant for a coordinator that no longer listens.
  std::atomic<bool>& rehoming() { return rehoming_; }
  /// The coordinator this member follows now, for threads that report to it (a checkpoint
  /// write's report): a new leader replaces it (rank.cpp, rehome).
  caf::actor coordinator() const {
    std::lock_guard lock(coordinator_m_);
    return coordinator_;
  }
  void set_coordinator(caf::actor c) {
    std::lock_guard lock(coordinator_m_);
    coordinator_ = std::move(c);
  }

 private:
  std::mutex m_;
  workload_generation* work_ = nullptr;
  stage_link* stage_ = nullptr;
  uint64_t running_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> newest_abort_{0};  ///< the newest generation an abort was for
  std::atomic<int64_t> step_{0};
  std::atomic<int64_t> coordinator_seen_ns_{
      std::chrono::steady_clock::now().time_since_epoch().count()};
  std::atomic<bool> fenced_{false};
  std::atomic<int64_t> epoch_seen_{0};
  std::atomic<bool> rehoming_{false};
  mutable std::mutex coordinator_m_;
  caf::actor coordinator_;
};

/// How long a worker or an agent goes without the coordinator's heartbeat before it takes the
/// coordinator for lost and fences itself is the job's coordinator timeout
/// (`liveness_of(elastic_config).coordinator`), which validation keeps longer than the time the
/// coordinator waits for a silent member (`heartbeat_timeout`): a delay the coordinator sits out
/// never ends a member from its own side, and a pause of the coordinator itself shorter than it
/// costs only the pause. In between, the coordinator has gone on without a cut-off member, and
/// the generation number fences what it says.

/// Receives the coordinator's aborts while the rank actor is busy, aborts the collective in
/// flight and hands the message on to the rank actor, which decides what follows; takes the
/// coordinator's heartbeats.
caf::behavior control_actor(caf::event_based_actor* self, std::shared_ptr<worker_shared> shared,
                            caf::actor rank);

/// When a worker acts on its coordinator's silence.
struct silence_policy {
  /// After this much silence: fence and exit without `rank`; with it, abort the running data
  /// plane and tell `rank` (silent_atom), which asks for the leader again.
  std::chrono::milliseconds act;
  /// With `rank`: when it has not been taken back on this long after it was told (its search
  /// for the leader outlasts its own deadline), the thread fences and ends the process.
  /// 0 = never (with standbys, the rank's search decides alone).
  std::chrono::milliseconds give_up{0};
  silence_policy(std::chrono::milliseconds act_after,  // NOLINT: a bare limit is a policy
                 std::chrono::milliseconds give_up_after = std::chrono::milliseconds(0))
      : act(act_after), give_up(give_up_after) {}
};

/// Beats from its own thread, so compute cannot silence it; only a stopped or dead process
/// is. When the coordinator has been silent for longer than `policy.act` (a partition, or the
/// coordinator hung or gone), a process without `rank` fences itself: it sends nothing more,
/// aborts the data plane, says so, and ends (exit code 1), whatever its agent does. With
/// `rank` the process may outlive the silence: the thread aborts the running data plane and
/// tells `rank` (silent_atom, once per silence), whose step loop asks for the leader again
/// and then points the thread at it (retarget).
class heartbeat_thread {
 public:
  heartbeat_thread(caf::actor coordinator, int32_t member, std::shared_ptr<worker_shared> shared,
                   std::chrono::milliseconds interval, silence_policy policy, caf::actor rank = {});
  ~heartbeat_thread();
  heartbeat_thread(const heartbeat_thread&) = delete;
  heartbeat_thread& operator=(const heartbeat_thread&) = delete;
  /// Beats go to `coordinator` from now on, and its silence counts from now.
  void retarget(caf::actor coordinator);

 private:
  void run(int32_t member, std::chrono::milliseconds interval, silence_policy policy);
  [[noreturn]] void fence_and_exit(double silent, std::chrono::milliseconds limit);

  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  caf::actor coordinator_;
  std::shared_ptr<worker_shared> shared_;
  caf::actor rank_;
  bool silence_told_ = false;  ///< the rank actor knows of the silence going on now
  std::chrono::steady_clock::time_point told_at_;
  std::thread thread_;
};

}  // namespace troupe::actors
