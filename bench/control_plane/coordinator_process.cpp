#include "bench/control_plane/coordinator_process.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "actors/wire/connect.hpp"
#include "runtime/sys/child_process.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::bench::control_plane {
namespace fs = std::filesystem;

namespace {

std::string read_small(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// utime + stime of a /proc stat line, in seconds; the name between the parentheses.
std::optional<std::pair<std::string, double>> cpu_of_stat(const std::string& text) {
  const auto open = text.find('(');
  const auto close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos) return std::nullopt;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  // Fields after the name: state(3) ... utime(14) stime(15).
  long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoll(field);
    if (i == 15) stime = std::stoll(field);
  }
  static const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  return std::make_pair(text.substr(open + 1, close - open - 1),
                        static_cast<double>(utime + stime) / tick);
}

int64_t status_kib(const std::string& status, const std::string& key) {
  const auto at = status.find(key + ":");
  if (at == std::string::npos) return 0;
  return std::stoll(status.substr(at + key.size() + 1)) * 1024;
}

}  // namespace

std::optional<process_sample> sample_process(pid_t pid) {
  const std::string base = "/proc/" + std::to_string(pid);
  const auto stat = cpu_of_stat(read_small(base + "/stat"));
  if (!stat) return std::nullopt;
  process_sample out;
  out.cpu_s = stat->second;
  const std::string status = read_small(base + "/status");
  out.rss_bytes = status_kib(status, "VmRSS");
  out.hwm_bytes = status_kib(status, "VmHWM");
  if (DIR* d = ::opendir((base + "/task").c_str())) {
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      if (auto t = cpu_of_stat(read_small(base + "/task/" + e->d_name + "/stat")))
        out.threads[std::atoi(e->d_name)] = *t;
    }
    ::closedir(d);
  }
  out.threads_count = static_cast<int64_t>(out.threads.size());
  return out;
}

std::string raise_descriptor_limit(long needed) {
  rlimit now{};
  ::getrlimit(RLIMIT_NOFILE, &now);
  if (now.rlim_cur != RLIM_INFINITY && static_cast<long>(now.rlim_cur) >= needed) return "";
  rlimit want = now;
  want.rlim_cur = static_cast<rlim_t>(needed);
  if (want.rlim_max != RLIM_INFINITY && static_cast<long>(want.rlim_max) < needed)
    want.rlim_max = static_cast<rlim_t>(needed);
  if (::setrlimit(RLIMIT_NOFILE, &want) != 0)
    return "the simulation needs " + std::to_string(needed) +
           " open descriptors (one connection per simulated node, and the coordinator's "
           "reserve) but RLIMIT_NOFILE is " +
           std::to_string(now.rlim_cur) + " and could not be raised (run as root, or `ulimit -n " +
           std::to_string(needed) + "` first; fs.nr_open bounds it)";
  return "";
}

std::vector<std::string> coordinator_argv(const coordinator_request& req) {
  std::vector<std::string> argv = {
      sys::self_executable(), "coordinator", "--run-dir", req.run_dir, "--host", "127.0.0.1",
      "--port", "0", "--world", std::to_string(req.members), "--layers", "1", "--heads", "1",
      "--d-model", std::to_string(req.d_model), "--context", "8", "--batch",
      std::to_string(req.members), "--micro-batch", "1", "--steps", std::to_string(req.steps),
      "--eval-every", "0", "--checkpoint-every", std::to_string(req.checkpoint_every),
      "--join-timeout-ms", "900000", "--heartbeat-timeout-ms",
      std::to_string(req.heartbeat_timeout_ms),
      // The FLOP/s measurement at start is a training machine's; nothing trains here.
      "--peak-flops", "1e12", "--metrics-port", std::to_string(req.metrics_port)};
  argv.insert(argv.end(), req.extra.begin(), req.extra.end());
  return argv;
}

coordinator_process::coordinator_process(const coordinator_request& req, int timeout_s) {
  fs::create_directories(req.run_dir);
  log_ = (fs::path(req.run_dir) / "coordinator.log").string();
  metrics_port_ = static_cast<uint16_t>(req.metrics_port);
  const int out = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) throw std::runtime_error("cannot write " + log_);
  // The child's stdout and stderr go to the log: dup them around the spawn.
  const int saved_out = ::dup(STDOUT_FILENO), saved_err = ::dup(STDERR_FILENO);
  ::dup2(out, STDOUT_FILENO);
  ::dup2(out, STDERR_FILENO);
  try {
    ::setenv("TROUPE_SIMULATED_CONNECTIONS", std::to_string(req.connections).c_str(), 1);
    pid_ = sys::spawn_child(coordinator_argv(req), true);
    ::unsetenv("TROUPE_SIMULATED_CONNECTIONS");
  } catch (...) {
    ::dup2(saved_out, STDOUT_FILENO);
    ::dup2(saved_err, STDERR_FILENO);
    throw;
  }
  ::dup2(saved_out, STDOUT_FILENO);
  ::dup2(saved_err, STDERR_FILENO);
  ::close(saved_out);
  ::close(saved_err);
  ::close(out);
  const auto addr = run_paths::coordinator_address(req.run_dir);
  token_ = run_paths::join_token(req.run_dir).string();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto gone = sys::try_reap(pid_)) {
      pid_ = -1;
      throw std::runtime_error("the coordinator exited (code " + std::to_string(gone->exit_code) +
                               ") before it listened; " + log_ + ":\n" + read_small(log_));
    }
    if (fs::exists(addr) && fs::exists(token_)) {
      const std::string text = read_small(addr.string());
      std::string line = text.substr(0, text.find('\n'));
      if (actors::parse_endpoint(line, host_, port_)) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw std::runtime_error("the coordinator did not listen within " + std::to_string(timeout_s) +
                           " s; see " + log_);
}

bool coordinator_process::running() {
  if (pid_ < 0) return false;
  if (auto st = sys::try_reap(pid_)) {
    exit_code_ = st->signal ? 128 + st->signal : st->exit_code;
    pid_ = -1;
    return false;
  }
  return true;
}

std::optional<int> coordinator_process::wait(int timeout_s) {
  if (pid_ < 0) return exit_code_;
  auto st = sys::wait_for_exit(pid_, std::chrono::seconds(timeout_s));
  if (!st) {
    ::kill(pid_, SIGKILL);
    sys::wait_for_exit(pid_, std::chrono::seconds(10));
    pid_ = -1;
    return std::nullopt;
  }
  pid_ = -1;
  return st->signal ? 128 + st->signal : st->exit_code;
}

coordinator_process::~coordinator_process() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    sys::wait_for_exit(pid_, std::chrono::seconds(10));
  }
}

}  // namespace troupe::bench::control_plane
