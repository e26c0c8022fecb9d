#pragma once
// Command-line parsing for every `troupe` command: options map onto config fields, and
// every mistake becomes a usage_error naming the option and the fix (exit code 2).

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/command_line.hpp"
#include "coordinator/job_options.hpp"
#include "runtime/cluster_env.hpp"
#include "runtime/config.hpp"

namespace troupe::cli {

using coordinator::job_options;  // coordinator/job_options.hpp

/// Applies `--config FILE` first, then every other option in order, then (--slurm) what the
/// Slurm allocation says where no option did, then validates.
/// Throws usage_error (bad option) or config_error (bad value or combination).
job_options parse_job_options(const std::vector<std::string>& args, bool coordinator_only,
                              const env_reader& env = process_environment());

/// Every job option, from the settings table (troupe run --help, troupe help options).
std::string job_options_help();
std::string run_help();
std::string coordinator_help();
std::string agent_help();
std::string worker_help();
std::string main_help();
std::string bench_help();
/// `troupe ckpt --help` for "", a subcommand's help for its name, "" for an unknown one.
std::string ckpt_help(const std::string& subcommand);

}  // namespace troupe::cli
