#include "chaos/fault_spec.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "runtime/config.hpp"

namespace troupe::chaos {
namespace {

// Without a known last step a step is still bounded, so that random schedules cannot overflow.
constexpr int64_t unbounded_last_step = 1'000'000'000'000;
constexpr int64_t max_random_kills = 10'000;
constexpr int64_t random_default_from = 5;
constexpr int64_t random_default_every = 5;
constexpr double max_slow_factor = 100.0;
constexpr int64_t max_stop_ms = 24 * 3600 * 1000;

// A spec is user input: quoted into messages with control and non-ASCII bytes escaped, so
// that a message is always printable (and valid JSON once it reaches events.jsonl).
std::string printable(std::string_view s) {
  constexpr size_t limit = 200;
  std::string out;
  for (size_t i = 0; i < s.size() && i < limit; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 0xf];
    }
  }
  if (s.size() > limit) out += "...";
  return out;
}

std::string in_quotes(std::string_view s) { return "'" + printable(s) + "'"; }

[[noreturn]] void refuse(const std::string& spec, const std::string& why) {
  throw config_error("--fault " + in_quotes(spec) + ": " + why);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const auto end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

std::string join(const std::vector<std::string_view>& words) {
  std::string out;
  for (auto w : words) out += (out.empty() ? "" : ", ") + std::string(w);
  return out;
}

// The key=value fields after the kind, in the order given; `coordinator` is the one bare word.
struct field_list {
  std::vector<std::pair<std::string, std::string>> items;

  const std::string* find(std::string_view key) const {
    for (const auto& [k, v] : items)
      if (k == key) return &v;
    return nullptr;
  }
  bool has(std::string_view key) const { return find(key) != nullptr; }
};

field_list fields_of(const std::string& spec, const std::vector<std::string>& parts,
                     const std::vector<std::string_view>& allowed) {
  const std::string& kind = parts[0];
  field_list out;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    if (part.empty()) refuse(spec, "field " + std::to_string(i + 1) + " is empty (a stray ':'?)");
    const auto eq = part.find('=');
    std::string key = part.substr(0, eq);
    std::string value = eq == std::string::npos ? "" : part.substr(eq + 1);
    if (key == "coordinator" && eq != std::string::npos)
      refuse(spec, "coordinator takes no value, got " + in_quotes(part));
    if (key != "coordinator" && eq == std::string::npos)
      refuse(spec, "expected key=value, got " + in_quotes(part));
    if (key.empty()) refuse(spec, "a field has no name: " + in_quotes(part));
    if (key != "coordinator" && value.empty()) refuse(spec, key + " has no value");
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      if (kind != "random" && (key == "rank" || key == "node" || key == "coordinator"))
        refuse(spec, kind + " applies to a rank only (rank=R), got " + in_quotes(part));
      refuse(spec,
             "unknown field " + in_quotes(key) + " (" + kind + " takes " + join(allowed) + ")");
    }
    if (out.has(key)) refuse(spec, key + " is given twice");
    out.items.emplace_back(std::move(key), std::move(value));
  }
  return out;
}

const std::string& required(const std::string& spec, const field_list& fields, std::string_view key,
                            std::string_view what) {
  const auto* v = fields.find(key);
  if (!v) refuse(spec, std::string(key) + "= is missing (" + std::string(what) + ")");
  return *v;
}

template <typename Int>
Int whole(const std::string& spec, std::string_view key, const std::string& text) {
  Int x = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, x);
  if (ec == std::errc::result_out_of_range)
    refuse(spec, std::string(key) + " " + in_quotes(text) + " is too large");
  if (ec != std::errc() || ptr != end)
    refuse(spec, std::string(key) + " must be a whole number, got " + in_quotes(text));
  return x;
}

int64_t whole_in(const std::string& spec, std::string_view key, const std::string& text, int64_t lo,
                 int64_t hi) {
  const auto x = whole<int64_t>(spec, key, text);
  if (x < lo || x > hi)
    refuse(spec, std::string(key) + " must be in " + std::to_string(lo) + ".." +
                     std::to_string(hi) + ", got " + std::to_string(x));
  return x;
}

