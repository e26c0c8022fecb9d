#include "runtime/sys/child_process.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace troupe::sys {
namespace {

exit_status decode(int status) {
  exit_status s;
  if (WIFEXITED(status)) s.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) s.signal = WTERMSIG(status);
  return s;
}

}  // namespace

std::string self_executable() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("cannot resolve /proc/self/exe");
  return std::string(buf, static_cast<size_t>(n));
}

namespace {

// fork, then in the child what every troupe child gets (the parent-death signal, its stdin,
// default signals), then exec: `envp` null = execv of a path, else execvpe with that environment.
pid_t fork_and_exec(const std::vector<std::string>& argv, bool new_process_group, int death_signal,
                    int stdin_fd, char* const* envp) {
  if (argv.empty()) throw std::runtime_error("spawn_child: empty command");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    // Only async-signal-safe calls until exec.
    prctl(PR_SET_PDEATHSIG, death_signal);
    if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
    if (new_process_group) setpgid(0, 0);
    if (stdin_fd >= 0 &&
        (stdin_fd == STDIN_FILENO ? fcntl(stdin_fd, F_SETFD, 0) : dup2(stdin_fd, STDIN_FILENO)) < 0)
      _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    if (envp != nullptr)
      execvpe(args[0], args.data(), envp);
    else
      execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

}  // namespace

pid_t spawn_child(const std::vector<std::string>& argv, bool new_process_group, int death_signal,
                  int stdin_fd) {
  return fork_and_exec(argv, new_process_group, death_signal, stdin_fd, nullptr);
}

pid_t spawn_program(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                    int death_signal, int stdin_fd) {
  // Built before the fork: the child may only make async-signal-safe calls.
  std::vector<std::string> merged;
  const auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    bool overridden = false;
    for (const auto& mine : env) overridden = overridden || name_of(mine) == name_of(entry);
    if (!overridden) merged.push_back(entry);
  }
  merged.insert(merged.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& entry : merged) envp.push_back(entry.data());
  envp.push_back(nullptr);
  return fork_and_exec(argv, false, death_signal, stdin_fd, envp.data());
}

std::optional<exit_status> try_reap(pid_t pid) {
  int status = 0;
  pid_t r = waitpid(pid, &status, WNOHANG);
  if (r == pid) return decode(status);
  if (r < 0 && errno == ECHILD) return exit_status{0, 0};  // already reaped elsewhere
  return std::nullopt;
}

std::optional<exit_status> wait_for_exit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(200);
  for (;;) {
    if (auto s = try_reap(pid)) return s;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(pause);  // polling a child's state, bounded by the deadline
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
}

}  // namespace troupe::sys
