// Step 4 of a job's coordinator: the store and the job supervisor, the agents, the signals
// that stop or preempt the job, and the wait for its result.

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "actors/coordinator/job_supervisor.hpp"
#include "actors/wire/connect.hpp"
#include "actors/wire/tls_transport.hpp"
#include "checkpoint/durable_io.hpp"
#include "coordinator/job_options.hpp"
#include "coordinator/job_steps.hpp"
#include "coordinator/slurm_launch.hpp"
#include "monitoring/events/events.hpp"
#include "monitoring/log.hpp"
#include "runtime/auth/credentials.hpp"
#include "runtime/model/peak_flops.hpp"
#include "runtime/sys/child_process.hpp"
#include "runtime/sys/run_paths.hpp"
#include "runtime/sys/signal_route.hpp"
#include "strategies/mesh.hpp"

namespace troupe::coordinator {
namespace {

const monitoring::log_context coordinator_ctx{"coordinator", -1, 0, -1};

// The store listens where the coordinator does, so agents on other machines reach it. Only
// members that prove they hold the job's secret reach it (store_auth::from_process()).
comm::store_server_options store_options(const job_listeners& listeners) {
  comm::store_server_options options;
  options.on_rejection = [on_rejection = listeners.on_rejection()](const std::string& peer,
                                                                   const std::string& why) {
    on_rejection("store", peer, why);
  };
  return options;
}

// The progress line follows the event stream.
void follow_progress(actors::job_setup& setup, progress_line& progress) {
  setup.on_event = [&progress](const troupe::events::job_event& event) {
    namespace ev = troupe::events;
    std::visit(ev::overloaded{
                   [&progress](const ev::step& e) {
                     progress.update(e.step, e.total_steps, e.loss, e.tokens_per_s);
                   },
                   [&progress](const ev::validation& e) {
                     progress.note("step " + std::to_string(e.step) + ": validation loss " +
                                   format_fixed(e.val_loss, 4));
                   },
                   [&progress](const ev::generation& e) {
                     if (e.number <= 1) return;
                     progress.note("generation " + std::to_string(e.number) + ": " +
                                   std::to_string(e.world) + " ranks from step " +
                                   std::to_string(e.start_step) + " (" + e.reason + ")");
                   },
                   [&progress](const ev::job_ended&) { progress.finish(); },
                   [](const auto&) {},
               },
               event);
  };
}

// SIGINT: stop at the step boundary (exit 130); SIGTERM, SIGUSR1: a scheduler wants the nodes
// back, so checkpoint the next step and stop (exit 75, requeue). Under Slurm both of the latter
// may come more than once (the batch shell forwards what Slurm also sends every process of the
// step): only a Ctrl-C after the first signal kills the job at once. Watches from its own
// thread from construction to destruction.
class signal_watcher {
 public:
  signal_watcher(const sigset_t& signals, caf::actor supervisor, const std::vector<pid_t>& agents,
                 std::string run_dir, std::function<bool()> standing_by = nullptr)
      : standing_by_(std::move(standing_by)),
        signals_(signals),
        supervisor_(std::move(supervisor)),
        agents_(agents),
        run_dir_(std::move(run_dir)),
        thread_([this] { watch(); }) {}
  ~signal_watcher() {
    troupe::sys::stop_waiting_for_signals();
    done_ = true;
    pthread_kill(thread_.native_handle(), SIGUSR1);
    thread_.join();
  }
  signal_watcher(const signal_watcher&) = delete;
  signal_watcher& operator=(const signal_watcher&) = delete;

 private:
  void watch() {
    troupe::sys::wait_here_for_signals();
    for (int count = 1;; ++count) {
      int sig = 0;
      if (sigwait(&signals_, &sig) != 0 || done_) return;
      if (sig == launcher_died) {
        // The launcher's agents and workers died with it (and an etcd it started): there is
        // nothing left to lead or to wait for.
        std::fprintf(stderr,
                     "troupe coordinator: the launcher that started this coordinator died, and "
                     "its agents and workers with it; ending now. --resume continues from %s\n",
                     committed_checkpoint_words(run_dir_).c_str());
        _exit(1);
      }
      if (standing_by_ && standing_by_()) continue;  // a standby just stops campaigning
      if (count == 1 && sig == SIGINT) {
        std::fprintf(stderr,
                     "\ntroupe: stopping the job at the step boundary, after any checkpoint "
                     "being written (press Ctrl-C again to kill it)\n");
        caf::anon_send(supervisor_, actors::shutdown_atom::value);
      } else if (count == 1 || sig != SIGINT) {
        if (count == 1)
          std::fprintf(stderr,
                       "\ntroupe: %s: checkpointing the next step and stopping the job; exit %d "
                       "asks for a requeue, --resume continues (Ctrl-C kills it at once)\n",
                       sig == SIGTERM ? "SIGTERM" : "SIGUSR1", actors::exit_code::requeue);
        caf::anon_send(supervisor_, actors::preempt_atom::value);
      } else {
        for (pid_t agent : agents_) kill(-agent, SIGKILL);  // an agent leads its workers' group
        std::fprintf(stderr, "\ntroupe: killed; the committed checkpoint is %s\n",
                     committed_checkpoint_words(run_dir_).c_str());
        _exit(actors::exit_code::interrupted);
      }
    }
  }

