#pragma once
// What `troupe run` and `troupe coordinator` were asked to do, as cli/options.cpp parsed it:
// the coordinator process's one input.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cluster_env.hpp"
#include "runtime/config.hpp"

namespace troupe::coordinator {

/// `troupe run` and `troupe coordinator`.
struct job_options {
  train_config cfg;
  bool help = false;
  std::string listen_host = "127.0.0.1";  ///< coordinator, or run --slurm
  uint16_t listen_port = 0;               ///< coordinator, or run --slurm; 0 = any free port
  bool host_given = false;                ///< --host was given (else --slurm picks the address)
  /// --slurm: the job runs in this Slurm allocation (slurm_job says which); the coordinator
  /// listens on this node's address and writes RUN_DIR/rendezvous.json for the agents, and
  /// `troupe run` starts them with `srun --no-kill`, one per node.
  std::optional<slurm_env> slurm_job;
  /// `troupe run --coordinators K` (with --etcd): K coordinator processes, one leading and the
  /// others standing by to take the job over; this process only launches and waits.
  int coordinators = 1;
  /// `troupe coordinator --join-token FILE` (with --etcd): one of several coordinators of a job
  /// whose run directory another process prepared (`troupe run --coordinators K`); it campaigns,
  /// stands by, and leads when elected.
  std::string join_token;
  /// --print-config: write the effective config (a file --config reads back) and exit.
  bool print_config = false;
  /// --log-level: debug, info, warn or error (empty: TROUPE_LOG_LEVEL, else info).
  std::string log_level;
  /// --resume: the run's own config.json, as this session found it (cfg starts from it).
  std::optional<train_config> saved;
};

/// An agent's command line, with the job's program after `--` when the workers run one (the
/// agent starts only what the process that launched it named: the program never travels in a
/// message).
inline std::vector<std::string> with_program(std::vector<std::string> agent_argv,
                                             const train_config& cfg) {
  if (!cfg.external_workload()) return agent_argv;
  agent_argv.push_back("--");
  agent_argv.insert(agent_argv.end(), cfg.workload_command.begin(), cfg.workload_command.end());
  return agent_argv;
}

}  // namespace troupe::coordinator
