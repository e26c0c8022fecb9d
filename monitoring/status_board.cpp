// The status board's state: events folded into the document, each read as its typed kind
// (monitoring/events), so that a field renamed in an event struct fails to compile here
// instead of leaving the document's field at its last value. The text of the summary is
// status_render.cpp's.
#include "monitoring/status_board.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>

#include "monitoring/events/events.hpp"

namespace troupe::monitoring {

using nlohmann::json;

namespace {

int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A finite number under `key`, if there is one (the envelope's unix_ms, the document's own).
std::optional<double> number_at(const json& e, const char* key) {
  const auto it = e.find(key);
  if (it == e.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
}

// doc[key] = v, except a number that is not finite (a NaN loss): the field keeps its value,
// since JSON has no word for it and a reader would see null.
template <class T>
void put(json& doc, const char* key, const T& v) {
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(v)) return;
  doc[key] = v;
}

template <class T>
void put(json& doc, const char* key, const std::optional<T>& v) {
  if (v) put(doc, key, *v);
}

// The layout's words from a plan document (strategies::plan_doc) or a plain string.
std::optional<std::string> layout_words(const json& plan) {
  if (plan.is_string()) return plan.get<std::string>();
  if (const auto it = plan.is_object() ? plan.find("describe") : plan.end();
      it != plan.end() && it->is_string())
    return it->get<std::string>();
  return std::nullopt;
}

// An event as the last-events list keeps it: big nested documents (configs, plans) dropped.
json trimmed(const json& e) {
  json out = json::object();
  for (const auto& [key, value] : e.items()) {
    if (key == "config" || key == "plan" || key == "layout" || key == "ts") continue;
    if (value.is_structured() && value.dump().size() > 200) continue;
    out[key] = value;
  }
  return out;
}

}  // namespace

// One call per kind the document shows; every other kind (an untyped one included) changes
// nothing.
struct status_board::fold {
  status_board& board;
  json& doc = board.doc_;

  void operator()(const events::job_start& e) {
    // A new session of the run (a resume appends to the same file): what the last one knew
    // about ranks and its end no longer holds.
    const json keep_run_dir = doc.value("run_dir", json());
    const json keep_source = doc.value("source", json());
    doc = json::object();
    doc["state"] = "forming";
    if (!keep_run_dir.is_null()) doc["run_dir"] = keep_run_dir;
    if (!keep_source.is_null()) doc["source"] = keep_source;
    board.clear_rows();
    board.rank_steps_.clear();
    put(doc, "world", e.world);
    put(doc, "total_steps", e.steps);
    put(doc, "step", e.start_step);
    if (const auto words = layout_words(e.layout)) doc["layout"] = *words;
    if (const auto it = e.config.is_object() ? e.config.find("run_dir") : e.config.end();
        it != e.config.end() && it->is_string())
      doc["run_dir"] = *it;
  }

  void operator()(const events::state& e) {
    put(doc, "state", e.to);
    put(doc, "state_reason", e.reason);
    put(doc, "generation", e.generation);
  }

  void operator()(const events::generation& e) {
    put(doc, "generation", e.number);
    put(doc, "world", e.world);
    put(doc, "spares", e.spares);
    put(doc, "step", e.start_step);
    if (const auto words = layout_words(e.plan)) doc["layout"] = *words;
    json g = json::object();
    put(g, "reason", e.reason);
    put(g, "cause", e.cause);
    put(g, "recovery_s", e.recovery_s);
    put(g, "start_step", e.start_step);
    doc["last_generation"] = std::move(g);
    // The ranks are numbered anew; the tick (or rank_joined events) fills the table again.
    board.rank_steps_.clear();
  }

  void operator()(const events::training_started& e) {
    if (const auto words = layout_words(e.layout)) doc["layout"] = *words;
    put(doc, "world", e.world);
  }

  void operator()(const events::step& e) {
    put(doc, "step", e.step);
    put(doc, "loss", e.loss);
    put(doc, "lr", e.lr);
    put(doc, "tokens_per_s", e.tokens_per_s);
    put(doc, "step_s", e.step_s);
    put(doc, "world", e.world);
    put(doc, "generation", e.generation);
    put(doc, "total_steps", e.total_steps);
    json breakdown = json::object();
    put(breakdown, "compute_s", e.compute_s);
    put(breakdown, "comm_s", e.comm_s);
    put(breakdown, "control_s", e.control_s);
    put(breakdown, "peer_wait_s", e.peer_wait_s);
    doc["step_breakdown"] = std::move(breakdown);
    if (e.phases && e.phases->is_object()) doc["step_phases"] = *e.phases;
    doc["tokens"] = doc.value("tokens", 0.0) + static_cast<double>(e.tokens);
    so_far(e);
  }

