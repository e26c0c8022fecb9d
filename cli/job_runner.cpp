#include "cli/job_runner.hpp"

#include "actors/child_process.hpp"
#include "actors/job_supervisor.hpp"
#include "actors/messages.hpp"
#include "checkpoint/checkpoint.hpp"
#include "cli/progress.hpp"
#include "monitoring/event_log.hpp"
#include "monitoring/http_server.hpp"
#include "monitoring/log.hpp"
#include "monitoring/metrics.hpp"
#include "runtime/comm/store.hpp"
#include "runtime/model/gpt.hpp"
#include "strategies/mesh.hpp"
#include "strategies/planner.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#ifndef TROUPE_DEFAULT_CORPUS
#define TROUPE_DEFAULT_CORPUS ""
#endif

namespace troupe::cli {
namespace {

namespace fs = std::filesystem;
const monitoring::log_context coordinator_ctx{"coordinator", -1, 0, -1};

// Resolves the corpus and the run directory; archives an old run instead of mixing a
// fresh one into it (no committed data is ever deleted).
void prepare_paths(train_config& cfg) {
  if (cfg.data.empty()) cfg.data = TROUPE_DEFAULT_CORPUS;
  if (cfg.data.empty() || !fs::is_regular_file(cfg.data))
    throw config_error("data: corpus file '" + cfg.data +
                       "' not found; run scripts/setup.sh (it builds the default corpus) or pass --data FILE");
  cfg.data = fs::absolute(cfg.data).string();
  cfg.run_dir = fs::absolute(cfg.run_dir).lexically_normal().string();
  if (!cfg.run_dir.empty() && cfg.run_dir.back() == '/') cfg.run_dir.pop_back();
  if (!cfg.resume && fs::exists(fs::path(cfg.run_dir) / "checkpoints")) {
    auto stamp = std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count());
    fs::path archived = cfg.run_dir + ".prev-" + stamp;
    fs::rename(cfg.run_dir, archived);
    std::fprintf(stderr, "troupe: %s held an earlier run; moved it to %s (use --resume to continue a run)\n",
                 cfg.run_dir.c_str(), archived.c_str());
  }
  fs::create_directories(cfg.run_dir);
}

// The step a resumed job starts after; checks the checkpoint fits this config.
int64_t resume_point(const train_config& cfg) {
  auto man = ckpt::latest_committed(cfg.run_dir);
  if (!man)
    throw config_error("resume: no committed checkpoint in " + cfg.run_dir +
                       "/checkpoints; run without --resume to start fresh, or point --run-dir at the run");
  // Everything that shapes the math must match; what only says how or how long to run
  // (world size, step budget, ports, paths, cadences) may change between sessions.
  static const std::vector<std::string> may_change = {
      "/world", "/steps", "/resume", "/run_dir", "/metrics_port", "/metrics_host", "/progress",
      "/exit_after_step", "/checkpoint_every", "/eval_every", "/eval_batches", "/step_timeout_ms",
      "/bucket_bytes", "/blas_threads", "/data",
      // The layout may change too: checkpoints are layout-independent (single-rank flat layout).
      "/parallel/tp", "/parallel/pp", "/parallel/ep", "/parallel/zero", "/parallel/micro_batches",
      "/parallel/schedule"};
  try {
    ckpt::require_compatible(*man, to_json(cfg), gpt(cfg.model).num_params(), may_change);
  } catch (const ckpt::checkpoint_error& e) {
    throw config_error(std::string("resume: ") + e.what());
  }
  if (man->step >= cfg.steps)
    throw config_error("resume: the checkpoint is at step " + std::to_string(man->step) +
                       ", which is not before --steps " + std::to_string(cfg.steps) + "; raise --steps");
  return man->step;
}

// Stage 1: the layout for this world, from the planner (a pure function the elastic path
// will call again with a new world size). Returns its JSON for events.jsonl.
std::string plan_job(const train_config& cfg, strategies::layout& shape_out) {
  auto planned = strategies::plan_layout(cfg.world, cfg);
  if (!strategies::has_plan(planned)) throw config_error("layout: " + strategies::reason_of(planned));
  const auto& plan = strategies::plan_of(planned);
  const auto& shape = plan.shape;
  if (shape.pp != 1)
    throw config_error("layout: " + strategies::describe(shape) +
                       " is valid, but `troupe run` trains data-, tensor- and expert-parallel layouts only so far "
                       "(pipeline parallelism is being wired in); use --pp 1");
  if (shape.tp > 1 && cfg.parallel.zero == 1)
    throw config_error("layout: ZeRO-1 together with tensor parallelism (" + strategies::describe(shape) +
                       ") is not supported yet; use --zero 0 or --tp 1");
  shape_out = shape;
  auto doc = nlohmann::json::parse(strategies::to_json(plan));
  doc["describe"] = strategies::describe(shape);
  doc["zero"] = cfg.parallel.zero;
  return doc.dump();
}

void print_summary(const train_config& cfg, const actors::job_result& r) {
  const char* verdict = r.exit_code == 0 ? "done" : r.exit_code == 130 ? "interrupted" : "FAILED";
  std::printf("troupe: %s in %s — %s\n", verdict, format_duration(r.wall_s).c_str(), r.message.c_str());
  std::printf("  steps             %lld of %d (world %d)\n", static_cast<long long>(r.steps_done), cfg.steps, cfg.world);
  if (r.final_loss == r.final_loss) std::printf("  train loss        %.4f\n", r.final_loss);
  if (r.val_loss >= 0) std::printf("  validation loss   %.4f\n", r.val_loss);
  std::printf("  tokens/s          %s\n", format_rate(r.tokens_per_s).c_str());
  std::printf("  checkpoint        %s\n", r.last_checkpoint.empty() ? "(none)" : r.last_checkpoint.c_str());
  std::printf("  events            %s/events.jsonl\n", cfg.run_dir.c_str());
  std::fflush(stdout);
}

}  // namespace

