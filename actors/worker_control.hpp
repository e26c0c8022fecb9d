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

#include "actors/messages.hpp"
#include "actors/stage.hpp"
#include "strategies/engine.hpp"

namespace troupe::actors {

/// What the rank actor, the control actor and the heartbeat thread share. Thread-safe.
class worker_shared {
 public:
  /// The engine (and pipeline stage) of the generation now running. One whose generation was
  /// superseded meanwhile is aborted at once.
  void attach(strategies::training_engine* engine, stage_link* stage, uint64_t generation);
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

 private:
  std::mutex m_;
  strategies::training_engine* engine_ = nullptr;
  stage_link* stage_ = nullptr;
  uint64_t running_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> newest_abort_{0};  ///< the newest generation an abort was for
  std::atomic<int64_t> step_{0};
  std::atomic<int64_t> coordinator_seen_ns_{
      std::chrono::steady_clock::now().time_since_epoch().count()};
  std::atomic<bool> fenced_{false};
};

/// How long a worker or an agent goes without the coordinator's heartbeat before it takes the
/// coordinator for lost and fences itself is the job's coordinator timeout
/// (`coordinator_timeout_ms(elastic_config)`), which validation keeps longer than the time the
/// coordinator waits for a silent member (`heartbeat_timeout`): a delay the coordinator sits out
/// never ends a member from its own side, and a pause of the coordinator itself shorter than it
/// costs only the pause. In between, the coordinator has gone on without a cut-off member, and
/// the generation number fences what it says.

/// Receives the coordinator's aborts while the rank actor is busy, aborts the collective in
/// flight and hands the message on to the rank actor, which decides what follows; takes the
/// coordinator's heartbeats.
caf::behavior control_actor(caf::event_based_actor* self, std::shared_ptr<worker_shared> shared,
                            caf::actor rank);

/// Beats from its own thread, so compute cannot silence it; only a stopped or dead process
/// is. When the coordinator has been silent for longer than `coordinator_timeout` (a
/// partition, or the coordinator hung or gone), this process fences itself: it sends nothing
/// more, aborts the data plane, says so, and ends (exit code 1), whatever its agent does.
class heartbeat_thread {
 public:
  heartbeat_thread(caf::actor coordinator, int32_t member, std::shared_ptr<worker_shared> shared,
                   std::chrono::milliseconds interval,
                   std::chrono::milliseconds coordinator_timeout);
  ~heartbeat_thread();
  heartbeat_thread(const heartbeat_thread&) = delete;
  heartbeat_thread& operator=(const heartbeat_thread&) = delete;

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace troupe::actors
