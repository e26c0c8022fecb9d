#include "actors/agent/node_supervisor.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "actors/agent/node_agent_state.hpp"
#include "actors/agent/node_relay.hpp"
#include "actors/wire/connect.hpp"
#include "actors/wire/messages.hpp"
#include "actors/wire/tls_transport.hpp"
#include "monitoring/log.hpp"
#include "runtime/auth/credentials.hpp"
#include "runtime/config.hpp"
#include "runtime/sys/child_process.hpp"
#include "runtime/sys/signal_route.hpp"

namespace troupe::actors {

leader_answer judge_leader_answer(const launch_plan& plan, int64_t epoch_seen) {
  if (plan.error.rfind(not_leading_prefix, 0) == 0) return leader_answer::not_leading;
  if (!plan.error.empty()) return leader_answer::refused;
  // A deposed leader that has not noticed yet still answers; following it would split the
  // job between two leaderships.
  if (plan.epoch < epoch_seen) return leader_answer::stale;
  return leader_answer::accepted;
}

using namespace agent_detail;
using sys::self_executable;
using sys::spawn_child;
using sys::spawn_program;
using sys::try_reap;
using sys::wait_for_exit;

namespace agent_detail {

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

// Where the `troupe` Python module of this build lies: beside a build tree's binary
// (build/cli/troupe -> build/python) or an installed one (bin/troupe -> lib/troupe/python).
std::string python_module_dir(const std::string& exe) {
  namespace fs = std::filesystem;
  const fs::path bin = fs::path(exe).parent_path();
  for (const fs::path& dir :
       {bin.parent_path() / "python", bin.parent_path() / "lib/troupe/python"}) {
    std::error_code ec;
    if (fs::exists(dir / "troupe" / "__init__.py", ec)) return dir.string();
  }
  return "";
}

// The troupe._native extension in a module directory ("" when not built there).
std::string python_extension(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(fs::path(dir) / "troupe", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("_native") && name.ends_with(".so")) return entry.path().string();
  }
  return "";
}

// Whether a program is a Python interpreter (python3, python3.11, /usr/bin/python3).
bool is_python(const std::string& program) {
  return std::filesystem::path(program).filename().string().starts_with("python");
}

// Starts the process of member `member` (a standby when negative, reading its id from
// `stdin_fd`): `troupe worker`, or the job's program, which finds the same facts in its
// environment (python/troupe, docs/WORKLOAD.md).
pid_t spawn_worker(const agent_state& s, int32_t member, int stdin_fd = -1) {
  if (s.args.program.empty()) return spawn_child(worker_command(s, member), false, 9, stdin_fd);
  std::vector<std::string> env{"TROUPE_COORDINATOR=" + s.endpoint,
                               "TROUPE_NODE=" + std::to_string(s.node),
                               "TROUPE_JOIN_TOKEN=" + auth::process_credentials().token_path};
  env.push_back(member >= 0 ? "TROUPE_MEMBER=" + std::to_string(member) : "TROUPE_STANDBY=1");
  if (!s.args.advertise.empty()) env.push_back("TROUPE_ADVERTISE=" + s.args.advertise);
  // The module that speaks this binary's protocol comes first on the path.
  if (const std::string dir = python_module_dir(s.exe); !dir.empty()) {
    const char* before = std::getenv("PYTHONPATH");
    env.push_back("PYTHONPATH=" + dir + (before && *before ? ":" + std::string(before) : ""));
    // A Python interpreter gets the module's extension preloaded: its bind() and connect()
    // then come before the C library's for every library of the process, as the troupe
    // binary's do, so gloo's pairs are signed and their connects abortable (torch has loaded
    // libgloo by the time the script imports troupe). The module takes it out of the
    // environment again, so the script's own children do not inherit it.
    const std::string extension = python_extension(dir);
    if (!extension.empty() && is_python(s.args.program.front())) {
      const char* preload = std::getenv("LD_PRELOAD");
      env.push_back("LD_PRELOAD=" + extension +
                    (preload && *preload ? ":" + std::string(preload) : ""));
      env.push_back("TROUPE_PRELOAD=" + extension);
    }
  }
  if (!std::getenv("PYTHONUNBUFFERED")) env.push_back("PYTHONUNBUFFERED=1");
  return spawn_program(s.args.program, env, 9, stdin_fd);
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
    s.standby = spawn_worker(s, -1, fds[0]);
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
  const pid_t pid = spawn_worker(s, member);
  start_standby(self);
  return pid;
}

// A member whose process the leader removed (it was cut off or stopped past the heartbeat
// timeout, and said so with rejoin_exit_code): a new process joins the job in its place at the
// next generation. Not a restart of a failed process, so --max-restarts is not spent.
// Returns the new process, -1 if it could not be started.
pid_t start_again(self_ptr self, int32_t member) {
  try {
    const pid_t pid = restart_worker(self, member);
    monitoring::log(monitoring::level::warn, agent_ctx,
                    "member " + std::to_string(member) +
                        " was removed from the job while it was cut off; started it again to "
                        "rejoin");
    return pid;
  } catch (const std::exception& e) {
    monitoring::log(monitoring::level::error, agent_ctx,
                    "cannot start member " + std::to_string(member) + " again: " + e.what());
    return -1;
  }
}

// What the coordinator is told goes to the current one; while there is none (between leaders)
// it waits for the next.
void report_exit(self_ptr self, const worker_exited& what) {
  auto& s = self->state;
  if (s.rehoming || !s.coordinator)
    s.unsent_exits.push_back(what);
  else
    self->send(s.coordinator, what);
}

// Whether the message being handled comes from the coordinator this agent follows now (not
// from a deposed one that still talks, nor from anyone else).
bool from_coordinator(self_ptr self) {
  const auto& sender = self->current_sender();
  return sender && self->state.coordinator &&
         caf::actor_cast<caf::actor_addr>(sender) == self->state.coordinator.address();
}

void begin_stop(self_ptr self, int exit_code) {
  auto& st = self->state;
  st.searching = false;
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
  st.searching = false;
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

// --relay: this node's workers vote and beat through the agent's relay, which carries them to
// the coordinator as one message per node. They find it in TROUPE_NODE_RELAY (inherited).
void use_relay(self_ptr self, const launch_plan& plan) {
  auto& s = self->state;
  if (!plan.relay) {
    ::unsetenv("TROUPE_NODE_RELAY");
    return;
  }
  if (!s.args.relay) {
    monitoring::log(monitoring::level::warn, agent_ctx,
                    "the job asks for --relay, but this agent runs none (it could not listen "
                    "for one): its workers talk to the coordinator directly");
    return;
  }
  const auto interval = heartbeat_interval(s.heartbeat_timeout);
  self->send(s.args.relay, lead_atom::value, s.coordinator, static_cast<int32_t>(interval.count()),
             plan.epoch);
  ::setenv("TROUPE_NODE_RELAY",
           (s.args.relay_host + ":" + std::to_string(s.args.relay_port)).c_str(), 1);
}

// The coordinator's launch plan, accepted: this agent becomes node plan.node and starts its
// members.
void follow_plan(self_ptr self, const launch_plan& plan) {
  auto& s = self->state;
  s.node = plan.node;
  // The workers' data plane treats each agent as a host of its own (shm inside, TCP
  // across).
  ::setenv("TROUPE_NODE", std::to_string(plan.node).c_str(), 1);
  s.restarts_left = plan.max_restarts;
  s.coordinator_timeout = std::chrono::milliseconds(plan.coordinator_timeout_ms);
  s.heartbeat_timeout = std::chrono::milliseconds(plan.heartbeat_timeout_ms);
  s.rejoin_timeout = std::chrono::milliseconds(std::max(0, plan.rejoin_timeout_ms));
  set_control_socket_timeout(
      liveness_timeouts{s.heartbeat_timeout, s.coordinator_timeout, s.rejoin_timeout}
          .dead_connection());
  s.coordinator_seen = std::chrono::steady_clock::now();
  s.epoch = plan.epoch;
  s.exe = self_executable();
  use_relay(self, plan);
  // Workers look for the leader themselves when it changes, so they get every coordinator.
  s.endpoint = s.several_coordinators()
                   ? endpoints_text(s.args.coordinators)
                   : s.args.coordinator_host + ":" + std::to_string(s.args.coordinator_port);
  for (int32_t m : plan.members) {
    s.given_members.insert(m);
    try {
      s.workers[m] = spawn_worker(s, m);
    } catch (const std::exception& e) {
      monitoring::log(monitoring::level::error, agent_ctx,
                      "cannot start member " + std::to_string(m) + ": " + e.what());
      report_exit(self, worker_exited{m, 0, 127, 0});
    }
  }
  start_standby(self);
  if (!s.ticking) {
    s.ticking = true;
    self->send(self, tick_atom::value);
  }
}

}  // namespace agent_detail

namespace {

std::string local_host_name() {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  return host;
}

caf::behavior node_supervisor(self_ptr self, agent_args args, caf::actor coordinator,
                              std::shared_ptr<std::atomic<int>> exit_code,
                              std::shared_ptr<search_threads> searches) {
  auto& st = self->state;
  st.args = std::move(args);
  st.coordinator = coordinator;
  st.exit_code = std::move(exit_code);
  st.searches = std::move(searches);
  st.host_name = local_host_name();
  if (st.args.coordinators.empty())  // alone: the rejoin search asks it
    st.args.coordinators.push_back(endpoint{st.args.coordinator_host, st.args.coordinator_port});
  if (coordinator) self->monitor(coordinator);
  // The relay ends with this agent.
  if (st.args.relay) self->send(st.args.relay, watch_atom::value, caf::actor{self});
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    if (s.asking && dm.source == s.asking.address()) {
      asked_one_lost(self, "its connection closed: " + self->system().render(dm.reason));
      return;
    }
    if (!s.coordinator || dm.source != s.coordinator.address()) return;
    if (!s.stopping) {
      const std::string why = self->system().render(dm.reason);
      if (s.several_coordinators())
        begin_rehome(self, "its connection closed: " + why);
      else
        enter_cut_off(self, "lost the coordinator (" + why + ")");
      return;
    }
    begin_stop(self, s.exit_code->load());
  });

