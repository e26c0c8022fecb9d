// `troupe run --coordinators K --etcd ...`: the launcher of a job whose coordinator is no single
// point of failure. It prepares the run directory and (for --etcd local) the job's etcd, starts
// K `troupe coordinator --join-token` processes (one is elected and leads, the others stand by
// to take the job over) and one agent per node that knows every coordinator, then waits. Its
// exit code is the job's: the code of the coordinator that ended the job.

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "actors/coordinator/job/job_actions.hpp"
#include "coordinator/job_options.hpp"
#include "coordinator/job_runner.hpp"
#include "coordinator/job_steps.hpp"
#include "monitoring/log.hpp"
#include "runtime/auth/credentials.hpp"
#include "runtime/sys/child_process.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::coordinator {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

const monitoring::log_context launcher_ctx{"launcher", -1, 0, -1};

std::string words_of(const sys::exit_status& e) {
  return e.signal ? "killed by signal " + std::to_string(e.signal)
                  : "exit code " + std::to_string(e.exit_code);
}

// The address coordinator `pid` published, once it has (RUN_DIR/coordinators/<pid>.addr).
std::string published_address(const std::string& run_dir, pid_t pid) {
  std::ifstream in(run_dir + "/coordinators/" + std::to_string(pid) + ".addr");
  std::string line;
  std::getline(in, line);
  return line;
}

class launcher {
 public:
  launcher(const job_options& opts, const sigset_t& signals)
      : signals_(signals),
        job_(plan_job(opts, true)),
        checked_((check_etcd_options(job_.cfg), true)),
        run_(prepare_run_dir(job_)),
        etcd_(job_.cfg, registry_, run_.events),
        count_(opts.coordinators) {
    // Before any coordinator starts: they would only stand by for another job's leader.
    etcd_.refuse_another_job();
  }

  int run() {
    start_coordinators();
    const std::string list = wait_for_addresses();
    start_agents(list);
    return supervise();
  }

 private:
  // `port`: 0 for a new address; a coordinator started again after one died takes the dead
  // one's port, so that the address the agents and workers were given leads to it.
  std::vector<std::string> coordinator_command(int index, int port = 0) const {
    const auto& cfg = job_.cfg;
    const int metrics = cfg.metrics_port == 0 ? 0 : cfg.metrics_port + index;
    return {sys::self_executable(),
            "coordinator",
            "--config",
            run_paths::config(cfg.run_dir).string(),
            "--etcd",
            etcd_.client_urls(),
            "--join-token",
            auth::process_credentials().token_path,
            "--host",
            job_.listen_host,
            "--port",
            std::to_string(port),
            "--metrics-port",
            std::to_string(metrics)};
  }

  void start_coordinators() {
    for (int i = 0; i < count_; ++i) {
      const pid_t pid = sys::spawn_child(coordinator_command(i), true, launcher_died);
      coordinators_[pid] = true;
      index_[pid] = i;
    }
    say("started %d coordinators (one leads through etcd %s)", count_, etcd_.client_urls().c_str());
  }

  // Every coordinator publishes before it campaigns; the agents get all their addresses.
  std::string wait_for_addresses() {
    const auto deadline = steady_clock::now() + milliseconds(job_.cfg.etcd.timeout_ms);
    std::map<pid_t, std::string> found;
    while (found.size() < coordinators_.size()) {
      for (const auto& [pid, live] : coordinators_) {
        if (found.contains(pid)) continue;
        if (auto ended = sys::try_reap(pid)) {
          stop_all();
          const std::string what = "coordinator " + std::to_string(pid) +
                                   " ended before it listened (" + words_of(*ended) +
                                   "); see its output above";
          // Exit 2 is the coordinator refusing the job's options (etcd's TLS among them): the
          // launcher's exit says the same, whichever came first, this or the address.
          if (ended->signal == 0 && ended->exit_code == 2) throw usage_error("troupe run: " + what);
          throw std::runtime_error(what);
        }
        if (auto address = published_address(job_.cfg.run_dir, pid); !address.empty())
          found[pid] = address;
      }
      if (steady_clock::now() > deadline) {
        stop_all();
        throw std::runtime_error("the coordinators did not all listen within --etcd-timeout-ms (" +
                                 std::to_string(job_.cfg.etcd.timeout_ms) + " ms)");
      }
      std::this_thread::sleep_for(milliseconds(20));  // pacing of a poll with a deadline
    }
    std::string list;
    for (const auto& [pid, address] : found) {
      list += (list.empty() ? "" : ",") + address;
      addresses_[pid] = address;
    }
    return list;
  }

  // A coordinator killed while the job goes on is started again, standing by, at its address:
  // the job keeps K coordinators however many are lost one after another. One that cannot
  // take the address back (it is in use) ends without a word to the job; the others go on.
  void replace(pid_t dead) {
    const auto address = addresses_.find(dead);
    if (address == addresses_.end()) return;
    const auto colon = address->second.rfind(':');
    const int port =
        colon == std::string::npos ? 0 : std::atoi(address->second.c_str() + colon + 1);
    if (port <= 0) return;
    const int index = index_[dead];
    pid_t pid = -1;
    try {
      pid = sys::spawn_child(coordinator_command(index, port), true, launcher_died);
    } catch (const std::exception& e) {
      monitoring::log(
          monitoring::level::warn, launcher_ctx,
          std::string("could not start a coordinator in the dead one's place: ") + e.what());
      return;
    }
    coordinators_[pid] = true;
    index_[pid] = index;
    addresses_[pid] = address->second;
    unpublished_.insert(pid);
    monitoring::log(monitoring::level::warn, launcher_ctx,
                    "started coordinator " + std::to_string(pid) + " at " + address->second +
                        " in place of " + std::to_string(dead) + ", standing by");
  }

