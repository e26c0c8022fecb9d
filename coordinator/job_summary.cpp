// Step 5 of a job's coordinator: the end-of-run summary.

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/job_steps.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::coordinator {
namespace {

const char* verdict_of(int exit_code) {
  switch (exit_code) {
    case actors::exit_code::done:
      return "done";
    case actors::exit_code::diverged:
      return "DIVERGED";
    case actors::exit_code::checkpoint_failed:
      return "done, but a CHECKPOINT FAILED";
    case actors::exit_code::interrupted:
      return "interrupted";
    case actors::exit_code::requeue:
      return "stopped for the scheduler (requeue)";
    default:
      return "FAILED";
  }
}

}  // namespace

std::string committed_checkpoint_words(const std::string& run_dir) {
  try {
    if (auto man = ckpt::latest_committed(run_dir))
      return "step " + std::to_string(man->step) + " (LATEST in " +
             run_paths::checkpoints(run_dir).string() + ")";
    return "(none)";
  } catch (const std::exception& e) {
    return std::string("(LATEST cannot be read: ") + e.what() + ")";
  }
}

// Where the rank-seconds went, largest first, and the MFU estimate
// (actors/coordinator/job/goodput.hpp).
void print_goodput(const std::string& goodput_json) {
  const auto g = nlohmann::json::parse(goodput_json, nullptr, false);
  if (!g.is_object() || !g.contains("phases") || !g["phases"].is_object()) return;
  const double all = g.value("rank_seconds", 0.0);
  if (all <= 0) return;
  std::vector<std::pair<double, std::string>> parts;
  for (const auto& [name, v] : g["phases"].items())
    if (v.is_number() && v.get<double>() > 0) parts.emplace_back(v.get<double>(), name);
  std::sort(parts.rbegin(), parts.rend());
  std::string words;
  for (const auto& [s, name] : parts) {
    char part[96];
    std::snprintf(part, sizeof part, "%s%s %.0f%%", words.empty() ? "" : ", ", name.c_str(),
                  100 * s / all);
    words += part;
  }
  std::printf("  goodput           %.1f%% of %.1f rank-seconds (%s)\n",
              100 * g.value("goodput", 0.0), all, words.c_str());
  if (g.value("peak_flops", 0.0) > 0 && g.value("mfu", 0.0) > 0)  // no FLOPs known: no MFU
    std::printf("  MFU               %.1f%% of %.1f GFLOP/s per rank\n", 100 * g.value("mfu", 0.0),
                g.value("peak_flops", 0.0) / 1e9);
}

void print_summary(const train_config& cfg, const actors::job_result& r) {
  const char* verdict = verdict_of(r.exit_code);
  std::printf("troupe: %s in %s — %s\n", verdict, format_duration(r.wall_s).c_str(),
              r.message.c_str());
  // The world the job ended with: lost ranks shrink it, joining workers grow it.
  const int world = r.world > 0 ? r.world : cfg.world;
  const std::string configured =
      world == cfg.world ? "" : ", configured " + std::to_string(cfg.world);
  std::printf("  steps             %lld of %d (world %d%s)\n", static_cast<long long>(r.steps_done),
              cfg.steps, world, configured.c_str());
  if (r.final_loss == r.final_loss) std::printf("  train loss        %.4f\n", r.final_loss);
  if (r.val_loss >= 0) std::printf("  validation loss   %.4f\n", r.val_loss);
  // A program of the user's counts samples (its step_outcome), the built-in GPT tokens.
  std::printf("  %s %s\n", cfg.external_workload() ? "samples/s        " : "tokens/s         ",
              format_rate(r.tokens_per_s).c_str());
  print_goodput(r.goodput_json);
  std::printf("  checkpoint        %s\n", committed_checkpoint_words(cfg.run_dir).c_str());
  std::printf("  events            %s\n", run_paths::events(cfg.run_dir).c_str());
  std::fflush(stdout);
}

}  // namespace troupe::coordinator
