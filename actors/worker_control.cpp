#include "actors/worker_control.hpp"

#include <caf/all.hpp>
#include <cstdlib>
#include <limits>

#include "actors/tls_transport.hpp"
#include "monitoring/log.hpp"

namespace troupe::actors {

void worker_shared::attach(strategies::training_engine* engine, stage_link* stage,
                           uint64_t generation) {
  std::lock_guard lock(m_);
  engine_ = engine;
  stage_ = stage;
  running_ = generation;
  generation_.store(generation);
  if (engine_ && superseded(generation)) {  // its abort came while it was being built
    engine_->abort();
    if (stage_) stage_->abort("a newer generation began while this one was being formed");
  }
}

void worker_shared::detach() {
  std::lock_guard lock(m_);
  engine_ = nullptr;
  stage_ = nullptr;
}

void worker_shared::abort_older_than(uint64_t generation, bool final, const std::string& why) {
  std::lock_guard lock(m_);
  const uint64_t newest = final ? std::numeric_limits<uint64_t>::max() : generation;
  for (uint64_t seen = newest_abort_.load(); seen < newest;) {
    if (newest_abort_.compare_exchange_weak(seen, newest)) break;
  }
  if (!engine_ || (!final && running_ >= generation)) return;
  engine_->abort();
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
        shared->abort_older_than(a.generation, a.final, a.reason);
        self->send(rank, a);
      },
      [=](const heartbeat&) { shared->coordinator_seen(); },
  };
}

heartbeat_thread::heartbeat_thread(caf::actor coordinator, int32_t member,
                                   std::shared_ptr<worker_shared> shared,
                                   std::chrono::milliseconds interval,
                                   std::chrono::milliseconds coordinator_timeout)
    : thread_([=, this] {
        std::unique_lock lock(m_);
        shared->coordinator_seen();
        while (!stop_) {
          caf::anon_send(coordinator, heartbeat{member, shared->generation().load(),
                                                shared->step().load(), tls_rejected_connections()});
          const double silent = shared->coordinator_silence();
          if (silent * 1000 > static_cast<double>(coordinator_timeout.count())) {
            // A hung (or unreachable) coordinator: nobody can commit a step any more.
            monitoring::log(monitoring::level::error,
                            {"rank", -1, shared->generation().load(), shared->step().load()},
                            "lost the coordinator: no heartbeat from it for " +
                                std::to_string(silent).substr(0, 4) +
                                " s; stopping (resume the job with --resume)");
            shared->abort_older_than(0, true, "the coordinator is gone");
            std::_Exit(1);
          }
          cv_.wait_for(lock, interval, [this] { return stop_; });
        }
      }) {}

heartbeat_thread::~heartbeat_thread() {
  {
    std::lock_guard lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace troupe::actors