  void start_agents(const std::string& list) {
    const auto& token = auth::process_credentials().token_path;
    for (int n = 0; n < job_.cfg.elastic.nodes; ++n)
      agents_.push_back(sys::spawn_child(
          with_program(
              {sys::self_executable(), "agent", "--coordinator", list, "--join-token", token},
              job_.cfg),
          true, SIGTERM));
  }

  int live_coordinators() const {
    int live = 0;
    for (const auto& [pid, alive] : coordinators_) live += alive ? 1 : 0;
    return live;
  }

  // Signals are the job's: each live coordinator gets them (the leader acts, standbys stop).
  void forward_signals() {
    timespec none{0, 0};
    for (;;) {
      const int sig = sigtimedwait(&signals_, nullptr, &none);
      if (sig <= 0) return;
      stopping_ = true;  // the job is being stopped: no coordinator is started again
      for (const auto& [pid, alive] : coordinators_)
        if (alive) kill(pid, sig);
    }
  }

  int supervise() {
    for (;;) {
      forward_signals();
      for (auto& [pid, alive] : coordinators_) {
        if (!alive) continue;
        const auto ended = sys::try_reap(pid);
        if (!ended) {
          if (unpublished_.contains(pid) && !published_address(job_.cfg.run_dir, pid).empty())
            unpublished_.erase(pid);
          continue;
        }
        alive = false;
        // A replacement that ended before it listened never led: the job is not its to end.
        const bool never_listened = unpublished_.erase(pid) > 0;
        const bool job_over = !never_listened && ended->signal == 0 &&
                              ended->exit_code != actors::exit_code::not_leading;
        if (job_over) return finish(ended->exit_code);
        if (ended->signal != 0) etcd_.release_dead_leader(pid);
        monitoring::log(monitoring::level::warn, launcher_ctx,
                        "coordinator " + std::to_string(pid) + " ended (" + words_of(*ended) +
                            "); " + std::to_string(live_coordinators()) + " coordinators left");
        if (ended->signal != 0 && live_coordinators() > 0 && !stopping_) {
          replace(pid);
          break;  // coordinators_ changed: look again on the next round
        }
        if (live_coordinators() == 0) {
          monitoring::log(monitoring::level::error, launcher_ctx,
                          "every coordinator of the job is gone; the job ends (--resume "
                          "continues from the last committed checkpoint)");
          stop_all();
          return actors::exit_code::failed;
        }
      }
      std::this_thread::sleep_for(milliseconds(20));  // pacing of the reaping poll
    }
  }

  // The job ended under its leader, which told the agents to stop: the standbys go, the agents
  // are given the time their own grace periods need.
  int finish(int code) {
    for (const auto& [pid, alive] : coordinators_)
      if (alive) kill(pid, SIGTERM);
    for (pid_t agent : agents_) {
      // An agent still looking for a leader when the job ended (it ended right after a
      // takeover that did not wait for it) is never told to stop: SIGTERM stops it in order.
      if (sys::wait_for_exit(agent, std::chrono::seconds(3))) continue;
      kill(agent, SIGTERM);
      if (!sys::wait_for_exit(agent, std::chrono::seconds(20))) {
        monitoring::log(monitoring::level::warn, launcher_ctx,
                        "an agent did not exit in time; killing it");
        kill(-agent, SIGKILL);
        sys::wait_for_exit(agent, std::chrono::seconds(10));
      }
    }
    for (auto& [pid, alive] : coordinators_)
      if (alive && !sys::wait_for_exit(pid, std::chrono::seconds(10))) {
        kill(-pid, SIGKILL);
        sys::wait_for_exit(pid, std::chrono::seconds(5));
      }
    return code;
  }

  void stop_all() {
    for (pid_t agent : agents_) kill(-agent, SIGTERM);
    for (const auto& [pid, alive] : coordinators_)
      if (alive) kill(-pid, SIGTERM);
    for (pid_t agent : agents_)
      if (!sys::wait_for_exit(agent, std::chrono::seconds(10))) {
        kill(-agent, SIGKILL);
        sys::wait_for_exit(agent, std::chrono::seconds(5));
      }
    for (auto& [pid, alive] : coordinators_) {
      if (!alive) continue;
      if (!sys::wait_for_exit(pid, std::chrono::seconds(10))) {
        kill(-pid, SIGKILL);
        sys::wait_for_exit(pid, std::chrono::seconds(5));
      }
      alive = false;
    }
  }

  sigset_t signals_;
  job_plan job_;
  bool checked_;
  run_dir_state run_;
  monitoring::metrics_registry registry_;  // the launcher exports nothing; job_etcd wants one
  job_etcd etcd_;
  int count_;
  std::map<pid_t, bool> coordinators_;      // pid -> still running
  std::map<pid_t, int> index_;              // pid -> which of the K (its metrics port)
  std::map<pid_t, std::string> addresses_;  // pid -> the address it published
  std::set<pid_t> unpublished_;             // started again, not listening yet
  bool stopping_ = false;                   // a signal asked the job to stop
  std::vector<pid_t> agents_;
};

}  // namespace

int run_with_standby_coordinators(const job_options& opts, const sigset_t& signals) {
  launcher l(opts, signals);
  return l.run();
}

}  // namespace troupe::coordinator
