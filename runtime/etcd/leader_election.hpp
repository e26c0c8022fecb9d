#pragma once
// Leader election for a job's coordinator through etcd: who leads, under which fencing epoch,
// and stepping down before the lease that backs the leadership can have expired.
//
// The leader key /troupe/<job>/leader exists only while its holder's lease lives. A candidate
// wins with one transaction: "if create_revision(key) == 0 then put(key, me, lease)".
// The epoch of a leadership is the create_revision of that key. etcd's revision counter only
// grows, and a new leader key can only be created after the previous one was deleted (a
// later revision still), so every leadership's epoch is larger than every earlier one's,
// without a second counter key that would have to be kept in step with the leader key.
// It also fences writes in etcd itself: compare::created(leader_key, equal, epoch) holds only
// while this leadership lasts (see leader_election::fence()).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "runtime/etcd/etcd_client.hpp"

namespace troupe::etcd {

/// The current leader as etcd records it.
struct leader_info {
  std::string id;
  std::string address;
  std::int64_t epoch = 0;  ///< create_revision of the leader key
};

struct election_options {
  std::string job;      ///< the key is /troupe/<job>/leader
  std::string id;       ///< this candidate's name, unique within the job
  std::string address;  ///< where this candidate serves when it leads (host:port)
  /// The lease's TTL: how long a dead leader holds the key before a standby can take over.
  std::chrono::seconds ttl{10};
  /// A leader steps down when no keepalive has succeeded for ttl - safety_margin, measured
  /// from when the last successful keepalive was sent (etcd renewed the lease after that).
  /// It absorbs clock-rate differences and the time on_lost takes. 0: ttl / 4, at least 500 ms.
  std::chrono::milliseconds safety_margin{0};
  /// How often the leader renews its lease. 0: ttl / 4, so several tries fit before stepping
  /// down.
  std::chrono::milliseconds keepalive_interval{0};
  /// How often a standby re-reads the key even when its watch reports nothing.
  std::chrono::milliseconds recheck_interval{0};  ///< 0: ttl
  /// Called on the election's thread when this candidate becomes leader.
  std::function<void(std::int64_t epoch)> on_elected;
  /// Called when it stops leading (lease lost, etcd unreachable for too long, key deleted: on
  /// the election's thread; resign(): on the caller's). is_leader() is already false then.
  /// Neither callback may call resign() or destroy the election.
  std::function<void(const std::string& reason)> on_lost;
};

/// One candidate. start() campaigns from a thread of its own until resign() or destruction.
class leader_election {
 public:
  leader_election(etcd_client& client, election_options options);
  /// Resigns if still leading.
  ~leader_election();
  leader_election(const leader_election&) = delete;
  leader_election& operator=(const leader_election&) = delete;

  /// Begins campaigning (again, after resign()).
  void start();
  /// Stops campaigning, and if leading, steps down (on_lost "resigned") and revokes the lease so
  /// that a standby takes over at once rather than after the TTL.
  void resign();

  /// Whether this candidate leads now. False from the step-down deadline on even when the
  /// election's thread has not yet noticed.
  bool is_leader() const;
  /// The epoch of the current (or last) leadership of this candidate; 0 before the first.
  std::int64_t epoch() const;
  /// The leader as read from etcd now; nullopt when nobody leads. Throws etcd_error.
  std::optional<leader_info> leader(const call_options& call = {});
  /// A comparison that holds only while this candidate's current leadership lasts: add it to a
  /// transaction to fence a write against a deposed leader.
  compare fence() const;
  const std::string& leader_key() const { return key_; }

 private:
  void run();
  void campaign();
  void keep_alive();
  void watch_from(std::int64_t revision);
  void step_down(const std::string& reason);
  void let_go(const std::string& reason);
  void wait_until(std::chrono::steady_clock::time_point until);
  std::string my_value() const;

  etcd_client& client_;
  election_options options_;
  std::string key_;
  std::chrono::milliseconds margin_;
  std::chrono::milliseconds interval_;
  std::chrono::milliseconds recheck_;

  std::atomic<bool> leading_{false};
  std::atomic<std::int64_t> epoch_{0};
  std::atomic<std::int64_t> lease_{0};
  /// steady_clock ticks at which the leadership ends unless a keepalive succeeds first.
  std::atomic<std::chrono::steady_clock::rep> step_down_at_{0};
  std::chrono::steady_clock::time_point next_keepalive_;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool key_changed_ = false;
  std::unique_ptr<watcher> watch_;
  std::thread thread_;
};

}  // namespace troupe::etcd
