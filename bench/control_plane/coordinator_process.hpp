#pragma once
// The coordinator under test: a real `troupe coordinator` child process with a job sized for
// the simulated members, and what /proc says about it (CPU per thread, resident memory).

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace troupe::bench::control_plane {

struct coordinator_request {
  std::string run_dir;
  int members = 0;
  int64_t steps = 50;
  int checkpoint_every = 0;
  int d_model = 8;
  int heartbeat_timeout_ms = 2000;
  int metrics_port = 0;
  int connections = 0;  ///< simulated nodes: one connection each
  /// Extra `troupe coordinator` options (--set KEY=VALUE and the like), passed as they are.
  std::vector<std::string> extra;
};

/// CPU seconds of one process and of each of its threads (utime + stime), and its memory.
struct process_sample {
  double cpu_s = 0;
  std::map<int, std::pair<std::string, double>> threads;  ///< tid -> (name, cpu seconds)
  int64_t rss_bytes = 0;
  int64_t hwm_bytes = 0;  ///< peak resident memory so far
  int64_t threads_count = 0;
};

/// Reads /proc/PID; nullopt once the process is gone.
std::optional<process_sample> sample_process(pid_t pid);

/// Raises this process's RLIMIT_NOFILE to `needed` (soft and hard: root may raise the hard
/// limit up to fs.nr_open) so that it and the coordinator it starts can hold one connection
/// per simulated node and the coordinator's own reserve. "" or why not.
std::string raise_descriptor_limit(long needed);

class coordinator_process {
 public:
  /// Starts it and waits (up to `timeout_s`) for RUN_DIR/coordinator.addr and the join token.
  /// Throws std::runtime_error with the coordinator's last words when it does not come up.
  coordinator_process(const coordinator_request& req, int timeout_s);
  ~coordinator_process();  ///< kills it if it still runs
  coordinator_process(const coordinator_process&) = delete;
  coordinator_process& operator=(const coordinator_process&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }
  const std::string& join_token() const { return token_; }
  const std::string& log_path() const { return log_; }
  uint16_t metrics_port() const { return metrics_port_; }
  /// Waits up to `timeout_s` for its exit; its exit code, or nullopt (then it is killed).
  std::optional<int> wait(int timeout_s);
  /// False once it has exited (reaped here; wait() then returns its code at once).
  bool running();

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::string host_;
  uint16_t port_ = 0;
  std::string token_;
  std::string log_;
  uint16_t metrics_port_ = 0;
};

/// The `troupe coordinator` argument list for a job of `req.members` data-parallel ranks of the
/// smallest model (the control plane is what is measured).
std::vector<std::string> coordinator_argv(const coordinator_request& req);

}  // namespace troupe::bench::control_plane
