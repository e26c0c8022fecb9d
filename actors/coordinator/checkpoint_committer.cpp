// The checkpoint committer's thread.

#include "actors/coordinator/checkpoint_committer.hpp"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "checkpoint/durable_io.hpp"
#include "checkpoint/format.hpp"
#include "monitoring/events/events.hpp"
#include "monitoring/log.hpp"

namespace troupe::actors {

checkpoint_committer::checkpoint_committer(std::string run_dir, ckpt::retention_policy policy,
                                           caf::actor reply_to,
                                           std::optional<int64_t> verified_step)
    : run_dir_(std::move(run_dir)), policy_(policy), reply_to_(std::move(reply_to)) {
  if (verified_step) gc_memory_.verified.insert(*verified_step);
  try {
    latest_seen_ = ckpt::read_latest_step(run_dir_);
  } catch (const std::exception&) {  // a damaged LATEST: the first commit replaces it
  }
  thread_ = std::thread([this] { run(); });
}

checkpoint_committer::~checkpoint_committer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    lane_.lift();  // the final commit is waited for
  }
  wake_.notify_all();
  thread_.join();
}

void checkpoint_committer::commit(ckpt::manifest m) {
  {
    std::lock_guard lock(mutex_);
    if (working_ || !queue_.empty()) lane_.lift();  // behind: catch up
    queue_.emplace_back(std::move(m));
  }
  wake_.notify_all();
}

void checkpoint_committer::collect_garbage(uint64_t ticket) {
  {
    std::lock_guard lock(mutex_);
    if (working_ || !queue_.empty()) lane_.lift();
    queue_.emplace_back(gc_job{ticket});
  }
  wake_.notify_all();
}

void checkpoint_committer::run() {
  pthread_setname_np(pthread_self(), "troupe-ckpt-c");  // names it in top -H and perf
  // Like the ranks' writers, this thread runs on cores that training leaves idle (see
  // runtime/sys/idle_priority.hpp), at nice 10 while it is lifted because work piles up.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  lane_.join();
  for (;;) {
    std::unique_lock lock(mutex_);
    working_ = false;
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    job next = std::move(queue_.front());
    queue_.pop_front();
    working_ = true;
    if (stopping_) lane_.lift();  // the job's end is waiting for these
    lock.unlock();
    lane_.job_started();
    if (auto* m = std::get_if<ckpt::manifest>(&next))
      do_commit(*m);
    else if (auto* f = std::get_if<fallback_job>(&next))
      do_fall_back(*f);
    else
      do_collect(std::get<gc_job>(next));
    lane_.job_finished();
  }
}

void checkpoint_committer::fall_back(int64_t step, std::string why) {
  {
    std::lock_guard lock(mutex_);
    lane_.lift();  // a recovery waits for it
    queue_.emplace_back(fallback_job{step, std::move(why)});
  }
  wake_.notify_all();
}

std::string checkpoint_committer::check_or_quarantine(int64_t step, std::string& quarantined) {
  const auto problems = ckpt::verify_checkpoint(run_dir_, step);
  if (problems.empty()) return "";
  const std::string what = problems.front().message +
                           (problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) +
                                                      " more damaged objects)"
                                                : "");
  if (ckpt::any_damage(problems)) {
    quarantined =
        ckpt::quarantine_checkpoint(run_dir_, step, ckpt::damage_reason(problems.front().kind));
    gc_memory_.references.erase(step);
    gc_memory_.verified.erase(step);
    // A rank that wrote a damaged chunk still trusts it and would name it again in a replay's
    // checkpoint of the same content: with the file moved aside, it writes the chunk anew.
    const std::string chunks = run_paths::chunks(run_dir_).string() + "/";
    for (const auto& p : problems) {
      if (!ckpt::is_damage(p.kind) || !p.path.starts_with(chunks)) continue;
      try {
        ckpt::move_aside(run_dir_, p.path, "damaged-chunk");
      } catch (const std::exception&) {  // gone already (a writer moved it): nothing to do
      }
    }
  }
  return what;
}

