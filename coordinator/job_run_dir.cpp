// Step 3 of a job's coordinator: the run directory, held by this job alone, with the job's
// credentials, its config and the first lines of its history written.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "actors/coordinator/job_supervisor.hpp"
#include "checkpoint/durable_io.hpp"
#include "coordinator/job_steps.hpp"
#include "monitoring/events/events.hpp"
#include "runtime/auth/credentials.hpp"
#include "runtime/optim/adamw.hpp"
#include "runtime/settings.hpp"
#include "runtime/sys/printable.hpp"
#include "runtime/sys/process_clock.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::coordinator {
namespace {

namespace fs = std::filesystem;

// The corpus must be a file; the workers open it by its absolute path.
void resolve_corpus(train_config& cfg) {
  if (cfg.data.empty() || !fs::is_regular_file(cfg.data))
    throw config_error(
        "data: corpus file '" + cfg.data +
        "' not found; run scripts/setup.sh (it builds the default corpus) or pass --data FILE");
  cfg.data = fs::absolute(cfg.data).string();
}

// Moves the earlier run in `run_dir` to RUN_DIR.prev-<seconds> instead of mixing a fresh one
// into it (no committed data is ever deleted), and makes `run_dir` afresh. The lock this job
// holds moves back with its file: a lock belongs to the file it was taken on, so the fresh
// directory is this job's from the start and no other job can take it in between.
void archive_earlier_run(const std::string& run_dir) {
  // Named by the second of the move; a run archived earlier in the same second (a job of one
  // step) already has that name, so the next free second is taken.
  int64_t seconds = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  fs::path archived;
  std::error_code unreadable;  // then the rename below says why
  do archived = run_paths::archived(run_dir, seconds++);
  while (fs::symlink_status(archived, unreadable).type() != fs::file_type::not_found &&
         !unreadable);
  fs::rename(run_dir, archived);
  say("%s held an earlier run; moved it to %s (use --resume to continue a run)", run_dir.c_str(),
      archived.c_str());
  ckpt::io::make_dirs_durable(run_paths::checkpoints(run_dir));
  fs::rename(run_paths::run_lock(archived), run_paths::run_lock(run_dir));
}

// One job per run directory: the lock also keeps `troupe ckpt gc` off chunks being written.
// Taken once, before an earlier run is moved aside, and held until the job ends.
ckpt::run_lock take_run_dir(const train_config& cfg) {
  const bool earlier_run = !cfg.resume && fs::exists(run_paths::checkpoints(cfg.run_dir));
  fs::create_directories(cfg.run_dir);
  auto lock = ckpt::run_lock::try_acquire(cfg.run_dir);
  if (!lock)
    throw config_error("run_dir: another troupe job is using " + cfg.run_dir + " (it holds " +
                       run_paths::run_lock("").string() + "); stop it or pick another --run-dir");
  if (earlier_run) archive_earlier_run(cfg.run_dir);
  // Nobody else holds the run: what an interrupted write left behind is garbage now.
  for (const auto& path : ckpt::remove_stale_temp_files(cfg.run_dir, *lock))
    say("removed %s, left by an interrupted write", path.c_str());
  return std::move(*lock);
}

// Batches skipped after divergences belong to the run being resumed, never to a fresh one.
std::vector<int64_t> skipped_batches(const train_config& cfg) {
  if (cfg.resume) return actors::load_skipped_batches(cfg.run_dir);
  std::error_code ignored;  // read-only run dir: opening events.jsonl below fails and says so
  fs::remove(run_paths::skipped_batches(cfg.run_dir), ignored);
  return {};
}

// This job's credentials: every agent and worker proves it holds them before any byte it
// sends reaches the control plane or the store (runtime/auth, docs/SECURITY.md).
void create_credentials(const std::string& run_dir) {
  try {
    auth::set_process_credentials(auth::create_join_token(run_paths::join_token(run_dir).string()));
  } catch (const auth::credentials_error& e) {
    throw config_error(std::string("run_dir: ") + e.what());
  }
}

// events.jsonl, opened with what this session starts from: the job, the checkpoints a resume
// passed over, and the one it resumes from.
monitoring::event_log open_events(const job_plan& job, const nlohmann::json& config,
                                  const resume_choice& resumed) {
  const train_config& cfg = job.cfg;
  auto events = monitoring::event_log::open(run_paths::events(cfg.run_dir).string());
  namespace ev = troupe::events;
  sys::mark_job_started();  // the job's time accounting starts with this line
  events.write(
      ev::to_json(ev::job_start{.world = cfg.world,
                                .steps = cfg.steps,
                                .resume = cfg.resume,
                                .start_step = resumed.step,
                                .config = config,
                                .pid = getpid(),
                                .layout = strategies::plan_doc(job.layout, cfg.parallel.zero)}));
  for (const auto& f : resumed.fallbacks)
    events.write(ev::to_json(ev::checkpoint_fallback{.step = f.step,
                                                     .path = f.path,
                                                     .error = f.error,
                                                     .quarantined = f.quarantined,
                                                     .resumed_step = resumed.step}));
  if (cfg.resume)
    events.write(ev::to_json(ev::resume{.step = resumed.step,
                                        .written_by = resumed.layout,
                                        .format_version = resumed.format,
                                        .latest_repaired = resumed.latest_repaired,
                                        .latest_was = {resumed.latest_was}}));
  return events;
}

// A resume says which settings it changed: the run's own config is where it started from.
void say_what_changed(const train_config& saved, const train_config& cfg) {
  std::string changes;
  for (const auto& c : changed_settings(saved, cfg)) {
    if (c.what->key == "resume" || c.what->key == "run_dir") continue;
    changes += (changes.empty() ? "" : ", ") + c.what->key + " " + sys::printable(c.before) +
               " -> " + sys::printable(c.after);
  }
  say("resume: the run's config from %s%s%s", run_paths::config(cfg.run_dir).c_str(),
      changes.empty() ? ", unchanged" : "; changed: ", changes.c_str());
}

// A resume that changed the run's length goes on from the learning rate the run had reached,
// never with a jump: past the warm-up, the cosine is re-based at the resumed step. Returns
// whether the schedule changed.
bool continue_schedule(train_config& cfg, const train_config& saved, int64_t step) {
  if (saved.steps == cfg.steps || step < cfg.optim.warmup_steps) return false;
  const double now = scheduled_lr(saved.optim, step, saved.steps);
  cfg.optim.rebase_step = static_cast<int>(step);
  cfg.optim.rebase_lr = now;
  say("resume: --steps %d -> %d: the learning rate goes on from %.4g (its value "
      "at step %lld) and decays to %.4g at step %d\n",
      saved.steps, cfg.steps, now, static_cast<long long>(step + 1),
      cfg.optim.lr * cfg.optim.min_lr_ratio, cfg.steps);
  return true;
}

// A new run draws its incarnation; a resumed one keeps it (or draws one, from before).
void mark_incarnation(const train_config& cfg) {
  const fs::path path = run_paths::incarnation(cfg.run_dir);
  std::error_code ec;
  if (cfg.resume && fs::is_regular_file(path, ec)) return;
  std::random_device random;
  char text[24];
  std::snprintf(text, sizeof text, "%08x%08x\n", static_cast<unsigned>(random()),
                static_cast<unsigned>(random()));
  ckpt::io::write_file_atomically(path, text);
}

}  // namespace

