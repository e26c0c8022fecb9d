#include "cli/checkpoint_choice.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "checkpoint/checkpoint.hpp"
#include "cli/command_line.hpp"
#include "runtime/sys/printable.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::cli {

std::string step_list(const std::vector<int64_t>& steps) {
  std::string out;
  for (const int64_t s : steps) out += (out.empty() ? "" : ", ") + std::to_string(s);
  return out;
}

int64_t read_chosen_checkpoint(const std::string& command, const std::string& run_dir,
                               const std::vector<int64_t>& steps, std::optional<int64_t> step,
                               const std::function<void(int64_t)>& read) {
  const std::string where = run_paths::checkpoints(run_dir).string();
  if (step) {
    if (!std::binary_search(steps.begin(), steps.end(), *step))
      throw usage_error(command + ": " + where + " has no committed checkpoint of step " +
                        std::to_string(*step) + "; " +
                        (steps.empty() ? "it has none" : "its steps: " + step_list(steps)) +
                        " (troupe ckpt ls)");
    read(*step);
    return *step;
  }
  std::optional<int64_t> latest;
  try {
    latest = ckpt::read_latest_step(run_dir);
  } catch (const ckpt::checkpoint_error& e) {
    std::fprintf(stderr,
                 "%s: LATEST is unreadable (%s); trying every committed checkpoint, newest "
                 "first\n",
                 command.c_str(), sys::printable(e.what()).c_str());
  }
  std::vector<int64_t> candidates;
  for (const int64_t s : steps)
    if (!latest || s <= *latest) candidates.push_back(s);
  if (candidates.empty())
    throw usage_error(
        command + ": " + where + " has no committed checkpoint" +
        (steps.empty() ? std::string()
                       : " at or before the step LATEST names; its steps: " + step_list(steps)));
  std::vector<int64_t> damaged;
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    try {
      read(*it);
      return *it;
    } catch (const ckpt::checkpoint_error& e) {
      if (!ckpt::is_damage(e.kind())) throw;
      std::fprintf(stderr, "%s: step %lld is damaged, passed over: %s\n", command.c_str(),
                   static_cast<long long>(*it), sys::printable_lines(e.what()).c_str());
      damaged.push_back(*it);
    }
  }
  std::reverse(damaged.begin(), damaged.end());
  throw std::runtime_error("no intact checkpoint in " + where + ": steps " + step_list(damaged) +
                           " are damaged (troupe ckpt verify says where)");
}

}  // namespace troupe::cli