void checkpoint_committer::do_fall_back(const fallback_job& f) {
  checkpoint_fallback_found found;
  found.damaged = f.step;
  try {
    check_fence("no checkpoint moved");
    found.error = check_or_quarantine(f.step, found.quarantined);
    if (found.error.empty()) {
      // It reads back now (the rank met a passing failure): restored from again.
      found.intact = f.step;
      found.error = f.why + " (it reads back intact now)";
    } else {
      const auto steps = ckpt::list_committed(run_dir_);
      for (auto it = steps.rbegin(); it != steps.rend() && !found.intact; ++it) {
        if (*it >= f.step) continue;
        std::string moved;
        if (check_or_quarantine(*it, moved).empty())
          found.intact = *it;
        else
          found.passed_over.push_back(*it);
      }
    }
    if (found.intact) {
      found.path = ckpt::format::step_dir(run_dir_, *found.intact).string();
      gc_memory_.verified.insert(*found.intact);
    }
    // LATEST never names a checkpoint that was moved aside: it names the intact one, or
    // nothing when none is.
    const bool moved = !found.quarantined.empty() || !found.passed_over.empty();
    if (moved && latest_seen_ && latest_seen_ != found.intact &&
        (*latest_seen_ == f.step || std::find(found.passed_over.begin(), found.passed_over.end(),
                                              *latest_seen_) != found.passed_over.end())) {
      if (const std::string failed = point_latest_patiently(found.intact); failed.empty()) {
        latest_seen_ = found.intact;
      } else if (found.intact) {
        // The intact checkpoint is found and the job goes on from it: the next commit moves
        // LATEST. Ending the job here would lose the training that the disk allows again.
        found.error += "; LATEST still names step " + std::to_string(f.step) + " (" + failed +
                       "); the next committed checkpoint moves it";
      } else {
        throw std::runtime_error(failed);
      }
    }
  } catch (const std::exception& e) {
    found.intact.reset();
    found.error =
        (found.error.empty() ? f.why : found.error) + "; looking for an earlier one: " + e.what();
  }
  caf::anon_send(reply_to_, ckpt_fallback_atom::value, fallback_done{std::move(found)});
}

