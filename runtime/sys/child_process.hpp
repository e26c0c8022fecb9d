#pragma once
// Starting, watching and stopping the child processes of a launcher or an agent, by pid.

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace troupe::sys {

/// How a child ended.
struct exit_status {
  int exit_code = 0;  ///< valid when signal == 0
  int signal = 0;     ///< the signal that killed it, or 0
};

/// The path of this program (for re-executing `troupe` in another role).
std::string self_executable();

/// fork + exec `argv`. The child dies with its parent (PR_SET_PDEATHSIG), so a killed
/// agent or launcher leaves no orphans, and starts with no signals blocked. With
/// `new_process_group`, a Ctrl-C at the terminal reaches only the parent, which then
/// stops the child in order.
/// With `stdin_fd` >= 0, the child reads that descriptor as its stdin.
/// Throws std::runtime_error when the process cannot be started.
pid_t spawn_child(const std::vector<std::string>& argv, bool new_process_group = false,
                  int death_signal = 9, int stdin_fd = -1);

/// The same for a program the user named: `argv[0]` is looked up on PATH when it has no '/',
/// and the child's environment is this process's with `env` ("NAME=VALUE" each) set over it.
pid_t spawn_program(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                    int death_signal = 9, int stdin_fd = -1);

/// Reaps `pid` if it has ended; never blocks.
std::optional<exit_status> try_reap(pid_t pid);

/// Waits until `pid` ends or `timeout` passes.
std::optional<exit_status> wait_for_exit(pid_t pid, std::chrono::milliseconds timeout);

}  // namespace troupe::sys
