#include "actors/coordinator/job/generation_plan.hpp"

#include <algorithm>

#include "monitoring/events/events.hpp"
#include "runtime/comm/host_communicator.hpp"
#include "strategies/exact_reducer.hpp"
#include "strategies/mesh.hpp"

namespace troupe::actors {

namespace {

using nlohmann::json;

// What counts as the same reason twice. A pair signed with another key is never answered: its
// connecting side sees a timeout, its listening side the kernel's dropped segments; one
// reason, seen from either side.
std::string failure_family(const std::string& cause) {
  return cause == "signature" ? "timed-out" : cause;
}

// The transport a group of all the generation's ranks picks (comm::choose_transport). Each
// member told the coordinator its request and its host when it joined (hello::transport): the
// very inputs the group's rank 0 decides from, so the coordinator names the choice without
// asking anyone. Smaller groups (tp, pp) decide the same way over their own ranks.
events::transport data_plane(const membership& members, int world) {
  events::transport t;
  t.world = world;
  std::vector<std::string> requested(static_cast<size_t>(world), "auto"),
      hosts(static_cast<size_t>(world));
  for (const auto& m : members.members()) {
    if (!m.live || m.rank < 0 || m.rank >= world) continue;
    const auto nl = m.transport.find('\n');
    requested[static_cast<size_t>(m.rank)] = m.transport.substr(0, nl);
    hosts[static_cast<size_t>(m.rank)] =
        nl == std::string::npos ? std::string() : m.transport.substr(nl + 1);
  }
  const auto layout = comm::node_layout::of_hosts(hosts);
  t.nodes = layout.nodes();
  std::vector<int> ranks_on(static_cast<size_t>(t.nodes), 0);
  for (int n : layout.node_of)
    t.ranks_per_node = std::max(t.ranks_per_node, ++ranks_on[static_cast<size_t>(n)]);
  try {
    switch (comm::choose_transport(requested, hosts)) {
      case comm::transport_kind::shm:
        t.backend = "shm";
        break;
      case comm::transport_kind::hierarchical:
        t.backend = "hierarchical";
        break;
      case comm::transport_kind::tcp:
        t.backend = "tcp";
        break;
      case comm::transport_kind::null:
        t.backend = "null";
        break;
    }
  } catch (const comm::comm_error&) {
    // shm asked for across hosts, or null by some ranks only: the group cannot connect.
    t.backend = "invalid";
  }
  return t;
}

// Where the ranks of a generation got their state, in one event (see restored_summary).
events::restored_summary restored_in_all(const std::map<int32_t, reconfigured>& done,
                                         const restore_plan& restore, uint64_t generation) {
  events::restored_summary all;
  all.generation = generation;
  all.step = restore.start_step;
  std::vector<uint64_t> bytes;
  std::vector<double> seconds;
  for (const auto& [rank, r] : done) {
    const auto source = restore.source[static_cast<size_t>(rank)];
    ++all.from[to_string(source)];
    if (source == state_source::checkpoint) all.checkpoint_step = restore.start_step;
    all.bytes += r.bytes;
    all.from_memory_bytes += r.memory_bytes;
    bytes.push_back(r.bytes);
    seconds.push_back(r.seconds);
  }
  all.ranks = static_cast<int32_t>(done.size());
  all.rank_bytes = events::spread_of(std::move(bytes));
  all.rank_seconds = events::spread_of(std::move(seconds));
  return all;
}

}  // namespace

replanner::replanner(const job_params& p)
    : model(p.cfg.model),
      // Parameters made by hand (tests) without the description get their config's.
      constraints(p.workload.name.empty() ? strategies::describe_workload(p.cfg).constraints
                                          : p.workload.constraints),
      bounds(p.bounds) {}

strategies::plan_result replanner::operator()(const strategies::layout_plan& previous,
                                              int live) const {
  return strategies::replan_layout(previous, live, model, constraints, bounds);
}

int replanner::world_for(const strategies::layout_plan& previous, int live) const {
  const auto planned = (*this)(previous, live);
  return strategies::has_plan(planned) ? strategies::plan_of(planned).shape.world() : 0;
}

generation_plan::generation_plan(const job_params& p)
    : replan_(p),
      reduction_cfg_(p.cfg),
      zero_(p.cfg.parallel.zero),
      rank_labels_(p.cfg.metrics_rank_labels),
      plan_(p.plan) {}

void generation_plan::begin_recovery(const std::string& reason, logic_time now) {
  started_ = now;
  reason_ = reason;
}

strategies::plan_result generation_plan::next(
    uint64_t generation, int live, const std::optional<std::vector<int>>& rebalanced) const {
  // The first plan, unless a first member never joined and the job forms without it.
  if (generation <= 1 && live >= plan_.shape.world()) return plan_;
  auto planned = replan_(plan_, live);
  if (!strategies::has_plan(planned)) return planned;
  strategies::layout_plan next = strategies::plan_of(planned);
  if (rebalanced && next.shape == plan_.shape &&
      static_cast<int>(rebalanced->size()) == next.shape.dp) {
    next.replica_micro_batches = *rebalanced;
    next.micro_batches_per_replica = *std::max_element(rebalanced->begin(), rebalanced->end());
  }
  return next;
}

void generation_plan::adopt(uint64_t generation, const strategies::layout_plan& next,
                            const std::vector<member_info>& live, int64_t restore_step,
                            int64_t checkpoint_step) {
  restore_ = plan_restore(live, plans_, next, zero_, restore_step, checkpoint_step);
  plan_ = next;
  plans_[generation] = next;
}

void generation_plan::reconfigures(const membership& members, const std::vector<int64_t>& skipped,
                                   actions& out) {
  const std::string plan_json = strategies::to_json(plan_);
  one_host_ = members.ranks_share_one_host();
  transport_ = data_plane(members, world());
  const auto receivers = peer_receivers(restore_);
  for (const auto& m : members.members()) {
    if (!m.live) continue;
    reconfigure msg;
    msg.generation = members.generation();
    msg.member = m.id;
    msg.rank = m.rank;
    msg.world = plan_.shape.world();
    msg.plan_json = plan_json;
    msg.start_step = restore_.start_step;
    msg.reason = reason_;
    msg.skipped_steps = skipped;
    msg.one_host = one_host_;
    if (m.rank >= 0) {
      msg.source = restore_.source[static_cast<size_t>(m.rank)];
      msg.source_rank = restore_.source_rank[static_cast<size_t>(m.rank)];
      msg.send_to = receivers[static_cast<size_t>(m.rank)];
    } else {
      msg.source = state_source::none;
    }
    out.push_back(send_reconfigure{m.id, std::move(msg)});
  }
}

void generation_plan::record_restored(const reconfigured& r) {
  if (r.rank >= 0) restored_[r.rank] = r;
}

std::optional<std::string> generation_plan::connect_failure(const reconfigured& r, actions& out) {
  if (r.error_cause.empty()) {
    connect_failed_.reset();
    return std::nullopt;
  }
  const auto space = r.error_cause.find(' ');
  connect_failure_seen seen{r.generation, r.error_cause.substr(0, space),
                            space == std::string::npos ? "" : r.error_cause.substr(space + 1)};
  out.push_back(emit_event{events::connect_failed{.generation = r.generation,
                                                  .member = r.member,
                                                  .rank = r.rank,
                                                  .cause = seen.cause,
                                                  .address = seen.address,
                                                  .error = r.error}});
  // Consecutive: the generation opened because the one before failed this way, and nothing
  // else (a lost member, a grow) opened another in between. A peer that died or hung is lost
  // first and opens a generation of its own, so a transient failure never gets here twice.
  const bool again = connect_failed_ && connect_failed_->generation + 1 == r.generation &&
                     failure_family(connect_failed_->cause) == failure_family(seen.cause);
  if (!again) {
    connect_failed_ = std::move(seen);
    return std::nullopt;
  }
  const auto& before = *connect_failed_;
  const std::string causes = before.cause == seen.cause && before.address == seen.address
                                 ? seen.cause + ": " + seen.address
                                 : before.cause + ": " + before.address + ", then " +
                                       (before.cause == seen.cause ? "" : seen.cause + ": ") +
                                       seen.address;
  return "generation " + std::to_string(r.generation) + " could not connect its groups, as " +
         "generation " + std::to_string(before.generation) + " could not, for the same " +
         "reason (" + causes + "); a retry would fail again: member " + std::to_string(r.member) +
         ": " + r.error;
}

void generation_plan::formed(uint64_t generation, int spares, int64_t committed, logic_time now,
                             actions& out) {
  const double took = std::chrono::duration<double>(now - started_).count();
  // A line per rank tells a small job's recovery; ten thousand lines would tell less than their
  // spread does.
  if (world() > rank_labels_) {
    if (!restored_.empty())
      out.push_back(emit_event{restored_in_all(restored_, restore_, generation)});
  } else {
    for (const auto& [rank, done] : restored_) {
      const auto source = restore_.source[static_cast<size_t>(rank)];
      const size_t r = static_cast<size_t>(rank);
      events::restored piece{.rank = rank,
                             .member = done.member,
                             .generation = generation,
                             .from = to_string(source),
                             .bytes = done.bytes,
                             .seconds = done.seconds,
                             .step = restore_.start_step,
                             .from_memory_bytes = done.memory_bytes > 0
                                                      ? std::optional<uint64_t>(done.memory_bytes)
                                                      : std::nullopt,
                             .peer_rank = source == state_source::peer
                                              ? std::optional<int32_t>(restore_.source_rank[r])
                                              : std::nullopt,
                             .checkpoint_step = source == state_source::checkpoint
                                                    ? std::optional<int64_t>(restore_.start_step)
                                                    : std::nullopt};
      out.push_back(emit_event{std::move(piece)});
    }
  }
  out.push_back(emit_event{events::generation{.number = generation,
                                              .world = world(),
                                              .spares = spares,
                                              .plan = strategies::plan_doc(plan_, zero_),
                                              .reason = reason_,
                                              .cause = cause_,
                                              .start_step = restore_.start_step,
                                              .planned_with_abort = planned_with_abort_,
                                              .shrunk = shrunk_,
                                              .recovery_s = generation > 1 ? took : 0.0}});
  transport_.generation = generation;
  transport_.shrunk = shrunk_;
  out.push_back(emit_event{transport_});
  // The first generation that forms starts training; under load that may be generation 2
  // or later, when a member was lost while the first one connected.
  if (!training_announced_) {
    training_announced_ = true;
    nlohmann::json layout = strategies::plan_doc(plan_, zero_);
    layout["reduction"] =
        strategies::reduces_exactly(reduction_cfg_, plan_.shape) ? "exact" : "fast";
    out.push_back(emit_event{events::training_started{.world = world(),
                                                      .generation = generation,
                                                      .start_step = committed,
                                                      .layout = std::move(layout)}});
  }
  cause_.clear();
}

}  // namespace troupe::actors
