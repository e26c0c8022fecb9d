// Test-only helpers to run a child process with redirected stdio, wait for it with a deadline
// and always reap it by pid, so a failing test never leaves a process behind.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace troupe::monitoring::testing {

/// Where a child's stdio goes; an empty path inherits the test's own.
struct spawn_options {
  std::string stdin_path{};   ///< read from this file
  std::string output_path{};  ///< stdout and stderr both go here (truncated)
  bool stdout_pipe = false;   ///< stdout to a pipe the parent reads (overrides output_path for it)
};

/// A child process; kills (SIGTERM, then SIGKILL) and reaps it on destruction unless waited.
class child_process {
 public:
  child_process(const std::vector<std::string>& argv, const spawn_options& options = {}) {
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    int pipe_fds[2] = {-1, -1};
    if (options.stdout_pipe && ::pipe2(pipe_fds, O_CLOEXEC) != 0) {
      throw std::runtime_error("pipe2 failed");
    }
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      // Only async-signal-safe calls until exec. If the test binary dies (a ctest timeout),
      // the child gets SIGTERM, and the harness and fixture clean up after themselves.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(126);
      if (!options.stdin_path.empty()) {
        const int fd = ::open(options.stdin_path.c_str(), O_RDONLY);
        if (fd < 0 || ::dup2(fd, 0) < 0) ::_exit(126);
      }
      if (!options.output_path.empty()) {
        const int fd = ::open(options.output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || ::dup2(fd, 1) < 0 || ::dup2(fd, 2) < 0) ::_exit(126);
      }
      if (options.stdout_pipe && ::dup2(pipe_fds[1], 1) < 0) ::_exit(126);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    if (options.stdout_pipe) {
      ::close(pipe_fds[1]);
      stdout_fd_ = pipe_fds[0];
    }
  }

  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  ~child_process() {
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
    if (!reaped_) kill_and_reap();
  }

  [[nodiscard]] pid_t pid() const { return pid_; }

  /// Reads stdout (pipe mode) up to and without the first newline; nullopt on EOF first.
  std::optional<std::string> read_line() {
    std::string line;
    char c = 0;
    for (;;) {
      const ssize_t n = ::read(stdout_fd_, &c, 1);
      if (n == 1) {
        if (c == '\n') return line;
        line += c;
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        return std::nullopt;
      }
    }
  }

  /// The exit code, -(signal) if killed, or nullopt if still running at the deadline.
  std::optional<int> wait_for(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        return -WTERMSIG(status);
      }
      if (r < 0 && errno != EINTR) {
        reaped_ = true;
        return -1000;
      }
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  /// SIGTERM, a grace period, then SIGKILL; always reaps.
  void kill_and_reap(std::chrono::milliseconds grace = std::chrono::seconds(5)) {
    if (reaped_) return;
    ::kill(pid_, SIGTERM);
    if (wait_for(grace)) return;
    ::kill(pid_, SIGKILL);
    (void)wait_for(std::chrono::seconds(30));
  }

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  bool reaped_ = false;
};

/// The whole content of a file (empty if it cannot be read).
inline std::string read_file(const std::string& path) {
  std::string out;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    char buf[4096];
    std::size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    std::fclose(f);
  }
  return out;
}

/// A fresh directory under $TMPDIR (or /tmp), removed with its content on destruction.
class temp_dir {
 public:
  temp_dir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") +
                          "/troupe-monitoring-test-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// Whether `path` names an executable file.
inline bool is_executable(const std::string& path) {
  return !path.empty() && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace troupe::monitoring::testing
