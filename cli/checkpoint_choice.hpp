#pragma once
// Which committed checkpoint a command that reads a trained model uses (`troupe ckpt export`,
// `troupe sample`, `troupe eval`): the one asked for, or the newest that reads back intact.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace troupe::cli {

/// "10, 20, 30": steps as the messages list them.
std::string step_list(const std::vector<int64_t>& steps);

/// Calls `read` on the checkpoint to use and returns its step. With `step`, that one: a
/// usage_error (exit 2) naming the committed `steps` when it is not among them; a damage
/// `read` finds passes on (ckpt::checkpoint_error, exit 1). Without: the committed steps at or
/// before the step LATEST names (all of them, said on stderr, when LATEST is unreadable), newest
/// first, passing over each one `read` finds damaged (said on stderr); throws
/// std::runtime_error when every one is damaged and a usage_error when there is none.
/// `command` ("troupe sample") starts every message.
int64_t read_chosen_checkpoint(const std::string& command, const std::string& run_dir,
                               const std::vector<int64_t>& steps, std::optional<int64_t> step,
                               const std::function<void(int64_t)>& read);

}  // namespace troupe::cli
