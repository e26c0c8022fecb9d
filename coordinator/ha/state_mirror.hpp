#pragma once
// The job's progress mirrored in etcd under /troupe/<job>/state (and its config beside it), so
// that a coordinator taking the job over starts where the last leader left it. Every write is
// fenced by the leadership that makes it; every read is checked for whose state it is: a job id
// another run used must never hand that run's numbers to this one.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "monitoring/events/events.hpp"
#include "runtime/etcd/etcd_client.hpp"

namespace troupe::coordinator::ha {

/// Who writes a state: this run's incarnation (RUN_DIR/incarnation), directory and host.
struct job_identity {
  std::string job;  ///< the id in etcd's keys
  std::string incarnation;
  std::string run_dir;
  std::string host;
};

/// The job's progress, as the mirror writes it.
struct job_progress {
  uint64_t generation = 0;
  int64_t committed_step = 0;
  int64_t checkpoint_step = 0;
  int64_t world = 0;
  /// The batches rollbacks skipped: a coordinator that takes over trains on the same data
  /// positions (skipped_batches.json on disk may miss the newest, on a full disk).
  std::vector<int64_t> skipped_steps;
  std::optional<int> ended;  ///< the job's exit code once it ended
};

/// A comparison that holds only while this coordinator's leadership lasts.
using fence_fn = std::function<etcd::compare()>;

class state_mirror {
 public:
  /// `timeout`: --etcd-timeout-ms (each call waits at most 10 s of it).
  state_mirror(etcd::etcd_client& client, job_identity who, std::chrono::milliseconds timeout);
  /// Writes what is pending, then stops the writer.
  ~state_mirror();
  state_mirror(const state_mirror&) = delete;
  state_mirror& operator=(const state_mirror&) = delete;

  /// Whether `doc` (a state read from etcd) is this run's own, or one written before
  /// incarnations were kept. Another run's that has not ended: config_error naming the job id
  /// and what to do. Another run's that ended: false (logged), and it is replaced.
  bool is_ours(const nlohmann::json& doc) const;
  /// Refuses (config_error) when etcd holds another running job's state under this id. etcd
  /// out of reach: logged, not thrown (the campaign that follows waits for it).
  void refuse_another_job();
  /// The state as etcd has it, when it is this run's: what a takeover starts from ("" when
  /// there is none, or another ended run's). Fills progress(). Throws etcd_error.
  std::string read_found();
  /// Marks the found state (or an empty one) with `epoch`, fenced: a leader that pauses and
  /// wins again can tell from it whether another led in between. Returns whether it was
  /// written (false: the fence failed). Throws etcd_error.
  bool mark(const std::string& found, int64_t epoch, const fence_fn& fence);
  /// Writes the job's config beside its state, fenced. Throws etcd_error.
  bool put_config(const std::string& config_json, const fence_fn& fence);
  /// Whether the state was last written under `before` and the job still runs; if so, marks
  /// it with `epoch` (the leadership won again). Any failure: false (stepping aside is safe).
  bool still_ours(int64_t before, int64_t epoch, const fence_fn& fence);
  /// Begins mirroring: from now on observe() queues the newest progress, and a thread writes
  /// it under `fence`, marked with `epoch`.
  void start(fence_fn fence, int64_t epoch);
  /// The leadership was won again under `epoch` (after a pause).
  void set_epoch(int64_t epoch);
  /// Follows the job's events (on the supervisor's thread; never waits for etcd).
  void observe(const events::job_event& event);
  /// Stops the writer once it wrote what is pending.
  void stop();
  /// The job ended: its state and config get a lease of `ttl` instead of staying forever (a
  /// standby elected as the leader resigns must still read that the job ended). Errors are
  /// logged.
  void lease_keys_of_ended_job(const std::string& config_json, std::chrono::seconds ttl);

  [[nodiscard]] job_progress progress() const;
  [[nodiscard]] std::string key() const { return "/troupe/" + who_.job + "/state"; }

 private:
  nlohmann::json document_locked() const;  // mutex_ held
  void mark_identity(nlohmann::json& doc) const;
  bool fenced_put(const std::string& key, const std::string& value, const fence_fn& fence);
  etcd::call_options call_within(std::chrono::milliseconds most) const;
  void write_loop();

  etcd::etcd_client& client_;
  job_identity who_;
  std::chrono::milliseconds timeout_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  job_progress progress_;
  int64_t epoch_ = 0;
  fence_fn fence_;
  bool mirroring_ = false;
  bool stopping_ = false;
  nlohmann::json pending_;  // null: nothing to write
  std::thread writer_;
};

}  // namespace troupe::coordinator::ha
