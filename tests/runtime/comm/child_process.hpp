#pragma once
// Test support: child processes that are always killed and reaped, and waits on them that
// are bounded by deadlines.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace troupe::test {

/// A process started with posix_spawn. Its destructor SIGKILLs and reaps it if it is still
/// there, so a test that fails half-way leaves nothing running.
class child_process {
 public:
  /// Starts argv[0] (a path) with argv. With capture_stdout its stdout is a pipe for
  /// read_line(); otherwise it shares ours.
  static child_process spawn(const std::vector<std::string>& argv, bool capture_stdout = false) {
    child_process c;
    int out[2] = {-1, -1};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (capture_stdout) {
      if (pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
      posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int rc = posix_spawn(&c.pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (capture_stdout) {
      ::close(out[1]);
      c.out_fd_ = out[0];
    }
    if (rc != 0) {
      c.pid_ = -1;
      throw std::runtime_error("posix_spawn " + argv[0] + ": " + std::strerror(rc));
    }
    return c;
  }

  child_process() = default;
  child_process(child_process&& o) noexcept { *this = std::move(o); }
  child_process& operator=(child_process&& o) noexcept {
    if (this != &o) {
      kill();
      pid_ = std::exchange(o.pid_, -1);
      out_fd_ = std::exchange(o.out_fd_, -1);
      buf_ = std::move(o.buf_);
    }
    return *this;
  }
  ~child_process() { kill(); }

  pid_t pid() const { return pid_; }

  void signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }

  /// SIGKILLs and reaps the process; afterwards it is certainly gone. Idempotent.
  void kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      pid_ = -1;
    }
    if (out_fd_ >= 0) {
      ::close(out_fd_);
      out_fd_ = -1;
    }
  }

  /// Waits up to `timeout` for the process to exit and returns its wait status (then it is
  /// reaped), or nullopt if it is still running.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return std::nullopt;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return status;
      }
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  /// Reads one line (without the newline) from the captured stdout, waiting up to `timeout`.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (const auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || out_fd_ < 0) return std::nullopt;
      pollfd p{out_fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[512];
      const ssize_t n = ::read(out_fd_, chunk, sizeof(chunk));
      if (n <= 0) return std::nullopt;  // the child closed its stdout (or died)
      buf_.append(chunk, static_cast<size_t>(n));
    }
  }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string buf_;
};

/// "exited 0", "exited 3", "killed by signal 9".
inline std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

/// A TCP port on 127.0.0.1 that nothing listens on right now (bound, then released).
inline uint16_t unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace troupe::test
