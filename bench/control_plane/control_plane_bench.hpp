#pragma once
// `troupe bench control-plane`: the real coordinator against thousands of simulated members
// (bench/control_plane/sim_member.hpp), measured. Phases: the coordinator starts, the simulated
// nodes connect and their members say hello (forming), steps run with a simulated compute time,
// members are lost by schedule, the job ends. One table, or one JSON object with --json.

#include <cstdint>
#include <string>

namespace troupe::bench::control_plane {

struct bench_options {
  int members = 0;
  int32_t first_member = 0;  ///< simulated member ids: first_member .. first_member + members - 1
  int64_t steps = 50;
  int step_ms = 200;
  int jitter_ms = 0;
  int members_per_node = 8;
  int lose = 0;                 ///< members lost at once at `lose_at`
  int64_t lose_at = 0;          ///< after this step's commit; 0 = the middle of the run
  double lose_percent = 0;      ///< percent of the members lost at once at `lose_percent_at`
  int64_t lose_percent_at = 0;  ///< 0 = three quarters into the run
  double straggler = 0;  ///< > 1: the first simulated member's steps take this many times as long
  int checkpoint_every = 0;
  /// The job's model width: the model's size, so the checkpoints' (shares, manifest pieces).
  int d_model = 8;
  int heartbeat_timeout_ms = 2000;
  /// Aggregation through the agents: each node's relay bundles its members' votes and beats
  /// and takes one commit for them (sim_relay.hpp); off, every member talks to the coordinator.
  bool aggregate = false;
  int vote_window_ms = 100;  ///< aggregated: how long a relay holds a step's first vote
  int connect_threads = 8;
  /// The coordinator leads through its own etcd (--etcd local); etcd's write counts are
  /// reported (etcd_writes_per_step, etcd_writes_per_loss).
  bool etcd = false;
  int hello_timeout_s = 600;
  /// Where the coordinator started here runs ("" = a fresh directory under /tmp, removed
  /// afterwards); with `coordinator`, that coordinator's run directory, read for the events
  /// figures ("" = none: they are left out).
  std::string run_dir;
  std::string coordinator;  ///< HOST:PORT of a running coordinator ("" = start one)
  std::string join_token;   ///< with `coordinator`: its job's join token
  bool json = false;
};

/// Runs the benchmark; returns the exit status (0 when every step committed and every figure
/// was taken, 1 otherwise). Throws usage_error-like std::invalid_argument for options that
/// contradict each other (the caller maps it to exit 2).
int run_control_plane_bench(const bench_options& o);

}  // namespace troupe::bench::control_plane
