#include "strategies/planner.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <tuple>

#include "runtime/comm/tree_sum.hpp"

namespace troupe::strategies {
namespace {

// Worlds above this are refused with a reason rather than enumerated: the cost model walks
// every group, and the config itself stops at 256 ranks.
constexpr int max_world = 1 << 17;  // as --world (runtime/settings.cpp)

std::string str(int v) { return std::to_string(v); }

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

std::string list(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + str(v[i]);
  return out;
}

// The sizes tp may take for this model: common divisors of the head count, MLP width and
// vocabulary (for the fix part of a reason).
std::vector<int> valid_tp(const model_config& m) {
  std::vector<int> out;
  for (int t : divisors(m.n_head))
    if ((4 * m.d_model) % t == 0 && m.vocab % t == 0) out.push_back(t);
  return out;
}

// M, the micro-batches of one step, or 0 when the batch does not split.
int step_micro_batches(const plan_constraints& c) {
  if (c.micro_batches > 0) return c.batch % c.micro_batches == 0 ? c.micro_batches : 0;
  return c.batch % c.micro_batch == 0 ? c.batch / c.micro_batch : 0;
}

// The micro-batch size a step runs in, named for a reason when parallel.micro_batches sets it.
std::string moe_micro_batch(const plan_constraints& c) {
  const int M = step_micro_batches(c);
  return "the micro-batch size batch / parallel.micro_batches (" + str(c.batch) + " / " + str(M) +
         " = " + str(c.batch / M) + ")";
}

// Rules that involve only the model, the batch and the fixed sizes, not the world: checked
// first so a request that no world can satisfy gets the one reason that matters.
std::string check_inputs(const model_config& m, const plan_constraints& c) {
  if (m.n_layer < 1 || m.n_head < 1 || m.d_model < 1 || m.vocab < 1 || m.context < 1 ||
      m.experts < 0 || m.top_k < 1)
    return "model: n_layer, n_head, d_model, vocab, context and top_k must be >= 1 and experts "
           ">= 0; fix the model section of the config";
  if (c.batch < 1 || c.micro_batch < 1 || c.micro_batches < 0)
    return "batch and micro_batch must be >= 1 and parallel.micro_batches >= 0";
  if (c.tp < 0 || c.pp < 0 || c.ep < 0)
    return "parallel.tp, parallel.pp and parallel.ep must be >= 1 (or 0 = let the planner choose)";
  if (c.ranks_per_node < 1) return "ranks_per_node must be >= 1";
  // The estimates divide by these; a zero or NaN would make every plan's cost inf or NaN and
  // the comparison between candidates meaningless.
  const auto positive = [](double x) { return std::isfinite(x) && x > 0; };
  if (!positive(c.flops_per_s) || !positive(c.intra_node_bytes_per_s) ||
      !positive(c.inter_node_bytes_per_s) || !std::isfinite(c.latency_s) || c.latency_s < 0 ||
      !std::isfinite(c.memory_bytes) || c.memory_bytes < 0)
    return "flops_per_s and the bandwidths must be finite and > 0, latency_s and memory_bytes "
           "finite and >= 0";
  if (c.micro_batches > 0 && c.batch % c.micro_batches != 0)
    return "parallel.micro_batches (" + str(c.micro_batches) + ") must divide batch (" +
           str(c.batch) + "); use one of " + list(divisors(c.batch));
  if (c.micro_batches == 0 && c.batch % c.micro_batch != 0)
    return "micro_batch (" + str(c.micro_batch) + ") must divide batch (" + str(c.batch) +
           "); use one of " + list(divisors(c.batch));
  if (c.tp > 0) {
    const auto why = [&](const char* what, int n) {
      return "parallel.tp (" + str(c.tp) + ") must divide " + what + " (" + str(n) +
             "); use one of " + list(valid_tp(m));
    };
    if (m.n_head % c.tp != 0) return why("model.n_head", m.n_head);
    if ((4 * m.d_model) % c.tp != 0) return why("the MLP width 4 * model.d_model", 4 * m.d_model);
    if (m.vocab % c.tp != 0) return why("model.vocab (vocab-parallel embedding)", m.vocab);
  }
  if (c.pp > m.n_layer)
    return "parallel.pp (" + str(c.pp) + ") must not exceed model.n_layer (" + str(m.n_layer) +
           "): every stage needs at least one layer; use pp <= " + str(m.n_layer);
  if (c.ep > 1 && m.experts == 0)
    return "parallel.ep (" + str(c.ep) +
           ") > 1 needs an MoE model (model.experts > 0); set ep "
           "to 1 or give the model experts";
  if (c.ep > 1 && m.experts % c.ep != 0)
    return "parallel.ep (" + str(c.ep) + ") must divide model.experts (" + str(m.experts) +
           "); use one of " + list(divisors(m.experts));
  if (m.experts > 0 && (c.tp > 1 || c.pp > 1))
    return "an MoE model (model.experts > 0) runs over dp x ep only, but " +
           (c.tp > 1 ? "parallel.tp (" + str(c.tp) + ")" : "parallel.pp (" + str(c.pp) + ")") +
           " asks for more; set tp and pp to 1 and shard the experts with parallel.ep";
  if (m.experts > 0 && c.zero == 1)
    return "ZeRO-1 (parallel.zero = 1) is not supported for MoE models; use parallel.zero = 0 "
           "(parallel.ep shards the experts and their optimizer state)";
  if (m.experts > 0 && c.ep > 1 && c.micro_batch % c.ep != 0)
    return "parallel.ep (" + str(c.ep) + ") must divide micro_batch (" + str(c.micro_batch) +
           "): the ep ranks split each micro-batch equally, because MoE capacity and aux loss "
           "are figures of a whole micro-batch; use a micro_batch that is a multiple of ep";
  if (m.experts > 0 && c.ep > 1 && (c.batch / step_micro_batches(c)) % c.ep != 0)
    return "parallel.ep (" + str(c.ep) + ") must divide " + moe_micro_batch(c) +
           ": the ep ranks split each micro-batch equally, because MoE capacity and aux loss "
           "are figures of a whole micro-batch; use fewer --micro-batches";
  if (c.pp > 1 && step_micro_batches(c) < c.pp)
    return "parallel.pp (" + str(c.pp) + ") needs at least " + str(c.pp) +
           " micro-batches per step to fill the pipeline, but the step has " +
           str(step_micro_batches(c)) + " (batch / micro_batch); lower micro_batch or pp";
  return {};
}

// ---- estimates ---------------------------------------------------------------------------

struct estimate {
  double params_per_rank = 0;  // fullest rank
  double dense_per_rank = 0;   // its parameters summed over dp
  double expert_per_rank = 0;  // its parameters summed over edp
  double memory_bytes = 0;
  double step_seconds = 0;
};

double mlp_params(double c) { return 8 * c * c + 5 * c; }  // fc [C,4C]+b, proj [4C,C]+b

bool spans_nodes(const layout& l, group_kind k, int ranks_per_node) {
  for (const auto& g : groups_of(l, k))
    for (int r : g.ranks)
      if (r / ranks_per_node != g.ranks.front() / ranks_per_node) return true;
  return false;
}

estimate estimate_of(const layout& l, const model_config& m, const plan_constraints& c,
                     const std::vector<layer_range>& stages, int micro_batches) {
  const double C = m.d_model, V = m.vocab, T = m.context, E = m.experts;
  const double tp = l.tp, dp = l.dp, ep = l.ep, edp = l.dp / l.ep;
  // One layer's parameters on one rank: attention and MLP matrices are split over tp, the
  // layer norms are replicated, and each rank holds E / ep experts.
  const double attn = (4 * C * C + 4 * C) / tp + 4 * C;
  const double dense_mlp = E > 0 ? C * E : mlp_params(C) / tp;  // router or dense MLP
  const double expert_mlp = E > 0 ? (E / ep) * mlp_params(C) / tp : 0;
  const double embed = V * C / tp;  // vocab-parallel token embedding (tied output head)
  estimate e;
  for (size_t s = 0; s < stages.size(); ++s) {
    const double n = stages[s].size();
    double dense = n * (attn + dense_mlp);
    if (s == 0) dense += embed + T * C;                  // wte, wpe
    if (s + 1 == stages.size()) dense += embed + 2 * C;  // tied head copy (if pp > 1), ln_f
    if (s == 0 && stages.size() == 1) dense -= embed;    // one stage holds wte once
    const double expert = n * expert_mlp;
    if (dense + expert > e.params_per_rank) {
      e.params_per_rank = dense + expert;
      e.dense_per_rank = dense;
      e.expert_per_rank = expert;
    }
  }
  // fp32 weights and gradients, AdamW's two moments (sharded over dp with ZeRO-1).
  e.memory_bytes = e.params_per_rank * (8 + 8 / (c.zero == 1 ? dp : 1.0));
  // The exact reduction keeps micro-batches' gradients apart: the fullest replica's copies.
  if (c.exact_reduction && l.ep == 1 && E == 0) {
    const int per_replica = (micro_batches + l.dp - 1) / l.dp;
    int copies = 0;
    for (int first = 0; first < micro_batches; first += per_replica)
      copies =
          std::max(copies, comm::exact_sum_buffers(micro_batches, first,
                                                   std::min(per_replica, micro_batches - first)));
    e.memory_bytes += e.params_per_rank * 4 * copies;
  }

  const int max_layers = stages.front().size();  // the first stages are the fullest
  const double mb = static_cast<double>(c.batch) / micro_batches;  // sequences / micro-batch
  const double m_rep = static_cast<double>(micro_batches) / l.dp;
  const double tokens = static_cast<double>(c.batch) * T;
  const double active_mlp = E > 0 ? m.top_k * mlp_params(C) + C * E : mlp_params(C);
  const double flops = 6 * tokens * (m.n_layer * (4 * C * C + active_mlp) + V * C) +
                       12 * tokens * m.n_layer * T * C;  // attention scores and mixing
  const double bubble = pipeline_bubble(l.pp, static_cast<int>(m_rep));
  double seconds = flops / l.world() / c.flops_per_s / (1 - bubble);

  const auto bw = [&](group_kind k) {
    return spans_nodes(l, k, c.ranks_per_node) ? c.inter_node_bytes_per_s
                                               : c.intra_node_bytes_per_s;
  };
  const auto ring = [](double n) { return 2 * (n - 1) / n; };  // all-reduce volume factor
  const double act = mb * T * C * 4;                           // one activation, bytes
  // Each collective call also pays a fixed latency, which is what keeps small models off
  // tp: its many small all-reduces cost more in latency than they save in bandwidth.
  const double a = c.latency_s;
  if (l.dp > 1) seconds += a + e.dense_per_rank * 4 * ring(dp) / bw(group_kind::dp);
  if (edp > 1) seconds += a + e.expert_per_rank * 4 * ring(edp) / bw(group_kind::edp);
  if (l.pp > 1) seconds += a + embed * 4 * ring(2) / bw(group_kind::embd);
  // Two all-reduces forward and two backward per layer and micro-batch.
  const double per_layer = max_layers * m_rep;
  if (l.tp > 1) seconds += 4 * per_layer * (a + act * ring(tp) / bw(group_kind::tp));
  // One activation forward and one gradient backward per stage boundary and micro-batch.
  if (l.pp > 1) seconds += 2 * m_rep * (a + act / bw(group_kind::pp));
  // Dispatch and combine, forward and backward, of every routed token per MoE layer.
  if (l.ep > 1) seconds += 4 * per_layer * (a + act * m.top_k * (ep - 1) / ep / bw(group_kind::ep));
  e.step_seconds = seconds;
  return e;
}

// The shortest decimal text that reads back as `x` (std::to_chars guarantees the round trip),
// so a plan sent as JSON arrives equal to the one planned; JSON has no inf or NaN: null.
std::string exact(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

std::string memory_text(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

// The rule against free tp crossing a node; not a validity rule, so kept apart from
// check_plan (a user who fixes tp gets what they asked for).
std::string check_free_tp(const layout& l, const plan_constraints& c) {
  if (c.tp == 0 && l.tp > 1 && c.ranks_per_node % l.tp != 0)
    return "tp (" + str(l.tp) + ") would not divide a node of " + str(c.ranks_per_node) +
           " ranks (ranks_per_node), so tensor-parallel peers would cross nodes; fix "
           "parallel.tp to allow it";
  return {};
}

// "a", "a or b", "a, b or c".
std::string either(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i)
    out += (i == 0 ? "" : i + 1 == v.size() ? " or " : ", ") + str(v[i]);
  return out;
}

// Whether the explicit-M rule (planner.hpp) leaves no layout of `world` ranks: M set by the
// user, tp and pp free, a dense model, pure dp of the world not dividing M and not over the
// memory budget. Then any layout would have tp or pp raised just to make dp divide M.
bool micro_batches_rule_out(int world, const model_config& m, const plan_constraints& c) {
  if (c.micro_batches == 0 || c.tp > 0 || c.pp > 0 || m.experts > 0) return false;
  const int M = step_micro_batches(c);
  if (M % world == 0) return false;  // pure dp fits M: the cost model chooses as before
  if (c.memory_bytes == 0) return true;
  const layout pure{world, 1, 1, 1, c.order};
  // A malformed order string is rejected by the search with its own reason.
  if (!check_layout(pure).empty()) return false;
  const double need = estimate_of(pure, m, c, stage_layers(m.n_layer, 1), M).memory_bytes;
  return need <= c.memory_bytes;  // over the budget: model parallelism is wanted anyway
}

// The reason when micro_batches_rule_out holds for `world`; `smaller` is the largest smaller
// world that fits, if any.
std::string micro_batches_reason(int world, const plan_constraints& c,
                                 const std::optional<layout_plan>& smaller) {
  std::vector<int> fits;  // micro-batch counts the batch allows that feed every rank
  for (int k : divisors(c.batch))
    if (k % world == 0 && fits.size() < 3) fits.push_back(k);
  std::vector<std::string> fixes;
  if (!fits.empty()) fixes.push_back("use --micro-batches " + either(fits));
  fixes.push_back("set --tp/--pp explicitly");
  if (smaller)
    fixes.push_back("run on " + str(smaller->shape.world()) + " ranks as " +
                    describe(smaller->shape) + " (or allow spare ranks)");
  std::string why = "--micro-batches " + str(c.micro_batches) +
                    " (parallel.micro_batches) cannot feed " + str(world) +
                    " data-parallel replicas (dp must divide the micro-batches; with tp and pp "
                    "free the planner does not add them to make it so unless memory needs "
                    "them); ";
  for (size_t i = 0; i < fixes.size(); ++i)
    why += (i == 0 ? "" : i + 1 == fixes.size() ? ", or " : ", ") + fixes[i];
  return why;
}

struct search_result {
  std::optional<layout_plan> best;
  std::vector<std::string> rejected;  // "dp4xtp2xpp1: reason"
};

// Every candidate layout of exactly `world` ranks that matches the fixed sizes, the best
// by the cost model, and why the others were rejected.
search_result search(int world, const model_config& m, const plan_constraints& c) {
  search_result out;
  // Nothing to choose from; plan_layout gives the reason for the whole world.
  if (micro_batches_rule_out(world, m, c)) return out;
  // A fixed size is tried even when it cannot work, so the reason says why.
  const auto sizes = [](int fixed, int n) {
    return fixed > 0 ? std::vector<int>{fixed} : divisors(n);
  };
  for (int tp : sizes(c.tp, world)) {
    if (world % tp != 0) {
      out.rejected.push_back("parallel.tp (" + str(tp) + ") does not divide the world of " +
                             str(world) + " ranks");
      continue;
    }
    for (int pp : sizes(c.pp, world / tp)) {
      if ((world / tp) % pp != 0) {
        out.rejected.push_back("tp (" + str(tp) + ") * parallel.pp (" + str(pp) +
                               ") does not divide the world of " + str(world) + " ranks");
        continue;
      }
      const int dp = world / (tp * pp);
      for (int ep : sizes(c.ep, dp)) {
        if (c.ep == 0 && ep > 1 && m.experts == 0) continue;  // never a reason worth listing
        const layout l{dp, tp, pp, ep, c.order};
        std::string why = check_plan(l, m, c);
        if (why.empty()) why = check_free_tp(l, c);
        if (!why.empty()) {
          out.rejected.push_back(describe(l) + ": " + why);
          continue;
        }
        layout_plan p = make_plan(l, m, c);
        const auto rank = [](const layout_plan& q) {
          const layout& s = q.shape;
          return std::make_tuple(q.step_seconds, s.tp * s.pp, s.pp, s.tp, s.ep);
        };
        if (!out.best || rank(p) < rank(*out.best)) out.best = std::move(p);
      }
    }
  }
  return out;
}

}  // namespace

std::vector<layer_range> stage_layers(int n_layer, int pp) {
  if (pp < 1 || pp > n_layer)
    throw std::invalid_argument("stage_layers: need 1 <= pp (" + str(pp) + ") <= n_layer (" +
                                str(n_layer) + ")");
  std::vector<layer_range> out;
  const int base = n_layer / pp, extra = n_layer % pp;
  int first = 0;
  for (int s = 0; s < pp; ++s) {
    const int n = base + (s < extra ? 1 : 0);
    out.push_back({first, first + n});
    first += n;
  }
  return out;
}

double pipeline_bubble(int pp, int m) {
  if (pp <= 1) return 0;
  if (m < 1) return 1;
  return static_cast<double>(pp - 1) / (m + pp - 1);
}

plan_constraints constraints_from(const train_config& cfg) {
  plan_constraints c;
  c.batch = cfg.batch;
  c.micro_batch = cfg.micro_batch;
  c.micro_batches = cfg.parallel.micro_batches;
  c.tp = cfg.parallel.tp > 1 ? cfg.parallel.tp : 0;
  c.pp = cfg.parallel.pp > 1 ? cfg.parallel.pp : 0;
  c.ep = cfg.parallel.ep > 1 ? cfg.parallel.ep : 0;
  c.zero = cfg.parallel.zero;
  c.exact_reduction =
      cfg.parallel.reduction == "exact" ||
      (cfg.parallel.reduction == "auto" && !cfg.external_workload() && cfg.model.experts == 0);
  if (cfg.external_workload()) c.tp = c.pp = c.ep = 1;  // a user's program: replicas only
  return c;
}

std::string check_plan(const layout& l, const model_config& m, const plan_constraints& c) {
  if (auto why = check_layout(l); !why.empty()) return why;
  const auto fixed = [&](const char* name, int want, int got) {
    return "parallel." + std::string(name) + " is fixed at " + str(want) + " but the layout has " +
           str(got);
  };
  if (c.tp > 0 && l.tp != c.tp) return fixed("tp", c.tp, l.tp);
  if (c.pp > 0 && l.pp != c.pp) return fixed("pp", c.pp, l.pp);
  if (c.ep > 0 && l.ep != c.ep) return fixed("ep", c.ep, l.ep);
  if (auto why = check_inputs(m, c); !why.empty()) return why;
  const std::string t = "tp (" + str(l.tp) + ") must divide ";
  if (m.n_head % l.tp != 0) return t + "model.n_head (" + str(m.n_head) + ")";
  if ((4 * m.d_model) % l.tp != 0)
    return t + "the MLP width 4 * model.d_model (" + str(4 * m.d_model) + ")";
  if (m.vocab % l.tp != 0)
    return t + "model.vocab (" + str(m.vocab) + ") for the vocab-parallel embedding";
  if (l.pp > m.n_layer)
    return "pp (" + str(l.pp) + ") must not exceed model.n_layer (" + str(m.n_layer) +
           "): every stage needs a layer";
  if (l.ep > 1 && m.experts == 0) return "ep (" + str(l.ep) + ") > 1 needs model.experts > 0";
  if (l.ep > 1 && m.experts % l.ep != 0)
    return "ep (" + str(l.ep) + ") must divide model.experts (" + str(m.experts) + ")";
  // MoE (strategies/expert_parallel/ep_backend.cpp): dp x ep only, and each ep group computes
  // whole micro-batches of the one-rank run, its ranks an equal slice each; the dp / ep copies
  // then split the micro-batches, which the dp rule below already keeps whole.
  if (m.experts > 0 && (l.tp > 1 || l.pp > 1))
    return "an MoE model runs over dp x ep only: tp (" + str(l.tp) + ") and pp (" + str(l.pp) +
           ") must be 1; shard the experts with ep";
  if (m.experts > 0 && c.zero == 1)
    return "ZeRO-1 is not supported for MoE models; use parallel.zero = 0";
  if (m.experts > 0 && c.micro_batch % l.ep != 0)
    return "ep (" + str(l.ep) + ") must divide micro_batch (" + str(c.micro_batch) +
           ") so the ep ranks split each micro-batch equally (MoE capacity and aux loss are "
           "per micro-batch); use a micro_batch that is a multiple of ep";
  const int M = step_micro_batches(c);
  // The expert backend runs the plan's micro-batches (batch / M sequences), not micro_batch's.
  if (m.experts > 0 && (c.batch / M) % l.ep != 0)
    return "ep (" + str(l.ep) + ") must divide " + moe_micro_batch(c) +
           " so the ep ranks split each micro-batch equally (MoE capacity and aux loss are per "
           "micro-batch); use fewer --micro-batches or a smaller ep";
  if (M % l.dp != 0)
    return "dp (" + str(l.dp) + ") must divide the " + str(M) +
           " micro-batches of a step (batch / micro_batch) so each replica runs whole "
           "micro-batches; use more tp/pp, fewer ranks, or a batch with more micro-batches";
  const int m_rep = M / l.dp;
  if (l.pp > 1 && m_rep < l.pp)
    return "pp (" + str(l.pp) + ") needs at least " + str(l.pp) +
           " micro-batches per replica to fill the pipeline, but each of the " + str(l.dp) +
           " replicas gets " + str(m_rep) +
           " (batch / micro_batch / dp); use fewer stages or "
           "replicas, or smaller micro-batches";
  if (c.memory_bytes > 0) {
    const double need = estimate_of(l, m, c, stage_layers(m.n_layer, l.pp), M).memory_bytes;
    if (need > c.memory_bytes)
      return "the fullest rank needs about " + memory_text(need) +
             " for weights, gradients and AdamW state, over the memory budget of " +
             memory_text(c.memory_bytes) + "; use more tp/pp/ep or parallel.zero = 1";
  }
  return {};
}

layout_plan make_plan(const layout& l, const model_config& m, const plan_constraints& c) {
  if (auto why = check_plan(l, m, c); !why.empty()) throw std::invalid_argument(why);
  layout_plan p;
  p.shape = l;
  p.stages = stage_layers(m.n_layer, l.pp);
  p.micro_batches = step_micro_batches(c);
  p.micro_batch_size = c.batch / p.micro_batches;
  p.micro_batches_per_replica = p.micro_batches / l.dp;
  p.replica_micro_batches.assign(static_cast<size_t>(l.dp), p.micro_batches_per_replica);
  p.bubble = pipeline_bubble(l.pp, p.micro_batches_per_replica);
  const estimate e = estimate_of(l, m, c, p.stages, p.micro_batches);
  p.params_per_rank = e.params_per_rank;
  p.memory_bytes = e.memory_bytes;
  p.step_seconds = e.step_seconds;
  return p;
}

plan_result plan_layout(int world, const model_config& m, const plan_constraints& c) {
  if (world < 1 || world > max_world)
    return "world (" + str(world) + ") must be between 1 and " + str(max_world) + " ranks";
  if (auto why = check_inputs(m, c); !why.empty()) return why;
  auto found = search(world, m, c);
  if (found.best) return std::move(*found.best);

  // The nearest smaller world that fits: the spare-rank plan, or the fix in the reason.
  std::optional<layout_plan> smaller;
  for (int w = world - 1; w >= 1 && !smaller; --w) {
    auto s = search(w, m, c);
    if (s.best) {
      smaller = std::move(s.best);
      smaller->spares = world - w;
    }
  }
  if (c.allow_spares && smaller) return std::move(*smaller);
  if (micro_batches_rule_out(world, m, c)) return micro_batches_reason(world, c, smaller);

  std::string why = "no layout of " + str(world) + " ranks fits";
  const size_t shown = std::min<size_t>(found.rejected.size(), 6);
  for (size_t i = 0; i < shown; ++i) why += (i ? "; " : ": ") + found.rejected[i];
  if (found.rejected.size() > shown)
    why += "; and " + str(static_cast<int>(found.rejected.size() - shown)) + " more";
  if (smaller)
    why += ". Fix: " + str(smaller->shape.world()) + " ranks would fit as " +
           describe(smaller->shape) + " (or allow spare ranks)";
  else
    why +=
        ". Fix: no smaller world fits either; change the batch, micro_batch or the fixed "
        "parallel sizes";
  return why;
}

plan_result plan_layout(int world, const train_config& cfg) {
  return plan_layout(world, cfg.model, constraints_from(cfg));
}

std::string to_json(const layout_plan& p) {
  std::string stages;
  for (size_t i = 0; i < p.stages.size(); ++i)
    stages += (i ? "," : "") + std::string("[") + str(p.stages[i].first) + "," +
              str(p.stages[i].last) + "]";
  // Runs of equal counts, [[replicas, count], ...]: the plan goes to every rank, and one entry
  // per replica would make that quadratic in the world; a plan has at most two distinct counts
  // unless a rebalance chose them.
  std::string runs;
  const auto& counts = p.replica_micro_batches;
  for (size_t i = 0, end = 0; i < counts.size(); i = end) {
    while (end < counts.size() && counts[end] == counts[i]) ++end;
    runs += (i ? ",[" : "[") + str(static_cast<int>(end - i)) + "," + str(counts[i]) + "]";
  }
  const std::string nums =
      "\"bubble\":" + exact(p.bubble) + ",\"params_per_rank\":" + exact(p.params_per_rank) +
      ",\"memory_bytes\":" + exact(p.memory_bytes) + ",\"step_seconds\":" + exact(p.step_seconds);
  return "{\"layout\":" + to_json(p.shape) + ",\"spares\":" + str(p.spares) + ",\"stages\":[" +
         stages + "],\"micro_batches\":" + str(p.micro_batches) +
         ",\"micro_batch_size\":" + str(p.micro_batch_size) +
         ",\"micro_batches_per_replica\":" + str(p.micro_batches_per_replica) +
         ",\"replica_micro_batch_runs\":[" + runs + "]," + nums + "}";
}

namespace {
// A double as to_json writes it, as a JSON value: null when not finite, and an integer when its
// shortest form has neither a fraction nor an exponent ("0", not "0.0"), so that it dumps to
// the same text as to_json's reads back to.
nlohmann::json number(double x) {
  if (!std::isfinite(x)) return nullptr;
  const std::string text = exact(x);
  if (text.find_first_of(".e") != std::string::npos) return x;
  int64_t whole = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), whole);
  if (r.ec != std::errc()) return x;
  return whole;
}
}  // namespace

nlohmann::json plan_doc(const layout_plan& p, int zero) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : p.stages) stages.push_back({s.first, s.last});
  return {{"layout", layout_doc(p.shape)},
          {"spares", p.spares},
          {"stages", std::move(stages)},
          {"micro_batches", p.micro_batches},
          {"micro_batch_size", p.micro_batch_size},
          {"micro_batches_per_replica", p.micro_batches_per_replica},
          {"replica_micro_batches", p.replica_micro_batches},
          {"bubble", number(p.bubble)},
          {"params_per_rank", number(p.params_per_rank)},
          {"memory_bytes", number(p.memory_bytes)},
          {"step_seconds", number(p.step_seconds)},
          {"describe", describe(p.shape)},
          {"zero", zero}};
}

}  // namespace troupe::strategies