int run_job(const job_options& opts, bool launch_local_agent) {
  // Signals are taken by one thread with sigwait; block them before any thread starts,
  // so a Ctrl-C never lands on a server thread and kills the process mid-write.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  train_config cfg = opts.cfg;
  strategies::layout shape;
  const std::string layout_json = plan_job(cfg, shape);
  prepare_paths(cfg);
  int64_t start_step = cfg.resume ? resume_point(cfg) : 0;
  {
    std::ofstream out(cfg.run_dir + "/config.json");
    out << nlohmann::json::parse(to_json(cfg)).dump(2) << "\n";
  }

  auto events = monitoring::event_log::open(cfg.run_dir + "/events.jsonl");
  events.write({{"event", "job_start"}, {"world", cfg.world}, {"steps", cfg.steps}, {"resume", cfg.resume},
                {"start_step", start_step}, {"config", nlohmann::json::parse(to_json(cfg))}, {"pid", getpid()},
                {"layout", nlohmann::json::parse(layout_json)}});

  monitoring::metrics_registry registry;
  std::optional<monitoring::metrics_server> metrics;
  if (cfg.metrics_port != 0) {
    try {
      metrics.emplace(registry, cfg.metrics_host, static_cast<uint16_t>(cfg.metrics_port));
    } catch (const std::exception& e) {
      throw config_error(std::string("metrics_port: ") + e.what());
    }
  }
  comm::tcp_store_server store("127.0.0.1", 0);

  actors::system_config sys_cfg;
  sys_cfg.load<caf::io::middleman>();
  caf::actor_system sys{sys_cfg};
  caf::scoped_actor self{sys};

  actors::job_setup setup;
  setup.cfg = cfg;
  setup.store_host = "127.0.0.1";
  setup.store_port = store.port();
  setup.start_step = start_step;
  setup.events = &events;
  setup.metrics = &registry;
  setup.listener = caf::actor_cast<caf::actor>(self);
  setup.layout_json = layout_json;
  setup.shape = shape;
  auto supervisor = actors::spawn_job_supervisor(sys, setup);
  self->monitor(supervisor);

  auto published = sys.middleman().publish(supervisor, opts.listen_port, opts.listen_host.c_str(), true);
  if (!published) {
    caf::anon_send_exit(supervisor, caf::exit_reason::user_shutdown);
    throw config_error("cannot listen on " + opts.listen_host + ":" + std::to_string(opts.listen_port) + " (" +
                       sys.render(published.error()) + "); pick another --port");
  }
  const std::string endpoint = opts.listen_host + ":" + std::to_string(*published);
  { std::ofstream(cfg.run_dir + "/coordinator.addr") << endpoint << "\n"; }
  if (metrics)
    std::fprintf(stderr, "troupe: metrics on http://%s:%u/metrics\n", cfg.metrics_host.c_str(), metrics->port());

  pid_t agent = -1;
  if (launch_local_agent) {
    agent = actors::spawn_child({actors::self_executable(), "agent", "--coordinator", endpoint}, true);
  } else {
    std::printf("troupe coordinator: listening on %s; start agents with: troupe agent --coordinator %s\n",
                endpoint.c_str(), endpoint.c_str());
    std::fflush(stdout);
  }

  std::thread signal_thread([&] {
    int count = 0;
    for (;;) {
      int sig = 0;
      if (sigwait(&signals, &sig) != 0 || sig == SIGUSR1) return;
      if (++count == 1) {
        std::fprintf(stderr, "\ntroupe: stopping the job (press Ctrl-C again to kill it)\n");
        caf::anon_send(supervisor, actors::shutdown_atom::value);
      } else {
        if (agent > 0) kill(-agent, SIGKILL);  // the agent leads its workers' process group
        _exit(130);
      }
    }
  });

  actors::job_result result;
  bool done = false;
  while (!done) {
    self->receive(
        [&](actors::result_atom, actors::job_result& r) {
          result = std::move(r);
          done = true;
        },
        [&](caf::down_msg& dm) {
          if (dm.source != supervisor.address()) return;
          result.exit_code = 1;
          result.message = "the job supervisor stopped unexpectedly (" + sys.render(dm.reason) + ")";
          done = true;
        });
  }

  if (agent > 0) {
    // The agent stops its workers (they were told to stop) and then exits; give it the
    // time its own grace periods need before taking its whole process group down.
    if (!actors::wait_for_exit(agent, std::chrono::seconds(20))) {
      monitoring::log(monitoring::level::warn, coordinator_ctx, "the agent did not exit in time; killing it");
      kill(-agent, SIGKILL);
      actors::wait_for_exit(agent, std::chrono::seconds(10));
    }
  }
  caf::anon_send_exit(supervisor, caf::exit_reason::user_shutdown);
  pthread_kill(signal_thread.native_handle(), SIGUSR1);
  signal_thread.join();
  print_summary(cfg, result);
  return result.exit_code;
}

}  // namespace troupe::cli
