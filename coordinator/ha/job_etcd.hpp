#pragma once
// The coordinator's leadership through etcd (--etcd): the election before supervising, the
// pause while its lease has lapsed, and stepping aside for another leader. It leads through
// the etcd of ha/local_etcd.hpp and keeps the job's state there with ha/state_mirror.hpp.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "coordinator/ha/local_etcd.hpp"
#include "monitoring/event_log.hpp"
#include "monitoring/events/events.hpp"
#include "monitoring/metrics.hpp"
#include "runtime/config.hpp"

namespace troupe::coordinator::ha {

/// With --etcd: the etcd the coordinator leads through (its own member for --etcd local), the
/// election, and the mirror of the job's state under /troupe/<job id>/. Without: does nothing.
/// Destroying it writes what is pending, steps down, and stops the local etcd.
class job_etcd {
 public:
  /// Checks the certificate files and, for --etcd local, starts the job's etcd member and waits
  /// until it answers. Throws config_error (exit 2) for unusable options, std::runtime_error
  /// (exit 1) for an etcd that does not start.
  job_etcd(const train_config& cfg, monitoring::metrics_registry& registry,
           monitoring::event_log& events);
  ~job_etcd();
  job_etcd(const job_etcd&) = delete;
  job_etcd& operator=(const job_etcd&) = delete;

  [[nodiscard]] bool enabled() const;
  /// Refuses (config_error, exit 2) when etcd holds the state of another run under this job's
  /// id that has not ended, naming the id, that run's directory and host, and --job-id.
  void refuse_another_job();
  /// Campaigns as `address` and returns once elected, having logged the leader event and
  /// written the job's config. `on_lost` runs (on the election's thread) if leadership is lost
  /// later. Throws config_error for a TLS failure, std::runtime_error when etcd does not answer
  /// or elect this coordinator within --etcd-timeout-ms.
  void lead(const std::string& address, std::function<void()> on_lost);
  /// A standby's campaign: like lead(), but waits for the leadership as long as it takes, until
  /// stop_campaign(). Returns whether it leads.
  bool stand_by(const std::string& address, std::function<void()> on_lost);
  /// Ends a stand_by() that waits (a signal to a standby).
  void stop_campaign();
  /// Whether this coordinator still leads (false from its step-down deadline on, even before
  /// the election's thread noticed); true without etcd.
  [[nodiscard]] bool leading() const;
  /// The epoch of this coordinator's leadership; 0 before it leads.
  [[nodiscard]] int64_t epoch() const;
  /// The job's state under /troupe/<job>/state as the election found it ("" when no
  /// coordinator led the job before): what a takeover starts from.
  [[nodiscard]] std::string found_state() const;
  /// Whether found_state() says the job ended (its last leader wrote its exit code).
  [[nodiscard]] bool job_ended() const;
  /// Asks etcd (at most 2 s) whether this coordinator's leadership holds now.
  bool confirm_leading();
  /// The client URLs of etcd (for --etcd local, the job's own member's).
  [[nodiscard]] std::string client_urls() const;
  /// `troupe run --coordinators K`: coordinator process `pid` is dead (reaped); if it held the
  /// job's leadership, its lease is revoked so that a standby leads at once instead of after
  /// the lease's TTL. Errors are logged, not thrown.
  void release_dead_leader(int pid);
  /// Drops lead()'s on_lost; once this returns it is not running and will not run. Called
  /// before what on_lost reaches (the actor system) is destroyed.
  void forget_on_lost();
  /// While leading: what the supervisor is told when the leadership's lease lapses (pause),
  /// when it leads again (resume, with the new epoch), and when etcd stayed out of reach for
  /// --etcd-timeout-ms (give_up, with the words: the job ends). Another coordinator leading
  /// meanwhile is lead()'s on_lost.
  void on_pause(std::function<void()> pause, std::function<void(int64_t)> resume,
                std::function<void(const std::string&)> give_up);
  /// Follows the job's events (on the supervisor's thread; never waits for etcd).
  void observe(const troupe::events::job_event& event);
  /// Why leadership was lost; empty while it holds (or without etcd).
  [[nodiscard]] std::string lost_reason() const;

 private:
  bool campaign(const std::string& address, std::function<void()> on_lost, bool standby);
  struct state;
  std::unique_ptr<state> state_;
};

}  // namespace troupe::coordinator::ha
