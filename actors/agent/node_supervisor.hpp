#pragma once
// The agent of one node: asks the coordinator which ranks to run, starts them as worker
// processes, reports how each one ends, and stops them all when told or when the
// coordinator is lost.

#include <caf/actor.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "actors/wire/connect.hpp"

namespace troupe::actors {

struct agent_args : coordinator_contact {
  int ranks = 0;  ///< workers this agent offers (--ranks K); 0 = its share of the job
  /// Under a scheduler (Slurm): SIGTERM and SIGUSR1 ask the coordinator to checkpoint and stop
  /// the job (preempt_atom) instead of stopping this node's workers.
  bool preempt_on_signals = false;
  /// The job's program (`troupe agent ... -- PROGRAM ARGS`): started as each worker, which
  /// joins through the `troupe` module or libtroupe; empty = `troupe worker`.
  std::vector<std::string> program;
  /// Filled by run_agent: this node's relay (actors/agent/node_relay.hpp) and where it listens
  /// (the node's address), for a job that asks for one (launch_plan::relay); none with several
  /// coordinators.
  caf::actor relay = {};
  std::string relay_host = {};
  uint16_t relay_port = 0;
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
