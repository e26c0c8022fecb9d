#pragma once
// The coordinator process of a job: prepares the run directory, serves the key-value
// store and the metrics, hosts the job supervisor, optionally launches the local agent
// (`troupe run`), handles Ctrl-C, and prints the summary.

#include <signal.h>

#include "coordinator/job_options.hpp"

namespace troupe::coordinator {

/// Runs the job to its end and returns the exit code (0, 1, 2 or 130).
/// `launch_local_agent`: true for `troupe run`, false for `troupe coordinator`.
int run_job(const job_options& opts, bool launch_local_agent);

/// `troupe run --coordinators K`: the launcher (coordinator/job_ha.cpp). `signals` are blocked.
int run_with_standby_coordinators(const job_options& opts, const sigset_t& signals);

}  // namespace troupe::coordinator
