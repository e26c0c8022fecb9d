#pragma once
// The agent of one node: asks the coordinator which ranks to run, starts them as worker
// processes, reports how each one ends, and stops them all when told or when the
// coordinator is lost.

#include <cstdint>
#include <string>
#include <vector>

#include "actors/wire/connect.hpp"

namespace troupe::actors {

struct agent_args {
  std::string coordinator_host = "127.0.0.1";
  uint16_t coordinator_port = 0;
  /// Every coordinator of the job (the first is coordinator_host:port). More than one: one
  /// leads and the others stand by; when the leader is lost (its connection closes, or it is
  /// silent for the heartbeat timeout) this process asks them in turn until the new leader
  /// takes it on (coordinator takeover), for up to the coordinator timeout, then fences.
  std::vector<endpoint> coordinators;
  int connect_timeout_ms = 30000;
  int ranks = 0;  ///< workers this agent offers (--ranks K); 0 = its share of the job
  /// The address this node's workers bind and advertise (--iface / --advertise or the
  /// environment, checked: actors/wire/node_address.hpp); "" = each worker's route toward the
  /// coordinator.
  std::string advertise;
  /// Under a scheduler (Slurm): SIGTERM and SIGUSR1 ask the coordinator to checkpoint and stop
  /// the job (preempt_atom) instead of stopping this node's workers.
  bool preempt_on_signals = false;
};

/// Runs the agent until its workers are gone; returns the process exit code
/// (0 after an orderly stop, 1 when the coordinator was lost or refused us).
int run_agent(const agent_args& args);

struct launch_plan;

/// How an agent takes a coordinator's answer to its agent_hello when the job has several
/// coordinators: only the leader of the newest leadership may take it on.
enum class leader_answer {
  accepted,     ///< the leader took the agent on
  not_leading,  ///< a standby (its error starts with not_leading_prefix): ask the next one
  stale,        ///< a leader of an older epoch than one the agent already followed: next one
  refused,      ///< the leader turned the agent away: asking others will not help
};
/// `epoch_seen`: the newest leadership epoch the agent has followed (0 = none yet).
leader_answer judge_leader_answer(const launch_plan& plan, int64_t epoch_seen);

}  // namespace troupe::actors
