// The summary of a status document as text (render_status, event_line): what `troupe status`
// prints and `troupe top` draws. It reads the document, not events, so that a document from
// another coordinator (over HTTP) reads the same as one folded here.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iterator>
#include <limits>
#include <optional>
#include <utility>

#include "monitoring/status_board.hpp"

namespace troupe::monitoring {

using nlohmann::json;

namespace {

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

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string pad(std::string s, std::size_t width, bool left = false, bool cut_to_width = true) {
  if (s.size() > width) {
    if (!cut_to_width) return s;
    s = s.substr(0, width);
  }
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

// The first `columns` characters of `s` (UTF-8 sequences kept whole), and whether it was cut.
// Control characters become '?': text from events (a host name, a message) must not move the
// cursor of the terminal it is drawn on.
std::pair<std::string, bool> cut(const std::string& s, std::size_t columns) {
  std::string out;
  out.reserve(std::min(s.size(), 4 * columns));
  std::size_t seen = 0;
  for (const char c : s) {
    const auto byte = static_cast<unsigned char>(c);
    // A continuation byte belongs to the character before it.
    if ((byte & 0xC0) != 0x80) {
      if (seen == columns) return {out, true};
      ++seen;
    }
    out += byte < 0x20 || byte == 0x7F ? '?' : c;
  }
  return {out, false};
}

std::string fit_width(const std::string& s, std::size_t columns) { return cut(s, columns).first; }

// Cut to `columns`, the last three of them "..." when anything was left out.
std::string fit_marked(const std::string& s, std::size_t columns) {
  if (!cut(s, columns).second) return s;
  return cut(s, columns > 3 ? columns - 3 : 0).first + std::string("...").substr(0, columns);
}

// Fields that say most about an event, shown before the rest (which follow alphabetically).
constexpr const char* telling_fields[] = {
    "loss",    "val_loss", "world",      "generation", "number",       "spares",    "rank",
    "member",  "from",     "to",         "cause",      "reason",       "exit_code", "message",
    "error",   "spec",     "start_step", "recovery_s", "tokens_per_s", "step_s",    "lr",
    "stall_s", "write_s",  "seconds",    "path",       "host",         "pid"};

bool plain(const json& v) { return !v.is_structured() && !v.is_null(); }

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

std::string event_line(const json& e, std::size_t width) {
  std::string line = "  ";
  if (const auto ms = number_at(e, "unix_ms")) line += clock_of(static_cast<int64_t>(*ms)) + "  ";
  if (!e.is_object()) return fit_marked(line + "?", width);
  line += pad(e.value("event", std::string("?")), 18, true, false);
  // The step goes first: it is what a reader lines events up by.
  const bool has_step = number_at(e, "step").has_value();
  if (has_step) line += " step=" + fixed(*number_at(e, "step"), 0);
  const auto shown = [&](const std::string& key) {
    return key == "event" || key == "unix_ms" || key == "ts" || (key == "step" && has_step);
  };
  for (const char* key : telling_fields)
    if (const auto it = e.find(key); it != e.end() && plain(*it) && !shown(key))
      line += std::string(" ") + key + "=" + scalar_words(*it);
  for (const auto& [key, value] : e.items()) {
    if (shown(key) || !plain(value) ||
        std::find_if(std::begin(telling_fields), std::end(telling_fields),
                     [&key](const char* t) { return key == t; }) != std::end(telling_fields))
      continue;
    line += " " + key + "=" + scalar_words(value);
    if (line.size() > 4 * width) break;  // far past the cut already
  }
  return fit_marked(line, width);
}

namespace {

// The summary's lines by part, before they are fitted to a screen.
struct summary {
  std::vector<std::string> head;   // where from, the job's state, step, world: always shown
  std::vector<std::string> facts;  // training numbers, the last checkpoint
  std::vector<std::string> ranks;  // the table's heading, then a row per rank (or none)
  std::vector<std::string> phases;
  std::vector<json> events;  // oldest first
};

summary summarise(const json& doc, const std::string& where, std::size_t host_width) {
  summary out;
  const auto head = [&out](const std::string& s) { out.head.push_back(s); };
  const std::string source = doc.value("source", std::string("live"));
  head("troupe status: " + where + " (" +
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
  head(job);

  const auto step = number_at(doc, "step").value_or(0);
  std::string progress = "step        " + fixed(step, 0);
  if (const auto total = number_at(doc, "total_steps"); total && *total > 0)
    progress += " / " + fixed(*total, 0) + " (" + fixed(100.0 * step / *total, 1) + "%)";
  if (const auto g = number_at(doc, "generation")) progress += "   generation " + fixed(*g, 0);
  if (const auto it = doc.find("last_generation"); it != doc.end() && it->is_object())
    if (const auto reason = string_at(*it, "reason"); reason && !reason->empty())
      progress += " (" + *reason + ")";
  head(progress);

  std::string world = "world       " + fixed(number_at(doc, "world").value_or(0), 0) + " ranks";
  if (const auto spares = number_at(doc, "spares"); spares && *spares > 0)
    world += " + " + fixed(*spares, 0) + " spares";
  if (const auto layout = string_at(doc, "layout")) world += "   layout " + *layout;
  head(world);

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
  if (train.size() > 12) out.facts.push_back(train);
  if (const auto it = doc.find("checkpoint"); it != doc.end() && it->is_object())
    if (const auto s = number_at(*it, "step"))
      out.facts.push_back("checkpoint  step " + fixed(*s, 0) + "   " +
                          it->value("path", std::string()));

  if (const auto it = doc.find("ranks"); it != doc.end() && it->is_array() && !it->empty()) {
    out.ranks.push_back("rank member node " + pad("host", host_width, true) + " " + pad("pid", 6) +
                        " " + pad("step_s", 8) + " " + pad("compute_s", 10) + " " +
                        pad("heartbeat", 10) + " " + pad("straggler", 10));
    for (const auto& r : *it) {
      if (!r.is_object()) continue;
      const auto num = [&r](const char* key, int digits, std::size_t width) {
        const auto v = number_at(r, key);
        return pad(v ? fixed(*v, digits) : "-", width);
      };
      std::string row = num("rank", 0, 4) + " " + num("member", 0, 6) + " " + num("node", 0, 4) +
                        " " + pad(r.value("host", std::string("-")), host_width, true) + " " +
                        num("pid", 0, 6) + " " + num("step_s", 3, 8) + " " +
                        num("compute_s", 3, 10) + " " +
                        (number_at(r, "heartbeat_age_s")
                             ? pad(fixed(*number_at(r, "heartbeat_age_s"), 2) + " s", 10)
                             : pad("-", 10)) +
                        " " + num("straggler_score", 2, 10);
      if (r.value("lost", false)) row += "  lost";
      out.ranks.push_back(row);
    }
  }

  const auto phase = [&out](const std::string& s) { out.phases.push_back(s); };
  if (const auto it = doc.find("goodput"); it != doc.end() && it->is_object()) {
    std::string head_line = "phases of every rank-second";
    if (const auto s = number_at(*it, "step")) head_line += " up to step " + fixed(*s, 0);
    std::string ratios;
    if (const auto g = number_at(*it, "goodput")) ratios += ", goodput " + fixed(100 * *g, 1) + "%";
    if (const auto m = number_at(*it, "mfu")) ratios += ", MFU " + fixed(100 * *m, 1) + "%";
    phase(head_line + (ratios.empty() ? "" : " (" + ratios.substr(2) + ")") + ":");
    if (const auto p = it->find("phases"); p != it->end() && p->is_object()) phase(phase_words(*p));
  }
  if (const auto it = doc.find("step_phases"); it != doc.end() && it->is_object()) {
    phase("phases of the last step (rank-seconds):");
    phase(phase_words(*it));
  } else if (const auto b = doc.find("step_breakdown"); b != doc.end() && b->is_object()) {
    std::string words = "last step per rank:";
    for (const auto& [key, value] : b->items())
      if (value.is_number()) words += "  " + key + " " + fixed(value.get<double>(), 4);
    phase(words);
  }

  if (const auto it = doc.find("events"); it != doc.end() && it->is_array())
    for (const auto& e : *it)
      if (e.is_object()) out.events.push_back(e);
  return out;
}

// `text` in lines of at most `columns` characters, broken at spaces where it can be.
std::vector<std::string> wrapped(const std::string& text, std::size_t columns) {
  std::vector<std::string> lines;
  std::string rest = text;
  while (!rest.empty()) {
    auto [first, was_cut] = cut(rest, columns);
    if (was_cut) {
      if (const auto space = first.rfind(' '); space != std::string::npos && space > 0)
        first.resize(space);
    }
    lines.push_back(first);
    rest.erase(0, first.size());
    while (!rest.empty() && rest.front() == ' ') rest.erase(0, 1);
  }
  return lines;
}

}  // namespace

std::string render_status(const json& doc, const std::string& where) {
  // Without a screen to fit, events are cut where a wide terminal would still hold them.
  constexpr std::size_t event_width = 140;
  const summary s = summarise(doc, where, 20);
  std::string out;
  const auto line = [&out](const std::string& t) { out += t + "\n"; };
  for (const auto& l : s.head) line(l);
  for (const auto& l : s.facts) line(l);
  if (!s.ranks.empty()) {
    line("");
    for (const auto& l : s.ranks) line(l);
  }
  line("");
  for (const auto& l : s.phases) line(l);
  if (!s.events.empty()) {
    line("");
    line("last events:");
    for (const auto& e : s.events) line(event_line(e, event_width));
  }
  return out;
}

std::string render_status(const json& doc, const std::string& where, const screen_size& screen,
                          const std::string& note) {
  const std::size_t columns = static_cast<std::size_t>(std::max(screen.columns, 20));
  const std::size_t unlimited = std::numeric_limits<std::size_t>::max();
  std::size_t left = screen.rows > 0 ? static_cast<std::size_t>(screen.rows) : unlimited;
  // The rank table's fixed columns take 66 characters: the host gets what the width leaves.
  const std::size_t host_width = std::clamp<std::size_t>(columns > 66 ? columns - 66 : 0, 8, 20);
  const summary s = summarise(doc, where, host_width);

  // What is shown of each part, decided in the order of what matters most; drawn below in the
  // order of the summary.
  const auto take = [&left](std::size_t want) {
    const std::size_t got = std::min(want, left);
    left -= got;
    return got;
  };
  const std::size_t head = take(s.head.size());
  const std::size_t facts = take(s.facts.size());
  std::size_t rank_rows = 0, ranks_hidden = 0;
  bool ranks_gap = false;
  if (!s.ranks.empty()) {
    const std::size_t rows = s.ranks.size() - 1;
    if (left >= rows + 2) {
      ranks_gap = take(1) == 1;
      rank_rows = rows;
      take(rows + 1);
    } else if (left >= 2) {
      // The heading and the "more" line, and the first ranks in the lines between.
      rank_rows = left - 2;
      ranks_hidden = rows - rank_rows;
      take(rank_rows + 2);
    }
  }
  const std::vector<std::string> note_lines =
      note.empty() ? std::vector<std::string>{} : wrapped(note, columns);
  std::size_t phases = 0;
  bool phases_gap = false;
  if (!s.phases.empty() && left >= 2) {
    phases_gap = take(1) == 1;
    phases = take(s.phases.size());
  }
  std::size_t notes = 0;
  bool note_gap = false;
  if (!note_lines.empty() && left >= 2) {
    note_gap = take(1) == 1;
    notes = take(note_lines.size());
  }
  std::size_t events = 0;
  if (!s.events.empty() && left >= 3) {
    take(2);  // a blank line and "last events:"
    events = take(s.events.size());
  }

  std::vector<std::string> lines;
  const auto add = [&lines, columns](const std::string& t) {
    lines.push_back(fit_width(t, columns));
  };
  for (std::size_t i = 0; i < head; ++i) add(s.head[i]);
  for (std::size_t i = 0; i < facts; ++i) add(s.facts[i]);
  if (ranks_gap) add("");
  if (!s.ranks.empty() && (rank_rows > 0 || ranks_hidden > 0)) {
    add(s.ranks.front());
    for (std::size_t i = 1; i <= rank_rows; ++i) add(s.ranks[i]);
    if (ranks_hidden > 0)
      add("... " + std::to_string(ranks_hidden) + " more rank" + (ranks_hidden == 1 ? "" : "s") +
          " (a taller terminal shows them; troupe status --json lists all)");
  }
  if (phases_gap) add("");
  for (std::size_t i = 0; i < phases; ++i) add(s.phases[i]);
  if (events > 0) {
    add("");
    add("last events:");
    for (std::size_t i = s.events.size() - events; i < s.events.size(); ++i)
      lines.push_back(event_line(s.events[i], columns));
  }
  if (note_gap) add("");
  for (std::size_t i = 0; i < notes; ++i) add(note_lines[i]);

  std::string out;
  for (std::size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" : "") + lines[i];
  return out;
}

}  // namespace troupe::monitoring
