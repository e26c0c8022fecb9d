// job_logic: joins, the votes and commits of training, checkpoints and validation, and how
// the job stops. Losses, watchdogs and forming generations are in job_logic_recovery.cpp; the
// state each concept keeps is in its machine under actors/coordinator/job/.
#include "actors/coordinator/job_logic.hpp"

#include <algorithm>

#include "monitoring/events/events.hpp"
#include "strategies/replan.hpp"

namespace troupe::actors {

namespace {

double seconds_between(logic_time a, logic_time b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

job_logic::job_logic(job_params params, logic_time now)
    : params_(std::move(params)),
      members_(params_),
      steps_(params_, now),
      checkpoints_(params_),
      generations_(params_),
      replacements_(params_),
      stragglers_(params_),
      divergence_(params_),
      stopping_(params_),
      ledger_(std::min(now, params_.accounted_from.value_or(now)), params_.members),
      deadline_(now + params_.form_timeout),
      latest_(now) {}

std::vector<double> job_logic::heartbeat_ages(logic_time now) const {
  return members_.heartbeat_ages(now, world());
}

std::vector<int32_t> job_logic::fault_victims(const chaos::fault& f) const {
  return members_.fault_victims(f, world());
}

void job_logic::set_state(job_state s, actions& out, const std::string& why) {
  if (s == state_) return;
  out.push_back(emit_event{events::state{.from = to_string(state_),
                                         .to = to_string(s),
                                         .value = static_cast<int>(s),
                                         .generation = generation(),
                                         .step = committed(),
                                         .reason = why}});
  state_ = s;
}

std::string job_logic::words(const halt& h) const {
  return stopping_.words(h, committed(), checkpoints_, divergence_);
}

actions job_logic::on_agent_joined(const agent_hello& h, launch_plan& answer) {
  actions out;
  if (!h.rejoin) {
    members_.admit_agent(h, ended_, answer, out);
    return out;
  }
  members_.readmit_agent(h, ended_, answer, out);
  if (!answer.error.empty() || !takeover_ || takeover_done_) return out;
  ++takeover_agents_;
  for (int32_t m : h.members) takeover_roll_.wait_for(m);
  maybe_finish_takeover(latest_, false, out);
  return out;
}

actions job_logic::take_over(const takeover& t, logic_time now) {
  actions out;
  takeover_ = t;
  latest_ = std::max(latest_, now);
  members_.continue_from_generation(t.generation);
  takeover_newest_generation_ = t.generation;
  steps_.restart_from(t.committed_step);
  deadline_ = now + t.wait;
  return out;
}

void job_logic::note_rejoin(const hello& h) {
  takeover_roll_.back(h.member);
  takeover_newest_generation_ =
      std::max({takeover_newest_generation_, h.newest_generation, h.held_generation});
  if (h.held_generation > 0 && !h.held_plan_json.empty() &&
      !takeover_plans_.contains(h.held_generation)) {
    try {
      takeover_plans_[h.held_generation] = strategies::plan_from_json(h.held_plan_json);
    } catch (const std::exception&) {
      // A plan that does not read back: that member's state is planned as unusable (its
      // generation has no plan here), and a peer or the checkpoint provides it.
    }
  }
  // The takeover may start once a member of every rank of the newest generation with a plan
  // is back (the agents, which only matter for restarts, need not be).
  if (!takeover_plans_.empty() && takeover_plans_.rbegin()->first != takeover_roll_.generation()) {
    const auto& [newest, plan] = *takeover_plans_.rbegin();
    takeover_roll_.hold_against(newest, plan.shape.world(), members_.members());
  } else if (const member_info* m = members_.find(h.member)) {
    takeover_roll_.holder(*m, 1);
  }
}

void job_logic::maybe_finish_takeover(logic_time now, bool force, actions& out) {
  if (!takeover_ || takeover_done_ || ended_) return;
  const bool everyone = takeover_agents_ >= params_.nodes && takeover_roll_.everyone_back();
  if (!everyone && !force && !takeover_roll_.every_rank_held()) return;
  takeover_done_ = true;
  const int min_ranks = std::max(1, params_.bounds.min_ranks);
  if (members_.live_count() < min_ranks) {
    finish(1,
           "took over the job as leader (epoch " + std::to_string(takeover_->epoch) +
               ") but only " + std::to_string(members_.live_count()) + " members rejoined within " +
               std::to_string(takeover_->wait.count()) + " ms, fewer than --min-ranks " +
               std::to_string(min_ranks) + "; resume with --resume from the last checkpoint",
           out);
    return;
  }
  members_.continue_from_generation(takeover_newest_generation_);
  for (const auto& [g, plan] : takeover_plans_) generations_.take_over(g, plan);
  // The newest step any member applied is committed: the others complete it (from a peer).
  int64_t newest = -1;
  for (const auto& m : members_.members())
    if (m.live) newest = std::max(newest, m.held_step);
  if (newest < 0) newest = std::max<int64_t>(takeover_->checkpoint_step, 0);
  steps_.restart_from(newest);
  begin_generation("coordinator takeover (epoch " + std::to_string(takeover_->epoch) + ", " +
                       std::to_string(members_.live_count()) + " members rejoined)",
                   now, out);
}

actions job_logic::on_member_joined(const hello& h, logic_time now, welcome& answer) {
  actions out;
  if (!members_.admit(h, state_ == job_state::forming, ended_, now, answer, out)) return out;
  if (h.rejoin && takeover_ && !takeover_done_) {
    latest_ = std::max(latest_, now);
    // What it holds answers the takeover's abort too; its plan is kept for planning.
    members_.set_held(h.member, h.held_generation, h.held_rank, h.held_step);
    note_rejoin(h);
    maybe_finish_takeover(now, false, out);
    return out;
  }
  if (state_ == job_state::recovering) {
    replacements_.rejoined(h.node);
    // It takes its old place.
    if (replacements_.held() && replacements_.awaited() == 0) plan_generation(now, out);
  }
  if (state_ == job_state::forming) {
    never_joined_.erase(h.member);  // restarted after all, against the prediction
    maybe_open_first_generation(now, out);
  }
  return out;
}

actions job_logic::on_member_rejoined(int32_t member, logic_time now) {
  actions out;
  const member_info* m = members_.find(member);
  if (ended_ || !m || !m->live || state_ == job_state::forming) return out;
  latest_ = std::max(latest_, now);
  members_.restart_heartbeat_clocks(now);
  begin_generation("member " + std::to_string(member) +
                       " lost this coordinator for a while and came back; its generation is "
                       "formed again",
                   now, out);
  return out;
}

int job_logic::first_members_pending() const {
  // Counted, not scanned: this runs on every join while some first member is known gone.
  int gone = 0;
  for (const auto& [m, why] : never_joined_) {
    const member_info* info = members_.find(m);
    if (m >= 0 && m < members_.expected() && !(info && info->live)) ++gone;
  }
  return members_.expected() - members_.live_first_members() - gone;
}

std::string job_logic::missing_members(bool gone_only) const {
  std::string words;
  for (int32_t m = 0; m < members_.expected(); ++m) {
    const member_info* info = members_.find(m);
    if (info && info->live) continue;
    const auto gone = never_joined_.find(m);
    if (gone_only && gone == never_joined_.end()) continue;
    words += (words.empty() ? "member " : ", member ") + std::to_string(m) +
             (gone != never_joined_.end()   ? " (" + gone->second + " before it joined)"
              : members_.launched_on(m) < 0 ? " (no agent was told to start it)"
                                            : " (not joined)");
  }
  return words;
}

std::string job_logic::forming_timeout_words() const {
  const auto& cfg = params_.cfg;
  const std::string within =
      std::to_string(params_.form_timeout.count() / 1000) + " s (--join-timeout-ms)";
  const std::string program =
      cfg.external_workload() ? "`" + cfg.workload_command.front() + " ...`" : std::string();
  const int live = members_.live_count();
  if (live < params_.members || generation() == 0)
    return "only " + std::to_string(live) + " of " + std::to_string(params_.members) +
           " workers joined within " + within + "; missing: " + missing_members() +
           (program.empty()
                ? std::string()
                : "; the workers run " + program +
                      ", which joins the job when it calls troupe.init() (a Python script) or "
                      "troupe::run_as_worker (a C++ program)") +
           "; check the agent's output for worker errors, or raise --join-timeout-ms if "
           "workers start that slowly";
  // Every worker joined, but some never took its place in the first generation.
  std::vector<int32_t> ids;
  for (const auto& m : members_.members())
    if (m.live && !(m.reported && m.reconfigured)) ids.push_back(m.id);
  std::sort(ids.begin(), ids.end());
  std::string late = ids.size() == 1 ? "member " : "members ";
  for (size_t i = 0; i < ids.size(); ++i) late += (i == 0 ? "" : ", ") + std::to_string(ids[i]);
  // plan_generation bounds the building of a generation, like any collective.
  const auto bound = std::chrono::milliseconds(cfg.step_timeout_ms) + params_.heartbeat_timeout;
  return "every worker joined, but generation " + std::to_string(generation()) +
         " did not start within " + std::to_string(bound.count() / 1000) +
         " s (--step-timeout-ms and --heartbeat-timeout-ms): " + late +
         (ids.size() == 1 ? " did not take its place in it" : " did not take their places in it") +
         (program.empty()
              ? std::string("; check the agent's output for worker errors")
              : "; a worker of " + program +
                    " takes its place once its script has made its troupe.Trainer (the script "
                    "must make one after troupe.init())") +
         "; raise --step-timeout-ms if the workers' setup takes that long";
}

void job_logic::maybe_open_first_generation(logic_time now, actions& out) {
  if (state_ != job_state::forming || ended_ || takeover_) return;
  const int live = members_.live_count();
  const int gone = static_cast<int>(never_joined_.size());
  const int min_ranks = std::max(1, params_.bounds.min_ranks);
  if (gone > 0 && live + first_members_pending() < min_ranks) {
    // Waiting for the join deadline would not change the answer.
    finish(1,
           "at most " + std::to_string(live + first_members_pending()) + " of " +
               std::to_string(params_.members) + " workers can join, fewer than --min-ranks " +
               std::to_string(min_ranks) + ": " + missing_members(true) +
               (params_.cfg.external_workload()
                    ? "; the workers run `" + params_.cfg.workload_command.front() +
                          " ...`, which joins the job when it calls troupe.init() (a Python "
                          "script) or "
                          "troupe::run_as_worker (a C++ program)"
                    : std::string()) +
               "; check the agent's output for the worker's error, then run again (with "
               "--max-restarts N an agent restarts such a worker; a lower --min-ranks starts "
               "the job without it)",
           out);
    return;
  }
  if (live + gone != params_.members) return;
  std::string reason = "start";
  if (gone > 0)
    reason = "start without " + missing_members() + "; " + std::to_string(live) + " of " +
             std::to_string(params_.members) + " workers joined";
  members_.open_first_generation();
  generations_.begin_recovery(reason, now);
  members_.all_reported();
  plan_generation(now, out);
}

actions job_logic::on_heartbeat(const heartbeat& h, logic_time now) {
  actions out;
  members_.record_heartbeat(h, now, out);
  return out;
}

actions job_logic::on_vote(const step_done& v, logic_time now) {
  actions out;
  if (ended_) return out;
  latest_ = std::max(latest_, now);
  const int32_t member = member_of_rank(v.rank);
  // Votes of the generation being formed count too: a rank that finished reconfiguring starts
  // its step while the coordinator may still wait for another rank's acknowledgement.
  const member_info* voter = member >= 0 ? members_.find(member) : nullptr;
  if (v.generation != generation() || member < 0 || !voter ||
      (state_ != job_state::training &&
       !((state_ == job_state::recovering || state_ == job_state::forming) &&
         voter->reconfigured))) {
    members_.stale("step_done", member, v.generation, out);
    return out;
  }
  if (!v.ok) {
    steps_.fail(v, now);
    return out;
  }
  steps_.count(v, world(), generation(), now, out);
  if (steps_.all_in(world()) && state_ == job_state::training) votes_complete(now, out);
  return out;
}

bool job_logic::previous_checkpoint_blocks(int64_t step) const {
  return checkpoints_.in_flight() && !stopping_.halting() &&
         checkpoints_.wanted(step, stopping_.preempting());
}

void job_logic::votes_complete(logic_time now, actions& out) {
  const int64_t step = steps_.pending_step();
  // The job's last checkpoint (its last step's, or the one a preemption asks for) is never
  // skipped: with checkpoint_overlap skip too, it waits for the one in flight.
  const bool last = step >= session_last_step(params_.cfg) || stopping_.preempting();
  if ((params_.cfg.checkpoint_overlap == "wait" || last) && previous_checkpoint_blocks(step)) {
    // Deciding this step would ask for a second checkpoint while the first is not committed:
    // the ranks wait for the commit message instead, and a crash loses at most one interval.
    steps_.hold();
    return;
  }
  all_votes_in(now, out);
}

void job_logic::release_held_votes(actions& out) {
  if (!steps_.held() || checkpoints_.in_flight()) return;
  steps_.release();
  if (state_ == job_state::training && steps_.all_in(world())) all_votes_in(latest_, out);
}

void job_logic::all_votes_in(logic_time now, actions& out) {
  if (stopping_.halting()) {  // stopping: no step is committed any more
    steps_.drop();
    return;
  }
  const auto& cfg = params_.cfg;
  const int w = world();
  const step_votes v = steps_.take();
  const int64_t step = v.step;
  const double loss = v.mean_loss();
  const std::string why = v.diverged.empty() ? loss_divergence(loss) : v.diverged;
  if (!why.empty()) {
    diverged(step, why, now, out);
    return;
  }
  const double step_s = steps_.commit(v, loss, now);
  generations_.step_committed();
  step_measures measured{.compute_s = v.compute_s,
                         .comm_s = v.comm_s,
                         .optim_s = v.optim_s,
                         .ckpt_stall_s = v.ckpt_stall_s,
                         .bubble_fraction = plan().bubble};
  if (plan().shape.pp == 1) measured.collective_skew_s = w * v.max_compute_s - v.compute_s;
  for (const logic_time arrived : v.arrived) measured.peer_wait_s += seconds_between(arrived, now);
  const phase_seconds phases = ledger_.step_committed(now, step, w, measured);
  nlohmann::json phases_doc = nlohmann::json::object();
  for (int p = 0; p < phase_count; ++p)
    if (phases.s[static_cast<size_t>(p)] > 0)
      phases_doc[std::string(phase_name(static_cast<phase>(p)))] = phases.s[static_cast<size_t>(p)];

  const int64_t last = session_last_step(cfg);
  const bool preempting = stopping_.preempting();
  // Members waiting to join open a generation at this step boundary; the ranks then hold
  // after applying instead of starting a step the abort would throw away.
  const bool grow = step < last && !preempting && grow_wanted();
  const bool evaluate = evaluation_due(step, last, cfg.eval_every) && !(preempting && step < last);
  commit c{generation(), step, checkpoints_.wanted(step, preempting), evaluate, 0.0, grow};
  c.loss = loss;
  c.loss_class = wire_encode(c.loss);  // c.loss becomes a finite stand-in where needed
  if (c.checkpoint && previous_checkpoint_blocks(step)) {  // checkpoint_overlap skip
    c.checkpoint = false;
    out.push_back(emit_event{events::checkpoint_skipped{
        step, "the previous checkpoint was not committed yet (checkpoint_overlap skip)"}});
  }
  // Logged before any rank hears of it: a coordinator that dies while it sends the commits
  // has recorded the step, which its successor completes on every rank.
  out.push_back(emit_event{
      events::step{.step = step,
                   .loss = loss,
                   .lr = v.lr,
                   .tokens = v.tokens,
                   .tokens_per_s = static_cast<double>(v.tokens) / std::max(step_s, 1e-9),
                   .world = w,
                   .generation = generation(),
                   .step_s = step_s,
                   .compute_s = v.compute_s / w,
                   .comm_s = v.comm_s / w,
                   .control_s = v.control_s / w,
                   .peer_wait_s = v.peer_wait_s / w,
                   .total_steps = cfg.steps,
                   .phases = std::move(phases_doc),
                   .goodput = ledger_.goodput(now),
                   .mfu = mfu(ledger_.totals(now).total())}});
  for (const auto& m : members()) {
    if (!m.live || m.rank < 0) continue;
    c.peer_wait_s = seconds_between(v.arrived[static_cast<size_t>(m.rank)], now);
    out.push_back(send_commit{m.id, c});
  }
  if (c.checkpoint) checkpoints_.start(step, w);
  if (c.evaluate) steps_.expect_validation(step);
  deadline_ = now + std::chrono::milliseconds(2LL * cfg.step_timeout_ms);
  if (step >= last) {
    stopping_.finish_training();
    maybe_finish(out);
    return;
  }
  if (preempting) {  // this step's checkpoint is the last thing the job does (on_preempt)
    stopping_.request(halt{exit_code::requeue, false, step, ""});
    deadline_ = now + std::chrono::milliseconds(cfg.step_timeout_ms);
    maybe_halt(now, false, out);
    return;
  }
  handle_stragglers(v.rank_compute_s, now, out);
  if (state_ == job_state::training && grow) {
    generations_.set_cause("grow");
    begin_generation("members waiting to join: the layout grows", now, out);
  }
}

void job_logic::handle_stragglers(const std::vector<double>& compute_s, logic_time now,
                                  actions& out) {
  const auto verdict = stragglers_.observe(compute_s, plan(), members_, committed(), out);
  using kind = straggler_response::verdict::kind;
  if (verdict.what == kind::evict) {
    generations_.set_cause("straggler");
    const int32_t member = member_of_rank(verdict.rank);
    if (members_.find(member)) {
      const std::string why = "compute " + std::to_string(verdict.factor) + "x the median";
      auto more = on_member_lost(member, loss_cause::straggler, why, now);
      out.insert(out.end(), more.begin(), more.end());
      // Told to go at once: left alone, the process would only fence itself once the
      // coordinator's silence outlasted its bound, holding its node's memory until then.
      out.push_back(
          send_abort{member, abort_generation{generation(), evicted_reason(why), true, {}}});
    }
  } else if (verdict.what == kind::rebalance) {
    generations_.set_cause("rebalance");
    begin_generation(
        "rebalancing micro-batches away from straggler rank " + std::to_string(verdict.rank), now,
        out);
  }
}

bool job_logic::grow_wanted() const {
  return !stopping_.finishing() &&
         replacements_.grow_wanted(plan(), members_.live_count(), members_.idle_count());
}

actions job_logic::on_shard_written(const shard_written& w, logic_time now) {
  actions out;
  // A job that failed abandoned its collections: a share still arriving from a survivor must
  // not commit a checkpoint behind the failure message, which already named the last one.
  if (ended_) return out;
  latest_ = std::max(latest_, now);
  switch (checkpoints_.add_share(w, generation(), world(), out)) {
    case checkpoint_collection::share_outcome::stale:
      members_.stale("shard_written", member_of_rank(w.rank), w.generation, out);
      break;
    case checkpoint_collection::share_outcome::awaited:
      break;
    case checkpoint_collection::share_outcome::given_up:
      release_held_votes(out);
      maybe_finish(out);
      break;
  }
  return out;
}

actions job_logic::on_checkpoint_committed(const commit_checkpoint& c, const std::string& path,
                                           const std::string& error, logic_time now) {
  actions out;
  latest_ = std::max(latest_, now);  // the job may end now: its time is accounted up to here
  checkpoints_.committed(c, path, error, generation(), out);
  release_held_votes(out);
  maybe_finish(out);
  return out;
}

actions job_logic::on_eval_done(const eval_done& e, logic_time now) {
  actions out;
  if (ended_) return out;
  latest_ = std::max(latest_, now);
  if (e.generation != generation() || !steps_.awaits_validation(e.step)) {
    members_.stale("eval_done", member_of_rank(e.rank), e.generation, out);
    return out;
  }
  if (steps_.add_validation(e, world(), generation(), out)) maybe_finish(out);
  return out;
}

actions job_logic::on_abandon(const std::string& why, logic_time now) {
  actions out;
  if (ended_) return out;
  latest_ = std::max(latest_, now);
  finish(exit_code::failed, why, out);
  return out;
}

actions job_logic::on_shutdown(logic_time now) {
  actions out;
  if (ended_) return out;
  latest_ = std::max(latest_, now);
  out.push_back(emit_event{events::interrupted{committed(), generation()}});
  const halt stop{exit_code::interrupted, false, committed(), ""};
  if (state_ != job_state::training) {
    finish(stop.exit_code, words(stop), out);
    return out;
  }
  // The step in flight is not committed; a checkpoint being written is, before the end. A
  // divergence that is already stopping the job keeps its exit code.
  if (!stopping_.halting() || stopping_.pending()->rollback) stopping_.request(stop);
  deadline_ = now + std::chrono::milliseconds(params_.cfg.step_timeout_ms);
  maybe_halt(now, false, out);
  return out;
}

actions job_logic::on_preempt(logic_time now) {
  actions out;
  if (ended_ || stopping_.preempting()) return out;
  latest_ = std::max(latest_, now);
  stopping_.preempt();
  out.push_back(emit_event{events::preempted{committed(), generation(), to_string(state_)}});
  if (stopping_.halting()) return out;  // an interrupt or a divergence is stopping the job
  if (state_ != job_state::training) {
    finish(exit_code::requeue, words(halt{exit_code::requeue, false, committed(), ""}), out);
    return out;
  }
  // all_votes_in commits the next step with a checkpoint and halts; a step that was the last
  // anyway ends the job as done.
  return out;
}

void job_logic::diverged(int64_t step, const std::string& what, logic_time now, actions& out) {
  const bool roll = divergence_.decide(step, what, generation(), committed(), out);
  stopping_.request(halt{roll ? exit_code::done : exit_code::diverged, roll, step, what});
  // The ranks wait for this step's commit for twice the step timeout; decide before that.
  deadline_ = now + std::chrono::milliseconds(params_.cfg.step_timeout_ms);
  maybe_halt(now, false, out);
}

void job_logic::maybe_halt(logic_time now, bool force, actions& out) {
  if (!stopping_.halting() || ended_) return;
  if (!force && checkpoints_.in_flight()) return;
  const std::string why = words(*stopping_.pending());
  if (take_halt(out)) return;
  generations_.set_cause("divergence");
  begin_generation(why, now, out);
}

bool job_logic::take_halt(actions& out) {
  const halt h = stopping_.take();
  if (!h.rollback) {
    finish(h.exit_code, words(h), out);
    return true;
  }
  divergence_.arm_rollback();
  return false;
}

void job_logic::maybe_finish(actions& out) {
  if (stopping_.halting()) {  // a stop (divergence, interrupt) ends the job once checkpoints are in
    maybe_halt(latest_, false, out);
    return;
  }
  if (!stopping_.finishing() || checkpoints_.in_flight() || steps_.validating() || ended_ ||
      state_ != job_state::training)
    return;
  const auto [code, message] = stopping_.end_of_training(committed(), checkpoints_);
  finish(code, message, out);
}

events::goodput job_logic::goodput_event(logic_time now) const {
  const phase_seconds t = ledger_.totals(now);
  events::goodput g;
  g.step = committed();
  g.generation = generation();
  g.wall_s = ledger_.wall_s(now);
  g.slots = ledger_.slots();
  g.rank_seconds = t.total();
  g.phases = nlohmann::json::object();
  for (int p = 0; p < phase_count; ++p)
    g.phases[std::string(phase_name(static_cast<phase>(p)))] = t.s[static_cast<size_t>(p)];
  g.goodput = g.rank_seconds > 0 ? t[phase::compute] / g.rank_seconds : 0;
  g.peak_flops = params_.peak_flops;
  g.tokens = steps_.tokens_trained();
  g.mfu = mfu(g.rank_seconds);
  return g;
}

double job_logic::mfu(double rank_seconds) const {
  const double available = params_.peak_flops * rank_seconds;
  return available > 0
             ? params_.flops_per_token * static_cast<double>(steps_.tokens_trained()) / available
             : 0;
}

void job_logic::finish(int exit_code, const std::string& message, actions& out) {
  if (ended_) return;
  ended_ = true;
  // After the last commit the job waited for its final checkpoint, or for the control plane.
  ledger_.ended(latest_, checkpoints_.last_step() == committed() && committed() > 0
                             ? phase::checkpoint_stall
                             : phase::control);
  out.push_back(emit_event{goodput_event(latest_)});
  set_state(exit_code == 0 ? job_state::done : job_state::failed, out, message);
  members_.stop_all(exit_code, message, out);
  out.push_back(emit_event{events::job_ended{exit_code, message, committed(), generation()}});
  out.push_back(finish_job{exit_code, message});
}

}  // namespace troupe::actors
