#pragma once
// Inside a worker that is the job's own program (a Python script through the troupe module, a
// C++ program through actors/worker/program_worker.hpp): what its agent told it, read from the
// environment the agent started it with (actors/agent/node_supervisor.cpp, spawn_worker).

#include "actors/worker/rank.hpp"

namespace troupe::actors {

/// Whether this process was started as a worker of a job: its agent set TROUPE_COORDINATOR.
bool started_by_agent();

/// The worker's arguments from TROUPE_COORDINATOR, TROUPE_MEMBER (or TROUPE_STANDBY=1),
/// TROUPE_NODE and TROUPE_JOIN_TOKEN (whose token becomes the process's credentials), and the
/// node's address (TROUPE_ADVERTISE, TROUPE_IFACE, ... as `troupe agent` reads them). Throws
/// std::invalid_argument naming the variable that is missing or malformed.
worker_args worker_args_from_environment();

}  // namespace troupe::actors