int64_t last_step(const fault_bounds& b) {
  return b.steps > 0 ? std::min(b.steps, unbounded_last_step) : unbounded_last_step;
}

int64_t step_of(const std::string& spec, std::string_view key, const std::string& text,
                const fault_bounds& b) {
  const auto x = whole<int64_t>(spec, key, text);
  const std::string k(key);
  if (x < 1)
    refuse(spec, k + " must be 1 or more (steps are numbered from 1), got " + std::to_string(x));
  if (x > last_step(b)) {
    if (b.steps > 0)
      refuse(spec, k + " " + std::to_string(x) + " is after the run's last step " +
                       std::to_string(b.steps) + " (1.." + std::to_string(b.steps) + ")");
    refuse(spec, k + " must be at most " + std::to_string(unbounded_last_step) + ", got " +
                     std::to_string(x));
  }
  return x;
}

int rank_of(const std::string& spec, const std::string& text, const fault_bounds& b) {
  const auto x = whole<int64_t>(spec, "rank", text);
  if (b.world < 1) refuse(spec, "there is no rank to hit (world " + std::to_string(b.world) + ")");
  if (x < 0 || x >= b.world)
    refuse(spec, "rank " + std::to_string(x) + " is outside the world of " +
                     std::to_string(b.world) + " (0.." + std::to_string(b.world - 1) + ")");
  return static_cast<int>(x);
}

int node_of(const std::string& spec, const std::string& text, const fault_bounds& b) {
  const auto x = whole<int64_t>(spec, "node", text);
  if (b.nodes < 1) refuse(spec, "there is no node to hit (" + std::to_string(b.nodes) + " nodes)");
  if (x < 0 || x >= b.nodes)
    refuse(spec, "node " + std::to_string(x) + " is outside the job's " + std::to_string(b.nodes) +
                     " nodes (0.." + std::to_string(b.nodes - 1) + ")");
  return static_cast<int>(x);
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// `500ms`, `3s` or `1.5s`: whole milliseconds, so a fraction of a second has 1 to 3 digits.
std::chrono::milliseconds duration_of(const std::string& spec, const std::string& text) {
  const auto bad = [&] {
    refuse(spec, "for must be a duration like 500ms, 3s or 1.5s, got " + in_quotes(text));
  };
  const bool ms = text.ends_with("ms");
  const bool s = !ms && text.ends_with("s");
  if (!ms && !s) bad();
  const std::string number = text.substr(0, text.size() - (ms ? 2 : 1));
  const auto dot = number.find('.');
  const std::string whole_part = number.substr(0, dot);
  const std::string fraction = dot == std::string::npos ? "" : number.substr(dot + 1);
  if (!all_digits(whole_part) || (dot != std::string::npos && (ms || !all_digits(fraction))) ||
      fraction.size() > 3)
    bad();
  const auto too_long = [&] {
    refuse(spec, "for must be at most " + std::to_string(max_stop_ms / 1000) + "s, got " +
                     in_quotes(text));
  };
  int64_t n = whole<int64_t>(spec, "for", whole_part);
  if (n > (s ? max_stop_ms / 1000 : max_stop_ms)) too_long();
  if (s) {
    int64_t frac_ms = 0;
    if (!fraction.empty()) frac_ms = whole<int64_t>(spec, "for", (fraction + "00").substr(0, 3));
    n = n * 1000 + frac_ms;
  }
  if (n == 0) refuse(spec, "for must be more than 0 (leave for= out to never continue)");
  if (n > max_stop_ms) too_long();
  return std::chrono::milliseconds(n);
}

double factor_of(const std::string& spec, const std::string& text) {
  double x = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, x);
  if ((ec != std::errc() && ec != std::errc::result_out_of_range) || ptr != end)
    refuse(spec, "factor must be a number like 2 or 1.5, got " + in_quotes(text));
  if (ec != std::errc() || !std::isfinite(x) || x <= 1.0 || x > max_slow_factor)
    refuse(spec, "factor must be more than 1 and at most " +
                     std::to_string(static_cast<int>(max_slow_factor)) + ", got " +
                     in_quotes(text));
  return x;
}

