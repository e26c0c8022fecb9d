#include "actors/node_supervisor.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <cerrno>
#include <csignal>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "actors/child_process.hpp"
#include "actors/connect.hpp"
#include "actors/messages.hpp"
#include "actors/worker_control.hpp"
#include "monitoring/log.hpp"
#include "runtime/auth/credentials.hpp"
#include "runtime/sys/signal_route.hpp"

namespace troupe::actors {
namespace {

constexpr auto reap_interval = std::chrono::milliseconds(20);
constexpr auto stop_grace = std::chrono::seconds(10);  // workers finish their step, then SIGTERM
constexpr auto kill_grace = std::chrono::seconds(3);   // then SIGKILL

struct agent_state {
  agent_args args;
  caf::actor coordinator;
  std::map<int32_t, pid_t> workers;  // member -> pid, until reaped
  // A started, connected worker without a member id yet, which replaces the next one that
  // dies (its id goes down the pipe): a restart then skips the process's start-up.
  pid_t standby = -1;
  int standby_input = -1;
  bool standby_failed = false;  // one exited on its own: do not start another
  int32_t node = 0;
  int restarts_left = 0;
  std::chrono::milliseconds coordinator_timeout{0};  // 0 = not known yet
  std::chrono::steady_clock::time_point coordinator_seen = std::chrono::steady_clock::now();
  std::string exe, endpoint;
  bool stopping = false;
  int stop_stage = 0;  // 0 asked, 1 SIGTERM sent, 2 SIGKILL sent
  std::shared_ptr<std::atomic<int>> exit_code;
  static inline const char* name = "node_supervisor";
};
using self_ptr = caf::stateful_actor<agent_state>*;

const monitoring::log_context agent_ctx{"agent", -1, 0, -1};

void signal_all(self_ptr self, int sig) {
  for (auto& [rank, pid] : self->state.workers) kill(pid, sig);
}

// The command of a worker of this node: member `member`, or a standby when it is negative.
std::vector<std::string> worker_command(const agent_state& s, int32_t member) {
  std::vector<std::string> argv{s.exe, "worker", "--coordinator", s.endpoint};
  if (member >= 0) {
    argv.insert(argv.end(), {"--member", std::to_string(member)});
  } else {
    argv.push_back("--standby");
  }
  argv.insert(argv.end(), {"--node", std::to_string(s.node), "--join-token",
                           auth::process_credentials().token_path});
  if (!s.args.advertise.empty()) argv.insert(argv.end(), {"--advertise", s.args.advertise});
  return argv;
}

// Starts the standby if restarts are left and none is there; failures only mean that the
// next restart starts a process of its own.
void start_standby(self_ptr self) {
  auto& s = self->state;
  if (s.stopping || s.standby > 0 || s.standby_failed || s.restarts_left <= 0 || s.exe.empty())
    return;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;
  try {
    s.standby = spawn_child(worker_command(s, -1), false, 9, fds[0]);
    s.standby_input = fds[1];
  } catch (const std::exception& e) {
    monitoring::log(monitoring::level::warn, agent_ctx,
                    std::string("cannot start a standby worker: ") + e.what());
    ::close(fds[1]);
  }
  ::close(fds[0]);
}

void drop_standby(self_ptr self) {
  auto& s = self->state;
  if (s.standby_input >= 0) ::close(s.standby_input);
  s.standby_input = -1;
  if (s.standby > 0) {
    ::kill(s.standby, SIGKILL);  // it holds nothing
    (void)wait_for_exit(s.standby, std::chrono::seconds(2));
  }
  s.standby = -1;
}

// The process that takes over `member`: the standby, told its id, or a new one.
pid_t restart_worker(self_ptr self, int32_t member) {
  auto& s = self->state;
  if (s.standby > 0 && s.standby_input >= 0) {
    const std::string line = std::to_string(member) + "\n";
    size_t sent = 0;
    while (sent < line.size()) {
      const ssize_t n = ::write(s.standby_input, line.data() + sent, line.size() - sent);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    if (sent == line.size()) {
      ::close(s.standby_input);
      s.standby_input = -1;
      const pid_t pid = s.standby;
      s.standby = -1;
      start_standby(self);
      return pid;
    }
    drop_standby(self);  // it died: start one the usual way
  }
  const pid_t pid = spawn_child(worker_command(s, member));
  start_standby(self);
  return pid;
}

void begin_stop(self_ptr self, int exit_code) {
  auto& st = self->state;
  drop_standby(self);
  if (!st.stopping) st.exit_code->store(exit_code);
  st.stopping = true;
  if (st.workers.empty()) {
    self->quit();
    return;
  }
  self->delayed_send(self,
                     exit_code == 0
                         ? std::chrono::duration_cast<std::chrono::milliseconds>(stop_grace)
                         : std::chrono::milliseconds(0),
                     stop_atom::value, int32_t{1});
}

// The coordinator is lost (its connection closed, or no heartbeat from it for the coordinator
// timeout): this node fences itself. Its workers watch the coordinator too and stop on their
// own, each saying why, without depending on this agent, by the same timeout; the moment they
// get for it is short (a quarter of the timeout, at most a second), then SIGTERM, then
// SIGKILL half as long again later. Nothing is restarted and nothing is reported any more.
void fence_node(self_ptr self, const std::string& why) {
  auto& st = self->state;
  const auto timeout =
      st.coordinator_timeout.count() > 0 ? st.coordinator_timeout : std::chrono::milliseconds(2000);
  const auto term = std::min<std::chrono::milliseconds>(timeout / 4, std::chrono::seconds(1));
  const auto kill = term * 3 / 2;
  monitoring::log(monitoring::level::error, agent_ctx,
                  why + "; fenced: this node's workers stop on their own, any still running get " +
                      "SIGTERM in " + std::to_string(term.count()) + " ms, and none is restarted");
  drop_standby(self);
  st.exit_code->store(1);
  st.stopping = true;
  if (st.workers.empty()) {
    self->quit();
    return;
  }
  self->delayed_send(self, term, stop_atom::value, int32_t{1});
  self->delayed_send(self, kill, stop_atom::value, int32_t{2});
}

caf::behavior node_supervisor(self_ptr self, agent_args args, caf::actor coordinator,
                              std::shared_ptr<std::atomic<int>> exit_code) {
  auto& st = self->state;
  st.args = std::move(args);
  st.coordinator = coordinator;
  st.exit_code = std::move(exit_code);
  self->monitor(coordinator);
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source != self->state.coordinator.address()) return;
    if (!self->state.stopping) {
      fence_node(self, "lost the coordinator (" + self->system().render(dm.reason) + ")");
      return;
    }
    begin_stop(self, self->state.exit_code->load());
  });

  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  self->request(coordinator, std::chrono::seconds(30),
                agent_hello{protocol_version, host, getpid(), st.args.ranks})
      .then(
          [=](const launch_plan& plan) {
            auto& s = self->state;
            if (!plan.error.empty()) {
              monitoring::log(monitoring::level::error, agent_ctx,
                              "the coordinator refused this agent: " + plan.error);
              begin_stop(self, 1);
              return;
            }
            s.node = plan.node;
            // The workers' data plane treats each agent as a host of its own (shm inside, TCP
            // across).
            ::setenv("TROUPE_NODE", std::to_string(plan.node).c_str(), 1);
            s.restarts_left = plan.max_restarts;
            s.coordinator_timeout = std::chrono::milliseconds(plan.coordinator_timeout_ms);
            s.coordinator_seen = std::chrono::steady_clock::now();
            s.exe = self_executable();
            s.endpoint = s.args.coordinator_host + ":" + std::to_string(s.args.coordinator_port);
            for (int32_t m : plan.members) {
              try {
                s.workers[m] = spawn_child(worker_command(s, m));
              } catch (const std::exception& e) {
                monitoring::log(monitoring::level::error, agent_ctx,
                                "cannot start member " + std::to_string(m) + ": " + e.what());
                self->send(s.coordinator, worker_exited{m, 0, 127, 0});
              }
            }
            start_standby(self);
            self->send(self, tick_atom::value);
          },
          [=](caf::error& e) {
            monitoring::log(monitoring::level::error, agent_ctx,
                            "the coordinator did not answer: " + self->system().render(e));
            begin_stop(self, 1);
          });

