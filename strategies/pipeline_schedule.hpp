#pragma once
// Pipeline schedules as data: for p stages and m micro-batches, the order in which each
// stage runs forward and backward passes (GPipe or 1F1B), checked against the pipeline's
// dependencies, simulated to measure the bubble, and rendered as a Chrome trace.

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::strategies {

enum class pipe_pass : uint8_t { forward, backward };

/// One unit of work on one stage.
struct pipe_op {
  pipe_pass pass = pipe_pass::forward;
  int micro_batch = 0;
  friend bool operator==(const pipe_op&, const pipe_op&) = default;
};

enum class pipe_schedule_kind : uint8_t { gpipe, one_f_one_b };

/// Parses "gpipe" or "1f1b"; throws std::invalid_argument otherwise.
pipe_schedule_kind parse_schedule_kind(const std::string& name);

/// ops[s] is stage s's program, in order. GPipe: every forward, then every backward in
/// reverse. 1F1B: stage s warms up with min(p - s - 1, m) forwards, then alternates one
/// forward and one backward, then drains the remaining backwards; so at most p - s
/// micro-batches' activations are alive on stage s (GPipe keeps all m).
std::vector<std::vector<pipe_op>> make_schedule(pipe_schedule_kind kind, int stages,
                                                int micro_batches);

/// Empty when `schedule` is a correct pipeline program: each stage runs each micro-batch's
/// forward and backward exactly once, backward after forward, and the whole thing can run
/// without deadlock given that F(s, i) needs F(s-1, i) and B(s, i) needs B(s+1, i).
/// Otherwise a description of the first problem.
std::string check_schedule(const std::vector<std::vector<pipe_op>>& schedule);

/// The most micro-batches whose activations are held at once on each stage.
std::vector<int> peak_live_activations(const std::vector<std::vector<pipe_op>>& schedule);

/// One executed op on a timeline (seconds from the start).
struct timed_op {
  int stage = 0;
  pipe_op op;
  double start = 0;
  double end = 0;
  int64_t step = 0;  ///< the training step it belongs to (0 in simulations)
};

/// Runs `schedule` as fast as dependencies allow with fixed durations per pass (send/recv
/// free): the ideal timeline of that schedule.
std::vector<timed_op> simulate_schedule(const std::vector<std::vector<pipe_op>>& schedule,
                                        double forward_s, double backward_s);

/// Idle fraction of a timeline: 1 - busy / (stages * makespan), where the makespan runs from
/// the first op's start to the last op's end.
double bubble_fraction(const std::vector<timed_op>& timeline, int stages);

/// The textbook bubble of GPipe and 1F1B with uniform passes: (p - 1) / (m + p - 1).
double ideal_bubble(int stages, int micro_batches);

/// A Chrome trace (chrome://tracing, Perfetto) of a timeline: one track per stage, one
/// complete event per op named "F3" / "B3", with its step in args.step.
std::string chrome_trace_json(const std::vector<timed_op>& timeline);

}  // namespace troupe::strategies
