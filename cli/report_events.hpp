// `troupe report`'s reading of a run's events.jsonl: every line on its own, read as its typed
// kind (monitoring/events), folded into the facts the report draws. A line that is not a JSON
// object with an "event" name, and one of a kind this build knows whose fields do not read
// (one missing, or of the wrong type), is counted and skipped; a kind this build does not know
// (a newer troupe's) is counted as read and changes nothing.
#pragma once

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "monitoring/events/events.hpp"

namespace troupe::cli::report {

struct step_row {
  double loss = NAN, tokens_per_s = NAN, step_s = NAN;
  int world = 0;
  std::vector<std::pair<std::string, double>> phases;  // rank-seconds by phase
};

struct recovery {
  double start = 0, end = 0;  // seconds from the start
  std::string reason;
};

struct timed {
  double at = 0;  // seconds from the start
  std::string label;
};

struct generation {
  double at = 0;
  long long number = 0;
  long long world = 0;
};

/// The last session's end (job_done or job_failed) and when it was written.
struct ending {
  events::job_ended event;
  std::optional<double> unix_ms;
};

struct run_facts {
  long long lines = 0, events = 0, skipped = 0, jobs = 0, total_steps = 0, step_events = 0;
  std::optional<double> first_ms, last_ms, first_step_ms;
  std::map<long long, step_row> steps;  // by step number: a step done again replaces the first
  std::vector<double> step_times;       // every step event's step_s
  std::map<long long, double> val_loss;
  std::vector<generation> generations;
  std::vector<recovery> recoveries;
  std::optional<recovery> open_recovery;
  std::vector<timed> faults, lost, committed, failed;
  std::optional<events::goodput> goodput;  // the last one
  std::optional<ending> done;
  std::vector<std::string> phase_order;
  nlohmann::json config;                     // the last session's (job_start), or config.json's
  nlohmann::json first_layout, last_layout;  // plan documents: at the start and the last generation
  std::optional<double> first_start_ms;      // the first session's job_start
};

/// A number as the report draws it: absent when not finite or beyond any step, time or loss a
/// run reaches (left out rather than drawn or converted).
[[nodiscard]] std::optional<double> drawable(double v);

/// Whether `text` (a line, a config file) nests no deeper than any event does: deeper is
/// refused before it reaches the parser.
[[nodiscard]] bool shallow(const std::string& text);

/// The facts of the events file at `path`, times in seconds from its first event. Throws
/// usage_error when it cannot be opened, std::runtime_error when reading it fails.
[[nodiscard]] run_facts read_events(const std::filesystem::path& path);

}  // namespace troupe::cli::report