  return {
      [=](tick_atom) {
        auto& s = self->state;
        if (s.standby > 0) {
          if (auto ended = try_reap(s.standby)) {
            monitoring::log(monitoring::level::warn, agent_ctx,
                            "the standby worker exited (code " + std::to_string(ended->exit_code) +
                                ", signal " + std::to_string(ended->signal) +
                                "); restarts start processes of their own");
            if (s.standby_input >= 0) ::close(s.standby_input);
            s.standby_input = -1;
            s.standby = -1;
            s.standby_failed = true;
          }
        }
        for (auto it = s.workers.begin(); it != s.workers.end();) {
          if (auto ended = try_reap(it->second)) {
            if (!s.stopping)
              self->send(s.coordinator,
                         worker_exited{it->first, it->second, ended->exit_code, ended->signal});
            const bool died = ended->signal != 0 || ended->exit_code != 0;
            if (!s.stopping && died && s.restarts_left > 0) {
              // The same member starts again and rejoins; the job admits it at a step boundary.
              --s.restarts_left;
              const int32_t member = it->first;
              monitoring::log(monitoring::level::warn, agent_ctx,
                              "member " + std::to_string(member) + " died; restarting it (" +
                                  std::to_string(s.restarts_left) + " restarts left)");
              try {
                it->second = restart_worker(self, member);
                ++it;
                continue;
              } catch (const std::exception& e) {
                monitoring::log(monitoring::level::error, agent_ctx,
                                std::string("restart failed: ") + e.what());
              }
            }
            it = s.workers.erase(it);
          } else {
            ++it;
          }
        }
        if (s.stopping && s.workers.empty()) {
          self->quit();
          return;
        }
        if (!s.stopping && s.coordinator_timeout.count() > 0 &&
            std::chrono::steady_clock::now() - s.coordinator_seen > s.coordinator_timeout) {
          fence_node(self, "lost the coordinator: no heartbeat from it for " +
                               std::to_string(s.coordinator_timeout.count()) +
                               " ms (--coordinator-timeout-ms)");
        }
        self->delayed_send(self, reap_interval, tick_atom::value);
      },
      [=](stop_atom) { begin_stop(self, 0); },
      [=](shutdown_atom, const std::string& why) {
        if (!self->state.stopping) monitoring::log(monitoring::level::error, agent_ctx, why);
        begin_stop(self, 1);
      },
      [=](const heartbeat&) { self->state.coordinator_seen = std::chrono::steady_clock::now(); },
      [=](stop_atom, int32_t stage) {
        auto& s = self->state;
        if (s.workers.empty() || stage <= s.stop_stage) return;
        s.stop_stage = stage;
        signal_all(self, stage == 1 ? SIGTERM : SIGKILL);
        if (stage == 1) self->delayed_send(self, kill_grace, stop_atom::value, int32_t{2});
      },
  };
}

}  // namespace

