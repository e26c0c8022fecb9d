#pragma once
// Running under a batch scheduler (Slurm; a Kubernetes Indexed Job): what an agent takes from
// the environment and the shared run directory where its options are silent, the workers'
// guard against the scheduler's signals, and the coordinator's side of a Slurm job (its
// address, RUN_DIR/rendezvous.json, the `srun --no-kill` that starts the agents).

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/cluster_env.hpp"

namespace troupe::cli {

/// What an agent found for itself.
struct agent_plan {
  bool idle = false;  ///< another task on this node runs the agent (SLURM_LOCALID > 0)
  std::string host;   ///< the coordinator
  uint16_t port = 0;
  std::string token_path;    ///< the job's join token
  bool under_slurm = false;  ///< SIGTERM / SIGUSR1 then go to the coordinator (preempt)
  std::string words;  ///< one line for the log: scheduler, node, where the coordinator came from
};

/// The agent's coordinator and join token: from `coordinator_flag` / `token_flag` when given
/// (checked), else from the environment and the run directory (`run_dir_flag`, else
/// TROUPE_RUN_DIR, else runs/latest under a scheduler): TROUPE_COORDINATOR, then under Slurm
/// RUN_DIR/rendezvous.json of this job's attempt, and RUN_DIR/join.token; under a scheduler
/// it waits up to `wait_ms` (TROUPE_AGENT_WAIT_MS) for the coordinator to write them. Throws
/// usage_error (exit 2) for a bad option or variable, std::runtime_error (exit 1) when nothing came
/// in time.
agent_plan plan_agent(const std::string& coordinator_flag, const std::string& token_flag,
                      const std::string& run_dir_flag, const env_reader& env, int wait_ms = 60000);

/// In a worker under Slurm: a SIGTERM that does not come from its agent (Slurm signals every
/// process of a step at once) is left to the coordinator, which checkpoints and stops the job;
/// SIGUSR1 and SIGUSR2 (`--signal` without B:) are ignored. The agent's own SIGTERM, and
/// SIGKILL, end the worker as before. Nothing changes outside Slurm.
void guard_worker_signals(const env_reader& env);

}  // namespace troupe::cli