std::string checkpoint_committer::point_latest_patiently(std::optional<int64_t> step) {
  // A full disk or another passing refusal of the OS (the soak fills the disk for 1.5 s) is
  // waited out for a while; a lost leadership is not.
  const auto until = std::chrono::steady_clock::now() + latest_patience;
  for (;;) {
    try {
      ckpt::point_latest_at(run_dir_, step, [&] { check_fence("LATEST not moved"); });
      return "";
    } catch (const ckpt::checkpoint_error& e) {
      if (e.kind() != ckpt::error_kind::io || std::chrono::steady_clock::now() >= until)
        return e.what();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // pacing of the retries
  }
}

void checkpoint_committer::check_fence(const char* doing) const {
  if (!fence_) return;
  if (!fence_())
    throw std::runtime_error(std::string("this coordinator no longer leads the job; ") + doing);
  std::optional<int64_t> latest;
  try {
    latest = ckpt::read_latest_step(run_dir_);
  } catch (const std::exception&) {
    latest = -1;  // damaged since this committer looked: not what it left
  }
  if (latest != latest_seen_)
    throw std::runtime_error("LATEST names step " +
                             (latest ? std::to_string(*latest) : std::string("none")) +
                             ", which this coordinator did not commit (it expected " +
                             (latest_seen_ ? std::to_string(*latest_seen_) : std::string("none")) +
                             "): another coordinator leads the job; " + doing);
}

void checkpoint_committer::undo_deposed_commit(int64_t step, bool moved_latest) {
  // The manifest this coordinator wrote after it was deposed names chunks the new leader
  // never knew of and may have collected: it must not stay a committed checkpoint. LATEST
  // goes back to what it named before, unless someone has moved it since.
  try {
    if (moved_latest && ckpt::read_latest_step(run_dir_) == step)
      ckpt::point_latest_at(run_dir_, latest_seen_);
    const auto manifest = ckpt::format::step_dir(run_dir_, step) / ckpt::format::manifest_name;
    if (::unlink(manifest.c_str()) == 0) ckpt::io::fsync_dir(manifest.parent_path());
  } catch (const std::exception& e) {
    monitoring::log(monitoring::level::error, {"coordinator", -1, 0, step},
                    std::string("undoing a commit made after losing the lead: ") + e.what());
  }
}

void checkpoint_committer::do_commit(const ckpt::manifest& m) {
  std::string error;
  try {
    // Checked right before each rename, after the slow fsyncs, not once up front: a stall
    // (SIGSTOP, a VM pause) between a check and the write it allows is what deposes a leader.
    int renames_allowed = 0;
    try {
      ckpt::commit_manifest(run_dir_, m, [&] {
        check_fence("not committed");
        ++renames_allowed;
      });
    } catch (...) {
      if (renames_allowed > 0 && fence_ && !fence_()) undo_deposed_commit(m.step, false);
      throw;
    }
    // And once after: a stall between the check and the rename is caught here.
    if (renames_allowed > 0 && fence_ && !fence_()) {
      undo_deposed_commit(m.step, renames_allowed > 1);
      throw std::runtime_error("this coordinator lost the lead while committing; not committed");
    }
    latest_seen_ = m.step;
    gc_memory_.remember(m);
    // Every chunk it names was written by this job's ranks or checked by them first.
    gc_memory_.verified.insert(m.step);
  } catch (const std::exception& e) {
    error = e.what();
  }
  caf::anon_send(reply_to_, ckpt_done_atom::value, m.step,
                 error.empty() ? ckpt::format::step_dir(run_dir_, m.step).string() : std::string(),
                 error);
}

void checkpoint_committer::do_collect(const gc_job& g) {
  // A writer that started after the ticket holds (or will wait for) the chunk store lock;
  // one that already finished changed the request count. Either way: not now.
  events::job_event event;
  try {
    check_fence("nothing collected");
  } catch (const std::exception&) {
    return;  // another coordinator may lead, and its checkpoints are live
  }
  try {
    const auto lock = ckpt::chunk_store_lock::try_exclusive(run_dir_);
    if (!lock || requests_.load() != g.ticket) return;
    // Again under the lock: no writer of anyone's can start now, so what this collection
    // finds unreferenced stays so.
    try {
      check_fence("nothing collected");
    } catch (const std::exception&) {
      return;
    }
    const auto started = std::chrono::steady_clock::now();
    // Keep as many collected files as the newest checkpoint has chunks: what the next one
    // writes when all of its state has changed. The disk then holds what it held at the
    // peak of a write, steadily.
    gc_memory_.recycle_up_to =
        gc_memory_.references.empty() ? 0 : gc_memory_.references.rbegin()->second.size();
    const ckpt::gc_result gc =
        ckpt::collect_garbage(run_dir_, policy_, std::chrono::minutes(10), gc_memory_);
    // Entries that are not troupe's (links, directories, ...) are skipped; each is said once.
    std::vector<std::string> foreign;
    for (const std::string& f : gc.foreign)
      if (foreign_reported_.insert(f).second && foreign.size() < 32) foreign.push_back(f);
    if (gc.removed_steps.empty() && gc.chunks_removed == 0 && foreign.empty()) return;
    event = events::checkpoint_gc{
        .foreign = std::move(foreign),
        .removed_steps = gc.removed_steps,
        .chunks_removed = gc.chunks_removed,
        .chunks_recycled = gc.chunks_recycled,
        .chunks_kept = gc.chunks_kept,
        .bytes_freed = gc.bytes_freed,
        .seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()};
  } catch (const std::exception& e) {
    event = events::checkpoint_gc_failed{e.what()};
  }
  caf::anon_send(reply_to_, ckpt_gc_atom::value, gc_event{std::move(event)});
}

}  // namespace troupe::actors
