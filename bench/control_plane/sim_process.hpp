#pragma once
// One forked process of the simulator: it runs a slice of the simulated nodes (CAF numbers the
// actor systems of one process in one byte of their node ids, so a process holds at most
// nodes_per_process of them), kills the members the bench marks in the shared ledger, and
// stops them all when told.

#include <chrono>
#include <cstdint>
#include <string>

#include "bench/control_plane/control_plane_bench.hpp"
#include "bench/control_plane/sim_ledger.hpp"

namespace troupe::bench::control_plane {

/// Past 256 actor systems in one process their node ids repeat, and the coordinator would take
/// two nodes for one.
constexpr int nodes_per_process = 250;

struct sim_process_setup {
  int first_node = 0, last_node = 0;  ///< [first, last)
  std::string host;
  uint16_t port = 0;
  std::chrono::milliseconds heartbeat_interval{400};
};

/// Runs in the forked process: connects its nodes, kills the members the bench marks, and
/// stops them all when the ledger says quit. Returns its exit status.
int run_sim_process(const bench_options& o, const sim_process_setup& p, sim_ledger& ledger);

}  // namespace troupe::bench::control_plane
