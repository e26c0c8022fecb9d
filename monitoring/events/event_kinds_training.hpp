#pragma once
// The job's event kinds of one topic (the job's life and its training: states, steps, generations,
// the transport, divergence, validation, memory, experts, the session's start and end); see
// monitoring/events/events.hpp for what every struct has and how they are written and read.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "monitoring/events/event_field.hpp"

namespace troupe::events {

/// The job moved between job_states ("state").
struct state {
  static constexpr std::string_view name = "state";
  std::string from;
  std::string to;
  int value = 0;  ///< job_state as a number (the troupe_job_state gauge)
  uint64_t generation = 0;
  int64_t step = 0;
  std::string reason;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("from", e.from);
    f("to", e.to);
    f("value", e.value);
    f("generation", e.generation);
    f("step", e.step);
    f("reason", e.reason);
  }
  friend bool operator==(const state&, const state&) = default;
};

/// A step was committed ("step").
struct step {
  static constexpr std::string_view name = "step";
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
  /// Rank-seconds of this step by phase, summed over the ranks
  /// (actors/coordinator/job/goodput.hpp); absent in logs written before phases were accounted.
  std::optional<nlohmann::json> phases;
  /// Goodput and MFU of the job so far, up to this commit (what a goodput event at this
  /// instant would say), so that live views need not wait for the next goodput event; absent
  /// in logs written before they were carried here.
  std::optional<double> goodput;
  std::optional<double> mfu;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("step", e.step);
    f("loss", e.loss);
    f("lr", e.lr);
    f("tokens", e.tokens);
    f("tokens_per_s", e.tokens_per_s);
    f("world", e.world);
    f("generation", e.generation);
    f("step_s", e.step_s);
    f("compute_s", e.compute_s);
    f("comm_s", e.comm_s);
    f("control_s", e.control_s);
    f("peer_wait_s", e.peer_wait_s);
    f("total_steps", e.total_steps);
    f("phases", e.phases);
    f("goodput", e.goodput);
    f("mfu", e.mfu);
  }
  friend bool operator==(const struct step&, const struct step&) = default;
};

/// Where the job's time went so far ("goodput"), by phase: at each change of generation and at
/// the end. Every step event carries the goodput and MFU so far in between.
struct goodput {
  static constexpr std::string_view name = "goodput";
  int64_t step = 0;
  uint64_t generation = 0;
  double wall_s = 0;        ///< since the coordinator started the job
  int slots = 0;            ///< rank processes the job holds
  double rank_seconds = 0;  ///< the phases' sum: wall_s x slots
  nlohmann::json phases;    ///< rank-seconds by phase, every phase named
  double goodput = 0;       ///< compute / rank_seconds
  double mfu = 0;           ///< model FLOPs of the committed tokens / (peak FLOP/s x rank_seconds)
  double peak_flops = 0;    ///< one rank's peak FLOP/s the MFU is measured against
  int64_t tokens = 0;       ///< tokens of the committed steps
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("step", e.step);
    f("generation", e.generation);
    f("wall_s", e.wall_s);
    f("slots", e.slots);
    f("rank_seconds", e.rank_seconds);
    f("phases", e.phases);
    f("goodput", e.goodput);
    f("mfu", e.mfu);
    f("peak_flops", e.peak_flops);
    f("tokens", e.tokens);
  }
  friend bool operator==(const struct goodput&, const struct goodput&) = default;
};

/// A generation formed ("generation").
struct generation {
  static constexpr std::string_view name = "generation";
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
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("number", e.number);
    f("world", e.world);
    f("spares", e.spares);
    f("plan", e.plan);
    f("reason", e.reason);
    f("cause", e.cause);
    f("start_step", e.start_step);
    f("planned_with_abort", e.planned_with_abort);
    f("shrunk", e.shrunk);
    f("recovery_s", e.recovery_s);
  }
  friend bool operator==(const generation&, const generation&) = default;
};

/// The data plane a generation's ranks connect over ("transport"), logged after its
/// "generation" event: what comm::choose_transport picks for a group of all its ranks from
/// the requests (TROUPE_TRANSPORT) and hosts its members reported when they joined. backend is
/// "shm", "hierarchical" (shm inside nodes, gloo across), "tcp" (gloo), "null" (every rank
/// asked for TROUPE_TRANSPORT=null: control-plane tests, collectives do nothing), or "invalid"
/// (shm asked for across hosts, or null by only some ranks: the group will not connect). shrunk:
/// the ranks kept the group of the generation before instead of connecting anew.
struct transport {
  static constexpr std::string_view name = "transport";
  uint64_t generation = 0;
  std::string backend;
  int world = 0;
  int nodes = 0;           ///< distinct nodes (agents) the ranks run on
  int ranks_per_node = 0;  ///< the most ranks on one node
  bool shrunk = false;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("generation", e.generation);
    f("backend", e.backend);
    f("world", e.world);
    f("nodes", e.nodes);
    f("ranks_per_node", e.ranks_per_node);
    f("shrunk", e.shrunk);
  }
  friend bool operator==(const transport&, const transport&) = default;
};

/// A step diverged and was not committed ("diverged").
struct diverged {
  static constexpr std::string_view name = "diverged";
  int64_t step = 0;
  uint64_t generation = 0;
  std::string what;
  std::string policy;
  std::string action;  ///< "rollback" or "stop"
  int rollbacks = 0;
  int max_rollbacks = 0;
  int64_t committed_step = 0;
  std::vector<int64_t> skipped_steps;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("step", e.step);
    f("generation", e.generation);
    f("what", e.what);
    f("policy", e.policy);
    f("action", e.action);
    f("rollbacks", e.rollbacks);
    f("max_rollbacks", e.max_rollbacks);
    f("committed_step", e.committed_step);
    f("skipped_steps", e.skipped_steps);
  }
  friend bool operator==(const diverged&, const diverged&) = default;
};

