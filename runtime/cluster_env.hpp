#pragma once
// What a batch scheduler tells the processes of a job, read from the environment (Slurm's
// SLURM_* variables, a Kubernetes Indexed Job's JOB_COMPLETION_INDEX), and the rendezvous
// file (RUN_DIR/rendezvous.json) through which the agents of a Slurm job find its coordinator.
// Pure functions of the environment and of text: the commands do the I/O.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace troupe {

/// One environment variable's value; nullopt when it is not set.
using env_reader = std::function<std::optional<std::string>(const std::string&)>;
/// This process's environment.
env_reader process_environment();
/// A fixed environment (tests).
env_reader environment_of(std::map<std::string, std::string> vars);

/// Expands a Slurm hostlist expression ("node[1-3,07-08],gpu-a[1-2]b,login") into host names,
/// in order, as `scontrol show hostnames` does (zero padding kept, several bracket groups in
/// one name multiply). Throws usage_error naming `what` and the expression when it is malformed.
std::vector<std::string> expand_hostlist(const std::string& expr, const std::string& what);

/// The Slurm job this process runs in.
struct slurm_env {
  std::string job_id;                   ///< SLURM_JOB_ID
  int restart_count = 0;                ///< SLURM_RESTART_COUNT: times the job was requeued
  std::vector<std::string> job_nodes;   ///< SLURM_JOB_NODELIST, expanded; [0] is the first node
  int job_num_nodes = 0;                ///< SLURM_JOB_NUM_NODES (or the nodelist's length)
  int tasks_per_node = 0;               ///< SLURM_NTASKS_PER_NODE when one number, else 0
  std::string node_name;                ///< SLURMD_NODENAME: this node's name in Slurm
  bool in_step = false;                 ///< a task of a step (srun): SLURM_STEP_ID is set
  int node_id = -1;                     ///< SLURM_NODEID: this node's index in the step
  int step_num_nodes = 0;               ///< SLURM_STEP_NUM_NODES (or SLURM_NNODES)
  int local_id = -1;                    ///< SLURM_LOCALID: this task's index on its node
  std::vector<std::string> step_nodes;  ///< SLURM_STEP_NODELIST, expanded

  /// This run of the job: a requeued job keeps its id and counts restarts.
  std::string attempt() const { return "slurm:" + job_id + "." + std::to_string(restart_count); }
};

/// The Slurm job around this process; nullopt when SLURM_JOB_ID is not set. A variable that is
/// set but malformed (a count that is not a number, a nodelist that does not parse) is a
/// usage_error naming it.
std::optional<slurm_env> read_slurm_env(const env_reader& env);

/// JOB_COMPLETION_INDEX of a Kubernetes Indexed Job (this pod's index); nullopt when unset,
/// usage_error when it is not a non-negative number.
std::optional<int> read_completion_index(const env_reader& env);

/// Where a coordinator started under a scheduler listens, written to the shared run directory
/// once it does (`troupe run --slurm`, `troupe coordinator --slurm`) and removed when it ends
/// (run_paths::rendezvous).
struct rendezvous {
  std::string job;   ///< slurm_env::attempt() of the job it serves
  std::string host;  ///< the address it listens on (one the agents reach)
  uint16_t port = 0;
  std::string node;  ///< the Slurm node it runs on
  int nodes = 0;     ///< agents it expects
  int64_t pid = 0;
};
std::string to_json(const rendezvous& r);
/// Parses a rendezvous file's text (at most 4 KiB, every field of the right type). Throws
/// std::runtime_error saying what is wrong: the file is input like anything in the run
/// directory.
rendezvous parse_rendezvous(const std::string& text);

}  // namespace troupe
