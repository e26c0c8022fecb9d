#include "actors/coordinator/job/checkpoint_collection.hpp"

#include <algorithm>

#include "monitoring/events/events.hpp"

namespace troupe::actors {

bool checkpoint_due(int64_t step, int64_t total_steps, int every) {
  return step == total_steps || (every > 0 && step % every == 0);
}

checkpoint_collection::checkpoint_collection(const job_params& p)
    : last_step_of_session_(session_last_step(p.cfg)),
      every_(p.cfg.checkpoint_every),
      checkpoint_step_(p.checkpoint_step) {}

bool checkpoint_collection::wanted(int64_t step, bool preempting) const {
  return step > checkpoint_step_ && (checkpoint_due(step, last_step_of_session_, every_) ||
                                     (owed_ && step >= owed_->from) || preempting);
}

void checkpoint_collection::start(int64_t step, int world) {
  collection c;
  c.commit.step = step;
  c.commit.world = world;
  c.reported.assign(static_cast<size_t>(world), false);
  if (owed_ && step >= owed_->from) {  // this checkpoint stands in for an abandoned one
    c.commit.replaces = owed_->replaces;
    owed_.reset();
  }
  collecting_[step] = std::move(c);
}

void checkpoint_collection::abandon(const std::string& reason, uint64_t next, actions& out) {
  for (const auto& [step, c] : collecting_) {
    if (!c.ok) {
      // A rank had already failed to write its share: that failure counts as any other,
      // and the next checkpoint due makes up for it as it would have.
      out.push_back(emit_event{events::checkpoint_failed{step, c.failed, c.error}});
      failed(step, c.error);
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
    out.push_back(emit_event{events::checkpoint_abandoned{
        .step = step,
        .generation = next - 1,
        .ranks_reported = c.in,
        .world = c.commit.world,
        .reason = "generation " + std::to_string(next - 1) +
                  " ended before every rank reported its share: " + reason,
        .retake_from = owed_->from,
        .then = "the first step from " + std::to_string(owed_->from) +
                " that the job commits takes a checkpoint in its place"}});
  }
  collecting_.clear();
}

checkpoint_collection::share_outcome checkpoint_collection::add_share(const shard_written& w,
                                                                      uint64_t generation,
                                                                      int world, actions& out) {
  const auto it = collecting_.find(w.step);
  if (w.generation != generation || it == collecting_.end() || w.rank < 0 || w.rank >= world ||
      it->second.reported[static_cast<size_t>(w.rank)])
    return share_outcome::stale;
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
    // A program's ranks each say what their state is; they must all say the same.
    if (error.empty() && !w.state_table_json.empty()) {
      if (c.commit.state_table_json.empty())
        c.commit.state_table_json = w.state_table_json;
      else if (c.commit.state_table_json != w.state_table_json)
        error = "rank " + std::to_string(w.rank) +
                " holds a state with another table or extras than another rank's (the script "
                "is not the same on every rank, or keeps per-rank state in an extra)";
    }
    // Against the ranks that wrote theirs: a skipped or failed share says nothing of its step.
    if (error.empty() && c.written > 0 && w.adam_t != c.commit.adam_t)
      error = "rank " + std::to_string(w.rank) + " is at optimizer step " +
              std::to_string(w.adam_t) + ", another rank at " + std::to_string(c.commit.adam_t);
    c.commit.adam_t = w.adam_t;
    ++c.written;
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
  if (c.in < c.commit.world) return share_outcome::awaited;
  collection done = std::move(c);
  collecting_.erase(it);
  if (done.ok && !done.skipped) {
    ++committing_;
    out.push_back(std::move(done.commit));
    return share_outcome::awaited;
  }
  if (!done.ok) {
    out.push_back(emit_event{events::checkpoint_failed{w.step, done.failed, done.error}});
    failed(w.step, done.error);
  }
  if (done.skipped && done.ok) {
    out.push_back(emit_event{events::checkpoint_skipped{
        w.step, "a rank was still writing the previous checkpoint (checkpoint_overlap skip)"}});
    // A checkpoint in place of an abandoned one is still owed: usually the survivors were
    // still writing their shares of the abandoned one. The next committed step tries again.
    if (done.commit.replaces >= 0 && !owed_) owed_ = owed_checkpoint{w.step, done.commit.replaces};
  }
  return share_outcome::given_up;
}

void checkpoint_collection::committed(const commit_checkpoint& c, const std::string& path,
                                      const std::string& error, uint64_t generation, actions& out) {
  const int64_t step = c.step;
  committing_ = std::max(0, committing_ - 1);
  if (!error.empty()) {
    out.push_back(emit_event{events::checkpoint_failed{step, std::nullopt, error}});
    failed(step, error);
    return;
  }
  checkpoint_step_ = std::max(checkpoint_step_, step);
  checkpoint_path_ = path;
  if (step >= failed_step_) {  // a later checkpoint made up for the failed one
    failed_step_ = -1;
    failed_error_.clear();
  }
  out.push_back(emit_event{events::checkpoint{
      .step = step,
      .path = path,
      .generation = generation,
      .bytes_written = c.bytes_written,
      .bytes_deduplicated = c.bytes_deduplicated,
      .stall_s = c.stall_s,
      .write_s = c.write_s,
      .snapshot_buffer_bytes = c.snapshot_buffer_bytes,
      .replicated_bytes = c.replicated_bytes,
      // the abandoned checkpoint's step
      .replaces = c.replaces >= 0 ? std::optional<int64_t>(c.replaces) : std::nullopt}});
}

std::string checkpoint_collection::words() const {
  if (checkpoint_step_ < 0) return "no checkpoint was committed";
  return "the last committed checkpoint is step " + std::to_string(checkpoint_step_) +
         (checkpoint_path_.empty() ? "" : " (" + checkpoint_path_ + ")");
}

void checkpoint_collection::failed(int64_t step, const std::string& error) {
  if (step < failed_step_) return;
  failed_step_ = step;
  failed_error_ = error;
}

}  // namespace troupe::actors
