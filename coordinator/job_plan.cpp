// Step 1 of a job's coordinator: the job as it will run, checked against this machine and its
// files before a process starts or a file is written.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "actors/wire/node_address.hpp"
#include "coordinator/job_options.hpp"
#include "coordinator/job_steps.hpp"
#include "coordinator/slurm_launch.hpp"
#include "runtime/comm/tcp_signature.hpp"
#include "runtime/data/corpus_plan.hpp"
#include "runtime/preflight.hpp"
#include "runtime/sys/child_process.hpp"
#include "runtime/sys/run_paths.hpp"
#include "strategies/mesh.hpp"

#ifndef TROUPE_DEFAULT_CORPUS
#define TROUPE_DEFAULT_CORPUS ""
#endif

namespace troupe::coordinator {
namespace {

namespace fs = std::filesystem;

// The default corpus: where this build rendered it, or beside an installed binary
// (`cmake --install`: PREFIX/bin/troupe and PREFIX/share/troupe/kjv.txt).
std::string default_corpus() {
  std::error_code ec;
  if (fs::exists(TROUPE_DEFAULT_CORPUS, ec)) return TROUPE_DEFAULT_CORPUS;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path().parent_path() / "share" / "troupe" / "kjv.txt";
    if (fs::exists(installed, ec)) return installed.string();
  }
  return TROUPE_DEFAULT_CORPUS;  // missing: preflight says so, naming scripts/setup.sh
}

// The run directory's name (as etcd_job_id makes it) and eight random hex digits.
std::string unique_job_id(const train_config& cfg) {
  std::string name = etcd_job_id(cfg);
  if (name.size() > 110) name.resize(110);
  std::random_device random;
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "-%08x", static_cast<unsigned>(random()));
  return name + suffix;
}

// The layout for this world, from the planner. The coordinator plans again, for the ranks
// that are left, whenever the world changes.
strategies::layout_plan first_layout(const train_config& cfg) {
  auto planned = strategies::plan_layout(cfg.world, cfg);
  if (!strategies::has_plan(planned))
    throw config_error("layout: " + strategies::reason_of(planned) +
                       (cfg.resume ? ". A resume keeps the run's own --tp, --pp, --ep and --zero "
                                     "(its config.json) unless they are given: give the sizes "
                                     "for the new world"
                                   : ""));
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

// The run directory as every path below it is written: absolute, normalized, and without a
// trailing '/' (RUN_DIR.prev-<seconds> is a sibling, not a child).
std::string absolute_run_dir(const std::string& run_dir) {
  std::string out = fs::absolute(run_dir).lexically_normal().string();
  if (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

// Under --slurm the coordinator listens on this node's address, and `troupe run` starts the
// agents on the allocation's nodes with srun instead of on this machine.
void place_listeners(const job_options& opts, job_plan& job) {
  job.listen_host = opts.listen_host;
  job.listen_port = opts.listen_port;
  job.slurm = opts.slurm_job;
  if (!job.slurm) return;
  if (!opts.host_given) job.listen_host = slurm_listen_host(*job.slurm);
  // Where the agents dial: never the wildcard (--host 0.0.0.0 listens on every address).
  job.rendezvous_host =
      job.listen_host == "0.0.0.0" ? slurm_listen_host(*job.slurm) : job.listen_host;
  if (job.launch_local_agent) {
    job.srun_agents =
        with_program(srun_agents_command(sys::self_executable(), job.cfg.elastic.nodes), job.cfg);
    // Before the job's threads start: the agents srun starts find the run directory (its join
    // token and rendezvous.json) here, and this coordinator through it.
    ::setenv("TROUPE_RUN_DIR", job.cfg.run_dir.c_str(), 1);
    ::unsetenv("TROUPE_COORDINATOR");
  }
}

// A run directory that can be one: not a file, or creatable by this user; and for --resume,
// one that holds checkpoints.
void check_run_dir(const train_config& cfg) {
  std::error_code ec;
  const fs::path run_dir = cfg.run_dir;
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
  const fs::path checkpoints = run_paths::checkpoints(run_dir);
  if (cfg.resume && !fs::exists(checkpoints, ec))
    throw config_error("resume: no committed checkpoint in " + checkpoints.string() +
                       "; run without --resume to start fresh, or point --run-dir at the run");
}

// Every check of the job against this machine and its files, before a process starts or a
// file is written (a refused job leaves the run directory as it found it): memory for the
// local ranks, a readable corpus big enough for a batch and the validation estimate, a run
// directory that can be one, and a checkpoint to resume from.
void preflight(const train_config& cfg, bool local_agents) {
  // A run directory too long for the paths written below it fails here, by name, not with a
  // raw filesystem error halfway through writing the run.
  check_run_dir_length(cfg.run_dir);
  if (!cfg.metrics_token_file.empty())
    check_path_length(cfg.metrics_token_file, "metrics_token_file", "--metrics-token");
  check_against_host(cfg, local_agents ? cfg.world + cfg.elastic.spares : 0, read_host_facts(cfg));
  // The local agents read the node address from the environment (TROUPE_ADVERTISE,
  // TROUPE_IFACE, GLOO_SOCKET_IFNAME): refused here, before any process starts, if unusable.
  if (local_agents) {
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
  check_run_dir(cfg);
}

}  // namespace

job_plan plan_job(const job_options& opts, bool launch_local_agent) {
  job_plan job;
  job.cfg = opts.cfg;
  job.launch_local_agent = launch_local_agent;
  // Empty only when --data and the config file left it out: an explicit "" is refused as it is
  // read (runtime/config.cpp), so that it never means the default corpus.
  if (job.cfg.data.empty()) job.cfg.data = default_corpus();
  // Before the layout: the data decides the vocabulary, which tensor parallelism divides.
  resolve_corpus(job.cfg);
  job.layout = first_layout(job.cfg);
  job.faults =
      chaos::parse_faults(job.cfg.elastic.faults, job.cfg.world + job.cfg.elastic.spares,
                          job.cfg.elastic.nodes, session_last_step(job.cfg), job.cfg.steps);
  job.cfg.run_dir = absolute_run_dir(job.cfg.run_dir);
  place_listeners(opts, job);
  preflight(job.cfg, launch_local_agent && !job.slurm);
  // config.json keeps the files the job reads as absolute paths: `troupe status` and a
  // --resume from another directory find them. Made so after preflight, whose messages name
  // them as the user wrote them.
  for (std::string* path : {&job.cfg.data, &job.cfg.val_data, &job.cfg.metrics_token_file,
                            &job.cfg.etcd.cacert, &job.cfg.etcd.cert, &job.cfg.etcd.key})
    if (!path->empty()) *path = std::filesystem::absolute(*path).lexically_normal().string();
  // A new job gets an id no other job has, so that jobs sharing an etcd never meet by
  // accident; config.json keeps it for --resume and the standby coordinators.
  if (job.cfg.job_id.empty() && !job.cfg.resume) job.cfg.job_id = unique_job_id(job.cfg);
  job.saved = opts.saved;
  return job;
}

}  // namespace troupe::coordinator
