#pragma once
// The agent of one node: asks the coordinator which ranks to run, starts them as worker
// processes, reports how each one ends, and stops them all when told or when the
// coordinator is lost.

#include <cstdint>
#include <string>

namespace troupe::actors {

struct agent_args {
  std::string coordinator_host = "127.0.0.1";
  uint16_t coordinator_port = 0;
  int connect_timeout_ms = 30000;
  int ranks = 0;  ///< workers this agent offers (--ranks K); 0 = its share of the job
  /// The address this node's workers bind and advertise (--iface / --advertise or the
  /// environment, checked: actors/node_address.hpp); "" = each worker's route toward the
  /// coordinator.
  std::string advertise;
  /// Under a scheduler (Slurm): SIGTERM and SIGUSR1 ask the coordinator to checkpoint and stop
  /// the job (preempt_atom) instead of stopping this node's workers.
  bool preempt_on_signals = false;
};

/// Runs the agent until its workers are gone; returns the process exit code
/// (0 after an orderly stop, 1 when the coordinator was lost or refused us).
int run_agent(const agent_args& args);

}  // namespace troupe::actors