  // True (and the campaign stopped) while this coordinator stands by.
  const std::function<bool()> standing_by_;
  const sigset_t signals_;
  const caf::actor supervisor_;
  const std::vector<pid_t>& agents_;
  const std::string run_dir_;
  std::atomic<bool> done_{false};
  std::thread thread_;  // last: it starts once everything it reads is set
};

}  // namespace

job_supervision::job_supervision(const job_plan& job, job_listeners& listeners, run_dir_state& run,
                                 job_etcd& etcd)
    : job_(job),
      listeners_(listeners),
      etcd_(etcd),
      store_(job.listen_host, 0, store_options(listeners)),
      sys_(sys_cfg_.use_network()),
      self_(sys_) {
  actors::job_setup setup;
  if (job.cfg.progress) {
    progress_.emplace(run.start_step);
    follow_progress(setup, *progress_);
  }
  if (etcd.enabled()) {
    // The mirror sees the same typed events as the progress line, after it.
    setup.on_event =
        [&etcd, progress = std::move(setup.on_event)](const troupe::events::job_event& event) {
          if (progress) progress(event);
          etcd.observe(event);
        };
  }
  {  // GET /status folds the same typed events, before the others see them
    auto& board = listeners.status();
    board.set_job(job.cfg.run_dir, job.cfg.steps, job.layout.shape.world(),
                  strategies::describe(job.layout.shape) + (job.cfg.parallel.zero ? " zero1" : ""));
    board.set_role(job.standby ? "standby" : "leader", 0);
    setup.status = &board;
    setup.on_event = [&board,
                      next = std::move(setup.on_event)](const troupe::events::job_event& event) {
      board.observe(event);
      if (next) next(event);
    };
  }
  setup.cfg = job.cfg;
  // Measured before the job forms (and by a standby before it may lead, so a takeover waits
  // for no measurement): the MFU's denominator unless --peak-flops gives it.
  if (job.cfg.peak_flops <= 0) setup.peak_flops = measure_peak_flops(job.cfg.blas_threads);
  setup.standby = job.standby;
  if (etcd.enabled()) {
    setup.still_leading = [&etcd] { return etcd.leading(); };
    setup.confirm_leading = [&etcd] { return etcd.confirm_leading(); };
  }
  setup.form_timeout_ms = job.cfg.elastic.join_timeout_ms;
  setup.store_host = job.listen_host;
  setup.store_port = store_.port();
  setup.start_step = run.start_step;
  setup.events = &run.events;
  setup.metrics = &listeners.registry();
  setup.listener = caf::actor_cast<caf::actor>(self_);
  setup.plan = job.layout;
  setup.faults = job.faults;
  setup.skipped_steps = run.skipped_steps;
  supervisor_ = actors::spawn_job_supervisor(sys_, std::move(setup));
  self_->monitor(supervisor_);
}

actors::job_result job_supervision::run(const sigset_t& signals) {
  // on_lost (below) holds the supervisor's handle, which must not outlive this actor system.
  struct forget_guard {
    job_etcd& etcd;
    ~forget_guard() { etcd.forget_on_lost(); }
  } forget{etcd_};
  const uint16_t port = publish();
  const std::string endpoint = job_.listen_host + ":" + std::to_string(port);
  // A lapsed lease pauses the supervisor; it goes on when it leads again, or ends the job.
  etcd_.on_pause(
      [supervisor = supervisor_] { caf::anon_send(supervisor, actors::pause_atom::value); },
      [supervisor = supervisor_](int64_t epoch) {
        caf::anon_send(supervisor, actors::lead_atom::value, epoch, std::string());
      },
      [supervisor = supervisor_](const std::string& why) {
        caf::anon_send(supervisor, actors::pause_atom::value, why);
      });
  if (job_.standby) return run_standby(signals, endpoint);
  // Elected before any agent is started or asked for: a coordinator that does not lead must
  // not have supervised anything.
  try {
    etcd_.lead(endpoint, [supervisor = supervisor_] {
      // A deposed leader stops deciding at once; the new leader (or --resume) takes the job
      // from its last checkpoint.
      caf::anon_send_exit(supervisor, caf::exit_reason::kill);
    });
  } catch (...) {
    caf::anon_send_exit(supervisor_, caf::exit_reason::user_shutdown);
    throw;
  }
  // Its epoch from now on; a tick during the campaign may have paused it (not leading yet).
  if (etcd_.enabled())
    caf::anon_send(supervisor_, actors::lead_atom::value, etcd_.epoch(), std::string());
  if (job_.slurm) announce_rendezvous(port);
  start_agents(endpoint);
  actors::job_result result;
  {
    signal_watcher watcher(signals, supervisor_, agents_, job_.cfg.run_dir);
    result = wait_for_result();
    // A loss noticed after the job had ended by itself changes nothing about that job.
    if (const std::string lost = etcd_.lost_reason(); !lost.empty() && supervisor_died_) {
      result.exit_code = 1;
      result.message =
          "lost leadership in etcd: " + lost + "; --resume continues from the last checkpoint";
      // Nobody told the agents to stop: ask them (their workers go with them).
      for (pid_t agent : agents_) kill(-agent, SIGTERM);
    }
    stop_agents();
    if (job_.slurm) remove_rendezvous(job_.cfg.run_dir, getpid());
    caf::anon_send_exit(supervisor_, caf::exit_reason::user_shutdown);
  }
  return result;
}

// One of several coordinators: published at once (members and agents that ask it are told it
// stands by), campaigns until elected, then takes the job over from etcd's state. Its agents
// belong to the launcher: it never starts or stops them.
actors::job_result job_supervision::run_standby(const sigset_t& signals,
                                                const std::string& endpoint) {
  actors::job_result result;
  signal_watcher watcher(signals, supervisor_, agents_, job_.cfg.run_dir, [this] {
    // It leads: the job's signal. A paused leader steps aside (or resumes) on its own.
    if (etcd_.epoch() > 0 && etcd_.leading()) return false;
    etcd_.stop_campaign();
    return true;
  });
  bool elected = false;
  try {
    elected = etcd_.stand_by(endpoint, [supervisor = supervisor_] {
      caf::anon_send_exit(supervisor, caf::exit_reason::kill);
    });
  } catch (...) {
    caf::anon_send_exit(supervisor_, caf::exit_reason::user_shutdown);
    throw;
  }
  if (!elected) {
    caf::anon_send_exit(supervisor_, caf::exit_reason::user_shutdown);
    result.exit_code = actors::exit_code::not_leading;
    result.message =
        etcd_.job_ended() ? "the job ended under another leader" : "stopped while standing by";
    return result;
  }
  caf::anon_send(supervisor_, actors::lead_atom::value, etcd_.epoch(), etcd_.found_state());
  result = wait_for_result();
  if (const std::string lost = etcd_.lost_reason(); !lost.empty() && supervisor_died_) {
    // Another coordinator takes the job over; the members look for it themselves.
    result.exit_code = actors::exit_code::not_leading;
    result.message = "lost leadership in etcd: " + lost + "; a standby coordinator goes on";
  }
  caf::anon_send_exit(supervisor_, caf::exit_reason::user_shutdown);
  return result;
}

// The coordinator's endpoint, published for the agents and workers and written to
// RUN_DIR/coordinator.addr (one of several coordinators: RUN_DIR/coordinators/<pid>.addr).
uint16_t job_supervision::publish() {
  // A connection to a node cut off for twice the coordinator timeout is given up: everyone has
  // acted on the cut by then, and the node rejoins over a new one when its link heals.
  actors::set_control_socket_timeout(liveness_of(job_.cfg.elastic).dead_connection());
  auto published = actors::publish_for_job(sys_, supervisor_, job_.listen_port, job_.listen_host,
                                           true, "coordinator");
  if (!published) {
    caf::anon_send_exit(supervisor_, caf::exit_reason::user_shutdown);
    throw config_error("cannot listen on " + job_.listen_host + ":" +
                       std::to_string(job_.listen_port) + " (" + sys_.render(published.error()) +
                       "); pick another --port");
  }
  const std::string endpoint = job_.listen_host + ":" + std::to_string(*published);
  if (job_.standby) {
    const std::string dir = job_.cfg.run_dir + "/coordinators";
    ckpt::io::make_dirs_durable(dir);
    ckpt::io::write_file_atomically(dir + "/" + std::to_string(getpid()) + ".addr",
                                    endpoint + "\n");
  } else {
    ckpt::io::write_file_atomically(run_paths::coordinator_address(job_.cfg.run_dir),
                                    endpoint + "\n");
  }
  if (const auto* metrics = listeners_.metrics()) {
    say("metrics on http://%s:%u/metrics", job_.cfg.metrics_host.c_str(), metrics->port());
    // Where `troupe status RUN_DIR` finds this coordinator's /status.
    ckpt::io::write_file_atomically(
        job_.standby ? run_paths::standby_metrics_address(job_.cfg.run_dir, getpid())
                     : run_paths::metrics_address(job_.cfg.run_dir),
        job_.cfg.metrics_host + ":" + std::to_string(metrics->port()) + "\n");
  }
  return *published;
}

// Under Slurm: RUN_DIR/rendezvous.json, where this attempt's agents find the coordinator.
void job_supervision::announce_rendezvous(uint16_t port) const {
  const auto& slurm = *job_.slurm;
  write_rendezvous(job_.cfg.run_dir,
                   rendezvous{slurm.attempt(), job_.rendezvous_host, port, slurm.node_name,
                              job_.cfg.elastic.nodes, static_cast<int64_t>(getpid())});
  say("Slurm job %s%s: coordinator on %s at %s:%u (%s)", slurm.job_id.c_str(),
      slurm.restart_count > 0 ? (" (restart " + std::to_string(slurm.restart_count) + ")").c_str()
                              : "",
      slurm.node_name.empty() ? "this node" : slurm.node_name.c_str(), job_.rendezvous_host.c_str(),
      static_cast<unsigned>(port), run_paths::rendezvous(job_.cfg.run_dir).c_str());
}

// The agents: started here (`troupe run`: one per simulated node, or one srun for the Slurm
// allocation's nodes), or asked for on stdout (`troupe coordinator`).
void job_supervision::start_agents(const std::string& endpoint) {
  const auto& token = auth::process_credentials().token_path;
  if (job_.slurm && job_.launch_local_agent) {
    // One agent per node of the allocation; srun --no-kill keeps the step when a node is lost.
    std::string words;
    for (const auto& w : job_.srun_agents) words += (words.empty() ? "" : " ") + w;
    say("starting %d agents: %s", job_.cfg.elastic.nodes, words.c_str());
    agents_.push_back(sys::spawn_child(job_.srun_agents, true, SIGTERM));
  } else if (job_.slurm) {
    std::printf(
        "troupe coordinator: listening on %s; start one agent per node with: srun --no-kill "
        "--ntasks-per-node=1 troupe agent --run-dir %s\n",
        endpoint.c_str(), job_.cfg.run_dir.c_str());
    std::fflush(stdout);
  } else if (job_.launch_local_agent) {
    // One agent per simulated node, each leading its own process group with its workers.
    for (int n = 0; n < job_.cfg.elastic.nodes; ++n)
      agents_.push_back(sys::spawn_child(
          with_program(
              {sys::self_executable(), "agent", "--coordinator", endpoint, "--join-token", token},
              job_.cfg),
          true, SIGTERM));
  } else {
    std::printf(
        "troupe coordinator: listening on %s; start agents with: troupe agent --coordinator %s "
        "--join-token %s%s\n",
        endpoint.c_str(), endpoint.c_str(), token.c_str(),
        job_.cfg.external_workload() ? " -- PROGRAM (the job's, as given after --)" : "");
    std::fflush(stdout);
  }
}

actors::job_result job_supervision::wait_for_result() {
  actors::job_result result;
  bool done = false;
  while (!done) {
    self_->receive(
        [&](actors::result_atom, actors::job_result& r) {
          result = std::move(r);
          done = true;
        },
        [&](caf::down_msg& dm) {
          if (dm.source != supervisor_.address()) return;
          result.exit_code = 1;
          result.message =
              "the job supervisor stopped unexpectedly (" + sys_.render(dm.reason) + ")";
          supervisor_died_ = true;
          done = true;
        });
  }
  return result;
}

void job_supervision::stop_agents() {
  for (pid_t agent : agents_) {
    // The agent stops its workers (they were told to stop) and then exits; give it the
    // time its own grace periods need before taking its whole process group down.
    if (job_.slurm && !sys::wait_for_exit(agent, std::chrono::seconds(20))) {
      // srun: two Ctrl-C within a second end the step (its tasks get SIGKILL from Slurm).
      monitoring::log(monitoring::level::warn, coordinator_ctx,
                      "the agents' srun did not end in time; cancelling its step");
      kill(agent, SIGINT);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      kill(agent, SIGINT);
    }
    if (!sys::wait_for_exit(agent, std::chrono::seconds(20))) {
      monitoring::log(monitoring::level::warn, coordinator_ctx,
                      "an agent did not exit in time; killing it");
      kill(-agent, SIGKILL);
      sys::wait_for_exit(agent, std::chrono::seconds(10));
    }
  }
}

}  // namespace troupe::coordinator
