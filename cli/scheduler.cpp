#include "cli/scheduler.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "actors/wire/connect.hpp"
#include "actors/wire/node_address.hpp"
#include "checkpoint/durable_io.hpp"
#include "cli/options.hpp"
#include "runtime/config.hpp"
#include "runtime/preflight.hpp"
#include "runtime/sys/run_paths.hpp"
#include "runtime/sys/small_file.hpp"

namespace troupe::cli {
namespace {

namespace fs = std::filesystem;
using clock = std::chrono::steady_clock;

std::string seconds_words(int ms) { return std::to_string((ms + 999) / 1000) + " s"; }

void parse_endpoint_or_refuse(const std::string& text, const std::string& from, agent_plan& p) {
  if (!actors::parse_endpoint(text, p.host, p.port))
    throw usage_error("troupe agent: " + from + " must be HOST:PORT, got '" + text + "'");
}

// The coordinator of this Slurm job's attempt, from RUN_DIR/rendezvous.json, waited for.
void find_rendezvous(const slurm_env& job, const std::string& run_dir, clock::time_point deadline,
                     int wait_ms, agent_plan& p) {
  const std::string path = run_paths::rendezvous(run_dir).string();
  std::string why = "it is not there";
  for (;;) {
    std::string problem;
    if (auto text = sys::read_small_file(path, problem)) {
      try {
        const rendezvous r = parse_rendezvous(*text);
        if (r.job == job.attempt()) {
          p.host = r.host;
          p.port = r.port;
          return;
        }
        why = "it is " + r.job + "'s, not " + job.attempt() + "'s";
      } catch (const std::exception& e) {
        why = std::string("it cannot be read: ") + e.what();
      }
    } else if (!problem.empty()) {
      why = problem;
    }
    if (clock::now() >= deadline)
      throw std::runtime_error(
          "troupe agent: no coordinator of Slurm job " + job.job_id + " (attempt " +
          std::to_string(job.restart_count) + ") wrote " + path + " within " +
          seconds_words(wait_ms) + " (" + why +
          "); start it on the allocation's first node with `troupe run --slurm` or `troupe "
          "coordinator --slurm --run-dir " +
          run_dir + "`, or pass --coordinator HOST:PORT");
    // Polling a file another node writes, bounded by the deadline.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void wait_for_token(const std::string& path, clock::time_point deadline, int wait_ms) {
  struct stat st {};
  while (::lstat(path.c_str(), &st) != 0) {
    if (clock::now() >= deadline)
      throw std::runtime_error("troupe agent: the job's join token " + path +
                               " did not appear within " + seconds_words(wait_ms) +
                               "; is the coordinator running with this --run-dir, on a file "
                               "system this node shares?");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

pid_t agent_pid = 0;

void on_worker_term(int sig, siginfo_t* info, void*) {
  if (info != nullptr && info->si_pid == agent_pid) {
    ::signal(sig, SIG_DFL);  // the agent stops this worker: end as before
    ::raise(sig);
    return;
  }
  static const char note[] =
      "troupe worker: SIGTERM from the scheduler: left to the coordinator, which checkpoints "
      "and stops the job\n";
  (void)!::write(STDERR_FILENO, note, sizeof note - 1);
}

}  // namespace

agent_plan plan_agent(const std::string& coordinator_flag, const std::string& token_flag,
                      const std::string& run_dir_flag, const env_reader& env, int wait_ms) {
  agent_plan p;
  const auto slurm = read_slurm_env(env);
  const auto index = read_completion_index(env);
  const bool scheduled = slurm.has_value() || index.has_value();
  p.under_slurm = slurm.has_value();
  if (slurm) {
    p.words = "Slurm job " + slurm->job_id +
              (slurm->restart_count > 0 ? " (restart " + std::to_string(slurm->restart_count) + ")"
                                        : std::string());
    if (slurm->in_step)
      p.words += ", node " + (slurm->node_name.empty() ? std::string("?") : slurm->node_name) +
                 " (SLURM_NODEID " + std::to_string(slurm->node_id) + " of " +
                 std::to_string(slurm->step_num_nodes) + ")";
    // Only an agent that srun started to find its coordinator; one given --coordinator (a
    // launcher's own agents, a user's choice) does what it is told.
    if (slurm->in_step && slurm->local_id > 0 && coordinator_flag.empty()) {
      p.idle = true;
      p.words += ": task SLURM_LOCALID " + std::to_string(slurm->local_id) +
                 " has nothing to do; one agent per node (SLURM_LOCALID 0) runs this node's "
                 "workers (use srun --ntasks-per-node=1)";
      return p;
    }
  } else if (index) {
    p.words = "Kubernetes Indexed Job, JOB_COMPLETION_INDEX " + std::to_string(*index);
  }

  std::string run_dir = run_dir_flag, run_dir_from = "--run-dir";
  if (run_dir.empty())
    if (auto v = env("TROUPE_RUN_DIR"); v && !v->empty()) {
      run_dir = *v;
      run_dir_from = "TROUPE_RUN_DIR";
    }
  if (run_dir.empty() && scheduled) {
    run_dir = "runs/latest";
    run_dir_from = "the default run directory";
  }
  if (!run_dir.empty()) check_path_length(run_dir, "run directory", run_dir_from);

  if (auto v = env("TROUPE_AGENT_WAIT_MS"); v && !v->empty()) {
    if (v->size() > 9 || v->find_first_not_of("0123456789") != std::string::npos)
      throw usage_error(
          "troupe agent: TROUPE_AGENT_WAIT_MS must be a number of milliseconds, got '" + *v + "'");
    wait_ms = std::stoi(*v);
  }
  const auto deadline = clock::now() + std::chrono::milliseconds(wait_ms);
  std::string coordinator_from;
  if (!coordinator_flag.empty()) {
    parse_endpoint_or_refuse(coordinator_flag, "--coordinator", p);
    coordinator_from = "--coordinator";
  } else if (auto v = env("TROUPE_COORDINATOR"); v && !v->empty()) {
    parse_endpoint_or_refuse(*v, "TROUPE_COORDINATOR", p);
    coordinator_from = "TROUPE_COORDINATOR";
  } else if (slurm) {
    find_rendezvous(*slurm, run_dir, deadline, wait_ms, p);
    coordinator_from = run_paths::rendezvous(run_dir).string();
  } else if (index) {
    throw usage_error(
        "troupe agent: in a Kubernetes Indexed Job (JOB_COMPLETION_INDEX=" +
        std::to_string(*index) +
        ") the coordinator comes from --coordinator HOST:PORT or TROUPE_COORDINATOR=HOST:PORT "
        "(e.g. pod 0's name under the job's headless Service: troupe-0.troupe:29400)");
  } else {
    throw usage_error("troupe agent: --coordinator HOST:PORT is required");
  }

  if (!token_flag.empty()) {
    p.token_path = token_flag;
  } else if (!run_dir.empty()) {
    p.token_path = run_paths::join_token(run_dir).string();
    if (scheduled) wait_for_token(p.token_path, deadline, wait_ms);
  } else {
    throw usage_error(
        "troupe agent: --join-token FILE is required (the coordinator writes it to "
        "RUN_DIR/join.token; copy it to this machine with mode 0600), or --run-dir RUN_DIR on a "
        "file system shared with the coordinator");
  }
  if (!p.words.empty())
    p.words += "; coordinator " + p.host + ":" + std::to_string(p.port) + " (from " +
               coordinator_from + ")";
  return p;
}

void guard_worker_signals(const env_reader& env) {
  if (!read_slurm_env(env)) return;
  agent_pid = ::getppid();
  struct sigaction sa {};
  sa.sa_sigaction = &on_worker_term;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGUSR1, SIG_IGN);
  ::signal(SIGUSR2, SIG_IGN);
}

}  // namespace troupe::cli
