// job_logic, the second half: checkpoints and evaluations being collected, members lost,
// the watchdog's tick, divergence, and how a job ends. The first half (job_logic.cpp) forms
// generations and counts the votes of each step.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "actors/job_logic.hpp"
#include "runtime/comm/communicator.hpp"

namespace troupe::actors {

namespace {

using nlohmann::json;

double seconds_between(logic_time a, logic_time b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

void job_logic::start_collecting(int64_t step) {
  collection c;
  c.commit.step = step;
  c.commit.world = world();
  c.reported.assign(static_cast<size_t>(world()), false);
  if (owed_ && step >= owed_->from) {  // this checkpoint stands in for an abandoned one
    c.commit.replaces = owed_->replaces;
    owed_.reset();
  }
  collecting_[step] = std::move(c);
}

void job_logic::abandon_collections(const std::string& reason, actions& out) {
  for (const auto& [step, c] : collecting_) {
    if (!c.ok) {
      // A rank had already failed to write its share: that failure counts as any other,
      // and the next checkpoint due makes up for it as it would have.
      out.push_back(emit_event{{{"event", "checkpoint_failed"},
                                {"step", step},
                                {"ranks_failed", c.failed},
                                {"error", c.error}}});
      checkpoint_failed(step, c.error);
      continue;
    }
    // The shares the survivors wrote are not a whole checkpoint (in plain data parallelism
    // each replica writes only its part of every tensor), and the new layout cuts the state
    // differently. Instead the first step the job commits from here on writes one, from the
    // new generation's ranks: a loss costs a few steps of checkpoint, never an interval.
    const int64_t replaces = c.commit.replaces >= 0 ? c.commit.replaces : step;
    if (!owed_)
      owed_ = owed_checkpoint{step, replaces};
    else
      owed_->from = std::min(owed_->from, step);
    out.push_back(
        emit_event{{{"event", "checkpoint_abandoned"},
                    {"step", step},
                    {"generation", generation_ - 1},
                    {"ranks_reported", c.in},
                    {"world", c.commit.world},
                    {"reason", "generation " + std::to_string(generation_ - 1) +
                                   " ended before every rank reported its share: " + reason},
                    {"retake_from", owed_->from},
                    {"then", "the first step from " + std::to_string(owed_->from) +
                                 " that the job commits takes a checkpoint in its place"}}});
  }
  collecting_.clear();
}

actions job_logic::on_shard_written(const shard_written& w, logic_time now) {
  actions out;
  // A job that failed abandoned its collections: a share still arriving from a survivor must
  // not commit a checkpoint behind the failure message, which already named the last one.
  if (ended_) return out;
  latest_ = std::max(latest_, now);
  const auto it = collecting_.find(w.step);
  if (w.generation != generation_ || it == collecting_.end() || w.rank < 0 || w.rank >= world() ||
      it->second.reported[static_cast<size_t>(w.rank)]) {
    stale("shard_written", member_of_rank(w.rank), w.generation, out);
    return out;
  }
  collection& c = it->second;
  c.reported[static_cast<size_t>(w.rank)] = true;
  ++c.in;
  std::string error = w.error;
  if (w.ok) {
    try {
      auto pieces = ckpt::decode_pieces(w.pieces_json);
      c.commit.pieces.insert(c.commit.pieces.end(), std::make_move_iterator(pieces.begin()),
                             std::make_move_iterator(pieces.end()));
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (error.empty() && c.in > 1 && w.adam_t != c.commit.adam_t)
      error = "rank " + std::to_string(w.rank) + " is at optimizer step " +
              std::to_string(w.adam_t) + ", another rank at " + std::to_string(c.commit.adam_t);
    c.commit.adam_t = w.adam_t;
    c.commit.bytes_written += w.bytes_written;
    c.commit.bytes_deduplicated += w.bytes_deduplicated;
    c.commit.stall_s = std::max(c.commit.stall_s, w.stall_s);
    c.commit.write_s = std::max(c.commit.write_s, w.write_s);
  }
  c.commit.snapshot_buffer_bytes += w.buffer_bytes;
  c.commit.replicated_bytes += w.replicated_bytes;
  if (w.skipped) {
    c.skipped = true;
  } else if (!w.ok || !error.empty()) {
    if (c.ok) c.error = "rank " + std::to_string(w.rank) + ": " + error;
    c.ok = false;
    ++c.failed;
  }
  if (c.in < c.commit.world) return out;
  collection done = std::move(c);
  collecting_.erase(it);
  if (done.ok && !done.skipped) {
    ++committing_;
    out.push_back(std::move(done.commit));
  } else {
    if (!done.ok) {
      out.push_back(emit_event{{{"event", "checkpoint_failed"},
                                {"step", w.step},
                                {"ranks_failed", done.failed},
                                {"error", done.error}}});
      checkpoint_failed(w.step, done.error);
    }
    if (done.skipped && done.ok) {
      out.push_back(emit_event{{{"event", "checkpoint_skipped"},
                                {"step", w.step},
                                {"reason",
                                 "a rank was still writing the previous checkpoint "
                                 "(checkpoint_overlap skip)"}}});
      // A checkpoint in place of an abandoned one is still owed: usually the survivors were
      // still writing their shares of the abandoned one. The next committed step tries again.
      if (done.commit.replaces >= 0 && !owed_)
        owed_ = owed_checkpoint{w.step, done.commit.replaces};
    }
    release_held_votes(out);
    maybe_finish(out);
  }
  return out;
}

actions job_logic::on_checkpoint_committed(const commit_checkpoint& c, const std::string& path,
                                           const std::string& error) {
  actions out;
  const int64_t step = c.step;
  committing_ = std::max(0, committing_ - 1);
  if (error.empty()) {
    checkpoint_step_ = std::max(checkpoint_step_, step);
    checkpoint_path_ = path;
    if (step >= failed_checkpoint_step_) {  // a later checkpoint made up for the failed one
      failed_checkpoint_step_ = -1;
      failed_checkpoint_error_.clear();
    }
    json event = {{"event", "checkpoint"},
                  {"step", step},
                  {"path", path},
                  {"generation", generation_},
                  {"bytes_written", c.bytes_written},
                  {"bytes_deduplicated", c.bytes_deduplicated},
                  {"stall_s", c.stall_s},
                  {"write_s", c.write_s},
                  {"snapshot_buffer_bytes", c.snapshot_buffer_bytes},
                  {"replicated_bytes", c.replicated_bytes}};
    if (c.replaces >= 0) event["replaces"] = c.replaces;  // the abandoned checkpoint's step
    out.push_back(emit_event{std::move(event)});
  } else {
    out.push_back(emit_event{{{"event", "checkpoint_failed"}, {"step", step}, {"error", error}}});
    checkpoint_failed(step, error);
  }
  release_held_votes(out);
  maybe_finish(out);
  return out;
}

actions job_logic::on_eval_done(const eval_done& e, logic_time now) {
  actions out;
  if (ended_) return out;
  latest_ = std::max(latest_, now);
  if (e.generation != generation_ || e.step != eval_step_ || eval_step_ < 0) {
    stale("eval_done", member_of_rank(e.rank), e.generation, out);
    return out;
  }
  eval_sum_ += wire_decode(e.loss_sum, e.loss_class);
  eval_batches_ += e.batches;
  if (++evals_in_ < world()) return out;
  last_val_ = eval_sum_ / static_cast<double>(std::max<int64_t>(eval_batches_, 1));
  out.push_back(emit_event{{{"event", "validation"},
                            {"step", eval_step_},
                            {"val_loss", last_val_},
                            {"generation", generation_}}});
  eval_step_ = -1;
  maybe_finish(out);
  return out;
}

actions job_logic::on_member_lost(int32_t member, loss_cause cause, const std::string& why,
                                  logic_time now) {
  actions out;
  member_info* m = find(member);
  if (!m || !m->live || ended_) return out;
  latest_ = std::max(latest_, now);
  m->live = false;
  const int32_t rank = m->rank;
  m->rank = -1;
  out.push_back(emit_event{{{"event", "rank_lost"},
                            {"rank", rank},
                            {"member", member},
                            {"node", m->node},
                            {"pid", m->pid},
                            {"cause", to_string(cause)},
                            {"reason", why},
                            {"step", committed_},
                            {"generation", generation_}}});
  const std::string what =
      (rank >= 0 ? "rank " + std::to_string(rank) : "spare member " + std::to_string(member)) +
      " lost (" + to_string(cause) + "): " + why;
  if (state_ == job_state::forming) {
    finish(1, what + " before the job formed; check the agent's output for worker errors", out);
    return out;
  }
  if (preempting_ && (!halting_ || halting_->exit_code == exit_code::requeue)) {
    // The scheduler is taking the nodes (srun kills its tasks when it gets SIGTERM itself):
    // nothing to recover for; the last committed checkpoint is what a requeued job resumes.
    finish(exit_code::requeue,
           what + " while stopping for the scheduler; " +
               halt_message(halt{exit_code::requeue, false, committed_, ""}),
           out);
    return out;
  }
  if (state_ == job_state::training && rank < 0 && !finishing_)
    return out;  // an idle spare: nothing to redo
  if (recovery_cause_.empty()) recovery_cause_ = to_string(cause);
  // A crashed worker whose agent has restarts left comes back in a moment; the plan of the
  // next generation waits for it (bounded by replacement_wait).
  const bool crashed = cause == loss_cause::exit || cause == loss_cause::connection;
  const bool agent_alive =
      std::find(lost_nodes_.begin(), lost_nodes_.end(), m->node) == lost_nodes_.end();
  if (crashed && agent_alive && params_.replacement_wait.count() > 0 &&
      restarts_used_[m->node] < params_.max_restarts) {
    ++restarts_used_[m->node];
    ++awaited_[m->node];
    replacement_deadline_ = now + params_.replacement_wait;
  }
  begin_generation(what, now, out);
  return out;
}

int job_logic::awaited() const {
  int n = 0;
  for (const auto& [node, count] : awaited_) n += count;
  return n;
}

bool job_logic::waiting_adds_ranks(int expected) const {
  const int live = live_count();
  auto world_for = [&](int members) {
    const auto planned =
        strategies::replan_layout(plan_, members, params_.cfg.model,
                                  strategies::constraints_from(params_.cfg), params_.bounds);
    return strategies::has_plan(planned) ? strategies::plan_of(planned).shape.world() : 0;
  };
  return world_for(live + expected) > world_for(live);
}

void job_logic::plan_or_wait(logic_time now, actions& out) {
  const int expected = awaited();
  // An idle spare already fills the place: the restarted worker becomes the next spare.
  if (expected == 0 || now >= replacement_deadline_ || !waiting_adds_ranks(expected)) {
    plan_generation(now, out);
    return;
  }
  if (!plan_held_)
    out.push_back(emit_event{{{"event", "replacement_wait"},
                              {"generation", generation_},
                              {"workers", expected},
                              {"wait_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                              replacement_deadline_ - now)
                                              .count()}}});
  plan_held_ = true;
  // Everyone has reported; the recovery deadline must not evict them while they wait.
  deadline_ = std::max(deadline_, replacement_deadline_ + params_.heartbeat_timeout);
}

actions job_logic::on_agent_lost(int node, logic_time now) {
  actions out;
  if (std::find(lost_nodes_.begin(), lost_nodes_.end(), node) == lost_nodes_.end())
    lost_nodes_.push_back(node);
  awaited_.erase(node);
  if (plan_held_ && awaited() == 0 && !ended_) plan_generation(now, out);
  return out;
}

actions job_logic::on_heartbeat(const heartbeat& h, logic_time now) {
  actions out;
  member_info* m = find(h.member);
  if (!m || !m->live) {
    // An evicted process that woke up (SIGCONT): its word no longer counts; tell it to go.
    stale("heartbeat", h.member, h.generation, out);
    if (m)
      out.push_back(
          send_abort{h.member, abort_generation{generation_, "this member was evicted", true, {}}});
    return out;
  }
  m->last_heartbeat = now;
  return out;
}

actions job_logic::on_tick(logic_time now) {
  actions out;
  if (ended_) return out;
  latest_ = std::max(latest_, now);
  if (state_ == job_state::forming) {
    if (now >= deadline_)
      finish(1,
             "only " + std::to_string(live_count()) + " of " + std::to_string(params_.members) +
                 " workers joined within " + std::to_string(params_.form_timeout.count() / 1000) +
                 " s; check the agent's output for worker errors",
             out);
    return out;
  }
  // Heartbeats: a process that stopped answering is lost, whatever it was doing.
  for (auto& m : members_) {
    if (!m.live || now - m.last_heartbeat <= params_.heartbeat_timeout) continue;
    auto more = on_member_lost(
        m.id, loss_cause::hang,
        "no heartbeat for " + std::to_string(seconds_between(m.last_heartbeat, now)).substr(0, 4) +
            " s (timeout " + std::to_string(params_.heartbeat_timeout.count()) + " ms)",
        now);
    out.insert(out.end(), more.begin(), more.end());
    if (ended_) return out;
  }
  if (state_ == job_state::training && !pending_failure_.empty() && now >= settle_deadline_) {
    // No member was lost meanwhile. A rank whose own collective failed (not because a peer
    // left or it was aborted) is at fault; when a collective timed out, the ranks that said
    // nothing are (they hang inside it). Those are evicted; otherwise the generation is
    // rebuilt with everyone.
    const std::string why = pending_failure_;
    const auto reports = failure_reports_;
    std::vector<int32_t> culprits;
    bool timed_out = false;
    for (const auto& [rank, kind] : reports) {
      const auto errc = static_cast<comm::comm_errc>(kind);
      if (kind == 0 || errc == comm::comm_errc::internal || errc == comm::comm_errc::invalid)
        culprits.push_back(rank);
      timed_out = timed_out || errc == comm::comm_errc::timeout;
    }
    if (culprits.empty() && timed_out)
      for (int r = 0; r < world(); ++r)
        if (!reports.count(r)) culprits.push_back(r);
    for (int32_t rank : culprits) {
      const int32_t member = member_of_rank(rank);
      if (member < 0) continue;
      if (recovery_cause_.empty()) recovery_cause_ = "error";
      auto more = on_member_lost(member, loss_cause::error, why, now);
      out.insert(out.end(), more.begin(), more.end());
      if (ended_) return out;
    }
    if (state_ == job_state::training) begin_generation(why, now, out);
    return out;
  }
  if (plan_held_ && now >= replacement_deadline_) {
    plan_generation(now, out);  // the restarted workers are late: the job goes on without them
    return out;
  }
  if (now < deadline_) return out;
  if (halting_) {  // checkpoints in flight took too long: stop (or roll back) without them
    maybe_halt(now, true, out);
    return out;
  }
  if (state_ == job_state::recovering) {
    for (auto& m : members_) {
      if (!m.live) continue;
      if (m.reported && m.reconfigured) continue;
      auto more = on_member_lost(
          m.id, loss_cause::hang,
          m.reported ? "did not finish reconfiguring in time" : "did not report its state in time",
          now);
      out.insert(out.end(), more.begin(), more.end());
      return out;  // on_member_lost opened the next generation, with fresh deadlines
    }
    return out;
  }
  if (state_ == job_state::training && votes_held_)
    finish(1,
           "no progress for " + std::to_string(2 * params_.cfg.step_timeout_ms / 1000) +
               " s after step " + std::to_string(committed_) + ": step " +
               std::to_string(pending_.step) +
               " waits for the previous checkpoint, which the checkpoint storage has not "
               "finished (slow or hung); " +
               checkpoint_words() + "; check the disk under the run directory",
           out);
  else if (state_ == job_state::training)
    finish(1,
           "no progress for " + std::to_string(2 * params_.cfg.step_timeout_ms / 1000) +
               " s after step " + std::to_string(committed_) +
               " (a rank hung); raise step_timeout_ms if steps are that slow",
           out);
  return out;
}

actions job_logic::on_shutdown(logic_time now) {
  actions out;
  if (ended_) return out;
  latest_ = std::max(latest_, now);
  out.push_back(
      emit_event{{{"event", "interrupted"}, {"step", committed_}, {"generation", generation_}}});
  const halt stop{exit_code::interrupted, false, committed_, ""};
  if (state_ != job_state::training) {
    finish(stop.exit_code, halt_message(stop), out);
    return out;
  }
  // The step in flight is not committed; a checkpoint being written is, before the end. A
  // divergence that is already stopping the job keeps its exit code.
  if (!halting_ || halting_->rollback) halting_ = stop;
  deadline_ = now + std::chrono::milliseconds(params_.cfg.step_timeout_ms);
  maybe_halt(now, false, out);
  return out;
}

actions job_logic::on_preempt(logic_time now) {
  actions out;
  if (ended_ || preempting_) return out;
  latest_ = std::max(latest_, now);
  preempting_ = true;
  out.push_back(emit_event{{{"event", "preempted"},
                            {"step", committed_},
                            {"generation", generation_},
                            {"state", to_string(state_)}}});
  if (halting_) return out;  // an interrupt or a divergence is stopping the job already
  if (state_ != job_state::training) {
    finish(exit_code::requeue, halt_message(halt{exit_code::requeue, false, committed_, ""}), out);
    return out;
  }
  // all_votes_in commits the next step with a checkpoint and halts; a step that was the last
  // anyway ends the job as done.
  return out;
}

void job_logic::diverged(int64_t step, const std::string& what, logic_time now, actions& out) {
  const auto& cfg = params_.cfg;
  const bool roll = cfg.on_divergence == "rollback" && rollbacks_ < cfg.max_rollbacks;
  if (roll) {
    ++rollbacks_;
    skipped_.insert(std::upper_bound(skipped_.begin(), skipped_.end(), step), step);
    out.push_back(record_skipped{skipped_});
  }
  out.push_back(emit_event{{{"event", "diverged"},
                            {"step", step},
                            {"generation", generation_},
                            {"what", what},
                            {"policy", cfg.on_divergence},
                            {"action", roll ? "rollback" : "stop"},
                            {"rollbacks", rollbacks_},
                            {"max_rollbacks", cfg.max_rollbacks},
                            {"committed_step", committed_},
                            {"skipped_steps", skipped_}}});
  halting_ = halt{roll ? exit_code::done : exit_code::diverged, roll, step, what};
  // The ranks wait for this step's commit for twice the step timeout; decide before that.
  deadline_ = now + std::chrono::milliseconds(cfg.step_timeout_ms);
  maybe_halt(now, false, out);
}

void job_logic::maybe_halt(logic_time now, bool force, actions& out) {
  if (!halting_ || ended_) return;
  if (!force && (!collecting_.empty() || committing_ > 0)) return;
  const std::string why = halt_message(*halting_);
  if (take_halt(out)) return;
  recovery_cause_ = "divergence";
  begin_generation(why, now, out);
}

bool job_logic::take_halt(actions& out) {
  const halt h = *halting_;
  halting_.reset();
  if (!h.rollback) {
    finish(h.exit_code, halt_message(h), out);
    return true;
  }
  rollback_ = true;
  return false;
}

std::string job_logic::checkpoint_words() const {
  if (checkpoint_step_ < 0) return "no checkpoint was committed";
  return "the last committed checkpoint is step " + std::to_string(checkpoint_step_) +
         (checkpoint_path_.empty() ? "" : " (" + checkpoint_path_ + ")");
}

std::string job_logic::halt_message(const halt& h) const {
  const auto& cfg = params_.cfg;
  if (h.exit_code == exit_code::interrupted)
    return "interrupted after step " + std::to_string(committed_) + "; " + checkpoint_words();
  if (h.exit_code == exit_code::requeue)
    return "stopped after step " + std::to_string(committed_) +
           " for the scheduler (SIGTERM or SIGUSR1); " + checkpoint_words() +
           (checkpoint_step_ >= 0 ? "; exit 75: requeue the job, --resume continues from there"
                                  : "; exit 75: requeue the job (it starts from step 0)");
  const std::string step = std::to_string(h.step);
  if (h.rollback)
    return "step " + step + " diverged (" + h.what + "); rolling back to " +
           (checkpoint_step_ >= 0 ? "checkpoint step " + std::to_string(checkpoint_step_)
                                  : std::string("the start (no checkpoint yet)")) +
           " and skipping the batch of step " + step + " (rollback " + std::to_string(rollbacks_) +
           " of " + std::to_string(cfg.max_rollbacks) + ")";
  return "step " + step + " diverged: " + h.what + "; it was not committed; " + checkpoint_words() +
         (cfg.on_divergence == "rollback"
              ? "; " + std::to_string(rollbacks_) + " rollbacks spent (--max-rollbacks " +
                    std::to_string(cfg.max_rollbacks) + ")"
              : "; lower --lr, or pass --on-divergence rollback");
}

void job_logic::checkpoint_failed(int64_t step, const std::string& error) {
  if (step < failed_checkpoint_step_) return;
  failed_checkpoint_step_ = step;
  failed_checkpoint_error_ = error;
}

void job_logic::maybe_finish(actions& out) {
  if (halting_) {  // a stop (divergence, interrupt) ends the job once checkpoints are in
    maybe_halt(latest_, false, out);
    return;
  }
  if (!finishing_ || !collecting_.empty() || committing_ > 0 || eval_step_ >= 0 || ended_ ||
      state_ != job_state::training)
    return;
  const auto& cfg = params_.cfg;
  const bool early = committed_ < cfg.steps;
  if (failed_checkpoint_step_ >= 0) {
    // Never silent: the job trained, but what it says is saved must be what LATEST holds.
    finish(
        exit_code::checkpoint_failed,
        (early ? "stopped after step " + std::to_string(committed_) + " as asked (exit_after_step)"
               : "trained " + std::to_string(committed_) + " steps") +
            ", but the checkpoint of step " + std::to_string(failed_checkpoint_step_) +
            " failed (" + failed_checkpoint_error_ + "); " + checkpoint_words() +
            (early ? (checkpoint_step_ >= 0 ? "; --resume continues from there"
                                            : "; --resume has nothing to continue from")
                   : ""),
        out);
    return;
  }
  // Only what LATEST holds: the last step's checkpoint may have been skipped (overlap skip).
  finish(exit_code::done,
         early ? "stopped after step " + std::to_string(committed_) +
                     " as asked (exit_after_step); " +
                     (checkpoint_step_ >= 0 ? "--resume continues from checkpoint step " +
                                                  std::to_string(checkpoint_step_)
                                            : "no checkpoint is committed to resume from")
               : "trained " + std::to_string(committed_) + " steps",
         out);
}

void job_logic::finish(int exit_code, const std::string& message, actions& out) {
  if (ended_) return;
  ended_ = true;
  set_state(exit_code == 0 ? job_state::done : job_state::failed, out, message);
  for (const auto& m : members_) {
    if (!m.live) continue;
    if (exit_code != 0)
      out.push_back(send_abort{m.id, abort_generation{generation_, message, true, {}}});
    out.push_back(send_stop{m.id});
  }
  out.push_back(emit_event{{{"event", exit_code == 0 ? "job_done" : "job_failed"},
                            {"exit_code", exit_code},
                            {"message", message},
                            {"step", committed_},
                            {"generation", generation_}}});
  out.push_back(finish_job{exit_code, message});
}

}  // namespace troupe::actors
