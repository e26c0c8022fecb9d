#pragma once
// `troupe eval`: the loss and perplexity of a run's model at a committed step on held-out
// tokens: the run's own validation split, read exactly as its workers read it (so the number is
// the job's `validation` event at that step), or the whole of another file of the same
// vocabulary.

#include <string>
#include <vector>

namespace troupe::cli {

/// The help text of `troupe eval`.
[[nodiscard]] std::string eval_help();

/// Runs `troupe eval` with the arguments after the command. Returns 0 when the loss was
/// printed, 1 for a damaged checkpoint or a failure while working. Bad usage and bad input (no
/// run directory, no checkpoint, a --step it lacks, bad numbers, a --data file of another
/// vocabulary or unusable) throw usage_error (exit 2).
int run_eval(const std::vector<std::string>& args);

}  // namespace troupe::cli
