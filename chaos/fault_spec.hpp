#pragma once
// Injected faults (`--fault SPEC`): what to do to which process at which step, parsed and
// checked before the job starts.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::chaos {

enum class fault_action { kill, stop, slow };
enum class fault_target { rank, node, coordinator };

/// One fault: `kill:rank=1:step=8` (kill -9 the process holding rank 1 when step 8 begins),
/// `kill:node=1:step=12` (its agent and all its workers), `stop:rank=2:step=5[:for=3s]`
/// (SIGSTOP, and SIGCONT after `for`; never without it), `kill:coordinator:step=15`, `slow:rank=0:factor=2:from=10` (that
/// rank's compute takes `factor` times as long from step 10 on: a straggler).
struct fault {
  fault_action kind = fault_action::kill;
  fault_target target = fault_target::rank;
  int id = 0;
  int64_t step = 1;
  std::chrono::milliseconds duration{0};
  double factor = 1.0;  ///< slow only
  std::string spec;
};

/// How much slower rank `rank` computes at `step` under `faults` (1 = not at all).
double slowdown(const std::vector<fault>& faults, int rank, int64_t step);

/// Parses one spec; throws troupe::config_error naming the spec, the field and what is allowed.
fault parse_fault(const std::string& spec, int world, int nodes, int64_t steps);
/// A seeded schedule, `random:kills=K:seed=S[:from=F][:every=E]`: K kill -9s of ranks drawn
/// from [0, world), at steps from F (default 5) on, at least E steps apart (default 10). The
/// same seed gives the same schedule everywhere (splitmix64, no std distributions). A rank
/// that is not placed when its kill comes is taken modulo the world of that moment.
std::vector<fault> expand_random(const std::string& spec, int world, int64_t steps);
/// Every spec of a ';'-separated list (elastic.faults), random ones expanded, sorted by step.
std::vector<fault> parse_faults(const std::string& specs, int world, int nodes, int64_t steps);

}  // namespace troupe::chaos
