// job_logic: members lost, the watchdogs of the clock's tick, and generations opened, planned
// and formed. Joins, steps, checkpoints and the job's end are in job_logic.cpp.
#include <algorithm>

#include "actors/coordinator/job_logic.hpp"
#include "monitoring/events/events.hpp"

namespace troupe::actors {

actions job_logic::on_member_lost(int32_t member, loss_cause cause, const std::string& why,
                                  logic_time now) {
  actions out;
  if (ended_) return out;
  const auto lost = members_.lose(member, cause, why, committed(), out);
  if (!lost) return out;
  latest_ = std::max(latest_, now);
  const std::string what = (lost->rank >= 0 ? "rank " + std::to_string(lost->rank)
                                            : "spare member " + std::to_string(member)) +
                           " lost (" + to_string(cause) + "): " + why;
  if (state_ == job_state::forming && takeover_) {  // the takeover goes on without it
    takeover_roll_.forget(member);
    takeover_roll_.holder(*members_.find(member), -1);
    maybe_finish_takeover(now, false, out);
    return out;
  }
  if (state_ == job_state::forming) {
    finish(1, what + " before the job formed; check the agent's output for worker errors", out);
    return out;
  }
  if (stopping_.preempting() &&
      (!stopping_.halting() || stopping_.pending()->exit_code == exit_code::requeue)) {
    // The scheduler is taking the nodes (srun kills its tasks when it gets SIGTERM itself):
    // nothing to recover for; the last committed checkpoint is what a requeued job resumes.
    finish(exit_code::requeue,
           what + " while stopping for the scheduler; " +
               words(halt{exit_code::requeue, false, committed(), ""}),
           out);
    return out;
  }
  if (state_ == job_state::training && lost->rank < 0 && !stopping_.finishing())
    return out;  // an idle spare: nothing to redo
  generations_.note_cause(to_string(cause));
  replacements_.member_lost(lost->node, cause, now);
  if (params_.regroup_window.count() < 0) {
    begin_generation(what, now, out);
    return out;
  }
  // Nothing commits meanwhile (the lost rank votes no more), so waiting costs only the window;
  // a generation per loss would cost each an abort round, and a burst exhausts
  // max_failed_recoveries without a step.
  regroup_last_ = now;
  if (regroup_losses_++ == 0) {
    regroup_reason_ = what;
    regroup_first_ = now;
    out.push_back(schedule_regroup{params_.regroup_window});
  }
  return out;
}

actions job_logic::on_regroup(logic_time now) {
  actions out;
  if (regroup_losses_ == 0 || ended_) return out;
  latest_ = std::max(latest_, now);
  // Losses still arriving (the connections of many nodes close over tens of milliseconds): wait
  // until they have been quiet for a window, at most ten windows in all.
  const auto window = params_.regroup_window;
  const auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(now - regroup_last_);
  if (quiet < window && now - regroup_first_ < 10 * window) {
    out.push_back(schedule_regroup{window - quiet});
    return out;
  }
  // Losses that interrupt a recovery make it start over without counting as a failed one: the
  // world only shrinks (bounded by --min-ranks), so this cannot go on forever; a loss storm
  // spread over seconds would otherwise end the job after max_failed_recoveries windows.
  regroup_now(now, out, state_ != job_state::recovering);
  return out;
}

void job_logic::regroup_now(logic_time now, actions& out, bool counted) {
  if (regroup_losses_ == 0 || ended_) return;
  const int more = regroup_losses_ - 1;
  std::string reason = std::move(regroup_reason_);
  if (more > 0)
    reason += " (and " + std::to_string(more) + " more member" + (more == 1 ? "" : "s") +
              " lost with it)";
  begin_generation(reason, now, out, counted);  // clears the pending losses
}

actions job_logic::on_worker_exited(const worker_exited& w, logic_time now) {
  actions out{emit_event{events::worker_exited{
      .member = w.member, .pid = w.pid, .exit_code = w.exit_code, .signal = w.signal}}};
  if (state_ == job_state::forming && takeover_ && !members_.find(w.member)) {
    takeover_roll_.forget(w.member);  // it will not rejoin
    maybe_finish_takeover(now, false, out);
    return out;
  }
  if (state_ == job_state::forming && !ended_ && !members_.find(w.member) && w.member >= 0 &&
      w.member < members_.expected()) {
    // A first member whose process ended before it joined. Its agent restarts a process that
    // died while it has restarts left (the same count the agent keeps); the restart joins
    // like any other. Otherwise the job will not see this member: form without it if the
    // others are enough, or fail now, naming it.
    const int32_t node = members_.launched_on(w.member);
    const bool died = w.signal != 0 || w.exit_code != 0;
    if (died && node >= 0 && prejoin_restarts_[node] < params_.max_restarts) {
      ++prejoin_restarts_[node];
      return out;
    }
    never_joined_[w.member] = w.signal ? "its process " + std::to_string(w.pid) +
                                             " was killed by signal " + std::to_string(w.signal)
                                       : "its process " + std::to_string(w.pid) +
                                             " exited with code " + std::to_string(w.exit_code);
    maybe_open_first_generation(now, out);
    return out;
  }
  if (!members_.current_process(w.member, w.pid)) return out;  // an earlier, restarted process
  const std::string why =
      w.signal
          ? "process " + std::to_string(w.pid) + " killed by signal " + std::to_string(w.signal)
          : "process " + std::to_string(w.pid) + " exited with code " + std::to_string(w.exit_code);
  auto more = on_member_lost(w.member, loss_cause::exit, why, now);
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

actions job_logic::on_agent_lost(int node, const std::string& why, logic_time now) {
  actions out;
  if (!ended_) out.push_back(emit_event{events::agent_lost{why}});
  replacements_.agent_lost(node);
  if (replacements_.held() && replacements_.awaited() == 0 && !ended_) plan_generation(now, out);
  return out;
}

actions job_logic::on_tick(logic_time now) {
  actions out;
  if (ended_) return out;
  latest_ = std::max(latest_, now);
  if (last_tick_ && params_.stall_gap.count() > 0 && now - *last_tick_ >= params_.stall_gap) {
    // This process did not run between the two ticks (SIGSTOP, a stalled VM): whatever the
    // members sent meanwhile waits unread, so their silence is the coordinator's own.
    const auto gap = now - *last_tick_;
    stall_ = std::chrono::duration_cast<std::chrono::milliseconds>(gap);
    members_.restart_heartbeat_clocks(now);
    // Reports and votes waited unread too: the deadline of what was awaited moves on.
    if (state_ == job_state::recovering || state_ == job_state::training) deadline_ += gap;
  }
  last_tick_ = now;
  const auto& cfg = params_.cfg;
  if (state_ == job_state::forming && takeover_) {
    if (now >= deadline_) maybe_finish_takeover(now, true, out);
    return out;
  }
  if (state_ == job_state::forming) {
    if (now >= deadline_) finish(1, forming_timeout_words(), out);
    return out;
  }
  // Heartbeats: a process that stopped answering is lost, whatever it was doing.
  for (const auto& [member, why] : members_.silent(now)) {
    auto more = on_member_lost(member, loss_cause::hang, why, now);
    out.insert(out.end(), more.begin(), more.end());
    if (ended_) return out;
  }
  // Found together, in one tick: nothing more to wait for.
  regroup_now(now, out, state_ != job_state::recovering);
  if (ended_) return out;
  if (state_ == job_state::training && steps_.failure_settled(now)) {
    blame_failed_step(now, out);
    return out;
  }
  if (replacements_.held() && now >= replacements_.deadline()) {
    plan_generation(now, out);  // the restarted workers are late: the job goes on without them
    return out;
  }
  if (now < deadline_) return out;
  if (stopping_.halting()) {  // checkpoints in flight took too long: stop (or roll back) anyway
    maybe_halt(now, true, out);
    return out;
  }
  if (state_ == job_state::recovering) {
    if (const member_info* m = members_.first_unready()) {
      const int32_t member = m->id;
      const std::string why =
          m->reported ? "did not finish reconfiguring in time" : "did not report its state in time";
      // The next generation opens now, with fresh deadlines (a later tick must not find this
      // recovery's deadline passed again and lose another member for it).
      auto more = on_member_lost(member, loss_cause::hang, why, now);
      out.insert(out.end(), more.begin(), more.end());
      regroup_now(now, out, true);
    }
    return out;
  }
  const std::string waited = "no progress for " + std::to_string(2 * cfg.step_timeout_ms / 1000) +
                             " s after step " + std::to_string(committed());
  if (state_ == job_state::training && steps_.held())
    finish(1,
           waited + ": step " + std::to_string(steps_.pending_step()) +
               " waits for the previous checkpoint, which the checkpoint storage has not "
               "finished (slow or hung); " +
               checkpoints_.words() + "; check the disk under the run directory",
           out);
  else if (state_ == job_state::training)
    finish(1, waited + " (a rank hung); raise step_timeout_ms if steps are that slow", out);
  return out;
}

void job_logic::blame_failed_step(logic_time now, actions& out) {
  // No member was lost meanwhile. A rank whose own collective failed (not because a peer
  // left or it was aborted) is at fault; when a collective timed out, the ranks that said
  // nothing are (they hang inside it). Those are evicted; otherwise the generation is
  // rebuilt with everyone.
  const std::string why = steps_.failure();
  if (steps_.failed_in_program()) {
    finish(1,
           why +
               "\nThe job stops: the program would fail the same way on a redo. Fix it, then "
               "start the job again",
           out);
    return;
  }
  for (int32_t rank : steps_.culprits(world())) {
    const int32_t member = member_of_rank(rank);
    if (member < 0) continue;
    generations_.note_cause("error");
    auto more = on_member_lost(member, loss_cause::error, why, now);
    out.insert(out.end(), more.begin(), more.end());
    if (ended_) return;
  }
  regroup_now(now, out, true);  // the culprits, named together
  if (state_ == job_state::training) begin_generation(why, now, out);
}

void job_logic::begin_generation(const std::string& reason, logic_time now, actions& out,
                                 bool counted) {
  if (ended_) return;
  // This generation plans without every member lost so far: a regroup pending is served.
  regroup_losses_ = 0;
  regroup_reason_.clear();
  // A member was lost or a vote failed while the job was stopping: stop now, or roll back
  // now, without waiting any longer for checkpoints in flight.
  if (stopping_.halting() && take_halt(out)) return;
  // Taken before the state changes: whether every member holds what the planner would ask.
  const bool was_training = state_ == job_state::training;
  if (state_ != job_state::recovering) generations_.begin_recovery(reason, now);
  if (counted && generations_.too_many_recoveries(params_.max_failed_recoveries)) {
    finish(1,
           "gave up after " + std::to_string(params_.max_failed_recoveries) +
               " recoveries without a committed step; last: " + reason,
           out);
    return;
  }
  const int min_ranks = std::max(1, params_.bounds.min_ranks);
  if (members_.live_count() < min_ranks) {
    finish(1,
           reason + "; " + std::to_string(members_.live_count()) +
               " ranks left, fewer than --min-ranks " + std::to_string(min_ranks) +
               "; resume with --resume from " +
               (checkpoints_.last_path().empty() ? std::string("the start (no checkpoint yet)")
                                                 : checkpoints_.last_path()),
           out);
    return;
  }
  members_.next_generation();
  replacements_.unhold();  // every live member reports again first
  ledger_.recovering(now);
  set_state(job_state::recovering, out, reason);
  steps_.new_generation();
  checkpoints_.abandon(reason, generation(), out);
  generations_.new_generation();
  const size_t first_abort = out.size();
  members_.abort_live(reason, out);
  // A member has a heartbeat timeout to answer; one that cannot is lost too.
  deadline_ = now + 2 * params_.heartbeat_timeout + std::chrono::milliseconds(1000);
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
  if (!params_.plan_with_abort || divergence_.rollback_armed() || stopping_.finishing())
    return false;
  const auto& shape = plan().shape;
  if (params_.cfg.parallel.zero > 0 || shape.tp > 1 || shape.pp > 1 || shape.ep > 1) return false;
  return replacements_.awaited() == 0 ||
         !replacements_.waiting_adds_ranks(plan(), members_.live_count());
}

void job_logic::plan_with_aborts(size_t first_abort, logic_time now, actions& out) {
  members_.assume_reports(committed());
  const strategies::layout before = plan().shape;
  const bool before_one_host = generations_.one_host();
  actions planned;
  plan_generation(now, planned);
  const auto kept =
      ended_ ? std::vector<int32_t>{}
             : replacements_.shrink_kept(before, before_one_host, generations_, members_);
  for (auto& a : planned) {
    auto* rc = std::get_if<send_reconfigure>(&a);
    if (rc && !kept.empty() && rc->msg.rank >= 0) {
      rc->msg.shrink_kept = kept;
      rc->msg.shrink_from = generation() - 1;
    }
    send_abort* carrier = nullptr;
    for (size_t i = first_abort; rc && !carrier && i < out.size(); ++i)
      if (auto* ab = std::get_if<send_abort>(&out[i]); ab && ab->member == rc->member) carrier = ab;
    if (carrier)
      carrier->msg.then.push_back(std::move(rc->msg));
    else
      out.push_back(std::move(a));
  }
  generations_.planned_ahead(!ended_, !kept.empty());
}

void job_logic::plan_generation(logic_time now, actions& out) {
  // Who has not rejoined by now joins later and is admitted by a grow.
  replacements_.planned();
  const auto live = members_.live_members();
  const auto next =
      generations_.next(generation(), static_cast<int>(live.size()), stragglers_.rebalanced());
  if (!strategies::has_plan(next)) {
    finish(1,
           "no layout fits the " + std::to_string(live.size()) +
               " live ranks: " + strategies::reason_of(next),
           out);
    return;
  }
  stragglers_.forget_rebalance();
  // After a divergence the state the members hold is suspect: every rank goes back to the last
  // committed checkpoint (a member holding exactly that step may keep it).
  const int64_t restore_step =
      divergence_.take_rollback() ? std::max<int64_t>(checkpoints_.last_step(), 0) : committed();
  generations_.adopt(generation(), strategies::plan_of(next), live, restore_step,
                     checkpoints_.last_step());
  steps_.restart_from(generations_.restore().start_step);
  members_.place(generations_.restore());
  generations_.reconfigures(members_, divergence_.skipped(), out);
  // Building communicators and moving state: bounded like any collective.
  deadline_ =
      now + std::chrono::milliseconds(params_.cfg.step_timeout_ms) + params_.heartbeat_timeout;
}

actions job_logic::on_checkpoint_fallback(const checkpoint_fallback_found& f, logic_time now) {
  actions out;
  latest_ = std::max(latest_, now);
  if (ended_ || fallback_generation_ == 0) return out;
  fallback_generation_ = 0;
  out.push_back(emit_event{events::checkpoint_fallback{.step = f.damaged,
                                                       .path = f.path,
                                                       .error = f.error,
                                                       .quarantined = f.quarantined,
                                                       .resumed_step = f.intact.value_or(-1)}});
  if (!f.intact) {
    finish(1,
           "the checkpoint of step " + std::to_string(f.damaged) + " does not read back (" +
               f.error +
               ") and no earlier committed checkpoint reads back intact; run `troupe ckpt "
               "verify` on the run directory",
           out);
    return out;
  }
  // Everyone goes back to the intact checkpoint and replays from there: the same batches, so
  // the same model.
  checkpoints_.fell_back(*f.intact, f.path);
  divergence_.arm_rollback();
  generations_.set_cause("checkpoint");
  begin_generation("the checkpoint of step " + std::to_string(f.damaged) +
                       " does not read back; restoring the one of step " +
                       std::to_string(*f.intact) + " and replaying from there",
                   now, out);
  return out;
}

void job_logic::plan_or_wait(logic_time now, actions& out) {
  if (!replacements_.worth_waiting(plan(), members_.live_count(), now)) {
    plan_generation(now, out);
    return;
  }
  replacements_.hold(generation(), now, out);
  // Everyone has reported; the recovery deadline must not evict them while they wait.
  deadline_ = std::max(deadline_, replacements_.deadline() + params_.heartbeat_timeout);
}

actions job_logic::on_state_report(const state_report& r, logic_time now) {
  actions out;
  const member_info* m = members_.find(r.member);
  if (!m || !m->live || r.generation != generation() || state_ != job_state::recovering) {
    members_.stale("state_report", r.member, r.generation, out);
    return out;
  }
  if (members_.report(r) && members_.everyone_reported()) plan_or_wait(now, out);
  return out;
}

actions job_logic::on_reconfigured(const reconfigured& r, logic_time now) {
  actions out;
  latest_ = std::max(latest_, now);
  const member_info* m = members_.find(r.member);
  if (!m || !m->live || r.generation != generation() || state_ == job_state::training || ended_) {
    members_.stale("reconfigured", r.member, r.generation, out);
    return out;
  }
  if (!r.ok && r.error_cause.starts_with(damaged_checkpoint_cause)) {
    // Every rank that restores meets the same damage: the first report asks the committer,
    // the others wait with it.
    if (fallback_generation_ != generation()) {
      fallback_generation_ = generation();
      out.push_back(fall_back_checkpoint{checkpoints_.last_step(), r.error});
    }
    return out;
  }
  if (!r.ok) {
    if (auto why = generations_.connect_failure(r, out))
      finish(1, *why, out);
    else
      begin_generation("member " + std::to_string(r.member) + " could not join generation " +
                           std::to_string(r.generation) + ": " + r.error,
                       now, out);
    return out;
  }
  members_.mark_reconfigured(r.member);
  generations_.record_restored(r);
  if (!members_.everyone_reconfigured()) return out;

  // Every member is in: the generation trains.
  generations_.formed(generation(), members_.idle_count(), committed(), now, out);
  set_state(job_state::training, out, generations_.reason());
  ledger_.training(now, world());
  out.push_back(emit_event{goodput_event(now)});
  stragglers_.new_generation(world());
  steps_.restart_clock(now);
  deadline_ = now + std::chrono::milliseconds(2LL * params_.cfg.step_timeout_ms);
  if (committed() < session_last_step(params_.cfg)) {
    // Ranks that finished reconfiguring first may already have voted for the next step.
    if (steps_.all_in(world())) votes_complete(now, out);
    return out;
  }
  // Recovered after the last step: the final checkpoint and validation come from the new
  // generation (its ranks hold the last step's state).
  stopping_.finish_training();
  const commit c{generation(), committed(), last_checkpoint_step() != committed(), false, 0.0};
  for (const auto& x : members())
    if (x.live && x.rank >= 0) out.push_back(send_commit{x.id, c});
  if (c.checkpoint) checkpoints_.start(committed(), world());
  maybe_finish(out);
  return out;
}

}  // namespace troupe::actors
