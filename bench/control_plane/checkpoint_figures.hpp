#pragma once
// The checkpoints a control-plane run committed, timed against its simulated ranks: from the
// step's last commit in to its last share reported, and to the manifest committed (the
// coordinator's checkpoint event, on the wall clock, moved onto the simulator's steady one).

#include <cstdint>
#include <string>
#include <vector>

#include "bench/control_plane/sim_ledger.hpp"

namespace troupe::bench::control_plane {

struct checkpoint_figures {
  int committed = 0, failed = 0;
  int committed_before = 0;  ///< committed before `before_unix_ms` (the final /proc sample)
  std::vector<double> shares_s, commit_s, coordinator_s;
  int64_t manifest_bytes = 0;  ///< the newest committed manifest's size
  int64_t manifest_pieces = 0;
};

/// Reads the run's events.jsonl (`events`) and its newest manifest; `steady_ns_at` and
/// `unix_ms_at` are one instant on both clocks.
checkpoint_figures checkpoints_of(const std::string& events, const std::string& run_dir,
                                  sim_ledger& ledger, int64_t steady_ns_at, int64_t unix_ms_at,
                                  int64_t before_unix_ms);

}  // namespace troupe::bench::control_plane
