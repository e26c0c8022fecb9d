#pragma once
// Command-line parsing for every `troupe` command: options map onto config fields, and
// every mistake becomes a usage_error naming the option and the fix (exit code 2).

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/config.hpp"

namespace troupe::cli {

class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// `troupe run` and `troupe coordinator`.
struct job_options {
  train_config cfg;
  bool help = false;
  std::string listen_host = "127.0.0.1";  ///< coordinator only
  uint16_t listen_port = 0;               ///< coordinator only; 0 = any free port
};

/// Applies `--config FILE` first, then every other option in order, then validates.
/// Throws usage_error (bad option) or config_error (bad value or combination).
job_options parse_job_options(const std::vector<std::string>& args, bool coordinator_only);

std::string run_help();
std::string coordinator_help();
std::string agent_help();
std::string worker_help();
std::string main_help();
std::string bench_help();
/// `troupe ckpt --help` for "", a subcommand's help for its name, "" for an unknown one.
std::string ckpt_help(const std::string& subcommand);

}  // namespace troupe::cli
