#pragma once
// The job's events as types: one struct per kind, one serialiser to the events.jsonl object
// and one parser back, so the metrics, the console and the progress line read fields by name
// in C++ and a renamed field fails to compile (or fails events_test) instead of exporting 0.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace troupe::actors::events {

/// The job moved between job_states ("state").
struct state {
  std::string from;
  std::string to;
  int value = 0;  ///< job_state as a number (the troupe_job_state gauge)
  uint64_t generation = 0;
  int64_t step = 0;
  std::string reason;
};

/// A step was committed ("step").
struct step {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;
  int64_t tokens = 0;
  double tokens_per_s = 0;
  int world = 0;
  uint64_t generation = 0;
  double step_s = 0;
  double compute_s = 0;  ///< means over the ranks
  double comm_s = 0;
  double control_s = 0;
  double peer_wait_s = 0;
  int64_t total_steps = 0;
};

/// A generation formed ("generation").
struct generation {
  uint64_t number = 0;
  int world = 0;
  int spares = 0;
  nlohmann::json plan;  ///< strategies::plan_doc
  std::string reason;
  std::string cause;
  int64_t start_step = 0;
  bool planned_with_abort = false;
  bool shrunk = false;
  double recovery_s = 0;
};

/// A member died or was declared lost ("rank_lost").
struct rank_lost {
  int32_t rank = -1;
  int32_t member = -1;
  int32_t node = -1;
  int64_t pid = 0;
  std::string cause;  ///< to_string(loss_cause)
  std::string reason;
  int64_t step = 0;
  uint64_t generation = 0;
};

/// A message of an older generation was dropped ("stale_message").
struct stale_message {
  std::string message;
  int32_t member = -1;
  uint64_t message_generation = 0;
  uint64_t generation = 0;
};

/// A checkpoint was committed ("checkpoint").
struct checkpoint {
  int64_t step = 0;
  std::string path;
  uint64_t generation = 0;
  uint64_t bytes_written = 0;
  uint64_t bytes_deduplicated = 0;
  double stall_s = 0;
  double write_s = 0;
  uint64_t snapshot_buffer_bytes = 0;
  uint64_t replicated_bytes = 0;
  std::optional<int64_t> replaces;  ///< the abandoned checkpoint's step it stands for
};

/// A checkpoint failed to save or commit ("checkpoint_failed").
struct checkpoint_failed {
  int64_t step = 0;
  std::optional<int> ranks_failed;  ///< absent when the commit (not a rank) failed
  std::string error;
};

/// A generation ended before every rank reported its share ("checkpoint_abandoned").
struct checkpoint_abandoned {
  int64_t step = 0;
  uint64_t generation = 0;
  int ranks_reported = 0;
  int world = 0;
  std::string reason;
  int64_t retake_from = 0;
  std::string then;
};

/// Checkpoint garbage collection failed ("checkpoint_gc_failed").
struct checkpoint_gc_failed {
  std::string error;
};

/// A step diverged and was not committed ("diverged").
struct diverged {
  int64_t step = 0;
  uint64_t generation = 0;
  std::string what;
  std::string policy;
  std::string action;  ///< "rollback" or "stop"
  int rollbacks = 0;
  int max_rollbacks = 0;
  int64_t committed_step = 0;
  std::vector<int64_t> skipped_steps;
};

/// A validation pass finished ("validation").
struct validation {
  int64_t step = 0;
  double val_loss = 0;
  uint64_t generation = 0;
};

/// The job ended: "job_done" when exit_code is 0, "job_failed" otherwise.
struct job_ended {
  int exit_code = 0;
  std::string message;
  int64_t step = 0;
  uint64_t generation = 0;
};

/// A checkpoint due at `step` was not taken ("checkpoint_skipped").
struct checkpoint_skipped {
  int64_t step = 0;
  std::string reason;
};

/// SIGINT: the job stops at the step boundary ("interrupted").
struct interrupted {
  int64_t step = 0;
  uint64_t generation = 0;
};

/// A scheduler wants the nodes back: checkpoint and stop ("preempted").
struct preempted {
  int64_t step = 0;
  uint64_t generation = 0;
  std::string state;  ///< to_string(job_state) when it came
};

/// An agent reported one of its workers' exit ("worker_exited").
struct worker_exited {
  int32_t member = -1;
  int32_t pid = 0;
  int exit_code = 0;
  int signal = 0;
};

/// The connection to an agent was lost ("agent_lost").
struct agent_lost {
  std::string reason;
};

/// A kind no struct describes yet, kept as its events.jsonl object ("event" included).
struct untyped {
  nlohmann::json fields;
};

/// One event of a job.
using job_event =
    std::variant<state, step, generation, rank_lost, stale_message, checkpoint, checkpoint_failed,
                 checkpoint_abandoned, checkpoint_gc_failed, diverged, validation, job_ended,
                 checkpoint_skipped, interrupted, preempted, worker_exited, agent_lost, untyped>;

/// The "event" string of `e` ("" for an untyped object without one).
[[nodiscard]] std::string kind(const job_event& e);

/// `e` as its events.jsonl object, without "ts" and "unix_ms" (monitoring::event_log adds them).
[[nodiscard]] nlohmann::json to_json(const job_event& e);

/// The event that `object` (one events.jsonl object, or to_json's) holds: an untyped one for
/// a kind with no struct. Throws nlohmann::json::exception when a typed kind lacks a field or
/// holds one of the wrong type.
[[nodiscard]] job_event from_json(const nlohmann::json& object);

/// Visits with a set of lambdas: std::visit(overloaded{[](const step&) {...}, ...}, e).
template <class... F>
struct overloaded : F... {
  using F::operator()...;
};
template <class... F>
overloaded(F...) -> overloaded<F...>;

}  // namespace troupe::actors::events
