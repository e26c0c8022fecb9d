#pragma once
// A worker process: one member of the job that takes a rank in each generation. Its `rank`
// actor runs the step loop (compute, all-reduce, vote, apply on commit, checkpoint,
// evaluate); a `control` actor beside it takes aborts while a step runs and aborts the
// communicators under it; a heartbeat thread tells the coordinator the process is alive.

#include <cstdint>
#include <string>
#include <vector>

#include "actors/wire/connect.hpp"
#include "runtime/workload/workload.hpp"

namespace troupe::actors {

struct worker_args : coordinator_contact {
  int member = -1;  ///< the process's identity in the job (its agent's slot)
  int node = 0;     ///< the agent (node) that started it
  /// Start and connect, then read the member id as one line from stdin (an agent's standby
  /// for a worker that dies: the start-up is done before it is needed). End of input: exit 0.
  bool standby = false;
};

/// Runs the worker until the job stops it; returns the process exit code
/// (0 stopped normally, 1 failed; the reason is logged).
/// `make` builds what this process trains once the coordinator's welcome brings the job's
/// settings (a Python script's workload, a C++ program's); empty = the built-in GPT over the
/// job's corpus.
int run_worker(const worker_args& args, const workload_factory& make = {});

}  // namespace troupe::actors
