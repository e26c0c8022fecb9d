// The job's live state as one JSON document (GET /status, `troupe status`, `troupe top`): folded
// from the same event stream events.jsonl records, plus what only the coordinator's clock
// knows (each rank's heartbeat age and straggler score), pushed in on its tick.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "monitoring/events/events.hpp"

namespace troupe::monitoring {

/// One rank of the current generation as the coordinator sees it on a tick.
struct status_rank {
  int rank = -1;
  int member = -1;
  int node = -1;
  std::string host;
  int pid = 0;
  double heartbeat_age_s = 0;
  double straggler_score = 0;  ///< NaN or infinite: not judged yet (shown as null)
};

/// The document's shape (a reader checks "format" before anything else):
///   format, source ("live" or "events.jsonl"), updated_unix_ms, role ("leader", "standby"),
///   epoch (with etcd), run_dir, state, state_reason, generation, step, total_steps, world,
///   spares, layout, loss, val_loss, tokens_per_s, step_s, lr, step_breakdown {compute_s,
///   comm_s, control_s, peer_wait_s}, step_phases (rank-seconds of the last step by phase, when
///   the job records them), goodput (the job so far: the last goodput event's wall_s,
///   rank_seconds, phases, goodput, mfu and peak_flops, each later step bringing goodput, mfu,
///   step, phases and rank_seconds up to its commit), checkpoint {step, path},
///   ranks [{rank, member, node, host, pid,
///   step_s, compute_s, heartbeat_age_s, straggler_score, lost}], ended {exit_code, message},
///   events (the last few, oldest first; of consecutive steps only the newest is kept).
///   Fields not known yet are absent or null.
///
/// Thread-safe: the supervisor's thread writes, the HTTP thread reads document(); every call
/// takes one mutex for a few microseconds.
class status_board {
 public:
  static constexpr int format_version = 1;

  explicit status_board(std::size_t max_events = 20);

  /// What the job is before any event: its run directory, steps, world and layout.
  void set_job(const std::string& run_dir, int64_t total_steps, int world,
               const std::string& layout);
  /// "leader" or "standby"; epoch 0 = no etcd (the field is left out).
  void set_role(const std::string& role, int64_t epoch);
  /// One event, as events.jsonl holds it (or events::to_json gives it), read as its typed kind
  /// (events::from_json). Ignored, never thrown: what is not an object with an "event" name,
  /// and a kind this build knows whose fields do not read (one missing or of the wrong type),
  /// as a torn line would be. A kind this build does not know (a newer troupe's) changes no
  /// field but is listed among the last events as it came.
  void observe(const nlohmann::json& event);
  /// One event as the job emits it: the same fold as observe(to_json(event)), without the trip
  /// through JSON (it is written out only if it is still among the last events when asked for).
  void observe(const events::job_event& event);
  /// The ranks of `generation` as the coordinator's tick sees them (replaces the table), in
  /// rank order (the tick sorts them; the table is kept ordered by rank).
  void set_ranks(uint64_t generation, std::vector<status_rank> ranks);
  /// A rank's vote for a step: its own seconds of work (compute + communication) and compute.
  void note_rank_step(uint64_t generation, int rank, double work_s, double compute_s);
  /// Where the document came from: "live" (default) or "events.jsonl".
  void set_source(const std::string& source);

  /// The document now.
  [[nodiscard]] nlohmann::json snapshot() const;
  /// snapshot() serialised (what GET /status answers).
  [[nodiscard]] std::string document() const;

 private:
  struct rank_step {
    uint64_t generation = 0;
    double work_s = 0, compute_s = 0;
  };
  // An event of the last-events list: as it came (trimmed), or typed (written out, trimmed,
  // when a snapshot shows it), with the unix_ms it came at; and whether it is a step.
  struct kept_event {
    nlohmann::json shown;
    std::optional<events::job_event> typed;
    int64_t unix_ms = 0;
    bool step = false;
  };
  // The rank table, ordered by rank (rows of one rank in the order they came), with where
  // each member's rows are: a rank_joined or rank_lost costs a logarithm, not a pass over
  // every row (and a sort of them all), which a job of ten thousand ranks forming cannot pay.
  struct rank_row {
    int member = -1;
    nlohmann::json shown;
  };
  using rank_rows = std::multimap<int, rank_row>;
  // Folds one typed event into the document (status_board.cpp): one call per kind.
  struct fold;
  void fold_in(const events::job_event& typed);
  void remember(kept_event kept);
  void clear_rows();
  void add_row(int rank, int member, nlohmann::json row);
  void erase_rows_of_rank(int rank);

  mutable std::mutex mutex_;
  std::size_t max_events_;
  nlohmann::json doc_;             // every scalar field, updated in place
  std::deque<kept_event> events_;  // the last max_events_
  rank_rows ranks_;
  std::unordered_multimap<int, rank_rows::iterator> rows_of_member_;
  std::vector<rank_step> rank_steps_;  // by rank
  int64_t updated_ms_ = 0;
};

/// A readable summary of a status document (what `troupe status` prints): the header line
/// ("troupe status: <where> ..."), the job's state and progress, the rank table, the phase
/// breakdown and the last events. `where` names the target (and how it was reached).
[[nodiscard]] std::string render_status(const nlohmann::json& doc, const std::string& where);

/// The terminal a summary is drawn on, in character cells; 0 rows: as many lines as it takes.
struct screen_size {
  int columns = 80;
  int rows = 24;
};

/// render_status fitted to `screen` (what `troupe top` draws): every line cut to its width and
/// at most screen.rows lines, none ending in a newline. The job's state and the rank table
/// stay (a table too long for the screen shows as many ranks as fit and "... N more ranks");
/// the facts, phases, `note` (a sentence about where the document came from; wrapped) and
/// then the newest events take the lines left, in that order.
[[nodiscard]] std::string render_status(const nlohmann::json& doc, const std::string& where,
                                        const screen_size& screen, const std::string& note = "");

/// One event as the summary lists it: its time, its kind and its step first, then the fields
/// that say most about that kind (loss, world, generation, cause...), then the rest, cut to
/// `width` characters ("..." marks a cut).
[[nodiscard]] std::string event_line(const nlohmann::json& event, std::size_t width);

}  // namespace troupe::monitoring
