#pragma once
// The steps of a job's coordinator process, in the order run_job (coordinator/job_runner.cpp) takes
// them: plan the job and check it against this machine (job_plan.cpp), open the listeners that
// must work before anything is written (job_listeners.cpp), prepare the run directory
// (job_run_dir.cpp, job_resume.cpp), reach etcd and, once published, win its election
// (job_etcd.cpp, --etcd only), supervise the job to its end (job_supervise.cpp), and summarise
// it (job_summary.cpp). Internal to coordinator/.

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <caf/all.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "actors/coordinator/job/job_actions.hpp"
#include "actors/wire/messages.hpp"
#include "actors/wire/tls_transport.hpp"
#include "chaos/fault_spec.hpp"
#include "checkpoint/checkpoint.hpp"
#include "coordinator/ha/job_etcd.hpp"
#include "coordinator/job_options.hpp"
#include "monitoring/event_log.hpp"
#include "monitoring/events/events.hpp"
#include "monitoring/http_server.hpp"
#include "monitoring/metrics.hpp"
#include "monitoring/progress.hpp"
#include "runtime/comm/store.hpp"
#include "strategies/planner.hpp"

namespace troupe::coordinator {

using monitoring::format_duration;
using monitoring::format_fixed;
using monitoring::format_rate;
using monitoring::progress_line;

/// What a coordinator started by `troupe run --coordinators K` is sent when that launcher dies
/// (PR_SET_PDEATHSIG): its agents and workers die with the launcher, and an etcd it started,
/// so the coordinator ends at once instead of waiting for them (or that etcd) to come back.
inline constexpr int launcher_died = SIGHUP;

/// One line of the coordinator's log at info (timestamped, like every log line), printf-style.
void say(const char* format, ...) __attribute__((format(printf, 1, 2)));

// ---- plan: nothing started, nothing written ----------------------------------------------

/// The job as it will run: its config (the default corpus filled in, the run directory
/// absolute), its first layout, its faults, and where its coordinator listens.
struct job_plan {
  train_config cfg;
  strategies::layout_plan layout;  ///< the planner's plan for the first generation
  std::vector<chaos::fault> faults;
  bool launch_local_agent = false;  ///< `troupe run`; false for `troupe coordinator`
  /// One of several coordinators (--join-token): stands by until elected, takes the job over
  /// from etcd's state, and exits with exit_code::not_leading when it stops without leading.
  bool standby = false;
  std::optional<slurm_env> slurm;        ///< --slurm: the allocation the job runs in
  std::string listen_host;               ///< where the coordinator and the store listen
  uint16_t listen_port = 0;              ///< the coordinator's port; 0 = any free port
  std::string rendezvous_host;           ///< --slurm: where the agents dial (never the wildcard)
  std::vector<std::string> srun_agents;  ///< `troupe run --slurm`: the srun that starts them
  /// --resume: the run's config.json as this session found it (the schedule's length in it).
  std::optional<train_config> saved;
};

/// Plans the job from its options and checks it against this machine and its files
/// (preflight): a job refused here (config_error, exit 2) has started nothing and left the run
/// directory as it found it.
job_plan plan_job(const job_options& opts, bool launch_local_agent);

// ---- listeners: bound before the run directory is touched --------------------------------

/// The coordinator's metrics and the accounting of refused connections. The metrics endpoint
/// is bound before the run directory is touched, so a port in use or an unreadable token is
/// exit 2 with nothing written. Lives as long as the job; not movable (the listeners hold it).
class job_listeners {
 public:
  /// Throws config_error for a metrics port or token that cannot be used.
  explicit job_listeners(const train_config& cfg);
  ~job_listeners();
  job_listeners(const job_listeners&) = delete;
  job_listeners& operator=(const job_listeners&) = delete;

  monitoring::metrics_registry& registry() { return registry_; }
  /// Counts a connection that `listener` refused and logs the first few, then one in 500.
  [[nodiscard]] const actors::rejection_listener& on_rejection() const { return on_rejection_; }
  /// The job's status document, served as GET /status beside the metrics.
  monitoring::status_board& status() { return status_; }
  /// The metrics endpoint; null with metrics_port 0.
  [[nodiscard]] const monitoring::metrics_server* metrics() const {
    return metrics_ ? &*metrics_ : nullptr;
  }