// splitmix64 (Steele, Lea, Flood 2014): fixed integer arithmetic, so a seed gives the same
// numbers on every platform, which std's distributions do not promise.
struct splitmix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// A number in [0, n); the modulo bias is below 1e-7 for the n used here.
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};

std::vector<fault> expand_random(const std::string& spec, const field_list& fields,
                                 const fault_bounds& b) {
  const int64_t kills = whole_in(spec, "kills", required(spec, fields, "kills", "how many kills"),
                                 1, max_random_kills);
  const auto seed = whole<uint64_t>(spec, "seed", required(spec, fields, "seed", "any number"));
  const int64_t last = last_step(b);
  const auto* from_text = fields.find("from");
  const int64_t from =
      from_text ? step_of(spec, "from", *from_text, b) : std::min(random_default_from, last);
  const auto* every_text = fields.find("every");
  const int64_t every =
      every_text ? whole_in(spec, "every", *every_text, 1, last) : random_default_every;
  const auto* nodes_text = fields.find("nodes");
  const int64_t node_kills = nodes_text ? whole_in(spec, "nodes", *nodes_text, 0, kills) : 0;
  if (node_kills < kills && b.world < 1) refuse(spec, "there is no rank to kill (world 0)");
  if (node_kills > 0 && b.nodes < 1) refuse(spec, "there is no node to kill (0 nodes)");
  // kills <= 1e4 and every <= 1e12: no overflow here or below.
  const int64_t tightest_last = from + (kills - 1) * every;
  if (tightest_last > last)
    refuse(spec, std::to_string(kills) + " kills " + std::to_string(every) +
                     " steps apart from step " + std::to_string(from) + " need steps up to " +
                     std::to_string(tightest_last) + ", after the last step " +
                     std::to_string(last) + "; lower kills or every, or run more steps");
  // Each gap is `every` plus a random share of the slack, so the kills spread over the run.
  const int64_t extra_max = b.steps > 0 ? (last - tightest_last) / kills : every - 1;
  splitmix64 rng{seed};
  std::vector<fault> out;
  int64_t step = from;
  int64_t node_kills_left = node_kills;
  for (int64_t k = 0; k < kills; ++k) {
    step += rng.below(extra_max + 1);
    // Selection sampling: exactly `node_kills` of the kills hit nodes, at random positions.
    const bool node = rng.below(kills - k) < node_kills_left;
    if (node) --node_kills_left;
    fault f;
    f.kind = fault_kind::kill;
    f.target = node ? fault_target::node : fault_target::rank;
    f.id = static_cast<int>(rng.below(node ? b.nodes : b.world));
    f.step = step;
    f.spec = spec;
    out.push_back(std::move(f));
    step += every;
  }
  return out;
}

const char* kind_name(fault_kind k) {
  switch (k) {
    case fault_kind::kill:
      return "kill";
    case fault_kind::stop:
      return "stop";
    case fault_kind::slow:
      return "slow";
    case fault_kind::diverge:
      return "diverge";
  }
  return "?";
}

const char* target_name(fault_target t) {
  switch (t) {
    case fault_target::rank:
      return "rank";
    case fault_target::node:
      return "node";
    case fault_target::coordinator:
      return "coordinator";
  }
  return "?";
}

}  // namespace