  if (st.several_coordinators()) {
    // Only the leader takes agents on; the standbys say so, and are passed over until one of
    // them leads.
    wire::search_start at;
    at.deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(st.args.connect_timeout_ms);
    start_search(self, agent_hello{protocol_version, st.host_name, getpid(), st.args.ranks},
                 wire::agent_start_policy(), at);
  } else {
    self->request(coordinator, std::chrono::seconds(30),
                  agent_hello{protocol_version, st.host_name, getpid(), st.args.ranks})
        .then(
            [=](const launch_plan& plan) {
              if (!plan.error.empty()) {
                monitoring::log(monitoring::level::error, agent_ctx,
                                "the coordinator refused this agent: " + plan.error);
                begin_stop(self, 1);
                return;
              }
              follow_plan(self, plan);
            },
            [=](caf::error& e) {
              monitoring::log(monitoring::level::error, agent_ctx,
                              "the coordinator did not answer: " + self->system().render(e));
              begin_stop(self, 1);
            });
  }

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
            if (!s.stopping && !s.cut_off)
              report_exit(self,
                          worker_exited{it->first, it->second, ended->exit_code, ended->signal});
            const bool removed = ended->signal == 0 && ended->exit_code == rejoin_exit_code;
            if (removed && !s.stopping && !s.cut_off) {
              const int32_t member = it->first;
              if (s.rehoming) {  // the next leader takes the node on first
                s.removed_while_rehoming.push_back(member);
                it = s.workers.erase(it);
                continue;
              }
              if (const pid_t pid = start_again(self, member); pid > 0) {
                it->second = pid;
                ++it;
              } else {
                it = s.workers.erase(it);
              }
              continue;
            }
            const bool died = ended->signal != 0 || ended->exit_code != 0;
            if (!s.stopping && !s.cut_off && died && s.restarts_left > 0) {
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
        const auto now = std::chrono::steady_clock::now();
        const auto limit = s.silence_limit();
        if (s.cut_off && !s.stopping) {
          if (now >= s.cut_at + s.rejoin_timeout) {
            give_up_rejoining(self, "no coordinator took it back on within " +
                                        std::to_string(s.rejoin_timeout.count()) +
                                        " ms (--rejoin-timeout-ms)");
          } else if (s.workers.empty() && !s.searching) {
            rejoin_search(self);
          }
        }
        if (!s.stopping && !s.rehoming && !s.cut_off && limit.count() > 0 &&
            now - s.coordinator_seen > limit) {
          const bool early = limit < s.coordinator_timeout;
          const std::string silent =
              "no heartbeat from it for " + std::to_string(limit.count()) +
              (early ? " ms (--heartbeat-timeout-ms)" : " ms (--coordinator-timeout-ms)");
          if (s.several_coordinators())
            begin_rehome(self, silent);
          else
            enter_cut_off(self, "lost the coordinator: " + silent);
        }

        self->delayed_send(self, reap_interval, tick_atom::value);
      },
      [=](stop_atom) {
        if (from_coordinator(self)) begin_stop(self, 0);
      },
      [=](shutdown_atom, const std::string& why) {
        if (!self->state.stopping) monitoring::log(monitoring::level::error, agent_ctx, why);
        begin_stop(self, 1);
      },
      [=](const heartbeat& beat) {
        auto& s = self->state;
        // An older leadership's beat says nothing about the one this node follows.
        if (!from_coordinator(self) || beat.epoch < s.epoch) return;
        s.epoch = beat.epoch;
        s.coordinator_seen = std::chrono::steady_clock::now();
      },
      [=](const candidate_found& found) { greet_candidate(self, found); },
      [=](const search_step& step) {
        auto& s = self->state;
        if (step.search == s.search_id && step.wake == s.search_wake) drive_search(self);
      },
      // From the signal thread, when the job has several coordinators: for the one leading now.
      [=](preempt_atom) {
        auto& s = self->state;
        if (from_coordinator(self)) return;
        if (s.rehoming || !s.coordinator)
          s.unsent_preempt = true;
        else
          self->send(s.coordinator, preempt_atom::value);
      },
      [=](stop_atom, int32_t stage) {
        auto& s = self->state;
        // A cut-off node's stop that comes after it rejoined would hit its new workers.
        if (!s.stopping && !s.cut_off) return;
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
  auto searches = std::make_shared<search_threads>();
  caf::actor coordinator;  // several: the agent looks for the leader itself
  const bool several = args.coordinators.size() > 1;
  if (!several) {
    std::string error;
    coordinator = connect_to_coordinator(sys, args.coordinator_host, args.coordinator_port,
                                         std::chrono::milliseconds(args.connect_timeout_ms), error);
    if (!coordinator) {
      monitoring::log(monitoring::level::error, agent_ctx, error);
      return 1;
    }
  }
  agent_args with_relay = args;
  {
    // Ready for a job that asks for it (--relay). It listens where every listener of this node's
    // processes does: the node's address (--advertise, or the route toward the coordinator,
    // the first one named when there are several), over TLS with the job's token. The leader
    // it carries to comes with the launch plan, and again after a takeover.
    relay_setup r;
    r.coordinator = coordinator;
    with_relay.relay = sys.spawn(node_relay, r);
    const std::string toward_host =
        several ? args.coordinators.front().host : args.coordinator_host;
    const uint16_t toward_port = several ? args.coordinators.front().port : args.coordinator_port;
    with_relay.relay_host =
        args.advertise.empty() ? local_address_toward(toward_host, toward_port) : args.advertise;
    auto port = publish_for_job(sys, with_relay.relay, 0, with_relay.relay_host, false, "relay");
    if (port) {
      with_relay.relay_port = *port;
    } else {
      monitoring::log(monitoring::level::warn, agent_ctx,
                      "cannot listen for this node's relay (" + sys.render(port.error()) +
                          "): its workers talk to the coordinator directly");
      caf::anon_send_exit(with_relay.relay, caf::exit_reason::user_shutdown);
      with_relay.relay = nullptr;
    }
  }
  auto code = std::make_shared<std::atomic<int>>(0);
  auto agent = sys.spawn(node_supervisor, with_relay, coordinator, code, searches);
  // SIGTERM (also what the kernel sends when the launching coordinator dies) stops the
  // workers in order and says why, instead of ending the agent silently. Under a scheduler
  // (preempt_on_signals) SIGTERM and SIGUSR1 are the scheduler's word for the whole job: the
  // coordinator checkpoints the next step and stops it, and its stop (or its loss) stops us.
  std::atomic<bool> done{false};
  std::thread signals([agent, coordinator, parent = getppid(), &blocked, &done,
                       preempt = args.preempt_on_signals, several] {
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
        // With several coordinators the one leading now is the agent's to know.
        caf::anon_send(several ? agent : coordinator, preempt_atom::value);
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
  searches->join_all();  // they use the actor system
  troupe::sys::stop_waiting_for_signals();
  done = true;
  pthread_kill(signals.native_handle(), SIGUSR1);
  signals.join();
  return code->load();
}

}  // namespace troupe::actors
