#include "strategies/replan.hpp"

#include <algorithm>
#include <cmath>
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
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    throw std::invalid_argument(std::string("plan: not JSON (") + e.what() + ")");
  }
  auto number = [&](const json& obj, const char* key, int min) {
    if (!obj.is_object() || !obj.contains(key) || !obj[key].is_number_integer())
      throw std::invalid_argument(std::string("plan: '") + key + "' missing or not an integer");
    const auto v = obj[key].get<int64_t>();
    if (v < min || v > 1'000'000)
      throw std::invalid_argument(std::string("plan: '") + key + "' out of range");
    return static_cast<int>(v);
  };
  layout_plan p;
  const json& l = doc.value("layout", json());
  p.shape.dp = number(l, "dp", 1);
  p.shape.tp = number(l, "tp", 1);
  p.shape.pp = number(l, "pp", 1);
  p.shape.ep = number(l, "ep", 1);
  if (l.contains("order") && l["order"].is_string()) p.shape.order = l["order"].get<std::string>();
  if (auto why = check_layout(p.shape); !why.empty()) throw std::invalid_argument("plan: " + why);
  p.spares = number(doc, "spares", 0);
  p.micro_batches = number(doc, "micro_batches", 1);
  p.micro_batch_size = number(doc, "micro_batch_size", 1);
  p.micro_batches_per_replica = number(doc, "micro_batches_per_replica", 1);
  if (!doc.contains("stages") || !doc["stages"].is_array() ||
      doc["stages"].size() != static_cast<size_t>(p.shape.pp))
    throw std::invalid_argument("plan: 'stages' must list pp layer ranges");
  for (const auto& s : doc["stages"]) {
    if (!s.is_array() || s.size() != 2 || !s[0].is_number_integer() || !s[1].is_number_integer())
      throw std::invalid_argument("plan: a stage must be [first, last]");
    layer_range r{s[0].get<int>(), s[1].get<int>()};
    if (r.first < 0 || r.last <= r.first)
      throw std::invalid_argument("plan: an empty or negative stage");
    p.stages.push_back(r);
  }
  if (!doc.contains("replica_micro_batches") || !doc["replica_micro_batches"].is_array() ||
      doc["replica_micro_batches"].size() != static_cast<size_t>(p.shape.dp))
    throw std::invalid_argument("plan: 'replica_micro_batches' must list dp counts");
  int sum = 0;
  for (const auto& x : doc["replica_micro_batches"]) {
    if (!x.is_number_integer() || x.get<int64_t>() < 1 || x.get<int64_t>() > 1'000'000)
      throw std::invalid_argument("plan: a replica's micro-batch count must be a positive integer");
    p.replica_micro_batches.push_back(x.get<int>());
    sum += p.replica_micro_batches.back();
  }
  if (sum != p.micro_batches)
    throw std::invalid_argument("plan: replica_micro_batches sum to " + std::to_string(sum) +
                                ", not micro_batches " + std::to_string(p.micro_batches));
  p.bubble = doc.value("bubble", 0.0);
  p.params_per_rank = doc.value("params_per_rank", 0.0);
  p.memory_bytes = doc.value("memory_bytes", 0.0);
  p.step_seconds = doc.value("step_seconds", 0.0);
  return p;
}

}  // namespace troupe::strategies