  // A step's goodput and MFU so far.
  void so_far(const events::step& e) {
    // A log written before steps carried it: the last goodput record stays.
    if (!e.goodput || !std::isfinite(*e.goodput)) return;
    json& g = doc["goodput"];
    if (!g.is_object()) g = json::object();
    g["goodput"] = *e.goodput;
    put(g, "mfu", e.mfu);
    put(g, "step", e.step);
    // The step's rank-seconds bring the last record's phases up to this commit (as the ledger
    // adds them); without a record to add to, only the ratios are known.
    if (!e.phases || !e.phases->is_object() || !g.contains("phases") || !g["phases"].is_object())
      return;
    double added = 0;
    for (const auto& [name, value] : e.phases->items()) {
      if (!value.is_number()) continue;
      g["phases"][name] = g["phases"].value(name, 0.0) + value.get<double>();
      added += value.get<double>();
    }
    if (const auto total = number_at(g, "rank_seconds")) g["rank_seconds"] = *total + added;
  }

  void operator()(const events::validation& e) {
    put(doc, "val_loss", e.val_loss);
    put(doc, "val_step", e.step);
  }

  void operator()(const events::checkpoint& e) {
    json c = json::object();
    put(c, "step", e.step);
    put(c, "path", e.path);
    put(c, "stall_s", e.stall_s);
    put(c, "write_s", e.write_s);
    doc["checkpoint"] = std::move(c);
  }

  void operator()(const events::goodput& e) {
    json g = json::object();
    put(g, "wall_s", e.wall_s);
    put(g, "rank_seconds", e.rank_seconds);
    put(g, "goodput", e.goodput);
    put(g, "mfu", e.mfu);
    put(g, "peak_flops", e.peak_flops);
    put(g, "step", e.step);
    if (e.phases.is_object()) g["phases"] = e.phases;
    doc["goodput"] = std::move(g);
  }

  void operator()(const events::leader& e) {
    put(doc, "epoch", e.epoch);
    put(doc, "leader_address", e.address);
  }

  void operator()(const events::rank_joined& e) {
    // Before (or without) the coordinator's tick: the table from the events.
    if (e.rank < 0) return;
    if (const auto g = number_at(doc, "generation"); g && static_cast<double>(e.generation) < *g)
      return;
    json row = json::object();
    put(row, "rank", e.rank);
    put(row, "member", e.member);
    put(row, "node", e.node);
    put(row, "pid", e.pid);
    put(row, "host", e.host);
    board.erase_rows_of_rank(e.rank);
    board.add_row(e.rank, e.member, std::move(row));
  }

  void operator()(const events::rank_lost& e) {
    for (auto [at, end] = board.rows_of_member_.equal_range(e.member); at != end; ++at)
      at->second->second.shown["lost"] = true;
  }

  void operator()(const events::job_ended& e) {
    doc["state"] = e.exit_code == 0 ? "done" : "failed";
    json ended = json::object();
    put(ended, "exit_code", e.exit_code);
    put(ended, "message", e.message);
    put(ended, "step", e.step);
    doc["ended"] = std::move(ended);
  }

