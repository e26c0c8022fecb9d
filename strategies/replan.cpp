#include "strategies/replan.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <stdexcept>

namespace troupe::strategies {
namespace {

int step_micro_batches(const plan_constraints& c) {
  if (c.micro_batches > 0) return c.micro_batches;
  return c.micro_batch > 0 ? c.batch / c.micro_batch : 0;
}

// The plan of `shape` with its replicas dividing M unevenly; `check` is the even plan of one
// replica with the same tp/pp/ep, which carries every rule that does not depend on dp.
layout_plan uneven_plan(const layout& shape, const layout_plan& one_replica, int M) {
  layout_plan p = one_replica;
  p.shape = shape;
  p.spares = 0;
  p.replica_micro_batches.assign(static_cast<size_t>(shape.dp), M / shape.dp);
  for (int r = 0; r < M % shape.dp; ++r) ++p.replica_micro_batches[static_cast<size_t>(r)];
  p.micro_batches_per_replica =
      *std::max_element(p.replica_micro_batches.begin(), p.replica_micro_batches.end());
  p.bubble = pipeline_bubble(
      shape.pp, *std::min_element(p.replica_micro_batches.begin(), p.replica_micro_batches.end()));
  return p;
}

}  // namespace

plan_result replan_layout(const layout_plan& previous, int live, const model_config& model,
                          const plan_constraints& c, const elastic_bounds& bounds) {
  const int usable = bounds.max_ranks > 0 ? std::min(live, bounds.max_ranks) : live;
  if (live < std::max(1, bounds.min_ranks))
    return std::to_string(live) + " live ranks, fewer than --min-ranks " +
           std::to_string(std::max(1, bounds.min_ranks));
  const int M = step_micro_batches(c);
  const layout& old = previous.shape;
  const int per_replica = old.tp * old.pp;
  plan_constraints fixed = c;
  fixed.tp = old.tp;
  fixed.pp = old.pp;
  fixed.ep = old.ep;
  fixed.allow_spares = false;
  // Keep tp, pp and ep: the largest dp that fits.
  for (int dp = usable / std::max(1, per_replica); dp >= 1; --dp) {
    layout shape = old;
    shape.dp = dp;
    if (dp % shape.ep != 0) continue;
    if (check_plan(shape, model, fixed).empty()) {
      layout_plan p = make_plan(shape, model, fixed);
      p.spares = live - shape.world();
      return p;
    }
    // Uneven replicas: dense models whose replicas each get at least pp micro-batches.
    if (model.experts > 0 || shape.ep != 1 || M < dp * std::max(1, shape.pp) || M % dp == 0)
      continue;
    layout one = shape;
    one.dp = 1;
    if (!check_plan(one, model, fixed).empty()) continue;
    layout_plan p = uneven_plan(shape, make_plan(one, model, fixed), M);
    p.spares = live - shape.world();
    return p;
  }
  // Re-plan tp, pp and ep freely for what is left.
  plan_constraints free = c;
  free.tp = free.pp = free.ep = 0;
  free.allow_spares = true;
  auto planned = plan_layout(usable, model, free);
  if (!has_plan(planned))
    return "no layout fits " + std::to_string(usable) + " ranks: " + reason_of(planned);
  layout_plan p = std::get<layout_plan>(std::move(planned));
  p.spares = live - p.shape.world();
  return p;
}

std::vector<int> balance_micro_batches(int M, const std::vector<double>& replica_speed,
                                       int min_each) {
  const int n = static_cast<int>(replica_speed.size());
  min_each = std::max(min_each, 0);
  if (n == 0 || M < n * min_each) return {};
  double total = 0;
  for (double s : replica_speed) {
    if (!std::isfinite(s) || s <= 0) return {};
    total += s;
  }
  // Each replica's ideal share of M, rounded down but never below the minimum; then the
  // micro-batches left over go to the largest shortfalls (ties to the lower index), or, when
  // the minimums overshoot, come back from the largest surpluses.
  std::vector<double> ideal(static_cast<size_t>(n));
  std::vector<int> out(static_cast<size_t>(n));
  int sum = 0;
  for (size_t i = 0; i < ideal.size(); ++i) {
    ideal[i] = M * replica_speed[i] / total;
    out[i] = std::max(min_each, static_cast<int>(std::floor(ideal[i])));
    sum += out[i];
  }
  while (sum != M) {
    const bool add = sum < M;
    size_t pick = ideal.size();
    for (size_t i = 0; i < ideal.size(); ++i) {
      if (!add && out[i] <= min_each) continue;
      const double gap = ideal[i] - out[i];
      if (pick == ideal.size()) {
        pick = i;
      } else {
        const double best = ideal[pick] - out[pick];
        if (add ? gap > best + 1e-12 : gap < best - 1e-12) pick = i;
      }
    }
    out[pick] += add ? 1 : -1;
    sum += add ? 1 : -1;
  }
  return out;
}

layout_plan plan_from_json(const std::string& text) {
  using nlohmann::json;
  const auto bad = [](const std::string& why) { return std::invalid_argument("plan: " + why); };
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    throw bad(std::string("not JSON (") + e.what() + ")");
  }
  // Every access below checks the type first, so nlohmann never throws its own type_error.
  if (!doc.is_object()) throw bad("not a JSON object");
  const auto integer = [&](const json& v, const std::string& what, int64_t min, int64_t max) {
    if (!v.is_number_integer()) throw bad("'" + what + "' missing or not an integer");
    const auto x = v.get<int64_t>();
    if (x < min || x > max)
      throw bad("'" + what + "' (" + std::to_string(x) + ") out of range [" + std::to_string(min) +
                ", " + std::to_string(max) + "]");
    return static_cast<int>(x);
  };
  constexpr int64_t most = 1'000'000;
  const auto field = [&](const json& obj, const char* key, int64_t min) {
    return integer(obj.contains(key) ? obj[key] : json(), key, min, most);
  };
  // Doubles are estimates: absent means 0 (older writers), present must be finite and in range.
  const auto real = [&](const char* key, double min, double max) {
    if (!doc.contains(key)) return 0.0;
    const json& v = doc[key];
    if (!v.is_number()) throw bad(std::string("'") + key + "' is not a number");
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < min || x > max)
      throw bad(std::string("'") + key + "' (" + std::to_string(x) + ") out of range");
    return x;
  };
  if (!doc.contains("layout") || !doc["layout"].is_object()) throw bad("'layout' missing");
  const json& l = doc["layout"];
  layout_plan p;
  p.shape.dp = field(l, "dp", 1);
  p.shape.tp = field(l, "tp", 1);
  p.shape.pp = field(l, "pp", 1);
  p.shape.ep = field(l, "ep", 1);
  if (l.contains("order")) {
    if (!l["order"].is_string()) throw bad("'order' is not a string");
    p.shape.order = l["order"].get<std::string>();
  }
  if (auto why = check_layout(p.shape); !why.empty()) throw bad(why);
  p.spares = field(doc, "spares", 0);
  p.micro_batches = field(doc, "micro_batches", 1);
  p.micro_batch_size = field(doc, "micro_batch_size", 1);
  p.micro_batches_per_replica = field(doc, "micro_batches_per_replica", 1);
  if (!doc.contains("stages") || !doc["stages"].is_array() ||
      doc["stages"].size() != static_cast<size_t>(p.shape.pp))
    throw bad("'stages' must list pp (" + std::to_string(p.shape.pp) + ") layer ranges");
  // Consecutive non-empty ranges from layer 0, as stage_layers makes them.
  int next = 0;
  for (const auto& s : doc["stages"]) {
    if (!s.is_array() || s.size() != 2) throw bad("a stage must be [first, last]");
    const layer_range r{integer(s[0], "stage first", 0, most),
                        integer(s[1], "stage last", 1, most)};
    if (r.first != next || r.last <= r.first)
      throw bad("stages must be consecutive non-empty ranges from layer 0");
    p.stages.push_back(r);
    next = r.last;
  }
  // Each replica's count, as runs [[replicas, count], ...] (to_json) or, from an older
  // writer, one entry per replica.
  const bool as_runs = doc.contains("replica_micro_batch_runs");
  if (as_runs == doc.contains("replica_micro_batches"))
    throw bad("exactly one of 'replica_micro_batch_runs' and 'replica_micro_batches' is needed");
  if (as_runs) {
    const json& runs = doc["replica_micro_batch_runs"];
    if (!runs.is_array()) throw bad("'replica_micro_batch_runs' is not a list");
    int64_t replicas = 0;
    for (const auto& run : runs) {
      if (!run.is_array() || run.size() != 2) throw bad("a run must be [replicas, count]");
      replicas += integer(run[0], "run replicas", 1, most);
      if (replicas > p.shape.dp) break;
    }
    if (replicas != p.shape.dp)
      throw bad("'replica_micro_batch_runs' must cover dp (" + std::to_string(p.shape.dp) +
                ") replicas");
    for (const auto& run : runs)
      p.replica_micro_batches.insert(p.replica_micro_batches.end(), run[0].get<size_t>(),
                                     integer(run[1], "run count", 1, most));
  } else {
    const json& counts = doc["replica_micro_batches"];
    if (!counts.is_array() || counts.size() != static_cast<size_t>(p.shape.dp))
      throw bad("'replica_micro_batches' must list dp (" + std::to_string(p.shape.dp) + ") counts");
    for (const auto& x : counts)
      p.replica_micro_batches.push_back(integer(x, "replica_micro_batches entry", 1, most));
  }
  int64_t sum = 0;
  for (int x : p.replica_micro_batches) sum += x;
  if (sum != p.micro_batches)
    throw bad("replica_micro_batches sum to " + std::to_string(sum) + ", not micro_batches " +
              std::to_string(p.micro_batches));
  const int largest =
      *std::max_element(p.replica_micro_batches.begin(), p.replica_micro_batches.end());
  if (p.micro_batches_per_replica != largest)
    throw bad("micro_batches_per_replica (" + std::to_string(p.micro_batches_per_replica) +
              ") is not the largest replica count (" + std::to_string(largest) + ")");
  p.bubble = real("bubble", 0, 1);
  p.params_per_rank = real("params_per_rank", 0, std::numeric_limits<double>::max());
  p.memory_bytes = real("memory_bytes", 0, std::numeric_limits<double>::max());
  p.step_seconds = real("step_seconds", 0, std::numeric_limits<double>::max());
  return p;
}

}  // namespace troupe::strategies
