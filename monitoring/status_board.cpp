#include "monitoring/status_board.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <optional>
#include <utility>

namespace troupe::monitoring {

using nlohmann::json;

namespace {

int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A finite number under `key`, if there is one.
std::optional<double> number_at(const json& e, const char* key) {
  const auto it = e.find(key);
  if (it == e.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
}

std::optional<std::string> string_at(const json& e, const char* key) {
  const auto it = e.find(key);
  if (it == e.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

// Copies e[key] into doc[as] when it is a finite number.
void copy_number(json& doc, const json& e, const char* key, const char* as = nullptr) {
  if (const auto v = number_at(e, key)) doc[as ? as : key] = e[key];
}

void copy_string(json& doc, const json& e, const char* key, const char* as = nullptr) {
  if (const auto v = string_at(e, key)) doc[as ? as : key] = *v;
}

// The layout's words from a plan document (strategies::plan_doc) or a plain string.
std::optional<std::string> layout_words(const json& plan) {
  if (plan.is_string()) return plan.get<std::string>();
  if (plan.is_object()) return string_at(plan, "describe");
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

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string pad(std::string s, std::size_t width, bool left = false) {
  if (s.size() > width) s = s.substr(0, width);
  const std::string fill(width - s.size(), ' ');
  return left ? s + fill : fill + s;
}

std::string clock_of(int64_t unix_ms) {
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%H:%M:%S", &tm);
  return buf;
}

std::string scalar_words(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return std::fabs(d) >= 100 || d == 0 ? fixed(d, 0) : fixed(d, std::fabs(d) < 0.01 ? 5 : 3);
  }
  return v.dump();
}

// One line for one event: its time, its kind, and its plain fields.
std::string event_line(const json& e) {
  std::string line = "  ";
  if (const auto ms = number_at(e, "unix_ms")) line += clock_of(static_cast<int64_t>(*ms)) + "  ";
  line += pad(e.value("event", std::string("?")), 18, true);
  for (const auto& [key, value] : e.items()) {
    if (key == "event" || key == "unix_ms" || key == "ts" || value.is_structured() ||
        value.is_null())
      continue;
    line += " " + key + "=" + scalar_words(value);
    if (line.size() > 140) {
      line = line.substr(0, 137) + "...";
      break;
    }
  }
  return line;
}

// "compute 81.2%  exposed_comm 4.0% ..." of a phases object, largest first.
std::string phase_words(const json& phases) {
  std::vector<std::pair<std::string, double>> parts;
  double total = 0;
  for (const auto& [key, value] : phases.items())
    if (value.is_number() && std::isfinite(value.get<double>())) {
      parts.emplace_back(key, value.get<double>());
      total += value.get<double>();
    }
  if (parts.empty() || total <= 0) return "";
  std::stable_sort(parts.begin(), parts.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out;
  for (const auto& [name, v] : parts)
    if (v / total >= 0.0005)
      out += "  " + name + " " + fixed(100.0 * v / total, 1) + "% (" + fixed(v, 2) + " s)";
  return out;
}

}  // namespace

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
  const auto kind = string_at(event, "event");
  if (!kind) return;
  std::lock_guard lock(mutex_);
  try {
    apply(*kind, event);
  } catch (const json::exception&) {
    // A field of an unexpected type: that field stays as it was.
  }
  remember(event);
  if (const auto ms = number_at(event, "unix_ms"))
    updated_ms_ = static_cast<int64_t>(*ms);
  else
    updated_ms_ = unix_ms_now();
}

void status_board::remember(const json& e) {
  json kept = trimmed(e);
  if (!kept.contains("unix_ms")) kept["unix_ms"] = unix_ms_now();
  // A run of steps keeps only its newest, so that steps do not push the notable events out.
  const auto is_step = [](const json& x) { return x.value("event", std::string()) == "step"; };
  if (is_step(kept) && !events_.empty() && is_step(events_.back())) events_.pop_back();
  events_.push_back(std::move(kept));
  while (events_.size() > max_events_) events_.pop_front();
}

void status_board::apply(const std::string& kind, const json& e) {
  if (kind == "job_start") {
    // A new session of the run (a resume appends to the same file): what the last one knew
    // about ranks and its end no longer holds.
    const json keep_run_dir = doc_.value("run_dir", json());
    const json keep_source = doc_.value("source", json());
    doc_ = json::object();
    doc_["state"] = "forming";
    if (!keep_run_dir.is_null()) doc_["run_dir"] = keep_run_dir;
    if (!keep_source.is_null()) doc_["source"] = keep_source;
    ranks_ = json::array();
    rank_steps_.clear();
    copy_number(doc_, e, "world");
    copy_number(doc_, e, "steps", "total_steps");
    copy_number(doc_, e, "start_step", "step");
    if (const auto it = e.find("layout"); it != e.end())
      if (const auto words = layout_words(*it)) doc_["layout"] = *words;
    if (const auto it = e.find("config"); it != e.end() && it->is_object())
      copy_string(doc_, *it, "run_dir");
  } else if (kind == "state") {
    copy_string(doc_, e, "to", "state");
    copy_string(doc_, e, "reason", "state_reason");
    copy_number(doc_, e, "generation");
  } else if (kind == "generation") {
    copy_number(doc_, e, "number", "generation");
    copy_number(doc_, e, "world");
    copy_number(doc_, e, "spares");
    copy_number(doc_, e, "start_step", "step");
    if (const auto it = e.find("plan"); it != e.end())
      if (const auto words = layout_words(*it)) doc_["layout"] = *words;
    json g = json::object();
    copy_string(g, e, "reason");
    copy_string(g, e, "cause");
    copy_number(g, e, "recovery_s");
    copy_number(g, e, "start_step");
    doc_["last_generation"] = std::move(g);
    // The ranks are numbered anew; the tick (or rank_joined events) fills the table again.
    rank_steps_.clear();
  } else if (kind == "training_started") {
    if (const auto it = e.find("layout"); it != e.end())
      if (const auto words = layout_words(*it)) doc_["layout"] = *words;
    copy_number(doc_, e, "world");
  } else if (kind == "step") {
    for (const char* key :
         {"step", "loss", "lr", "tokens_per_s", "step_s", "world", "generation", "total_steps"})
      copy_number(doc_, e, key);
    json breakdown = json::object();
    for (const char* key : {"compute_s", "comm_s", "control_s", "peer_wait_s"})
      copy_number(breakdown, e, key);
    doc_["step_breakdown"] = std::move(breakdown);
    if (const auto it = e.find("phases"); it != e.end() && it->is_object())
      doc_["step_phases"] = *it;
    if (const auto tokens = number_at(e, "tokens"))
      doc_["tokens"] = doc_.value("tokens", 0.0) + *tokens;
    so_far(e);
  } else if (kind == "validation") {
    copy_number(doc_, e, "val_loss");
    copy_number(doc_, e, "step", "val_step");
  } else if (kind == "checkpoint") {
    json c = json::object();
    copy_number(c, e, "step");
    copy_string(c, e, "path");
    copy_number(c, e, "stall_s");
    copy_number(c, e, "write_s");
    doc_["checkpoint"] = std::move(c);
  } else if (kind == "goodput") {
    json g = json::object();
    for (const char* key : {"wall_s", "rank_seconds", "goodput", "mfu", "peak_flops", "step"})
      copy_number(g, e, key);
    if (const auto it = e.find("phases"); it != e.end() && it->is_object()) g["phases"] = *it;
    doc_["goodput"] = std::move(g);
  } else if (kind == "leader") {
    copy_number(doc_, e, "epoch");
    copy_string(doc_, e, "address", "leader_address");
  } else if (kind == "rank_joined") {
    // Before (or without) the coordinator's tick: the table from the events.
    const auto rank = number_at(e, "rank");
    if (!rank || *rank < 0) return;
    if (const auto g = number_at(e, "generation"); g && doc_.contains("generation") &&
                                                   doc_["generation"].is_number() &&
                                                   *g < doc_["generation"].get<double>())
      return;
    json row = json::object();
    for (const char* key : {"rank", "member", "node", "pid"}) copy_number(row, e, key);
    copy_string(row, e, "host");
    auto& rows = ranks_;
    for (auto it = rows.begin(); it != rows.end();)
      it = (*it).value("rank", -1.0) == *rank ? rows.erase(it) : it + 1;
    rows.push_back(std::move(row));
    std::sort(rows.begin(), rows.end(), [](const json& a, const json& b) {
      return a.value("rank", 0.0) < b.value("rank", 0.0);
    });
  } else if (kind == "rank_lost") {
    const auto member = number_at(e, "member");
    for (auto& row : ranks_)
      if (member && row.value("member", -1.0) == *member) row["lost"] = true;
  } else if (kind == "job_done" || kind == "job_failed") {
    doc_["state"] = kind == "job_done" ? "done" : "failed";
    json ended = json::object();
    copy_number(ended, e, "exit_code");
    copy_string(ended, e, "message");
    copy_number(ended, e, "step");
    doc_["ended"] = std::move(ended);
  }
}

void status_board::so_far(const json& step) {
  const auto goodput = number_at(step, "goodput");
  if (!goodput) return;  // a log written before steps carried it: the last goodput record stays
  json& g = doc_["goodput"];
  if (!g.is_object()) g = json::object();
  g["goodput"] = *goodput;
  copy_number(g, step, "mfu");
  copy_number(g, step, "step");
  // The step's rank-seconds bring the last record's phases up to this commit (as the ledger
  // adds them); without a record to add to, only the ratios are known.
  const auto p = step.find("phases");
  if (p == step.end() || !p->is_object() || !g.contains("phases") || !g["phases"].is_object())
    return;
  double added = 0;
  for (const auto& [name, value] : p->items()) {
    if (!value.is_number()) continue;
    g["phases"][name] = g["phases"].value(name, 0.0) + value.get<double>();
    added += value.get<double>();
  }
  if (const auto total = number_at(g, "rank_seconds")) g["rank_seconds"] = *total + added;
}

void status_board::set_ranks(uint64_t generation, std::vector<status_rank> ranks) {
  json rows = json::array();
  std::lock_guard lock(mutex_);
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
    rows.push_back(std::move(row));
  }
  ranks_ = std::move(rows);
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
  doc["ranks"] = ranks_;
  json events = json::array();
  for (const auto& e : events_) events.push_back(e);
  doc["events"] = std::move(events);
  return doc;
}

std::string status_board::document() const {
  return snapshot().dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string render_status(const json& doc, const std::string& where) {
  std::string out;
  const auto line = [&out](const std::string& s) { out += s + "\n"; };
  const std::string source = doc.value("source", std::string("live"));
  line("troupe status: " + where + " (" +
       (source == "live" ? std::string("live") : "from " + source) + ", " +
       clock_of(static_cast<int64_t>(number_at(doc, "updated_unix_ms").value_or(0))) +
       " UTC last update)");

  std::string state = doc.value("state", std::string("unknown"));
  if (const auto reason = string_at(doc, "state_reason"); reason && !reason->empty())
    state += " (" + *reason + ")";
  if (const auto it = doc.find("ended"); it != doc.end() && it->is_object()) {
    state = doc.value("state", std::string("ended")) + ", exit " +
            std::to_string(static_cast<int>(number_at(*it, "exit_code").value_or(-1)));
    if (const auto msg = string_at(*it, "message"); msg && !msg->empty()) state += ": " + *msg;
  }
  std::string job = "job         " + state;
  if (const auto role = string_at(doc, "role"); role && *role != "leader")
    job += "   [this coordinator: " + *role + "]";
  if (const auto epoch = number_at(doc, "epoch")) job += "   leader epoch " + fixed(*epoch, 0);
  line(job);

  const auto step = number_at(doc, "step").value_or(0);
  std::string progress = "step        " + fixed(step, 0);
  if (const auto total = number_at(doc, "total_steps"); total && *total > 0)
    progress += " / " + fixed(*total, 0) + " (" + fixed(100.0 * step / *total, 1) + "%)";
  if (const auto g = number_at(doc, "generation")) progress += "   generation " + fixed(*g, 0);
  if (const auto it = doc.find("last_generation"); it != doc.end() && it->is_object())
    if (const auto reason = string_at(*it, "reason"); reason && !reason->empty())
      progress += " (" + *reason + ")";
  line(progress);

  std::string world = "world       " + fixed(number_at(doc, "world").value_or(0), 0) + " ranks";
  if (const auto spares = number_at(doc, "spares"); spares && *spares > 0)
    world += " + " + fixed(*spares, 0) + " spares";
  if (const auto layout = string_at(doc, "layout")) world += "   layout " + *layout;
  line(world);

  std::string train = "training   ";
  if (const auto loss = number_at(doc, "loss")) train += " loss " + fixed(*loss, 4);
  if (const auto val = number_at(doc, "val_loss")) train += "   validation " + fixed(*val, 4);
  if (const auto tps = number_at(doc, "tokens_per_s"))
    train += "   " + fixed(*tps, 0) + " tokens/s";
  if (const auto s = number_at(doc, "step_s")) train += "   step " + fixed(*s, 3) + " s";
  if (const auto lr = number_at(doc, "lr")) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", *lr);
    train += std::string("   lr ") + buf;
  }
  if (train.size() > 12) line(train);
  if (const auto it = doc.find("checkpoint"); it != doc.end() && it->is_object())
    if (const auto s = number_at(*it, "step"))
      line("checkpoint  step " + fixed(*s, 0) + "   " + it->value("path", std::string()));

  if (const auto it = doc.find("ranks"); it != doc.end() && it->is_array() && !it->empty()) {
    line("");
    line("rank member node host                  pid   step_s  compute_s  heartbeat  straggler");
    for (const auto& r : *it) {
      const auto num = [&r](const char* key, int digits, std::size_t width) {
        const auto v = number_at(r, key);
        return pad(v ? fixed(*v, digits) : "-", width);
      };
      std::string row = num("rank", 0, 4) + " " + num("member", 0, 6) + " " + num("node", 0, 4) +
                        " " + pad(r.value("host", std::string("-")), 20, true) + " " +
                        num("pid", 0, 6) + " " + num("step_s", 3, 8) + " " +
                        num("compute_s", 3, 10) + " " +
                        (number_at(r, "heartbeat_age_s")
                             ? pad(fixed(*number_at(r, "heartbeat_age_s"), 2) + " s", 10)
                             : pad("-", 10)) +
                        " " + num("straggler_score", 2, 10);
      if (r.value("lost", false)) row += "  lost";
      line(row);
    }
  }

  line("");
  if (const auto it = doc.find("goodput"); it != doc.end() && it->is_object()) {
    std::string head = "phases of every rank-second";
    if (const auto s = number_at(*it, "step")) head += " up to step " + fixed(*s, 0);
    std::string ratios;
    if (const auto g = number_at(*it, "goodput")) ratios += ", goodput " + fixed(100 * *g, 1) + "%";
    if (const auto m = number_at(*it, "mfu")) ratios += ", MFU " + fixed(100 * *m, 1) + "%";
    line(head + (ratios.empty() ? "" : " (" + ratios.substr(2) + ")") + ":");
    if (const auto p = it->find("phases"); p != it->end() && p->is_object()) line(phase_words(*p));
  }
  if (const auto it = doc.find("step_phases"); it != doc.end() && it->is_object()) {
    line("phases of the last step (rank-seconds):");
    line(phase_words(*it));
  } else if (const auto b = doc.find("step_breakdown"); b != doc.end() && b->is_object()) {
    std::string words = "last step per rank:";
    for (const auto& [key, value] : b->items())
      if (value.is_number()) words += "  " + key + " " + fixed(value.get<double>(), 4);
    line(words);
  }

  if (const auto it = doc.find("events"); it != doc.end() && it->is_array() && !it->empty()) {
    line("");
    line("last events:");
    for (const auto& e : *it)
      if (e.is_object()) line(event_line(e));
  }
  return out;
}

}  // namespace troupe::monitoring
