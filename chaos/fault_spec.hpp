#pragma once
// `--fault SPEC` values: parsed, range-checked and expanded into the faults a job injects.

#include <chrono>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace troupe::chaos {

/// What is done to the target: kill -9, SIGSTOP (and SIGCONT later), slowed compute, or a
/// poisoned loss (the batch of one step makes training diverge).
enum class fault_kind { kill, stop, slow, diverge };
/// Whom it is done to: one worker rank, a node's agent with all its workers, or the coordinator.
enum class fault_target { rank, node, coordinator };

/// One fault, at the start of one step.
struct fault {
  fault_kind kind = fault_kind::kill;
  fault_target target = fault_target::rank;
  int id = -1;       ///< rank or node number; -1 for the coordinator
  int64_t step = 0;  ///< the step at whose start it fires (slow: first slowed step)
  std::chrono::milliseconds duration{0};  ///< stop: when to continue; 0 = never
  double factor = 1.0;                    ///< slow only: compute takes this many times as long
  /// kill:coordinator only: -1 = at the start of `step`; N >= 0 = in the middle of committing
  /// `step`, once its commit has gone to N ranks and not to the others.
  int commits = -1;
  std::string spec;  ///< the text it came from (for events and messages)
  friend bool operator==(const fault&, const fault&) = default;
};

/// What the job looks like, for range checks and random expansion.
struct fault_bounds {
  int world = 1;      ///< ranks are 0..world-1
  int nodes = 1;      ///< nodes are 0..nodes-1
  int64_t steps = 0;  ///< the run's last step; 0 = not known, steps are then only checked >= 1
  /// The schedule's last step (--steps), the bound of a poisoned batch: after a skip, the batch
  /// of a step beyond --exit-after-step's may be trained before it. 0 = `steps`.
  int64_t batches = 0;
};

/// Parses one --fault value; a random schedule expands into its kills. Accepted forms:
///   kill:rank=R:step=S   kill:node=N:step=S   kill:coordinator:step=S[:commits=N]
///                                    (commits=N: the leading coordinator dies while it commits
///                                     step S, after sending the commit to N ranks)
///   stop:rank=R:step=S[:for=D]       (D like 500ms, 3s or 1.5s; without it never continued)
///   slow:rank=R:factor=X:from=S      (X in (1, 100]; compute X times slower from step S on)
///   diverge:step=S[:rank=R]          (rank R, default 0, reports a NaN loss for the batch
///                                     step S trains on in a run that skipped none; a skipped
///                                     batch is not met again)
///   random:kills=K:seed=Z[:from=S][:every=E][:nodes=M]
/// The fields after the kind may come in any order. A random schedule draws, with splitmix64
/// so that a seed means the same schedule everywhere, K kills at increasing steps from S
/// (default 5) on, at least E (default 5) apart, M (default 0) of them of whole nodes and the
/// rest of single ranks. Throws troupe::config_error naming the spec, the field, what it got
/// and what is allowed.
std::vector<fault> parse_fault(const std::string& spec, const fault_bounds& bounds);
/// All faults of several specs, sorted by step (stable: faults of one step keep their order).
std::vector<fault> parse_faults(const std::vector<std::string>& specs, const fault_bounds& bounds);
/// The same for elastic.faults, which holds the repeated --fault values joined by ';'.
std::vector<fault> parse_faults(const std::string& joined, int world, int nodes, int64_t steps,
                                int64_t batches = 0);

/// How many times slower rank `rank` computes at `step` under `faults` (1 = not slowed): the
/// largest factor of the slow faults on that rank that have begun.
double slowdown(const std::vector<fault>& faults, int rank, int64_t step);

/// Whether rank `rank` must report a diverged (NaN) loss when it trains on `data_position`
/// under `faults`: a diverge fault names that rank and the batch step S trains on when no batch
/// was skipped (data position S - 1). The batch is poisoned, not the step number: after a
/// rollback skipped an earlier batch, a later fault fires one step earlier, on its batch; the
/// rollback skips that batch in turn, so each fault fires once however often steps are replayed,
/// and a job with the same faults skips the same batches whenever its rollbacks come.
bool diverges(const std::vector<fault>& faults, int rank, int64_t data_position);

/// The fault as JSON for events.jsonl: {"what":"kill","target":"rank","id":1,"step":8,...}, with
/// "for_ms" for a stop that is continued and "factor" for a slow. The spec is kept as given
/// (a hand-made one may hold any bytes): the event log escapes what it writes.
nlohmann::json to_json(const fault& f);

}  // namespace troupe::chaos