std::vector<fault> parse_fault(const std::string& spec, const fault_bounds& bounds) {
  if (spec.empty()) refuse(spec, "empty; expected e.g. kill:rank=1:step=8");
  const auto parts = split(spec, ':');
  const std::string& kind = parts[0];
  if (kind == "random")
    return expand_random(spec, fields_of(spec, parts, {"kills", "seed", "from", "every", "nodes"}),
                         bounds);
  fault f;
  f.spec = spec;
  if (kind == "kill") {
    const auto fields = fields_of(spec, parts, {"rank", "node", "coordinator", "step", "commits"});
    const int targets = fields.has("rank") + fields.has("node") + fields.has("coordinator");
    if (targets == 0) refuse(spec, "name the target: rank=R, node=N or coordinator");
    if (targets > 1) refuse(spec, "name one target, not several of rank=, node= and coordinator");
    if (const auto* r = fields.find("rank")) {
      f.id = rank_of(spec, *r, bounds);
    } else if (const auto* n = fields.find("node")) {
      f.target = fault_target::node;
      f.id = node_of(spec, *n, bounds);
    } else {
      f.target = fault_target::coordinator;
    }
    if (const auto* c = fields.find("commits")) {
      if (f.target != fault_target::coordinator)
        refuse(spec, "commits= is for kill:coordinator only");
      const auto n = whole<int64_t>(spec, "commits", *c);
      if (n < 0 || n > bounds.world)
        refuse(spec, "commits " + std::to_string(n) + " is outside 0.." +
                         std::to_string(bounds.world) + " (the ranks that get the commit)");
      f.commits = static_cast<int>(n);
    }
    f.step = step_of(spec, "step", required(spec, fields, "step", "the step it fires at"), bounds);
  } else if (kind == "stop") {
    const auto fields = fields_of(spec, parts, {"rank", "step", "for"});
    f.kind = fault_kind::stop;
    f.id = rank_of(spec, required(spec, fields, "rank", "the rank to stop"), bounds);
    f.step = step_of(spec, "step", required(spec, fields, "step", "the step it fires at"), bounds);
    if (const auto* d = fields.find("for")) f.duration = duration_of(spec, *d);
  } else if (kind == "slow") {
    const auto fields = fields_of(spec, parts, {"rank", "factor", "from"});
    f.kind = fault_kind::slow;
    f.id = rank_of(spec, required(spec, fields, "rank", "the rank to slow"), bounds);
    f.factor = factor_of(spec, required(spec, fields, "factor", "how many times slower"));
    f.step = step_of(spec, "from", required(spec, fields, "from", "the first slowed step"), bounds);
  } else if (kind == "diverge") {
    const auto fields = fields_of(spec, parts, {"rank", "step"});
    f.kind = fault_kind::diverge;
    const auto* r = fields.find("rank");
    f.id = r ? rank_of(spec, *r, bounds) : 0;
    if (!r && bounds.world < 1)
      refuse(spec, "there is no rank to hit (world " + std::to_string(bounds.world) + ")");
    fault_bounds batches = bounds;
    if (bounds.batches > 0) batches.steps = bounds.batches;
    f.step = step_of(spec, "step", required(spec, fields, "step", "the step whose batch diverges"),
                     batches);
  } else {
    refuse(spec, "unknown kind " + in_quotes(kind) + " (kill, stop, slow, diverge or random)");
  }
  return {std::move(f)};
}

std::vector<fault> parse_faults(const std::vector<std::string>& specs, const fault_bounds& bounds) {
  std::vector<fault> out;
  for (const auto& spec : specs) {
    auto more = parse_fault(spec, bounds);
    out.insert(out.end(), std::make_move_iterator(more.begin()),
               std::make_move_iterator(more.end()));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const fault& a, const fault& b) { return a.step < b.step; });
  return out;
}

std::vector<fault> parse_faults(const std::string& joined, int world, int nodes, int64_t steps,
                                int64_t batches) {
  if (joined.empty()) return {};
  return parse_faults(split(joined, ';'), fault_bounds{world, nodes, steps, batches});
}

double slowdown(const std::vector<fault>& faults, int rank, int64_t step) {
  double factor = 1.0;
  for (const auto& f : faults)
    if (f.kind == fault_kind::slow && f.target == fault_target::rank && f.id == rank &&
        step >= f.step)
      factor = std::max(factor, f.factor);
  return factor;
}

bool diverges(const std::vector<fault>& faults, int rank, int64_t data_position) {
  for (const auto& f : faults)
    if (f.kind == fault_kind::diverge && f.target == fault_target::rank && f.id == rank &&
        data_position == f.step - 1)
      return true;
  return false;
}

nlohmann::json to_json(const fault& f) {
  nlohmann::json j = {{"what", kind_name(f.kind)},
                      {"target", target_name(f.target)},
                      {"id", f.id},
                      {"step", f.step}};
  if (f.kind == fault_kind::stop && f.duration.count() > 0) j["for_ms"] = f.duration.count();
  if (f.kind == fault_kind::slow) j["factor"] = f.factor;
  if (f.commits >= 0) j["commits"] = f.commits;
  j["spec"] = f.spec;
  return j;
}

}  // namespace troupe::chaos
