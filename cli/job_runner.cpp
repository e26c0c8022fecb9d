#include "cli/job_runner.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "actors/child_process.hpp"
#include "actors/connect.hpp"
#include "actors/job_supervisor.hpp"
#include "actors/messages.hpp"
#include "actors/node_address.hpp"
#include "actors/tls_transport.hpp"
#include "chaos/fault_spec.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/durable_io.hpp"
#include "checkpoint/format.hpp"
#include "cli/progress.hpp"
#include "cli/scheduler.hpp"
#include "monitoring/event_log.hpp"
#include "monitoring/http_server.hpp"
#include "monitoring/log.hpp"
#include "monitoring/metrics.hpp"
#include "runtime/auth/credentials.hpp"
#include "runtime/comm/store.hpp"
#include "runtime/comm/tcp_signature.hpp"
#include "runtime/model/gpt.hpp"
#include "runtime/preflight.hpp"
#include "runtime/sys/printable.hpp"
#include "runtime/sys/signal_route.hpp"
#include "strategies/mesh.hpp"
#include "strategies/planner.hpp"

#ifndef TROUPE_DEFAULT_CORPUS
#define TROUPE_DEFAULT_CORPUS ""
#endif

namespace troupe::cli {
namespace {

namespace fs = std::filesystem;
const monitoring::log_context coordinator_ctx{"coordinator", -1, 0, -1};

// Every check of the job against this machine and its files, before a process starts or a
// file is written (a refused job leaves the run directory as it found it): memory for the
// local ranks, a readable corpus big enough for a batch and the validation estimate, a run
// directory that can be one, and a checkpoint to resume from.
void preflight(train_config& cfg, bool launch_local_agent) {
  // Empty only when --data and the config file left it out: an explicit "" is refused as it is
  // read (runtime/config.cpp), so that it never means the default corpus.
  if (cfg.data.empty()) cfg.data = TROUPE_DEFAULT_CORPUS;
  // A run directory too long for the paths written below it fails here, by name, not with a
  // raw filesystem error halfway through writing the run.
  check_run_dir_length(fs::absolute(cfg.run_dir).lexically_normal().string());
  if (!cfg.metrics_token_file.empty())
    check_path_length(cfg.metrics_token_file, "metrics_token_file", "--metrics-token");
  check_against_host(cfg, launch_local_agent ? cfg.world + cfg.elastic.spares : 0,
                     read_host_facts(cfg));
  // The local agents read the node address from the environment (TROUPE_ADVERTISE,
  // TROUPE_IFACE, GLOO_SOCKET_IFNAME): refused here, before any process starts, if unusable.
  if (launch_local_agent) {
    try {
      actors::resolve_node_address(actors::choose_node_address("", ""));
    } catch (const actors::node_address_error& e) {
      throw config_error(std::string("the node address for this job's workers: ") + e.what());
    }
  }
  // Ranks on different nodes talk over gloo's TCP pairs, signed unless told otherwise.
  std::string why;
  if (cfg.elastic.nodes > 1 && cfg.data_plane_auth == "tcp-md5" &&
      !comm::tcp_signatures_supported(&why)) {
    throw config_error(
        "data_plane_auth (--data-plane-auth): got 'tcp-md5', but this kernel "
        "cannot sign TCP segments (" +
        why +
        "); pass --data-plane-auth none "
        "to connect the nodes' pairs unsigned, on a network you trust");
  }
  std::error_code ec;
  const fs::path run_dir = fs::absolute(cfg.run_dir).lexically_normal();
  if (fs::exists(run_dir, ec) && !fs::is_directory(run_dir, ec))
    throw config_error("run_dir (--run-dir): '" + run_dir.string() +
                       "' exists and is not a directory; pick another --run-dir");
  // The nearest existing ancestor must be a directory this user can create entries in.
  fs::path ancestor = run_dir;
  while (!ancestor.empty() && !fs::exists(ancestor, ec) && ancestor != ancestor.parent_path())
    ancestor = ancestor.parent_path();
  if (!fs::exists(run_dir, ec) &&
      (!fs::is_directory(ancestor, ec) || ::access(ancestor.c_str(), W_OK | X_OK) != 0))
    throw config_error("run_dir (--run-dir): cannot create '" + run_dir.string() + "': '" +
                       ancestor.string() + "' is not a writable directory");
  if (cfg.resume && !fs::exists(run_dir / "checkpoints", ec))
    throw config_error("resume: no committed checkpoint in " + (run_dir / "checkpoints").string() +
                       "; run without --resume to start fresh, or point --run-dir at the run");
}

// Resolves the corpus and the run directory; archives an old run instead of mixing a
// fresh one into it (no committed data is ever deleted).
void prepare_paths(train_config& cfg) {
  if (cfg.data.empty()) cfg.data = TROUPE_DEFAULT_CORPUS;
  if (cfg.data.empty() || !fs::is_regular_file(cfg.data))
    throw config_error(
        "data: corpus file '" + cfg.data +
        "' not found; run scripts/setup.sh (it builds the default corpus) or pass --data FILE");
  cfg.data = fs::absolute(cfg.data).string();
  cfg.run_dir = fs::absolute(cfg.run_dir).lexically_normal().string();
  if (!cfg.run_dir.empty() && cfg.run_dir.back() == '/') cfg.run_dir.pop_back();
  if (!cfg.resume && fs::exists(fs::path(cfg.run_dir) / "checkpoints")) {
    if (!ckpt::run_lock::try_acquire(cfg.run_dir))
      throw config_error("run_dir: another troupe job is using " + cfg.run_dir +
                         " (it holds checkpoints/.lock); stop it or pick another --run-dir");
    auto stamp = std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count());
    fs::path archived = cfg.run_dir + ".prev-" + stamp;
    fs::rename(cfg.run_dir, archived);
    std::fprintf(
        stderr, "troupe: %s held an earlier run; moved it to %s (use --resume to continue a run)\n",
        cfg.run_dir.c_str(), archived.c_str());
  }
  fs::create_directories(cfg.run_dir);
}

// A checkpoint (or LATEST) that --resume passed over, for the event log.
struct passed_over {
  int64_t step = -1;  // -1: LATEST itself
  std::string path, error;
  std::string quarantined;  // where the damaged checkpoint went; empty when left in place
};

struct resume_choice {
  int64_t step = 0;
  std::string layout;
  int format = 0;
  std::vector<passed_over> fallbacks;
  std::optional<int64_t> latest_was;  // what LATEST named, when it had to be repaired
  bool latest_repaired = false;
};

// The problems of a checkpoint as one line: the first, and how many more.
std::string first_problem(const std::vector<ckpt::problem>& problems) {
  return problems.front().message +
         (problems.size() > 1
              ? " (and " + std::to_string(problems.size() - 1) + " more damaged objects)"
              : "");
}

// The checkpoint a resumed job starts from: the newest committed one that fits this config
// and reads back intact (every chunk against its hash). A damaged one is reported, moved to
// checkpoints/damaged/ (so that the replay of its step commits a fresh one) and passed over
// for the one before; LATEST is then made to name the one chosen. None left stops the job
// (exit 1), a checkpoint of another run or model stops it as a usage error (exit 2).
resume_choice resume_point(const train_config& cfg) {
  // Everything that shapes the math must match; what only says how or how long to run
  // (world size, step budget, ports, paths, cadences) may change between sessions.
  static const std::vector<std::string> may_change = {
      "/world", "/steps", "/resume", "/run_dir", "/metrics_port", "/metrics_host",
      "/metrics_token_file", "/progress", "/exit_after_step", "/checkpoint_every", "/eval_every",
      "/eval_batches", "/step_timeout_ms", "/bucket_bytes", "/blas_threads", "/data",
      "/checkpoint_async", "/checkpoint_overlap", "/verify_checkpoints", "/checkpoint_chunk_kib",
      "/keep_last", "/keep_every", "/optim/freeze", "/replicate_checkpoints",
      // The layout may change too: a checkpoint holds boxes of the single-rank model, which
      // any layout reads back (reshard on restore).
      "/parallel/tp", "/parallel/pp", "/parallel/ep", "/parallel/zero", "/parallel/micro_batches",
      "/parallel/schedule",
      // How the job survives failures does not change what it computes.
      "/elastic/nodes", "/elastic/min_ranks", "/elastic/max_ranks", "/elastic/spares",
      "/elastic/max_restarts", "/elastic/heartbeat_timeout_ms", "/elastic/replacement_wait_ms",
      "/elastic/straggler_policy", "/elastic/faults",
      // What is done about a divergence; the batches it skipped are in skipped_batches.json.
      "/on_divergence", "/max_rollbacks",
      // How the data plane's connections are guarded.
      "/data_plane_auth"};
  resume_choice out;
  const std::string latest_path = (fs::path(cfg.run_dir) / "checkpoints" / "LATEST").string();
  std::vector<int64_t> candidates = ckpt::list_committed(cfg.run_dir);
  std::optional<int64_t> latest;
  try {
    latest = ckpt::read_latest_step(cfg.run_dir);
  } catch (const ckpt::checkpoint_error& e) {
    out.fallbacks.push_back({-1, e.path(), e.what(), ""});
  }
  // LATEST is the commit record; without it nothing is known committed, and that is said.
  if (!latest && out.fallbacks.empty() && !candidates.empty())
    out.fallbacks.push_back(
        {-1, latest_path,
         "checkpoint: " + latest_path +
             ": is missing although step directories hold manifests, so no checkpoint is known "
             "committed; taking the newest one that reads back intact",
         ""});
  if (latest && !std::binary_search(candidates.begin(), candidates.end(), *latest))
    out.fallbacks.push_back({-1, latest_path,
                             "checkpoint: " + latest_path + ": names " +
                                 ckpt::format::step_dir_name(*latest) +
                                 ", which holds no manifest; taking the newest one before it "
                                 "that reads back intact",
                             ""});
  if (candidates.empty() && out.fallbacks.empty())
    throw config_error(
        "resume: no committed checkpoint in " + cfg.run_dir +
        "/checkpoints; run without --resume to start fresh, or point --run-dir at the run");
  const auto quarantine = [&](int64_t step, ckpt::error_kind kind) -> std::string {
    return ckpt::is_damage(kind)
               ? ckpt::quarantine_checkpoint(cfg.run_dir, step, ckpt::damage_reason(kind))
               : std::string();
  };
  // Newest first, never past what LATEST names (a newer manifest was never committed).
  std::sort(candidates.rbegin(), candidates.rend());
  std::vector<int64_t> uncommitted;
  for (int64_t step : candidates) {
    if (latest && step > *latest) {
      uncommitted.push_back(step);
      continue;
    }
    ckpt::manifest man;
    try {
      man = ckpt::read_manifest(cfg.run_dir, step);
    } catch (const ckpt::checkpoint_error& e) {
      out.fallbacks.push_back({step, e.path(), e.what(), quarantine(step, e.kind())});
      continue;
    }
    try {
      ckpt::require_compatible(man, to_json(cfg), gpt(cfg.model).num_params(), may_change);
    } catch (const ckpt::checkpoint_error& e) {
      throw config_error(std::string("resume: ") + e.what());
    }
    const auto problems = ckpt::verify_checkpoint(cfg.run_dir, step);
    if (!problems.empty()) {
      const bool damaged = ckpt::any_damage(problems);
      out.fallbacks.push_back(
          {step, problems.front().path, first_problem(problems),
           damaged ? ckpt::quarantine_checkpoint(cfg.run_dir, step,
                                                 ckpt::damage_reason(problems.front().kind))
                   : std::string()});
      continue;
    }
    out.step = man.step;
    out.layout = man.format_version >= 2 ? man.layout : "dp" + std::to_string(man.world);
    out.format = man.format_version;
    break;
  }
  for (const auto& f : out.fallbacks)
    std::fprintf(
        stderr, "troupe: resume: passing over %s: %s%s\n",
        f.step < 0 ? "LATEST" : ("checkpoint step " + std::to_string(f.step)).c_str(),
        sys::printable(f.error).c_str(),
        f.quarantined.empty()
            ? ""
            : ("; moved it to " + sys::printable(f.quarantined) + " (kept, not deleted)").c_str());
  if (out.format == 0 && latest &&
      !fs::exists(fs::path(cfg.run_dir) / "checkpoints" / ckpt::format::step_dir_name(*latest)))
    ckpt::point_latest_at(cfg.run_dir, std::nullopt);  // it must never name a damaged step
  if (out.format == 0)
    throw std::runtime_error("resume: no committed checkpoint in " + cfg.run_dir +
                             "/checkpoints reads back intact (see above; damaged ones are in "
                             "checkpoints/damaged/); nothing to resume. Restore the damaged files "
                             "from a copy, or start a new run.");
  if (out.step >= cfg.steps)
    throw config_error("resume: the checkpoint is at step " + std::to_string(out.step) +
                       ", which is not before --steps " + std::to_string(cfg.steps) +
                       "; raise --steps");
  // Written but never committed (newer than LATEST): out of the way of the replay, which
  // commits those steps afresh.
  for (int64_t step : uncommitted) {
    const std::string where = ckpt::quarantine_checkpoint(cfg.run_dir, step, "never-committed");
    std::fprintf(stderr,
                 "troupe: resume: step %lld was written but never committed (newer than LATEST); "
                 "moved it to %s\n",
                 static_cast<long long>(step), sys::printable(where).c_str());
  }
  // LATEST names what the job resumes from, whatever it said before.
  if (latest != out.step) {
    ckpt::point_latest_at(cfg.run_dir, out.step);
    out.latest_was = latest;
    out.latest_repaired = true;
    std::fprintf(stderr, "troupe: resume: LATEST now names %s (it %s)\n",
                 ckpt::format::step_dir_name(out.step).c_str(),
                 latest ? ("named " + ckpt::format::step_dir_name(*latest)).c_str()
                        : "was missing or unreadable");
  }
  std::fprintf(stderr, "troupe: resuming from checkpoint step %lld (written by %s, format %d)%s\n",
               static_cast<long long>(out.step), out.layout.c_str(), out.format,
               std::any_of(out.fallbacks.begin(), out.fallbacks.end(),
                           [](const passed_over& f) { return f.step >= 0; })
                   ? ", an earlier one than the newest"
                   : "");
  return out;
}

// Stage 1: the layout for this world, from the planner. The coordinator plans again, for the
// ranks that are left, whenever the world changes.
strategies::layout_plan plan_job(const train_config& cfg) {
  auto planned = strategies::plan_layout(cfg.world, cfg);
  if (!strategies::has_plan(planned))
    throw config_error("layout: " + strategies::reason_of(planned));
  const auto& plan = strategies::plan_of(planned);
  const auto& shape = plan.shape;
  // What the planner allows but no engine backend runs yet (strategies/engine.cpp).
  if (cfg.model.experts > 0 && (shape.tp > 1 || shape.pp > 1))
    throw config_error(
        "layout: " + strategies::describe(shape) +
        " with MoE experts: expert parallelism does not combine with tensor or pipeline "
        "parallelism yet; use --tp 1 --pp 1 (dp and --ep only) or --experts 0");
  if (cfg.model.experts > 0 && cfg.parallel.zero == 1)
    throw config_error(
        "layout: ZeRO-1 with MoE experts is not supported yet; use --zero 0 or --experts 0");
  return plan;
}

// What the run has on disk to resume from: the checkpoint LATEST names, and nothing the
// coordinator merely believes (a commit may have landed after its last word, or failed).
std::string committed_checkpoint_words(const std::string& run_dir) {
  try {
    if (auto man = ckpt::latest_committed(run_dir))
      return "step " + std::to_string(man->step) + " (LATEST in " +
             (fs::path(run_dir) / "checkpoints").string() + ")";
    return "(none)";
  } catch (const std::exception& e) {
    return std::string("(LATEST cannot be read: ") + e.what() + ")";
  }
}

const char* verdict_of(int exit_code) {
  switch (exit_code) {
    case actors::exit_code::done:
      return "done";
    case actors::exit_code::diverged:
      return "DIVERGED";
    case actors::exit_code::checkpoint_failed:
      return "done, but a CHECKPOINT FAILED";
    case actors::exit_code::interrupted:
      return "interrupted";
    case actors::exit_code::requeue:
      return "stopped for the scheduler (requeue)";
    default:
      return "FAILED";
  }
}

void print_summary(const train_config& cfg, const actors::job_result& r) {
  const char* verdict = verdict_of(r.exit_code);
  std::printf("troupe: %s in %s — %s\n", verdict, format_duration(r.wall_s).c_str(),
              r.message.c_str());
  std::printf("  steps             %lld of %d (world %d)\n", static_cast<long long>(r.steps_done),
              cfg.steps, cfg.world);
  if (r.final_loss == r.final_loss) std::printf("  train loss        %.4f\n", r.final_loss);
  if (r.val_loss >= 0) std::printf("  validation loss   %.4f\n", r.val_loss);
  std::printf("  tokens/s          %s\n", format_rate(r.tokens_per_s).c_str());
  std::printf("  checkpoint        %s\n", committed_checkpoint_words(cfg.run_dir).c_str());
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
  // A library's thread born before main (OpenBLAS) does not block them: handed on from there.
  troupe::sys::route_signals({SIGINT, SIGTERM, SIGUSR1});

  train_config cfg = opts.cfg;
  const strategies::layout_plan plan = plan_job(cfg);
  const auto faults = chaos::parse_faults(cfg.elastic.faults, cfg.world + cfg.elastic.spares,
                                          cfg.elastic.nodes, session_last_step(cfg));
  auto layout_doc = nlohmann::json::parse(strategies::to_json(plan));
  layout_doc["describe"] = strategies::describe(plan.shape);
  layout_doc["zero"] = cfg.parallel.zero;
  // Under Slurm (--slurm) the coordinator listens on this node's address, and `troupe run`
  // starts the agents on the allocation's nodes with srun instead of on this machine.
  const auto& slurm = opts.slurm_job;
  std::string listen_host = opts.listen_host, rendezvous_host;
  std::vector<std::string> srun_agents;
  if (slurm) {
    if (!opts.host_given) listen_host = slurm_listen_host(*slurm);
    // Where the agents dial: never the wildcard (--host 0.0.0.0 listens on every address).
    rendezvous_host = listen_host == "0.0.0.0" ? slurm_listen_host(*slurm) : listen_host;
    if (launch_local_agent) {
      srun_agents = srun_agents_command(actors::self_executable(), cfg.elastic.nodes);
      // Before the job's threads start: the agents srun starts find the run directory (its join
      // token and rendezvous.json) here, and this coordinator through it.
      ::setenv("TROUPE_RUN_DIR", fs::absolute(cfg.run_dir).lexically_normal().c_str(), 1);
      ::unsetenv("TROUPE_COORDINATOR");
    }
  }
  preflight(cfg, launch_local_agent && !slurm);
  monitoring::metrics_registry registry;
  // Every refused connection is counted by listener; the first few are logged with the peer's
  // address, then one line in 500, so a flood cannot flood the console too.
  auto& rejections = registry.add_counter_family("troupe_rejected_connections_total",
                                                 actors::rejected_connections_help);
  rejections.with({{"listener", "coordinator"}});
  rejections.with({{"listener", "store"}});
  const actors::rejection_listener on_rejection =
      [&rejections](const std::string& listener, const std::string& peer, const std::string& why) {
        static std::atomic<uint64_t> seen{0};
        rejections.with({{"listener", listener}}).inc();
        const uint64_t n = ++seen;
        if (n <= 20 || n % 500 == 0)
          monitoring::log(monitoring::level::warn, coordinator_ctx,
                          "refused a connection to the " + listener + " listener from " + peer +
                              ": " + why + " (" + std::to_string(n) + " refused so far)");
      };
  actors::set_rejection_listener(on_rejection);
  struct forget_listener {
    ~forget_listener() { actors::set_rejection_listener(nullptr); }
  } forget_rejections;
  // The metrics endpoint is bound before the run directory is touched, so a port in use or
  // an unreadable token is exit 2 with nothing written.
  std::optional<monitoring::metrics_server> metrics;
  if (cfg.metrics_port != 0) {
    monitoring::metrics_server_limits limits;
    if (!cfg.metrics_token_file.empty()) {
      try {
        limits.bearer_token = auth::read_bearer_token(cfg.metrics_token_file);
      } catch (const auth::credentials_error& e) {
        throw config_error(std::string("metrics_token_file (--metrics-token): ") + e.what());
      }
    }
    limits.on_reject = [on_rejection](const std::string& peer, const std::string& why) {
      on_rejection("metrics", peer, why);
    };
    rejections.with({{"listener", "metrics"}});
    try {
      metrics.emplace(registry, cfg.metrics_host, static_cast<uint16_t>(cfg.metrics_port),
                      std::move(limits));
    } catch (const std::exception& e) {
      throw config_error(std::string("metrics_port: ") + e.what());
    }
  }
  prepare_paths(cfg);
  // One job per run directory: the lock also keeps `troupe ckpt gc` off chunks being written.
  auto lock = ckpt::run_lock::try_acquire(cfg.run_dir);
  if (!lock)
    throw config_error("run_dir: another troupe job is using " + cfg.run_dir +
                       " (it holds checkpoints/.lock); stop it or pick another --run-dir");
  // Nobody else holds the run: what an interrupted write left behind is garbage now.
  for (const auto& path : ckpt::remove_stale_temp_files(cfg.run_dir, *lock))
    std::fprintf(stderr, "troupe: removed %s, left by an interrupted write\n", path.c_str());
  // Batches skipped after divergences belong to the run being resumed, never to a fresh one.
  std::vector<int64_t> skipped_steps;
  std::error_code ec_ignored;  // read-only run dir: opening events.jsonl below fails and says so
  if (cfg.resume)
    skipped_steps = actors::load_skipped_batches(cfg.run_dir);
  else
    fs::remove(fs::path(cfg.run_dir) / "skipped_batches.json", ec_ignored);
  // This job's credentials: every agent and worker proves it holds them before any byte it
  // sends reaches the control plane or the store (runtime/auth, docs/SECURITY.md).
  try {
    auth::set_process_credentials(auth::create_join_token(cfg.run_dir + "/join.token"));
  } catch (const auth::credentials_error& e) {
    throw config_error(std::string("run_dir: ") + e.what());
  }
  const resume_choice resumed = cfg.resume ? resume_point(cfg) : resume_choice{};
  const int64_t start_step = resumed.step;
  // Replaced by rename, never written through: a link planted in the run directory is not
  // followed (docs/SECURITY.md).
  ckpt::io::write_file_atomically(fs::path(cfg.run_dir) / "config.json",
                                  nlohmann::json::parse(to_json(cfg)).dump(2) + "\n");

  auto events = monitoring::event_log::open(cfg.run_dir + "/events.jsonl");
  events.write({{"event", "job_start"},
                {"world", cfg.world},
                {"steps", cfg.steps},
                {"resume", cfg.resume},
                {"start_step", start_step},
                {"config", nlohmann::json::parse(to_json(cfg))},
                {"pid", getpid()},
                {"layout", layout_doc}});
  for (const auto& f : resumed.fallbacks)
    events.write({{"event", "checkpoint_fallback"},
                  {"step", f.step},
                  {"path", f.path},
                  {"error", f.error},
                  {"quarantined", f.quarantined},
                  {"resumed_step", start_step}});
  if (cfg.resume)
    events.write({{"event", "resume"},
                  {"step", start_step},
                  {"written_by", resumed.layout},
                  {"format_version", resumed.format},
                  {"latest_repaired", resumed.latest_repaired},
                  {"latest_was", resumed.latest_was ? nlohmann::json(*resumed.latest_was)
                                                    : nlohmann::json(nullptr)}});
  // The progress line follows the event stream.
  std::optional<progress_line> progress;
  if (cfg.progress) progress.emplace(start_step);
  if (progress)
    events.set_listener([&progress](const nlohmann::json& e) {
      const std::string what = e.value("event", "");
      if (what == "step") {
        progress->update(e.value("step", int64_t{0}), e.value("total_steps", int64_t{0}),
                         e.value("loss", 0.0), e.value("tokens_per_s", 0.0));
      } else if (what == "validation") {
        progress->note("step " + std::to_string(e.value("step", 0)) + ": validation loss " +
                       format_fixed(e.value("val_loss", 0.0), 4));
      } else if (what == "generation" && e.value("number", 0) > 1) {
        progress->note("generation " + std::to_string(e.value("number", 0)) + ": " +
                       std::to_string(e.value("world", 0)) + " ranks from step " +
                       std::to_string(e.value("start_step", 0)) + " (" +
                       e.value("reason", std::string()) + ")");
      } else if (what == "job_done" || what == "job_failed") {
        progress->finish();
      }
    });

  // The store listens where the coordinator does, so agents on other machines reach it.
  // Only members that prove they hold the job's secret reach it (store_auth::from_process()).
  comm::store_server_options store_options;
  store_options.on_rejection = [on_rejection](const std::string& peer, const std::string& why) {
    on_rejection("store", peer, why);
  };
  comm::tcp_store_server store(listen_host, 0, std::move(store_options));

  actors::system_config sys_cfg;
  sys_cfg.use_network();
  caf::actor_system sys{sys_cfg};
  caf::scoped_actor self{sys};

  actors::job_setup setup;
  setup.cfg = cfg;
  setup.store_host = listen_host;
  setup.store_port = store.port();
  setup.start_step = start_step;
  setup.events = &events;
  setup.metrics = &registry;
  setup.listener = caf::actor_cast<caf::actor>(self);
  setup.plan = plan;
  setup.nodes = cfg.elastic.nodes;
  setup.spares = cfg.elastic.spares;
  setup.bounds.min_ranks = cfg.elastic.min_ranks;
  setup.bounds.max_ranks = cfg.elastic.max_ranks > 0 ? cfg.elastic.max_ranks : cfg.world;
  setup.heartbeat_timeout_ms = cfg.elastic.heartbeat_timeout_ms;
  setup.straggler_policy = cfg.elastic.straggler_policy;
  setup.faults = faults;
  setup.skipped_steps = skipped_steps;
  auto supervisor = actors::spawn_job_supervisor(sys, setup);
  self->monitor(supervisor);

  auto published =
      actors::publish_for_job(sys, supervisor, opts.listen_port, listen_host, true, "coordinator");
  if (!published) {
    caf::anon_send_exit(supervisor, caf::exit_reason::user_shutdown);
    throw config_error("cannot listen on " + listen_host + ":" + std::to_string(opts.listen_port) +
                       " (" + sys.render(published.error()) + "); pick another --port");
  }
  const std::string endpoint = listen_host + ":" + std::to_string(*published);
  ckpt::io::write_file_atomically(fs::path(cfg.run_dir) / "coordinator.addr", endpoint + "\n");
  if (metrics)
    std::fprintf(stderr, "troupe: metrics on http://%s:%u/metrics\n", cfg.metrics_host.c_str(),
                 metrics->port());

  std::vector<pid_t> agents;
  const int64_t self_pid = getpid();
  if (slurm) {
    write_rendezvous(cfg.run_dir, rendezvous{slurm->attempt(), rendezvous_host, *published,
                                             slurm->node_name, cfg.elastic.nodes, self_pid});
    std::fprintf(
        stderr, "troupe: Slurm job %s%s: coordinator on %s at %s:%u (%s)\n", slurm->job_id.c_str(),
        slurm->restart_count > 0
            ? (" (restart " + std::to_string(slurm->restart_count) + ")").c_str()
            : "",
        slurm->node_name.empty() ? "this node" : slurm->node_name.c_str(), rendezvous_host.c_str(),
        static_cast<unsigned>(*published), (fs::path(cfg.run_dir) / rendezvous_file_name).c_str());
  }
  if (slurm && launch_local_agent) {
    // One agent per node of the allocation; srun --no-kill keeps the step when a node is lost.
    std::string words;
    for (const auto& w : srun_agents) words += (words.empty() ? "" : " ") + w;
    std::fprintf(stderr, "troupe: starting %d agents: %s\n", cfg.elastic.nodes, words.c_str());
    agents.push_back(actors::spawn_child(srun_agents, true, SIGTERM));
  } else if (slurm) {
    std::printf(
        "troupe coordinator: listening on %s; start one agent per node with: srun --no-kill "
        "--ntasks-per-node=1 troupe agent --run-dir %s\n",
        endpoint.c_str(), cfg.run_dir.c_str());
    std::fflush(stdout);
  } else if (launch_local_agent) {
    // One agent per simulated node, each leading its own process group with its workers.
    for (int n = 0; n < cfg.elastic.nodes; ++n)
      agents.push_back(
          actors::spawn_child({actors::self_executable(), "agent", "--coordinator", endpoint,
                               "--join-token", auth::process_credentials().token_path},
                              true, SIGTERM));
  } else {
    std::printf(
        "troupe coordinator: listening on %s; start agents with: troupe agent --coordinator %s "
        "--join-token %s\n",
        endpoint.c_str(), endpoint.c_str(), auth::process_credentials().token_path.c_str());
    std::fflush(stdout);
  }

  // SIGINT: stop at the step boundary (exit 130); SIGTERM, SIGUSR1: a scheduler wants the nodes
  // back, so checkpoint the next step and stop (exit 75, requeue). Under Slurm both of the
  // latter may come more than once (the batch shell forwards what Slurm also sends every
  // process of the step): only a Ctrl-C after the first signal kills the job at once.
  std::atomic<bool> signals_done{false};
  std::thread signal_thread([&] {
    troupe::sys::wait_here_for_signals();
    int count = 0;
    for (;;) {
      int sig = 0;
      if (sigwait(&signals, &sig) != 0 || signals_done) return;
      if (++count == 1 && sig == SIGINT) {
        std::fprintf(stderr,
                     "\ntroupe: stopping the job at the step boundary, after any checkpoint "
                     "being written (press Ctrl-C again to kill it)\n");
        caf::anon_send(supervisor, actors::shutdown_atom::value);
      } else if (count == 1 || sig != SIGINT) {
        if (count == 1)
          std::fprintf(stderr,
                       "\ntroupe: %s: checkpointing the next step and stopping the job; exit %d "
                       "asks for a requeue, --resume continues (Ctrl-C kills it at once)\n",
                       sig == SIGTERM ? "SIGTERM" : "SIGUSR1", actors::exit_code::requeue);
        caf::anon_send(supervisor, actors::preempt_atom::value);
      } else {
        for (pid_t agent : agents)
          kill(-agent, SIGKILL);  // an agent leads its workers' process group
        std::fprintf(stderr, "\ntroupe: killed; the committed checkpoint is %s\n",
                     committed_checkpoint_words(cfg.run_dir).c_str());
        _exit(actors::exit_code::interrupted);
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
          result.message =
              "the job supervisor stopped unexpectedly (" + sys.render(dm.reason) + ")";
          done = true;
        });
  }

  for (pid_t agent : agents) {
    // The agent stops its workers (they were told to stop) and then exits; give it the
    // time its own grace periods need before taking its whole process group down.
    if (slurm && !actors::wait_for_exit(agent, std::chrono::seconds(20))) {
      // srun: two Ctrl-C within a second end the step (its tasks get SIGKILL from Slurm).
      monitoring::log(monitoring::level::warn, coordinator_ctx,
                      "the agents' srun did not end in time; cancelling its step");
      kill(agent, SIGINT);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      kill(agent, SIGINT);
    }
    if (!actors::wait_for_exit(agent, std::chrono::seconds(20))) {
      monitoring::log(monitoring::level::warn, coordinator_ctx,
                      "an agent did not exit in time; killing it");
      kill(-agent, SIGKILL);
      actors::wait_for_exit(agent, std::chrono::seconds(10));
    }
  }
  if (slurm) remove_rendezvous(cfg.run_dir, self_pid);
  caf::anon_send_exit(supervisor, caf::exit_reason::user_shutdown);
  troupe::sys::stop_waiting_for_signals();
  signals_done = true;
  pthread_kill(signal_thread.native_handle(), SIGUSR1);
  signal_thread.join();
  print_summary(cfg, result);
  return result.exit_code;
}

}  // namespace troupe::cli
