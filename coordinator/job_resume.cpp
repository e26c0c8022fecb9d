// Part of step 3 (the run directory): the checkpoint a resumed job starts from, the newest
// committed one that fits this config and reads back intact. A damaged one is reported, moved
// to checkpoints/damaged/ (so that the replay of its step commits a fresh one) and passed over
// for the one before; LATEST is then made to name the one chosen. None left stops the job
// (exit 1), a checkpoint of another run or model stops it as a usage error (exit 2).

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/format.hpp"
#include "coordinator/job_steps.hpp"
#include "runtime/sys/printable.hpp"
#include "runtime/sys/run_paths.hpp"
#include "strategies/workload_description.hpp"

namespace troupe::coordinator {
namespace {

namespace fs = std::filesystem;

// Everything that shapes the math must match; what only says how or how long to run (world
// size, step budget, ports, paths, cadences) may change between sessions.
const std::vector<std::string> may_change = {
    "/world", "/steps", "/resume", "/run_dir", "/metrics_port", "/metrics_host",
    "/metrics_token_file", "/progress", "/exit_after_step", "/checkpoint_every", "/eval_every",
    "/eval_batches", "/step_timeout_ms", "/bucket_bytes", "/blas_threads", "/data",
    "/checkpoint_async", "/checkpoint_overlap", "/verify_checkpoints", "/checkpoint_chunk_kib",
    "/keep_last", "/keep_every", "/optim/freeze", "/replicate_checkpoints",
    // A fixed script may resume its run (workload.command); its state's table must still fit.
    "/workload/command",
    // The layout may change too: a checkpoint holds boxes of the single-rank model, which any
    // layout reads back (reshard on restore).
    "/parallel/tp", "/parallel/pp", "/parallel/ep", "/parallel/zero", "/parallel/micro_batches",
    "/parallel/schedule", "/parallel/reduction",
    // How the job survives failures does not change what it computes.
    "/elastic/nodes", "/elastic/min_ranks", "/elastic/max_ranks", "/elastic/spares",
    "/elastic/max_restarts", "/elastic/heartbeat_timeout_ms", "/elastic/coordinator_timeout_ms",
    "/elastic/rejoin_timeout_ms", "/elastic/join_timeout_ms", "/elastic/replacement_wait_ms",
    "/elastic/straggler_policy", "/elastic/straggler_factor", "/elastic/faults", "/elastic/relay",
    // What is done about a divergence; the batches it skipped are in skipped_batches.json.
    "/on_divergence", "/max_rollbacks",
    // How the data plane's connections are guarded.
    "/data_plane_auth",
    // Where the coordinator leads through etcd, and under which name.
    "/job_id", "/etcd/endpoints", "/etcd/cacert", "/etcd/cert", "/etcd/key", "/etcd/timeout_ms"};

// The problems of a checkpoint as one line: the first, and how many more.
std::string first_problem(const std::vector<ckpt::problem>& problems) {
  return problems.front().message +
         (problems.size() > 1
              ? " (and " + std::to_string(problems.size() - 1) + " more damaged objects)"
              : "");
}

// The step LATEST names. LATEST is the commit record: when it is damaged, missing although
// step directories hold manifests, or names a step without one, that is said (a fallback).
std::optional<int64_t> read_latest(const train_config& cfg, const std::vector<int64_t>& candidates,
                                   resume_choice& out) {
  const std::string latest_path = run_paths::latest(cfg.run_dir).string();
  std::optional<int64_t> latest;
  try {
    latest = ckpt::read_latest_step(cfg.run_dir);
  } catch (const ckpt::checkpoint_error& e) {
    out.fallbacks.push_back({-1, e.path(), e.what(), ""});
  }
  if (!latest && out.fallbacks.empty() && !candidates.empty())
    out.fallbacks.push_back(
        {-1, latest_path,
         "checkpoint: " + latest_path +
             ": is missing although step directories hold manifests, so no checkpoint is known "
             "committed; taking the newest one that reads back intact",
         ""});
  if (latest && !std::binary_search(candidates.begin(), candidates.end(), *latest))
    out.fallbacks.push_back({-1, latest_path,
                             "checkpoint: " + latest_path + ": names " +
                                 ckpt::format::step_dir_name(*latest) +
                                 ", which holds no manifest; taking the newest one before it "
                                 "that reads back intact",
                             ""});
  return latest;
}

// Whether the committed checkpoint of `step` is the one to resume from: it fits this config
// (else config_error) and reads back intact. A damaged one is moved to checkpoints/damaged/.
bool take_checkpoint(const train_config& cfg, const nlohmann::json& config, int64_t step,
                     resume_choice& out) {
  ckpt::manifest man;
  try {
    man = ckpt::read_manifest(cfg.run_dir, step);
  } catch (const ckpt::checkpoint_error& e) {
    out.fallbacks.push_back(
        {step, e.path(), e.what(),
         ckpt::is_damage(e.kind())
             ? ckpt::quarantine_checkpoint(cfg.run_dir, step, ckpt::damage_reason(e.kind()))
             : std::string()});
    return false;
  }
  try {
    // A program's state is known from its checkpoint alone; its ranks check the table when they
    // load it (load_state_dict), and the config is compared here as for the built-in model.
    const size_t numel = cfg.external_workload() ? man.global_numel
                                                 : strategies::describe_workload(cfg).global_numel;
    ckpt::require_compatible(man, config, numel, may_change);
  } catch (const ckpt::checkpoint_error& e) {
    throw config_error(std::string("resume: ") + e.what());
  }
  const auto problems = ckpt::verify_checkpoint(cfg.run_dir, step);
  if (!problems.empty()) {
    out.fallbacks.push_back(
        {step, problems.front().path, first_problem(problems),
         ckpt::any_damage(problems)
             ? ckpt::quarantine_checkpoint(cfg.run_dir, step,
                                           ckpt::damage_reason(problems.front().kind))
             : std::string()});
    return false;
  }
  out.step = man.step;
  out.layout = man.format_version >= 2 ? man.layout : "dp" + std::to_string(man.world);
  out.format = man.format_version;
  return true;
}

void print_fallbacks(const resume_choice& out) {
  for (const auto& f : out.fallbacks)
    say("resume: passing over %s: %s%s",
        f.step < 0 ? "LATEST" : ("checkpoint step " + std::to_string(f.step)).c_str(),
        sys::printable(f.error).c_str(),
        f.quarantined.empty()
            ? ""
            : ("; moved it to " + sys::printable(f.quarantined) + " (kept, not deleted)").c_str());
}

// With a checkpoint chosen: what was written but never committed (newer than LATEST) goes out
// of the way of the replay, which commits those steps afresh, and LATEST names the choice.
void settle_on(const train_config& cfg, const std::vector<int64_t>& uncommitted,
               std::optional<int64_t> latest, resume_choice& out) {
  for (int64_t step : uncommitted) {
    const std::string where = ckpt::quarantine_checkpoint(cfg.run_dir, step, "never-committed");
    say("resume: step %lld was written but never committed (newer than LATEST); "
        "moved it to %s\n",
        static_cast<long long>(step), sys::printable(where).c_str());
  }
  if (latest != out.step) {
    ckpt::point_latest_at(cfg.run_dir, out.step);
    out.latest_was = latest;
    out.latest_repaired = true;
    say("resume: LATEST now names %s (it %s)", ckpt::format::step_dir_name(out.step).c_str(),
        latest ? ("named " + ckpt::format::step_dir_name(*latest)).c_str()
               : "was missing or unreadable");
  }
  say("resuming from checkpoint step %lld (written by %s, format %d)%s",
      static_cast<long long>(out.step), out.layout.c_str(), out.format,
      std::any_of(out.fallbacks.begin(), out.fallbacks.end(),
                  [](const passed_over& f) { return f.step >= 0; })
          ? ", an earlier one than the newest"
          : "");
}

}  // namespace

resume_choice resume_point(const train_config& cfg, const nlohmann::json& config) {
  resume_choice out;
  std::vector<int64_t> candidates = ckpt::list_committed(cfg.run_dir);
  const std::optional<int64_t> latest = read_latest(cfg, candidates, out);
  const std::string checkpoints = run_paths::checkpoints(cfg.run_dir).string();
  if (candidates.empty() && out.fallbacks.empty())
    throw config_error("resume: no committed checkpoint in " + checkpoints +
                       "; run without --resume to start fresh, or point --run-dir at the run");
  // Newest first, never past what LATEST names (a newer manifest was never committed).
  std::sort(candidates.rbegin(), candidates.rend());
  std::vector<int64_t> uncommitted;
  for (int64_t step : candidates) {
    if (latest && step > *latest)
      uncommitted.push_back(step);
    else if (take_checkpoint(cfg, config, step, out))
      break;
  }
  print_fallbacks(out);
  if (out.format == 0 && latest && !fs::exists(ckpt::format::step_dir(cfg.run_dir, *latest)))
    ckpt::point_latest_at(cfg.run_dir, std::nullopt);  // it must never name a damaged step
  if (out.format == 0)
    throw std::runtime_error("resume: no committed checkpoint in " + checkpoints +
                             " reads back intact (see above; damaged ones are in "
                             "checkpoints/damaged/); nothing to resume. Restore the damaged files "
                             "from a copy, or start a new run.");
  if (out.step >= cfg.steps)
    throw config_error("resume: the checkpoint is at step " + std::to_string(out.step) +
                       ", which is not before --steps " + std::to_string(cfg.steps) +
                       "; raise --steps");
  settle_on(cfg, uncommitted, latest, out);
  return out;
}

}  // namespace troupe::coordinator