 private:
  monitoring::metrics_registry registry_;
  std::atomic<uint64_t> refused_{0};
  actors::rejection_listener on_rejection_;
  monitoring::status_board status_;  // before metrics_: the endpoint reads it
  std::optional<monitoring::metrics_server> metrics_;
};

// ---- the run directory ------------------------------------------------------------------

/// A checkpoint (or LATEST) that --resume passed over, for the event log.
struct passed_over {
  int64_t step = -1;  ///< -1: LATEST itself
  std::string path, error;
  std::string quarantined;  ///< where the damaged checkpoint went; empty when left in place
};

/// Where a resumed job starts.
struct resume_choice {
  int64_t step = 0;
  std::string layout;  ///< the layout that wrote the checkpoint
  int format = 0;      ///< its format version; 0 = none chosen
  std::vector<passed_over> fallbacks;
  std::optional<int64_t> latest_was;  ///< what LATEST named, when it had to be repaired
  bool latest_repaired = false;
};

/// The checkpoint a resumed job starts from: the newest committed one that fits this config
/// (`config`: to_json(cfg)) and reads back intact. See job_resume.cpp.
resume_choice resume_point(const train_config& cfg, const nlohmann::json& config);

/// The run directory as this job holds it.
struct run_dir_state {
  /// One job per run directory, for as long as the job runs; empty for a coordinator of a run
  /// directory another process holds (`troupe coordinator --join-token`).
  std::optional<ckpt::run_lock> lock;
  int64_t start_step = 0;              ///< steps already committed (resume)
  std::vector<int64_t> skipped_steps;  ///< batches skipped by earlier sessions (resume)
  monitoring::event_log events;        ///< events.jsonl, its opening events written
};

/// Prepares the run directory: resolves the corpus, takes the run's lock (moving an earlier
/// run aside), writes the job's credentials and config.json, chooses the checkpoint to resume
/// from, and opens events.jsonl with the job's first events.
run_dir_state prepare_run_dir(job_plan& job);
/// A coordinator of a run directory that `troupe run --coordinators K` prepared and holds: the
/// job's credentials from `join_token`, the skipped batches, events.jsonl opened to append.
run_dir_state join_run_dir(job_plan& job, const std::string& join_token);

// ---- etcd: the coordinator leads the job through an election (coordinator/ha/) -----------

using ha::check_etcd_options;
using ha::job_etcd;

// ---- supervision ------------------------------------------------------------------------

/// The job while it runs: the store, the actor system with the job supervisor, the agents,
/// and the progress line. What it holds is torn down when it is destroyed, after the summary.
class job_supervision {
 public:
  /// Starts the store and the job supervisor (nothing listens for the agents yet).
  job_supervision(const job_plan& job, job_listeners& listeners, run_dir_state& run,
                  job_etcd& etcd);
  job_supervision(const job_supervision&) = delete;
  job_supervision& operator=(const job_supervision&) = delete;

  /// Publishes the coordinator, starts (or asks for) the agents, and waits for the job's
  /// result while `signals` (blocked in every thread) stop or preempt it; then stops the agents.
  actors::job_result run(const sigset_t& signals);

 private:
  uint16_t publish();
  actors::job_result run_standby(const sigset_t& signals, const std::string& endpoint);
  void announce_rendezvous(uint16_t port) const;
  void start_agents(const std::string& endpoint);
  actors::job_result wait_for_result();
  void stop_agents();

  const job_plan& job_;
  job_listeners& listeners_;
  job_etcd& etcd_;
  std::optional<progress_line> progress_;
  comm::tcp_store_server store_;
  actors::system_config sys_cfg_;
  caf::actor_system sys_;
  caf::scoped_actor self_;
  caf::actor supervisor_;
  std::vector<pid_t> agents_;
  bool supervisor_died_ = false;  ///< it ended without sending the job's result
};

// ---- summary ----------------------------------------------------------------------------

/// What the run has on disk to resume from: the checkpoint LATEST names, and nothing the
/// coordinator merely believes (a commit may have landed after its last word, or failed).
std::string committed_checkpoint_words(const std::string& run_dir);

/// The end-of-run summary on stdout: verdict, steps and world, losses, throughput, where the
/// checkpoint and the events are.
void print_summary(const train_config& cfg, const actors::job_result& r);

}  // namespace troupe::coordinator
