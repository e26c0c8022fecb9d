// job_logic, the first half: members joining, generations formed and planned, the votes of
// each step and stragglers. The second half is in job_logic_lifecycle.cpp.
#include "actors/job_logic.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "runtime/comm/communicator.hpp"
#include "strategies/mesh.hpp"

namespace troupe::actors {

const char* to_string(job_state s) {
  switch (s) {
    case job_state::forming:
      return "forming";
    case job_state::training:
      return "training";
    case job_state::recovering:
      return "recovering";
    case job_state::done:
      return "done";
    case job_state::failed:
      return "failed";
  }
  return "unknown";
}

const char* to_string(loss_cause c) {
  switch (c) {
    case loss_cause::exit:
      return "exit";
    case loss_cause::connection:
      return "connection";
    case loss_cause::hang:
      return "hang";
    case loss_cause::straggler:
      return "straggler";
    case loss_cause::error:
      return "error";
  }
  return "unknown";
}

bool checkpoint_due(int64_t step, int64_t total_steps, int every) {
  return step == total_steps || (every > 0 && step % every == 0);
}

bool evaluation_due(int64_t step, int64_t total_steps, int every) {
  return checkpoint_due(step, total_steps, every);
}

namespace {

using nlohmann::json;

double seconds_between(logic_time a, logic_time b) {
  return std::chrono::duration<double>(b - a).count();
}

// A loss or norm as a message shows it: "nan", "-inf", "-0.5312".
std::string number_words(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

// The plan as events.jsonl shows it: the planner's figures, a readable name and ZeRO.
json plan_doc(const strategies::layout_plan& p, int zero) {
  json doc = json::parse(strategies::to_json(p));
  doc["describe"] = strategies::describe(p.shape);
  doc["zero"] = zero;
  return doc;
}

}  // namespace

job_logic::job_logic(job_params params, logic_time now)
    : params_(std::move(params)),
      plan_(params_.plan),
      committed_(params_.start_step),
      checkpoint_step_(params_.checkpoint_step),
      stragglers_(straggler_options{}),
      skipped_(params_.skipped_steps) {
  std::sort(skipped_.begin(), skipped_.end());
  deadline_ = now + params_.form_timeout;
  last_commit_ = now;
  latest_ = now;
}

member_info* job_logic::find(int32_t member) {
  for (auto& m : members_)
    if (m.id == member) return &m;
  return nullptr;
}

int job_logic::live_count() const {
  return static_cast<int>(
      std::count_if(members_.begin(), members_.end(), [](const member_info& m) { return m.live; }));
}

int32_t job_logic::member_of_rank(int32_t rank) const {
  for (const auto& m : members_)
    if (m.live && m.rank == rank && rank >= 0) return m.id;
  return -1;
}

std::vector<double> job_logic::heartbeat_ages(logic_time now) const {
  std::vector<double> ages(static_cast<size_t>(world()), 0.0);
  for (const auto& m : members_)
    if (m.live && m.rank >= 0 && m.rank < world())
      ages[static_cast<size_t>(m.rank)] = seconds_between(m.last_heartbeat, now);
  return ages;
}

void job_logic::set_state(job_state s, actions& out, const std::string& why) {
  if (s == state_) return;
  out.push_back(emit_event{{{"event", "state"},
                            {"from", to_string(state_)},
                            {"to", to_string(s)},
                            {"value", static_cast<int>(s)},
                            {"generation", generation_},
                            {"step", committed_},
                            {"reason", why}}});
  state_ = s;
}

void job_logic::stale(const std::string& what, int32_t member, uint64_t generation, actions& out) {
  ++stale_;
  out.push_back(emit_event{{{"event", "stale_message"},
                            {"message", what},
                            {"member", member},
                            {"message_generation", generation},
                            {"generation", generation_}}});
}

actions job_logic::on_member_joined(const hello& h, logic_time now, welcome& answer) {
  actions out;
  answer.generation = generation_;
  if (h.protocol != protocol_version) {
    answer.error = "protocol version " + std::to_string(h.protocol) + " != coordinator's " +
                   std::to_string(protocol_version) + "; run the same troupe build everywhere";
    return out;
  }
  if (ended_) {
    answer.error = "the job is over";
    return out;
  }
  if (h.member < 0) {
    answer.error = "member " + std::to_string(h.member) + " is not a valid member id";
    return out;
  }
  member_info* m = find(h.member);
  if (m && m->live) {
    answer.error = "member " + std::to_string(h.member) + " already joined (a duplicate worker)";
    return out;
  }
  if (!m) {
    members_.push_back(member_info{});
    m = &members_.back();
  }
  *m = member_info{};
  m->id = h.member;
  m->node = h.node;
  m->pid = h.pid;
  m->host = h.host;
  m->transport = h.transport;
  m->last_heartbeat = now;
  // A member that joins a running job waits idle for the next generation; the current one
  // (training, or being formed) does not wait for it.
  m->reported = m->reconfigured = state_ != job_state::forming;
  out.push_back(emit_event{{{"event", "rank_joined"},
                            {"member", h.member},
                            {"rank", h.member},
                            {"pid", h.pid},
                            {"host", h.host},
                            {"node", h.node},
                            {"generation", generation_}}});
  if (state_ == job_state::recovering) {
    if (auto it = awaited_.find(h.node); it != awaited_.end() && it->second > 0) --it->second;
    if (plan_held_ && awaited() == 0) plan_generation(now, out);  // it takes its old place
  }
  if (state_ == job_state::forming && live_count() == params_.members) {
    generation_ = 1;
    recovery_reason_ = "start";
    recovery_started_ = now;
    for (auto& x : members_) x.reported = true;
    plan_generation(now, out);
  }
  return out;
}

void job_logic::begin_generation(const std::string& reason, logic_time now, actions& out) {
  if (ended_) return;
  if (halting_) {
    // A member was lost or a vote failed while the job was stopping: stop now, or roll back
    // now, without waiting any longer for checkpoints in flight.
    if (take_halt(out)) return;
  }
  // Set before the state changes: whether every member holds what the planner would ask.
  const bool was_training = state_ == job_state::training;
  if (state_ != job_state::recovering) {
    recovery_started_ = now;
    recovery_reason_ = reason;
  }
  if (++failed_recoveries_ > params_.max_failed_recoveries) {
    finish(1,
           "gave up after " + std::to_string(params_.max_failed_recoveries) +
               " recoveries without a committed step; last: " + reason,
           out);
    return;
  }
  if (live_count() < std::max(1, params_.bounds.min_ranks)) {
    finish(1,
           reason + "; " + std::to_string(live_count()) + " ranks left, fewer than --min-ranks " +
               std::to_string(std::max(1, params_.bounds.min_ranks)) +
               "; resume with --resume from " +
               (checkpoint_path_.empty() ? std::string("the start (no checkpoint yet)")
                                         : checkpoint_path_),
           out);
    return;
  }
  ++generation_;
  plan_held_ = false;  // every live member reports again first
  set_state(job_state::recovering, out, reason);
  pending_ = votes{};
  votes_held_ = false;
  pending_failure_.clear();
  failure_reports_.clear();
  abandon_collections(reason, out);
  eval_step_ = -1;
  restored_.clear();
  const size_t first_abort = out.size();
  for (auto& m : members_) {
    if (!m.live) continue;
    m.reported = m.reconfigured = false;
    out.push_back(send_abort{m.id, abort_generation{generation_, reason, false, {}}});
  }
  // A member has a heartbeat timeout to answer; one that cannot is lost too.
  deadline_ = now + 2 * params_.heartbeat_timeout + std::chrono::milliseconds(1000);
  planned_with_abort_ = false;
  shrunk_ = false;
  if (was_training && can_plan_without_reports()) plan_with_aborts(first_abort, now, out);
}

bool job_logic::can_plan_without_reports() const {
  // In the middle of training every placed member holds its rank's state at the last
  // committed step (a commit reaches a rank before the abort that follows it), and an idle
  // member holds nothing. A rollback, the steps after the last one, and restarted workers
  // to wait for all change that picture; they take the report round. So does a layout whose
  // update is itself a collective (ZeRO's all-gather, the global gradient norm across tensor,
  // pipeline or expert ranks): the abort can catch a rank in the middle of it, and the wrong
  // guess then costs a failed generation more than the reports would have.
  if (!params_.plan_with_abort || rollback_ || finishing_) return false;
  const auto& shape = plan_.shape;
  if (params_.cfg.parallel.zero > 0 || shape.tp > 1 || shape.pp > 1 || shape.ep > 1) return false;
  const int expected = awaited();
  return expected == 0 || !waiting_adds_ranks(expected);
}

void job_logic::plan_with_aborts(size_t first_abort, logic_time now, actions& out) {
  for (auto& m : members_) {
    if (!m.live) continue;
    m.reported = true;
    const bool placed = m.rank >= 0;
    m.held_generation = placed ? generation_ - 1 : 0;
    m.held_rank = placed ? m.rank : -1;
    m.held_step = placed ? committed_ : -1;
  }
  const strategies::layout before = plan_.shape;
  const bool before_one_host = one_host_;
  actions planned;
  plan_generation(now, planned);
  const auto kept = ended_ ? std::vector<int32_t>{} : shrinkable(before, before_one_host);
  shrunk_ = !kept.empty();
  for (auto& a : planned) {
    auto* rc = std::get_if<send_reconfigure>(&a);
    if (rc && shrunk_ && rc->msg.rank >= 0) {
      rc->msg.shrink_kept = kept;
      rc->msg.shrink_from = generation_ - 1;
    }
    send_abort* carrier = nullptr;
    for (size_t i = first_abort; rc && !carrier && i < out.size(); ++i)
      if (auto* ab = std::get_if<send_abort>(&out[i]); ab && ab->member == rc->member) carrier = ab;
    if (carrier)
      carrier->msg.then.push_back(std::move(rc->msg));
    else
      out.push_back(std::move(a));
  }
  planned_with_abort_ = !ended_;
}

std::vector<int32_t> job_logic::shrinkable(const strategies::layout& before,
                                           bool before_one_host) const {
  const auto plain_dp = [](const strategies::layout& l) {
    return l.tp == 1 && l.pp == 1 && l.ep == 1;
  };
  if (!params_.shrink_groups || !before_one_host || !one_host_ || !plain_dp(before) ||
      !plain_dp(plan_.shape) || params_.cfg.parallel.zero > 0)
    return {};
  std::vector<int32_t> kept;
  for (size_t r = 0; r < restore_.member_of_rank.size(); ++r) {
    const member_info* m = nullptr;
    for (const auto& x : members_)
      if (x.id == restore_.member_of_rank[r]) m = &x;
    // Every new rank must be an old one that keeps its own state: a newcomer or a rank
    // restored otherwise needs a connect (and the old group has no place for it).
    if (!m || restore_.source[r] != state_source::self || m->held_rank < 0 ||
        m->held_generation != generation_ - 1)
      return {};
    kept.push_back(m->held_rank);
  }
  return kept;
}

void job_logic::plan_generation(logic_time now, actions& out) {
  // Who has not rejoined by now joins later and is admitted by a grow.
  plan_held_ = false;
  awaited_.clear();
  std::vector<member_info> live;
  for (const auto& m : members_)
    if (m.live) live.push_back(m);
  strategies::layout_plan next = plan_;
  if (generation_ > 1) {
    auto c = strategies::constraints_from(params_.cfg);
    auto bounds = params_.bounds;
    auto planned = strategies::replan_layout(plan_, static_cast<int>(live.size()),
                                             params_.cfg.model, c, bounds);
    if (!strategies::has_plan(planned)) {
      finish(1,
             "no layout fits the " + std::to_string(live.size()) +
                 " live ranks: " + strategies::reason_of(planned),
             out);
      return;
    }
    next = strategies::plan_of(planned);
    if (rebalanced_ && next.shape == plan_.shape &&
        static_cast<int>(rebalanced_->size()) == next.shape.dp) {
      next.replica_micro_batches = *rebalanced_;
      next.micro_batches_per_replica = *std::max_element(rebalanced_->begin(), rebalanced_->end());
    }
  }
  rebalanced_.reset();
  // After a divergence the state the members hold is suspect: every rank goes back to the last
  // committed checkpoint (a member holding exactly that step may keep it).
  const int64_t restore_step = rollback_ ? std::max<int64_t>(checkpoint_step_, 0) : committed_;
  rollback_ = false;
  restore_ =
      plan_restore(live, plans_, next, params_.cfg.parallel.zero, restore_step, checkpoint_step_);
  plan_ = next;
  plans_[generation_] = next;
  committed_ = restore_.start_step;
  for (auto& m : members_) {
    m.rank = -1;
    m.reconfigured = false;
  }
  for (size_t r = 0; r < restore_.member_of_rank.size(); ++r)
    if (auto* m = find(restore_.member_of_rank[r])) m->rank = static_cast<int32_t>(r);
  const std::string plan_json = strategies::to_json(next);
  const bool one_host = ranks_share_one_host();
  one_host_ = one_host;
  for (auto& m : members_) {
    if (!m.live) continue;
    reconfigure msg;
    msg.generation = generation_;
    msg.member = m.id;
    msg.rank = m.rank;
    msg.world = next.shape.world();
    msg.plan_json = plan_json;
    msg.start_step = restore_.start_step;
    msg.reason = recovery_reason_;
    msg.skipped_steps = skipped_;
    msg.one_host = one_host;
    if (m.rank >= 0) {
      msg.source = restore_.source[static_cast<size_t>(m.rank)];
      msg.source_rank = restore_.source_rank[static_cast<size_t>(m.rank)];
      for (size_t r = 0; r < restore_.source_rank.size(); ++r)
        if (restore_.source[r] == state_source::peer && restore_.source_rank[r] == m.rank)
          msg.send_to.push_back(static_cast<int32_t>(r));
    } else {
      msg.source = state_source::none;
    }
    out.push_back(send_reconfigure{m.id, std::move(msg)});
  }
  // Building communicators and moving state: bounded like any collective.
  deadline_ =
      now + std::chrono::milliseconds(params_.cfg.step_timeout_ms) + params_.heartbeat_timeout;
}

actions job_logic::on_state_report(const state_report& r, logic_time now) {
  actions out;
  member_info* m = find(r.member);
  if (!m || !m->live || r.generation != generation_ || state_ != job_state::recovering) {
    stale("state_report", r.member, r.generation, out);
    return out;
  }
  if (m->reported) return out;  // a duplicate, or a member that joined after the abort
  m->reported = true;
  m->held_generation = r.held_generation;
  m->held_rank = r.held_rank;
  m->held_step = r.held_step;
  for (const auto& x : members_)
    if (x.live && !x.reported) return out;
  plan_or_wait(now, out);
  return out;
}

namespace {

// What counts as the same reason twice. A pair signed with another key is never answered: its
// connecting side sees a timeout, its listening side the kernel's dropped segments; one
// reason, seen from either side.
std::string failure_family(const std::string& cause) {
  return cause == "signature" ? "timed-out" : cause;
}

}  // namespace

bool job_logic::fails_the_same_way(const reconfigured& r, actions& out) {
  if (r.error_cause.empty()) {
    connect_failed_.reset();
    return false;
  }
  const auto space = r.error_cause.find(' ');
  connect_failure_seen seen{r.generation, r.error_cause.substr(0, space),
                            space == std::string::npos ? "" : r.error_cause.substr(space + 1)};
  out.push_back(emit_event{{{"event", "connect_failed"},
                            {"generation", r.generation},
                            {"member", r.member},
                            {"rank", r.rank},
                            {"cause", seen.cause},
                            {"address", seen.address},
                            {"error", r.error}}});
  // Consecutive: the generation opened because the one before failed this way, and nothing
  // else (a lost member, a grow) opened another in between. A peer that died or hung is lost
  // first and opens a generation of its own, so a transient failure never gets here twice.
  const bool again = connect_failed_ && connect_failed_->generation + 1 == r.generation &&
                     failure_family(connect_failed_->cause) == failure_family(seen.cause);
  if (!again) {
    connect_failed_ = std::move(seen);
    return false;
  }
  const auto& before = *connect_failed_;
  const std::string causes = before.cause == seen.cause && before.address == seen.address
                                 ? seen.cause + ": " + seen.address
                                 : before.cause + ": " + before.address + ", then " +
                                       (before.cause == seen.cause ? "" : seen.cause + ": ") +
                                       seen.address;
  finish(1,
         "generation " + std::to_string(r.generation) + " could not connect its groups, as " +
             "generation " + std::to_string(before.generation) + " could not, for the same " +
             "reason (" + causes + "); a retry would fail again: member " +
             std::to_string(r.member) + ": " + r.error,
         out);
  return true;
}

actions job_logic::on_reconfigured(const reconfigured& r, logic_time now) {
  actions out;
  latest_ = std::max(latest_, now);
  member_info* m = find(r.member);
  if (!m || !m->live || r.generation != generation_ || state_ == job_state::training || ended_) {
    stale("reconfigured", r.member, r.generation, out);
    return out;
  }
  if (!r.ok) {
    if (fails_the_same_way(r, out)) return out;
    begin_generation("member " + std::to_string(r.member) + " could not join generation " +
                         std::to_string(r.generation) + ": " + r.error,
                     now, out);
    return out;
  }
  m->reconfigured = true;
  if (r.rank >= 0) restored_[r.rank] = r;
  for (const auto& x : members_)
    if (x.live && !x.reconfigured) return out;

  // Every member is in: the generation trains.
  const double took = seconds_between(recovery_started_, now);
  for (const auto& [rank, done] : restored_) {
    const auto source = restore_.source[static_cast<size_t>(rank)];
    json piece = {{"event", "restored"},       {"rank", rank},
                  {"member", done.member},     {"generation", generation_},
                  {"from", to_string(source)}, {"bytes", done.bytes},
                  {"seconds", done.seconds},   {"step", restore_.start_step}};
    if (done.memory_bytes > 0) piece["from_memory_bytes"] = done.memory_bytes;
    if (source == state_source::peer)
      piece["peer_rank"] = restore_.source_rank[static_cast<size_t>(rank)];
    if (source == state_source::checkpoint) piece["checkpoint_step"] = restore_.start_step;
    out.push_back(emit_event{std::move(piece)});
  }
  int spares = 0;
  for (const auto& x : members_) spares += x.live && x.rank < 0;
  out.push_back(emit_event{{{"event", "generation"},
                            {"number", generation_},
                            {"world", world()},
                            {"spares", spares},
                            {"plan", plan_doc(plan_, params_.cfg.parallel.zero)},
                            {"reason", recovery_reason_},
                            {"cause", recovery_cause_},
                            {"start_step", restore_.start_step},
                            {"planned_with_abort", planned_with_abort_},
                            {"shrunk", shrunk_},
                            {"recovery_s", generation_ > 1 ? took : 0.0}}});
  // The first generation that forms starts training; under load that may be generation 2
  // or later, when a member was lost while the first one connected.
  if (!training_announced_) {
    training_announced_ = true;
    out.push_back(emit_event{{{"event", "training_started"},
                              {"world", world()},
                              {"generation", generation_},
                              {"start_step", committed_},
                              {"layout", plan_doc(plan_, params_.cfg.parallel.zero)}}});
  }
  recovery_cause_.clear();
  set_state(job_state::training, out, recovery_reason_);
  stragglers_.reset();
  flagged_.assign(static_cast<size_t>(world()), false);
  last_commit_ = now;
  deadline_ = now + std::chrono::milliseconds(2LL * params_.cfg.step_timeout_ms);
  if (committed_ < session_last_step(params_.cfg)) {
    // Ranks that finished reconfiguring first may already have voted for the next step.
    if (pending_.count == world()) votes_complete(now, out);
  } else {
    // Recovered after the last step: the final checkpoint and validation come from the
    // new generation (its ranks hold the last step's state).
    finishing_ = true;
    commit c{generation_, committed_, checkpoint_step_ != committed_, false, 0.0};
    for (const auto& x : members_)
      if (x.live && x.rank >= 0) out.push_back(send_commit{x.id, c});
    if (c.checkpoint) start_collecting(committed_);
    maybe_finish(out);
  }
  return out;
}

actions job_logic::on_vote(const step_done& v, logic_time now) {
  actions out;
  if (ended_) return out;
  latest_ = std::max(latest_, now);
  const int32_t member = member_of_rank(v.rank);
  // Votes of the generation being formed count too: a rank that finished reconfiguring starts
  // its step while the coordinator may still wait for another rank's acknowledgement.
  const auto* voter = member >= 0 ? find(member) : nullptr;
  if (v.generation != generation_ || member < 0 || !voter ||
      (state_ != job_state::training &&
       !((state_ == job_state::recovering || state_ == job_state::forming) &&
         voter->reconfigured))) {
    stale("step_done", member, v.generation, out);
    return out;
  }
  if (!v.ok) {
    // A rank whose peer died reports the broken collective, often before the peer's own
    // loss reaches us; the root cause gets a moment to arrive so the verdict names it.
    failure_reports_[v.rank] = v.error_kind;
    if (pending_failure_.empty()) {
      pending_failure_ =
          "rank " + std::to_string(v.rank) + " failed step " + std::to_string(v.step) + " (" +
          (v.error_op.empty() ? std::string("step") : v.error_op) +
          (v.error_group.empty() ? "" : ", group " + v.error_group) + "): " + v.error;
      settle_deadline_ = now + params_.settle;
    }
    return out;
  }
  auto& p = pending_;
  if (p.step != v.step) {
    p = votes{};
    p.step = v.step;
    p.arrived.assign(static_cast<size_t>(world()), now);
    p.rank_compute_s.assign(static_cast<size_t>(world()), std::nan(""));
  }
  p.arrived[static_cast<size_t>(v.rank)] = now;
  p.rank_compute_s[static_cast<size_t>(v.rank)] =
      v.compute_cpu_s > 0 ? v.compute_cpu_s : v.compute_s;
  ++p.count;
  const double loss_sum = wire_decode(v.loss_sum, v.loss_class);
  const double grad_norm = wire_decode(v.grad_norm, v.grad_norm_class);
  p.loss_sum += loss_sum;
  p.tokens += v.tokens;
  p.lr = v.lr;
  p.compute_s += v.compute_s;
  p.comm_s += v.comm_s;
  p.control_s += v.control_s;
  p.peer_wait_s += v.peer_wait_s;
  // Divergence: a cross-entropy cannot be negative, and neither it nor a norm can be infinite.
  if (p.diverged.empty()) {
    const std::string where = " on rank " + std::to_string(v.rank);
    const double rank_loss = v.tokens > 0 ? loss_sum / static_cast<double>(v.tokens) : loss_sum;
    if (!std::isfinite(loss_sum))
      p.diverged = "loss " + number_words(rank_loss) + where + " (not finite)";
    else if (loss_sum < 0)
      p.diverged = "loss " + number_words(rank_loss) + where + " (a cross-entropy below zero)";
    else if (!std::isfinite(grad_norm))
      p.diverged = "gradient norm " + number_words(grad_norm) + where + " (not finite)";
  }
  if (v.optim_state_bytes > 0)
    out.push_back(emit_event{{{"event", "memory"},
                              {"rank", v.rank},
                              {"step", v.step},
                              {"generation", generation_},
                              {"optimizer_state_bytes", v.optim_state_bytes},
                              {"peak_rss_bytes", v.peak_rss_bytes},
                              {"zero", params_.cfg.parallel.zero}}});
  if (p.count == world() && state_ == job_state::training) votes_complete(now, out);
  return out;
}

bool job_logic::checkpoint_wanted(int64_t step) const {
  const auto& cfg = params_.cfg;
  // A step replayed after a recovery may already have its checkpoint.
  return step > checkpoint_step_ &&
         (checkpoint_due(step, session_last_step(cfg), cfg.checkpoint_every) ||
          (owed_ && step >= owed_->from) || preempting_);
}

bool job_logic::previous_checkpoint_blocks(int64_t step) const {
  return checkpoints_in_flight() && !halting_ && checkpoint_wanted(step);
}

void job_logic::votes_complete(logic_time now, actions& out) {
  if (params_.cfg.checkpoint_overlap == "wait" && previous_checkpoint_blocks(pending_.step)) {
    // Deciding this step would ask for a second checkpoint while the first is not committed:
    // the ranks wait for the commit message instead, and a crash loses at most one interval.
    votes_held_ = true;
    return;
  }
  all_votes_in(now, out);
}

void job_logic::release_held_votes(actions& out) {
  if (!votes_held_ || checkpoints_in_flight()) return;
  votes_held_ = false;
  if (state_ == job_state::training && pending_.count == world()) all_votes_in(latest_, out);
}

void job_logic::all_votes_in(logic_time now, actions& out) {
  auto& v = pending_;
  const auto& cfg = params_.cfg;
  const int w = world();
  const int64_t step = v.step;
  const double loss = v.tokens > 0 ? v.loss_sum / static_cast<double>(v.tokens) : 0.0;
  if (halting_) {  // stopping: no step is committed any more
    pending_ = votes{};
    return;
  }
  std::string why = v.diverged;
  if (why.empty() && !std::isfinite(loss)) why = "loss " + number_words(loss) + " (not finite)";
  if (why.empty() && loss < 0) why = "loss " + number_words(loss) + " (a cross-entropy below zero)";
  if (!why.empty()) {
    pending_ = votes{};
    diverged(step, why, now, out);
    return;
  }
  const double step_s = seconds_between(last_commit_, now);
  last_commit_ = now;
  committed_ = step;
  last_loss_ = loss;
  tokens_trained_ += v.tokens;
  failed_recoveries_ = 0;

  const int64_t last = session_last_step(cfg);
  // Members waiting to join open a generation at this step boundary; the ranks then hold
  // after applying instead of starting a step the abort would throw away.
  const bool grow = step < last && !preempting_ && grow_wanted();
  const bool evaluate = evaluation_due(step, last, cfg.eval_every) && !(preempting_ && step < last);
  commit c{generation_, step, checkpoint_wanted(step), evaluate, 0.0, grow};
  if (c.checkpoint && previous_checkpoint_blocks(step)) {  // checkpoint_overlap skip
    c.checkpoint = false;
    out.push_back(emit_event{{{"event", "checkpoint_skipped"},
                              {"step", step},
                              {"reason",
                               "the previous checkpoint was not committed yet "
                               "(checkpoint_overlap skip)"}}});
  }
  for (const auto& m : members_) {
    if (!m.live || m.rank < 0) continue;
    c.peer_wait_s = seconds_between(v.arrived[static_cast<size_t>(m.rank)], now);
    out.push_back(send_commit{m.id, c});
  }
  if (c.checkpoint) start_collecting(step);
  if (c.evaluate) {
    eval_step_ = step;
    eval_sum_ = 0;
    eval_batches_ = 0;
    evals_in_ = 0;
  }
  out.push_back(
      emit_event{{{"event", "step"},
                  {"step", step},
                  {"loss", loss},
                  {"lr", v.lr},
                  {"tokens", v.tokens},
                  {"tokens_per_s", static_cast<double>(v.tokens) / std::max(step_s, 1e-9)},
                  {"world", w},
                  {"generation", generation_},
                  {"step_s", step_s},
                  {"compute_s", v.compute_s / w},
                  {"comm_s", v.comm_s / w},
                  {"control_s", v.control_s / w},
                  {"peer_wait_s", v.peer_wait_s / w},
                  {"total_steps", cfg.steps}}});
  const auto compute = v.rank_compute_s;
  pending_ = votes{};
  deadline_ = now + std::chrono::milliseconds(2LL * cfg.step_timeout_ms);
  if (step >= last) {
    finishing_ = true;
    maybe_finish(out);
    return;
  }
  if (preempting_) {  // this step's checkpoint is the last thing the job does (on_preempt)
    halting_ = halt{exit_code::requeue, false, step, ""};
    deadline_ = now + std::chrono::milliseconds(cfg.step_timeout_ms);
    maybe_halt(now, false, out);
    return;
  }
  handle_stragglers(compute, now, out);
  if (state_ == job_state::training && grow) {
    recovery_cause_ = "grow";
    begin_generation("members waiting to join: the layout grows", now, out);
  }
}

void job_logic::handle_stragglers(const std::vector<double>& compute_s, logic_time now,
                                  actions& out) {
  for (const auto& verdict : stragglers_.observe(compute_s)) {
    const auto r = static_cast<size_t>(verdict.rank);
    if (r >= flagged_.size() || flagged_[r]) continue;
    flagged_[r] = true;
    out.push_back(emit_event{{{"event", "straggler"},
                              {"rank", verdict.rank},
                              {"member", member_of_rank(verdict.rank)},
                              {"factor", verdict.factor},
                              {"generation", generation_},
                              {"step", committed_},
                              {"policy", params_.straggler_policy}}});
    if (params_.straggler_policy == "evict") {
      recovery_cause_ = "straggler";
      if (auto* m = find(member_of_rank(verdict.rank))) {
        auto more =
            on_member_lost(m->id, loss_cause::straggler,
                           "compute " + std::to_string(verdict.factor) + "x the median", now);
        out.insert(out.end(), more.begin(), more.end());
      }
      return;
    }
    if (params_.straggler_policy == "rebalance" && plan_.shape.dp > 1) {
      // Replica speeds from the smoothed scores of their ranks (the slowest rank of a
      // replica sets its pace); the global batch and the math stay the same.
      // A replica's speed: micro-batches per second of (smoothed) compute, its slowest rank
      // setting the pace; a second rebalance so starts from the counts the first one gave.
      const auto& times = stragglers_.smoothed();
      std::vector<double> speed(static_cast<size_t>(plan_.shape.dp), 1e300);
      for (int rank = 0; rank < world(); ++rank) {
        const auto at = strategies::coords_of(plan_.shape, rank);
        const auto d = static_cast<size_t>(at.dp);
        const double t = static_cast<size_t>(rank) < times.size() ? times[static_cast<size_t>(rank)]
                                                                  : std::nan("");
        const double count =
            d < plan_.replica_micro_batches.size() ? plan_.replica_micro_batches[d] : 1.0;
        if (std::isfinite(t) && t > 0) speed[d] = std::min(speed[d], count / t);
      }
      for (auto& x : speed)
        if (x >= 1e300) x = 0;  // no reports: balance_micro_batches refuses, nothing changes
      // The replicas of one ep group (dp = ep + ep_size * edp) share every micro-batch, so they
      // run equally many: balance the groups, each at the pace of its slowest replica, and give
      // every replica of a group the group's count. With ep = 1 a group is one replica.
      const auto ep = static_cast<size_t>(std::max(1, plan_.shape.ep));
      std::vector<double> group_speed(speed.size() / ep, 1e300);
      for (size_t d = 0; d < speed.size(); ++d)
        group_speed[d / ep] = std::min(group_speed[d / ep], speed[d]);
      const auto group_counts = strategies::balance_micro_batches(
          plan_.micro_batches / static_cast<int>(ep), group_speed, std::max(1, plan_.shape.pp));
      std::vector<int> counts;
      for (size_t d = 0; d < speed.size() && !group_counts.empty(); ++d)
        counts.push_back(group_counts[d / ep]);
      if (!counts.empty() && counts != plan_.replica_micro_batches) {
        rebalanced_ = counts;
        recovery_cause_ = "rebalance";
        begin_generation(
            "rebalancing micro-batches away from straggler rank " + std::to_string(verdict.rank),
            now, out);
        return;
      }
    }
  }
}

bool job_logic::ranks_share_one_host() const {
  std::optional<std::string> host;
  for (const auto& m : members_) {
    if (!m.live || m.rank < 0) continue;
    const auto nl = m.transport.find('\n');
    if (nl == std::string::npos) return false;
    const std::string request = m.transport.substr(0, nl), where = m.transport.substr(nl + 1);
    if ((request != "auto" && request != "shm") || (host && *host != where)) return false;
    host = where;
  }
  return host.has_value();
}

bool job_logic::grow_wanted() const {
  int idle = 0;
  for (const auto& m : members_) idle += m.live && m.rank < 0;
  if (idle == 0 || finishing_) return false;
  auto planned =
      strategies::replan_layout(plan_, live_count(), params_.cfg.model,
                                strategies::constraints_from(params_.cfg), params_.bounds);
  return strategies::has_plan(planned) && strategies::plan_of(planned).shape.world() > world();
}

}  // namespace troupe::actors