/// A validation pass finished ("validation").
struct validation {
  static constexpr std::string_view name = "validation";
  int64_t step = 0;
  double val_loss = 0;
  uint64_t generation = 0;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("step", e.step);
    f("val_loss", e.val_loss);
    f("generation", e.generation);
  }
  friend bool operator==(const validation&, const validation&) = default;
};

/// The job ended: "job_done" when exit_code is 0, "job_failed" otherwise.
struct job_ended {
  static constexpr std::string_view name = "job_done";
  static constexpr std::string_view failed_name = "job_failed";
  int exit_code = 0;
  std::string message;
  int64_t step = 0;
  uint64_t generation = 0;
  /// The one kind whose name depends on a field.
  [[nodiscard]] std::string_view event_name() const { return exit_code == 0 ? name : failed_name; }
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("exit_code", e.exit_code);
    f("message", e.message);
    f("step", e.step);
    f("generation", e.generation);
  }
  friend bool operator==(const job_ended&, const job_ended&) = default;
};

/// SIGINT: the job stops at the step boundary ("interrupted").
struct interrupted {
  static constexpr std::string_view name = "interrupted";
  int64_t step = 0;
  uint64_t generation = 0;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("step", e.step);
    f("generation", e.generation);
  }
  friend bool operator==(const interrupted&, const interrupted&) = default;
};

/// A scheduler wants the nodes back: checkpoint and stop ("preempted").
struct preempted {
  static constexpr std::string_view name = "preempted";
  int64_t step = 0;
  uint64_t generation = 0;
  std::string state;  ///< to_string(job_state) when it came
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("step", e.step);
    f("generation", e.generation);
    f("state", e.state);
  }
  friend bool operator==(const preempted&, const preempted&) = default;
};

/// The first generation formed: training begins ("training_started").
struct training_started {
  static constexpr std::string_view name = "training_started";
  int world = 0;
  uint64_t generation = 0;
  int64_t start_step = 0;
  nlohmann::json layout;  ///< strategies::plan_doc
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("world", e.world);
    f("generation", e.generation);
    f("start_step", e.start_step);
    f("layout", e.layout);
  }
  friend bool operator==(const training_started&, const training_started&) = default;
};

/// A rank reported its optimizer state and peak memory ("memory").
struct memory {
  static constexpr std::string_view name = "memory";
  int32_t rank = 0;
  int64_t step = 0;
  uint64_t generation = 0;
  int64_t optimizer_state_bytes = 0;
  int64_t peak_rss_bytes = 0;
  int zero = 0;  ///< the ZeRO stage
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("rank", e.rank);
    f("step", e.step);
    f("generation", e.generation);
    f("optimizer_state_bytes", e.optimizer_state_bytes);
    f("peak_rss_bytes", e.peak_rss_bytes);
    f("zero", e.zero);
  }
  friend bool operator==(const memory&, const memory&) = default;
};

/// The `memory` events of a generation's first step in one, for a job of more ranks than
/// --metrics-rank-labels ("memory_summary"): how many ranks reported and the spread of each
/// figure over them.
struct memory_summary {
  static constexpr std::string_view name = "memory_summary";
  int64_t step = 0;
  uint64_t generation = 0;
  int32_t ranks = 0;
  spread<int64_t> optimizer_state_bytes;
  spread<int64_t> peak_rss_bytes;
  int zero = 0;  ///< the ZeRO stage
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("step", e.step);
    f("generation", e.generation);
    f("ranks", e.ranks);
    f("optimizer_state_bytes", e.optimizer_state_bytes);
    f("peak_rss_bytes", e.peak_rss_bytes);
    f("zero", e.zero);
  }
  friend bool operator==(const memory_summary&, const memory_summary&) = default;
};

/// A MoE step's routing, summed over the ranks ("expert_load").
struct expert_load {
  static constexpr std::string_view name = "expert_load";
  int64_t step = 0;
  uint64_t generation = 0;
  int32_t experts = 0;
  int top_k = 1;
  std::vector<std::vector<int64_t>> tokens;  ///< [block][expert]
  std::vector<int64_t> dropped;              ///< [block]
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("step", e.step);
    f("generation", e.generation);
    f("experts", e.experts);
    f("top_k", e.top_k);
    f("tokens", e.tokens);
    f("dropped", e.dropped);
  }
  friend bool operator==(const expert_load&, const expert_load&) = default;
};

/// A rank's expert load report did not fit the tally ("expert_load_rejected").
struct expert_load_rejected {
  static constexpr std::string_view name = "expert_load_rejected";
  int32_t rank = 0;
  std::string error;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("rank", e.rank);
    f("error", e.error);
  }
  friend bool operator==(const expert_load_rejected&, const expert_load_rejected&) = default;
};

/// A session of the job starts ("job_start"), the first line it writes.
struct job_start {
  static constexpr std::string_view name = "job_start";
  int world = 0;
  int steps = 0;
  bool resume = false;
  int64_t start_step = 0;
  nlohmann::json config;  ///< to_json(train_config)
  int32_t pid = 0;
  nlohmann::json layout;  ///< strategies::plan_doc
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("world", e.world);
    f("steps", e.steps);
    f("resume", e.resume);
    f("start_step", e.start_step);
    f("config", e.config);
    f("pid", e.pid);
    f("layout", e.layout);
  }
  friend bool operator==(const job_start&, const job_start&) = default;
};

}  // namespace troupe::events