run_dir_state prepare_run_dir(job_plan& job) {
  train_config& cfg = job.cfg;
  resolve_corpus(cfg);
  ckpt::run_lock lock = take_run_dir(cfg);
  std::vector<int64_t> skipped = skipped_batches(cfg);
  create_credentials(cfg.run_dir);
  mark_incarnation(cfg);
  nlohmann::json config = to_json(cfg);
  const resume_choice resumed = cfg.resume ? resume_point(cfg, config) : resume_choice{};
  if (cfg.resume && job.saved) {
    say_what_changed(*job.saved, cfg);
    if (continue_schedule(cfg, *job.saved, resumed.step)) config = to_json(cfg);
  }
  // Replaced by rename, never written through: a link planted in the run directory is not
  // followed (docs/SECURITY.md).
  ckpt::io::write_file_atomically(run_paths::config(cfg.run_dir), config.dump(2) + "\n");
  return {std::move(lock), resumed.step, std::move(skipped), open_events(job, config, resumed)};
}

run_dir_state join_run_dir(job_plan& job, const std::string& join_token) {
  train_config& cfg = job.cfg;
  resolve_corpus(cfg);
  try {
    auth::set_process_credentials(auth::load_join_token(join_token));
  } catch (const auth::credentials_error& e) {
    throw config_error(std::string("--join-token: ") + e.what());
  }
  auto events = monitoring::event_log::open(run_paths::events(cfg.run_dir).string());
  return {std::nullopt, 0, actors::load_skipped_batches(cfg.run_dir), std::move(events)};
}

}  // namespace troupe::coordinator
