#pragma once
// How a coordinator reaches the etcd it leads through: the job's own single-member etcd for
// --etcd local (started here, in RUN_DIR/etcd, stopped when this ends), or the endpoints
// --etcd names, with their TLS files; and waiting until it answers.

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>

#include "runtime/config.hpp"
#include "runtime/etcd/etcd_client.hpp"

namespace troupe::coordinator::ha {

/// Checks, before the run directory is touched, what --etcd needs from this machine: etcd
/// itself for --etcd local, readable certificate files. Throws config_error (exit 2).
void check_etcd_options(const train_config& cfg);

/// The etcd of one coordinator process. Not movable: the client is used by reference.
class etcd_link {
 public:
  /// For --etcd local, starts the job's etcd member (it answers later: wait_until_answering).
  /// `job` is the job's id in etcd (etcd_job_id).
  etcd_link(const train_config& cfg, const std::string& job);
  /// Stops the job's own etcd (SIGTERM, then SIGKILL after 10 s).
  ~etcd_link();
  etcd_link(const etcd_link&) = delete;
  etcd_link& operator=(const etcd_link&) = delete;

  etcd::etcd_client& client() { return *client_; }
  [[nodiscard]] bool local() const { return local_pid_ > 0; }
  /// The endpoints as messages name them ("http://127.0.0.1:PORT (the job's own etcd, log
  /// ...)" for --etcd local).
  [[nodiscard]] const std::string& words() const { return words_; }
  /// etcd's client URLs, comma-separated.
  [[nodiscard]] const std::string& client_urls() const { return client_urls_; }

  /// Returns once etcd answers a read. Throws config_error for a TLS failure (the options are
  /// wrong: waiting will not mend it), std::runtime_error when the job's own etcd exited or
  /// nothing answered as etcd does by `deadline`.
  void wait_until_answering(std::chrono::steady_clock::time_point deadline);
  /// Stops the job's own etcd now (the client goes first); nothing for other endpoints.
  void stop();

 private:
  const train_config& cfg_;
  std::string job_;
  std::string words_, client_urls_;
  pid_t local_pid_ = 0;
  std::string local_log_;
  std::optional<etcd::etcd_client> client_;
};

}  // namespace troupe::coordinator::ha
