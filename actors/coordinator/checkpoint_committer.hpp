#pragma once
// The coordinator's disk work for checkpoints, off the actor that commits steps: writing a
// manifest and LATEST (fsyncs) and retention (unlinking old manifests and chunks) take tens
// of milliseconds, which the ranks would otherwise spend waiting for their next commit.
// One thread does the jobs in order and answers the supervisor with messages.

#include <atomic>
#include <caf/all.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <variant>

#include "actors/coordinator/job/job_actions.hpp"
#include "checkpoint/checkpoint.hpp"
#include "monitoring/events/events.hpp"
#include "runtime/sys/idle_priority.hpp"

namespace troupe::actors {

/// (ckpt_done_atom, step, path, error): a manifest committed (error empty) or not.
using ckpt_done_atom = caf::atom_constant<caf::atom("ckptdone")>;
/// (ckpt_gc_atom, gc_event): what a garbage collection removed.
using ckpt_gc_atom = caf::atom_constant<caf::atom("ckptgc")>;

/// (ckpt_fallback_atom, fallback_done): what a fall_back found.
using ckpt_fallback_atom = caf::atom_constant<caf::atom("ckptfall")>;

/// A checkpoint_fallback_found handed from the committer's thread to the supervisor.
struct fallback_done {
  checkpoint_fallback_found found;
};

/// A checkpoint_gc or checkpoint_gc_failed event for the job's log, handed from the
/// committer's thread to the supervisor as a value (it never leaves the process).
struct gc_event {
  events::job_event event;
};

class checkpoint_committer {
 public:
  /// `verified_step`: a committed checkpoint already known intact (a resume's), which
  /// retention may keep in place of newer ones it has not verified.
  checkpoint_committer(std::string run_dir, ckpt::retention_policy policy, caf::actor reply_to,
                       std::optional<int64_t> verified_step = std::nullopt);
  /// Finishes the queued jobs (a final checkpoint must be committed), then stops.
  ~checkpoint_committer();
  checkpoint_committer(const checkpoint_committer&) = delete;
  checkpoint_committer& operator=(const checkpoint_committer&) = delete;

  /// Queues the commit of `m`; answered with ckpt_done_atom.
  void commit(ckpt::manifest m);
  /// Counts a checkpoint asked of the ranks (they may start writing chunks now).
  void checkpoint_requested() { requests_.fetch_add(1); }
  /// The number of checkpoints asked so far: the ticket of a collection queued now.
  [[nodiscard]] uint64_t requests() const { return requests_.load(); }
  /// Queues retention and chunk garbage collection. It runs only if no checkpoint was asked
  /// for since `ticket` was taken and no writer holds the chunk store; otherwise it waits for
  /// the next one. Answered with ckpt_gc_atom when it removed something.
  void collect_garbage(uint64_t ticket);
  /// Queues the search for an intact checkpoint after a rank could not read the one of
  /// `step` (`why`): it is verified, moved to checkpoints/damaged/ when damaged, and so are the
  /// older ones until one reads back intact; LATEST then names that one. Answered with
  /// ckpt_fallback_atom.
  void fall_back(int64_t step, std::string why);
  /// With etcd: asked (on the committer's thread) right before a manifest is written, right
  /// before LATEST is moved, and before anything is collected; false (this coordinator no
  /// longer leads: it may have woken from a stall while another leads the job) commits and
  /// collects nothing. With a fence, LATEST must also still name what this committer last
  /// left there (or found when it was made): a LATEST moved by another coordinator is never
  /// moved back. Set before the first job is queued.
  void set_fence(std::function<bool()> still_leading) { fence_ = std::move(still_leading); }

 private:
  // Throws when this coordinator may not touch the run's checkpoints any more (see set_fence).
  void check_fence(const char* doing) const;
  // Takes back a manifest (and LATEST, when `moved_latest`) written after the lead was lost.
  void undo_deposed_commit(int64_t step, bool moved_latest);
  // Points LATEST at `step` (nothing when nullopt), retrying a refusal of the OS for up to
  // latest_patience; returns why it could not, empty when done.
  std::string point_latest_patiently(std::optional<int64_t> step);
  static constexpr std::chrono::seconds latest_patience{10};

  std::function<bool()> fence_;
  std::optional<int64_t> latest_seen_;  // LATEST as this committer left or found it
  struct gc_job {
    uint64_t ticket;
  };
  struct fallback_job {
    int64_t step;
    std::string why;
  };
  using job = std::variant<ckpt::manifest, gc_job, fallback_job>;
  void run();
  void do_commit(const ckpt::manifest& m);
  void do_collect(const gc_job& g);
  void do_fall_back(const fallback_job& f);
  // Verifies committed checkpoint `step`: "" when intact, else what is wrong (and the
  // checkpoint is moved aside when that is damage; `quarantined` says where).
  std::string check_or_quarantine(int64_t step, std::string& quarantined);

  std::string run_dir_;
  ckpt::retention_policy policy_;
  caf::actor reply_to_;
  std::atomic<uint64_t> requests_{0};
  ckpt::gc_memory gc_memory_;  // this thread's alone: what it committed, so GC parses nothing
  std::set<std::string> foreign_reported_;  // this thread's alone too
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<job> queue_;
  bool stopping_ = false;
  bool working_ = false;  // a job is being done
  // Jobs run on cores that training leaves idle, for at most half a second each.
  sys::idle_lane lane_{std::chrono::milliseconds(500)};
  std::thread thread_;
};

}  // namespace troupe::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::gc_event)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::fallback_done)
