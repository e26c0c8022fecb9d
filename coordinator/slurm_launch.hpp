#pragma once
// The coordinator's side of a Slurm job: the address it listens on, RUN_DIR/rendezvous.json
// through which the agents find it, and the `srun --no-kill` that starts them.

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/cluster_env.hpp"

namespace troupe::coordinator {

/// The address the coordinator of a Slurm job listens on when --host does not say: the node
/// address the environment names (TROUPE_ADVERTISE, TROUPE_IFACE, GLOO_SOCKET_IFNAME), else
/// the address this node's Slurm name (SLURMD_NODENAME, else the host name) resolves to,
/// which must be held by this host and not be loopback. Throws config_error (exit 2) naming
/// the fix otherwise.
std::string slurm_listen_host(const slurm_env& job);

/// Writes RUN_DIR/rendezvous.json atomically (mode 0644: no secret in it).
void write_rendezvous(const std::string& run_dir, const rendezvous& r);
/// Removes RUN_DIR/rendezvous.json if it is still this process's (a later attempt's is kept).
void remove_rendezvous(const std::string& run_dir, int64_t pid);

/// `srun --no-kill ... <exe> agent`: one agent on each of `nodes` nodes of the allocation; a
/// node lost does not end the step (srun --no-kill), nor does an agent's exit.
std::vector<std::string> srun_agents_command(const std::string& exe, int nodes);
/// Refuses (config_error) when srun is not on PATH.
void require_srun();

}  // namespace troupe::coordinator
