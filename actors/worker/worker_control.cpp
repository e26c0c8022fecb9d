#include "actors/worker/worker_control.hpp"

#include <caf/all.hpp>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "actors/wire/tls_transport.hpp"
#include "monitoring/log.hpp"

namespace troupe::actors {

void worker_shared::attach(workload_generation* work, stage_link* stage, uint64_t generation) {
  std::lock_guard lock(m_);
  work_ = work;
  stage_ = stage;
  running_ = generation;
  generation_.store(generation);
  if (work_ && superseded(generation)) {  // its abort came while it was being built
    work_->abort();
    if (stage_) stage_->abort("a newer generation began while this one was being formed");
  }
}

void worker_shared::detach() {
  std::lock_guard lock(m_);
  work_ = nullptr;
  stage_ = nullptr;
}

void worker_shared::abort_older_than(uint64_t generation, bool final, const std::string& why) {
  std::lock_guard lock(m_);
  const uint64_t newest = final ? std::numeric_limits<uint64_t>::max() : generation;
  for (uint64_t seen = newest_abort_.load(); seen < newest;) {
    if (newest_abort_.compare_exchange_weak(seen, newest)) break;
  }
  if (!work_ || (!final && running_ >= generation)) return;
  work_->abort();
  if (stage_) stage_->abort(why);
}

void worker_shared::abort_running(const std::string& why) {
  std::lock_guard lock(m_);
  if (!work_) return;
  work_->abort();
  if (stage_) stage_->abort(why);
}

void worker_shared::coordinator_seen() {
  coordinator_seen_ns_.store(std::chrono::steady_clock::now().time_since_epoch().count());
}

double worker_shared::coordinator_silence() const {
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  return static_cast<double>(now - coordinator_seen_ns_.load()) * 1e-9;
}

caf::behavior control_actor(caf::event_based_actor* self, std::shared_ptr<worker_shared> shared,
                            caf::actor rank) {
  return {
      [=](const abort_generation& a) {
        // A deposed coordinator may still be running: its word ends nothing of ours.
        if (from_older_epoch(a.epoch, shared->epoch_seen().load())) return;
        shared->abort_older_than(a.generation, a.final, a.reason);
        self->send(rank, a);
      },
      [=](const heartbeat& h) {
        if (!from_older_epoch(h.epoch, shared->epoch_seen().load())) shared->coordinator_seen();
      },
      // A commit the node's relay hands on (--relay): the step loop's.
      [=](const commit& c) { self->send(rank, c); },
  };
}

heartbeat_thread::heartbeat_thread(caf::actor coordinator, int32_t member,
                                   std::shared_ptr<worker_shared> shared,
                                   std::chrono::milliseconds interval, silence_policy policy,
                                   caf::actor rank)
    : coordinator_(std::move(coordinator)), shared_(std::move(shared)), rank_(std::move(rank)) {
  thread_ = std::thread([=, this] { run(member, interval, policy); });
}

void heartbeat_thread::retarget(caf::actor coordinator) {
  std::lock_guard lock(m_);
  coordinator_ = std::move(coordinator);
  shared_->coordinator_seen();
  silence_told_ = false;
}

void heartbeat_thread::fence_and_exit(double silent, std::chrono::milliseconds limit) {
  // Cut off from the coordinator (a partition), or it hung or died: nobody can commit a step
  // of ours any more, and a live coordinator has replaced us already.
  shared_->fence();
  char said[64];
  std::snprintf(said, sizeof said, "%.2f s (limit %.2f s)", silent,
                static_cast<double>(limit.count()) / 1000);
  monitoring::log(monitoring::level::error,
                  {"rank", -1, shared_->generation().load(), shared_->step().load()},
                  std::string("lost the coordinator: no heartbeat from it for ") + said +
                      "; fenced: this worker sends no vote, writes no checkpoint and "
                      "exits (a live coordinator goes on without it; if the "
                      "coordinator is gone, resume the job with --resume)");
  shared_->abort_older_than(0, true, "the coordinator is gone");
  std::_Exit(1);
}

void heartbeat_thread::run(int32_t member, std::chrono::milliseconds interval,
                           silence_policy policy) {
  using clock = std::chrono::steady_clock;
  const auto& shared = shared_;
  std::unique_lock lock(m_);
  shared->coordinator_seen();
  const auto limit = policy.act;
  // The silence is checked more often than the beats go out, so the fence falls within
  // a twentieth of the timeout of its limit.
  const auto check = std::min(interval, std::max(std::chrono::milliseconds(10), limit / 20));
  auto next_beat = clock::now();
  while (!stop_) {
    const auto now = clock::now();
    if (now >= next_beat) {
      heartbeat beat{member, shared->generation().load(), shared->step().load(),
                     tls_rejected_connections()};
      beat.epoch = shared->epoch_seen().load();
      caf::anon_send(coordinator_, beat);
      next_beat = now + interval;
    }
    const double silent = shared->coordinator_silence();
    const bool too_long = silent * 1000 > static_cast<double>(limit.count());
    if (!too_long) silence_told_ = false;
    if (too_long && rank_ && !silence_told_) {
      // Nothing of this generation can be committed while the coordinator is silent, so its
      // collectives stop here (without counting as an abort: the leader's next generations
      // are not superseded), and the step loop asks for the leader.
      silence_told_ = true;
      told_at_ = now;
      shared->rehoming().store(true);
      shared->abort_running("the coordinator is silent");
      caf::anon_send(rank_, silent_atom::value);
    } else if (too_long && rank_ && policy.give_up.count() > 0 &&
               now - told_at_ > policy.give_up + std::chrono::seconds(1) &&
               shared->rehoming().load()) {
      // The step loop's search has a deadline of its own; this one holds if it never returns.
      fence_and_exit(silent, policy.give_up);
    } else if (too_long && !rank_) {
      fence_and_exit(silent, limit);
    }
    cv_.wait_for(lock, check, [this] { return stop_; });
  }
}

heartbeat_thread::~heartbeat_thread() {
  {
    std::lock_guard lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace troupe::actors