int run_agent(const agent_args& args) {
  // Taken by one thread with sigwait (below); blocked before any thread starts.
  sigset_t blocked;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGTERM);
  sigaddset(&blocked, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
  troupe::sys::route_signals({SIGTERM, SIGUSR1});  // from a thread born before main (OpenBLAS)
  system_config cfg;
  cfg.use_network();
  caf::actor_system sys{cfg};
  std::string error;
  auto coordinator =
      connect_to_coordinator(sys, args.coordinator_host, args.coordinator_port,
                             std::chrono::milliseconds(args.connect_timeout_ms), error);
  if (!coordinator) {
    monitoring::log(monitoring::level::error, agent_ctx, error);
    return 1;
  }
  auto code = std::make_shared<std::atomic<int>>(0);
  auto agent = sys.spawn(node_supervisor, args, coordinator, code);
  // SIGTERM (also what the kernel sends when the launching coordinator dies) stops the
  // workers in order and says why, instead of ending the agent silently. Under a scheduler
  // (preempt_on_signals) SIGTERM and SIGUSR1 are the scheduler's word for the whole job: the
  // coordinator checkpoints the next step and stops it, and its stop (or its loss) stops us.
  std::atomic<bool> done{false};
  std::thread signals([agent, coordinator, parent = getppid(), &blocked, &done,
                       preempt = args.preempt_on_signals] {
    troupe::sys::wait_here_for_signals();
    for (;;) {
      siginfo_t info{};
      const int sig = sigwaitinfo(&blocked, &info);
      if (sig < 0 || done) return;
      if (preempt) {
        monitoring::log(monitoring::level::warn, agent_ctx,
                        std::string(sig == SIGTERM ? "SIGTERM" : "SIGUSR1") +
                            " from the scheduler: asked the coordinator to checkpoint the job "
                            "and stop it (exit 75)");
        caf::anon_send(coordinator, preempt_atom::value);
        continue;
      }
      if (sig == SIGUSR1) continue;
      // The kernel sends the death signal when the thread that started us exits, which can be
      // well before the rest of a large coordinator process is torn down and this process
      // handed to a new parent (seconds on a loaded machine). So a SIGTERM that may be that
      // signal (sent by the parent, or passed on by route_signals from one of our own
      // threads) waits for the reparenting to show; one from anyone else is acted on at once.
      const bool maybe_death_signal = info.si_pid == parent || info.si_pid == getpid();
      const auto wait = maybe_death_signal ? std::chrono::seconds(3) : std::chrono::seconds(0);
      for (const auto until = std::chrono::steady_clock::now() + wait;
           getppid() == parent && std::chrono::steady_clock::now() < until;)
        std::this_thread::sleep_for(std::chrono::milliseconds(4));
      caf::anon_send(agent, shutdown_atom::value,
                     getppid() != parent
                         ? std::string("lost the coordinator: the process that launched this agent "
                                       "died; stopping the workers")
                         : std::string("stopped by SIGTERM; stopping the workers"));
    }
  });
  sys.await_all_actors_done();
  troupe::sys::stop_waiting_for_signals();
  done = true;
  pthread_kill(signals.native_handle(), SIGUSR1);
  signals.join();
  return code->load();
}

}  // namespace troupe::actors