  template <class Other>
  void operator()(const Other&) {}
};

status_board::status_board(std::size_t max_events)
    : max_events_(std::max<std::size_t>(1, max_events)) {
  doc_ = json::object();
  doc_["state"] = "forming";
}

void status_board::set_job(const std::string& run_dir, int64_t total_steps, int world,
                           const std::string& layout) {
  std::lock_guard lock(mutex_);
  doc_["run_dir"] = run_dir;
  doc_["total_steps"] = total_steps;
  doc_["world"] = world;
  if (!layout.empty()) doc_["layout"] = layout;
  updated_ms_ = unix_ms_now();
}

void status_board::set_role(const std::string& role, int64_t epoch) {
  std::lock_guard lock(mutex_);
  doc_["role"] = role;
  if (epoch > 0)
    doc_["epoch"] = epoch;
  else
    doc_.erase("epoch");
}

void status_board::set_source(const std::string& source) {
  std::lock_guard lock(mutex_);
  doc_["source"] = source;
}

void status_board::observe(const json& event) {
  if (!event.is_object()) return;
  if (const auto it = event.find("event"); it == event.end() || !it->is_string()) return;
  events::job_event typed;
  try {
    typed = events::from_json(event);
  } catch (const json::exception&) {
    return;  // a known kind that does not read: nothing of it is trusted, as of a torn line
  }
  const auto ms = number_at(event, "unix_ms");
  std::lock_guard lock(mutex_);
  fold_in(typed);
  kept_event kept;
  kept.shown = trimmed(event);
  if (!kept.shown.contains("unix_ms")) kept.shown["unix_ms"] = unix_ms_now();
  kept.step = std::holds_alternative<events::step>(typed);
  remember(std::move(kept));
  updated_ms_ = ms ? static_cast<int64_t>(*ms) : unix_ms_now();
}

void status_board::observe(const events::job_event& event) {
  if (const auto* other = std::get_if<events::untyped>(&event)) {
    observe(other->object);  // as it came, its own unix_ms included
    return;
  }
  const int64_t now = unix_ms_now();
  std::lock_guard lock(mutex_);
  fold_in(event);
  kept_event kept;
  kept.typed = event;
  kept.unix_ms = now;
  kept.step = std::holds_alternative<events::step>(event);
  remember(std::move(kept));
  updated_ms_ = now;
}

void status_board::fold_in(const events::job_event& typed) {
  try {
    std::visit(fold{*this}, typed);
  } catch (const json::exception&) {
    // A nested document (phases) that does not add up: its fields stay as they were.
  }
}

void status_board::remember(kept_event kept) {
  // A run of steps keeps only its newest, so that steps do not push the notable events out.
  if (kept.step && !events_.empty() && events_.back().step) events_.pop_back();
  events_.push_back(std::move(kept));
  while (events_.size() > max_events_) events_.pop_front();
}

void status_board::clear_rows() {
  ranks_.clear();
  rows_of_member_.clear();
}

void status_board::add_row(int rank, int member, json row) {
  // At the end of its rank's rows, in amortised constant time when rows come in rank order.
  const auto at = ranks_.emplace_hint(ranks_.end(), rank, rank_row{member, std::move(row)});
  rows_of_member_.emplace(member, at);
}

void status_board::erase_rows_of_rank(int rank) {
  auto [at, end] = ranks_.equal_range(rank);
  while (at != end) {
    auto [index, index_end] = rows_of_member_.equal_range(at->second.member);
    while (index != index_end && index->second != at) ++index;
    if (index != index_end) rows_of_member_.erase(index);
    at = ranks_.erase(at);
  }
}

void status_board::set_ranks(uint64_t generation, std::vector<status_rank> ranks) {
  std::lock_guard lock(mutex_);
  clear_rows();
  for (const auto& r : ranks) {
    json row = {{"rank", r.rank},
                {"member", r.member},
                {"node", r.node},
                {"host", r.host},
                {"pid", r.pid},
                {"heartbeat_age_s", r.heartbeat_age_s},
                {"straggler_score", nullptr}};
    if (std::isfinite(r.straggler_score)) row["straggler_score"] = r.straggler_score;
    row["step_s"] = nullptr;
    row["compute_s"] = nullptr;
    if (r.rank >= 0 && static_cast<std::size_t>(r.rank) < rank_steps_.size()) {
      const auto& s = rank_steps_[static_cast<std::size_t>(r.rank)];
      if (s.generation == generation) {
        row["step_s"] = s.work_s;
        row["compute_s"] = s.compute_s;
      }
    }
    add_row(r.rank, r.member, std::move(row));
  }
}

void status_board::note_rank_step(uint64_t generation, int rank, double work_s, double compute_s) {
  if (rank < 0 || rank > 1 << 20) return;
  std::lock_guard lock(mutex_);
  if (rank_steps_.size() <= static_cast<std::size_t>(rank))
    rank_steps_.resize(static_cast<std::size_t>(rank) + 1);
  rank_steps_[static_cast<std::size_t>(rank)] = {generation, work_s, compute_s};
}

json status_board::snapshot() const {
  std::lock_guard lock(mutex_);
  json doc = doc_;
  doc["format"] = format_version;
  if (!doc.contains("source")) doc["source"] = "live";
  doc["updated_unix_ms"] = updated_ms_;
  json rows = json::array();
  rows.get_ref<json::array_t&>().reserve(ranks_.size());
  for (const auto& [rank, row] : ranks_) rows.push_back(row.shown);
  doc["ranks"] = std::move(rows);
  json events = json::array();
  for (const auto& e : events_) {
    if (!e.typed) {
      events.push_back(e.shown);
      continue;
    }
    json shown = trimmed(events::to_json(*e.typed));
    shown["unix_ms"] = e.unix_ms;
    events.push_back(std::move(shown));
  }
  doc["events"] = std::move(events);
  return doc;
}

std::string status_board::document() const {
  return snapshot().dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace troupe::monitoring
