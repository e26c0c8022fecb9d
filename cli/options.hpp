#pragma once
// Command-line parsing for every `troupe` command: options map onto config fields, and
// every mistake becomes a usage_error naming the option and the fix (exit code 2).

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/cluster_env.hpp"
#include "cli/command_line.hpp"
#include "runtime/config.hpp"

namespace troupe::cli {

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

}  // namespace troupe::cli
namespace troupe {
struct setting;
}
namespace troupe::cli {
/// One setting whose value differs between two configs, as text.
struct setting_change {
  const setting* what;
  std::string before, after;
};
std::vector<setting_change> changed_settings(const train_config& before, const train_config& after);

/// Applies `--config FILE` first, then every other option in order, then (--slurm) what the
/// Slurm allocation says where no option did, then validates.
/// Throws usage_error (bad option) or config_error (bad value or combination).
job_options parse_job_options(const std::vector<std::string>& args, bool coordinator_only,
                              const env_reader& env = process_environment());

/// Every job option, from the settings table (troupe run --help, troupe help options).
std::string job_options_help();
std::string run_help();
std::string coordinator_help();
std::string agent_help();
std::string worker_help();
std::string main_help();
std::string bench_help();
/// `troupe ckpt --help` for "", a subcommand's help for its name, "" for an unknown one.
std::string ckpt_help(const std::string& subcommand);

}  // namespace troupe::cli
