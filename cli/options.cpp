#include "cli/options.hpp"

#include <algorithm>
#include <map>

namespace troupe::cli {
namespace {

// Command-line spellings of the config fields a user sets most; anything else goes
// through --set KEY=VALUE with the config file's dotted names.
const std::map<std::string, std::string>& flag_fields() {
  static const std::map<std::string, std::string> table = {
      {"--world", "world"},
      {"--steps", "steps"},
      {"--seed", "seed"},
      {"--run-dir", "run_dir"},
      {"--metrics-port", "metrics_port"},
      {"--metrics-host", "metrics_host"},
      {"--metrics-token", "metrics_token_file"},
      {"--metrics-rank-labels", "metrics_rank_labels"},
      {"--checkpoint-every", "checkpoint_every"},
      {"--exit-after-step", "exit_after_step"},
      {"--checkpoint-overlap", "checkpoint_overlap"},
      {"--verify-checkpoints", "verify_checkpoints"},
      {"--checkpoint-chunk-kib", "checkpoint_chunk_kib"},
      {"--keep-last", "keep_last"},
      {"--keep-every", "keep_every"},
      {"--freeze", "optim.freeze"},
      {"--batch", "batch"},
      {"--micro-batch", "micro_batch"},
      {"--lr", "optim.lr"},
      {"--data", "data"},
      {"--eval-every", "eval_every"},
      {"--layers", "model.n_layer"},
      {"--heads", "model.n_head"},
      {"--d-model", "model.d_model"},
      {"--context", "model.context"},
      {"--step-timeout-ms", "step_timeout_ms"},
      {"--blas-threads", "blas_threads"},
      {"--peak-flops", "peak_flops"},
      {"--zero", "parallel.zero"},
      {"--tp", "parallel.tp"},
      {"--pp", "parallel.pp"},
      {"--ep", "parallel.ep"},
      {"--micro-batches", "parallel.micro_batches"},
      {"--schedule", "parallel.schedule"},
      {"--experts", "model.experts"},
      {"--top-k", "model.top_k"},
      {"--nodes", "elastic.nodes"},
      {"--min-ranks", "elastic.min_ranks"},
      {"--max-ranks", "elastic.max_ranks"},
      {"--spares", "elastic.spares"},
      {"--max-restarts", "elastic.max_restarts"},
      {"--heartbeat-timeout-ms", "elastic.heartbeat_timeout_ms"},
      {"--coordinator-timeout-ms", "elastic.coordinator_timeout_ms"},
      {"--join-timeout-ms", "elastic.join_timeout_ms"},
      {"--replacement-wait-ms", "elastic.replacement_wait_ms"},
      {"--straggler-policy", "elastic.straggler_policy"},
      {"--fault", "elastic.faults"},
      {"--on-divergence", "on_divergence"},
      {"--max-rollbacks", "max_rollbacks"},
      {"--data-plane-auth", "data_plane_auth"},
      {"--job-id", "job_id"},
      {"--etcd", "etcd.endpoints"},
      {"--etcd-cacert", "etcd.cacert"},
      {"--etcd-cert", "etcd.cert"},
      {"--etcd-key", "etcd.key"},
      {"--etcd-timeout-ms", "etcd.timeout_ms"},
  };
  return table;
}

}  // namespace

job_options parse_job_options(const std::vector<std::string>& args, bool coordinator_only,
                              const env_reader& env) {
  job_options out;
  const std::string command = coordinator_only ? "coordinator" : "run";
  // Split "--flag=value" and find the config file first, so command-line options win.
  std::vector<std::pair<std::string, std::string>> items;  // flag, value ("" if none)
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::string value;
    bool has_value = false;
    if (auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    bool boolean = flag == "--resume" || flag == "--help" || flag == "-h" ||
                   flag == "--no-progress" || flag == "--replicate-checkpoints" ||
                   flag == "--slurm";
    if (flag.rfind("-", 0) != 0)
      throw usage_error("troupe " + command + ": unexpected argument '" + flag + "'; see troupe " +
                        command + " --help");
    if (!boolean && !has_value) {
      if (i + 1 >= args.size())
        throw usage_error("troupe " + command + ": option " + flag + " needs a value; see troupe " +
                          command + " --help");
      value = args[++i];
    }
    items.emplace_back(flag, value);
  }
  // `troupe run --slurm` is a coordinator too: it takes --host and --port.
  bool slurm = false;
  for (const auto& [flag, value] : items) slurm = slurm || flag == "--slurm";
  const bool listens = coordinator_only || slurm;
  for (const auto& [flag, value] : items)
    if (flag == "--config") load_config_file(value, out.cfg);
  const train_config from_file = out.cfg;
  bool world_given = false, nodes_given = false;
  for (const auto& [flag, value] : items) {
    world_given =
        world_given || flag == "--world" || (flag == "--set" && value.rfind("world=", 0) == 0);
    nodes_given = nodes_given || flag == "--nodes" ||
                  (flag == "--set" && value.rfind("elastic.nodes=", 0) == 0);
  }
  for (const auto& [flag, value] : items) {
    if (flag == "--config" || flag == "--slurm") continue;
    if (flag == "--help" || flag == "-h") {
      out.help = true;
    } else if (flag == "--resume") {
      out.cfg.resume = true;
    } else if (flag == "--no-progress") {
      out.cfg.progress = false;
    } else if (flag == "--replicate-checkpoints") {
      out.cfg.replicate_checkpoints = true;
    } else if (flag == "--set") {
      auto eq = value.find('=');
      if (eq == std::string::npos || eq == 0)
        throw usage_error("troupe " + command +
                          ": --set needs KEY=VALUE (e.g. --set optim.lr=0.001), got '" + value +
                          "'");
      set_config_field(out.cfg, value.substr(0, eq), value.substr(eq + 1));
    } else if (listens && flag == "--host") {
      // An empty host would listen on every address: say so, never read "" as the default.
      if (value.empty())
        throw usage_error("troupe " + command +
                          ": --host must be a host name or address, got an empty value; "
                          "leave it out for " +
                          (slurm ? std::string("this node's address") : "127.0.0.1") +
                          ", or give 0.0.0.0 to listen on every address");
      out.listen_host = value;
      out.host_given = true;
    } else if (!coordinator_only && flag == "--coordinators") {
      try {
        size_t used = 0;
        const int k = std::stoi(value, &used);
        if (used != value.size() || k < 1 || k > 9) throw std::out_of_range("coordinators");
        out.coordinators = k;
      } catch (const std::exception&) {
        throw usage_error("troupe run: --coordinators must be a number in 1..9, got '" + value +
                          "'");
      }
    } else if (coordinator_only && flag == "--join-token") {
      if (value.empty())
        throw usage_error("troupe coordinator: --join-token must name the job's join token file");
      out.join_token = value;
    } else if (listens && flag == "--port") {
      try {
        size_t used = 0;
        int p = std::stoi(value, &used);
        if (used != value.size() || p < 0 || p > 65535) throw std::out_of_range("port");
        out.listen_port = static_cast<uint16_t>(p);
      } catch (const std::exception&) {
        throw usage_error("troupe " + command + ": --port must be a number in 0..65535, got '" +
                          value + "'");
      }
    } else if (auto it = flag_fields().find(flag); it != flag_fields().end()) {
      try {
        set_config_field(out.cfg, it->second, value);
      } catch (const config_error& e) {
        throw usage_error("troupe " + command + ": bad value for " + flag + ": '" + value + "' (" +
                          e.what() + ")");
      }
    } else if (flag == "--host" || flag == "--port") {
      throw usage_error("troupe run: " + flag +
                        " is an option of the coordinator: troupe coordinator, or troupe run "
                        "--slurm (whose coordinator the agents of other nodes reach)");
    } else {
      throw usage_error("troupe " + command + ": unknown option '" + flag + "'; see troupe " +
                        command + " --help");
    }
  }
  if (slurm && !out.help) {
    out.slurm_job = read_slurm_env(env);
    if (!out.slurm_job)
      throw usage_error("troupe " + command +
                        " --slurm: not inside a Slurm job (SLURM_JOB_ID is not set); submit it "
                        "with sbatch (deploy/slurm/troupe.sbatch)");
    const auto& job = *out.slurm_job;
    const int have = job.job_num_nodes;
    // What the allocation says counts where no option (nor the config file) did; an option is
    // honoured, or refused when the allocation cannot give it.
    nodes_given = nodes_given || from_file.elastic.nodes != train_config{}.elastic.nodes;
    world_given = world_given || from_file.world != train_config{}.world;
    if (have < 1)
      throw usage_error("troupe " + command +
                        " --slurm: the Slurm environment names no nodes (SLURM_JOB_NUM_NODES, "
                        "SLURM_JOB_NODELIST)");
    if (!nodes_given) out.cfg.elastic.nodes = have;
    if (out.cfg.elastic.nodes > have)
      throw usage_error("troupe " + command + " --slurm: --nodes " +
                        std::to_string(out.cfg.elastic.nodes) + " is more than the " +
                        std::to_string(have) + " nodes of Slurm job " + job.job_id +
                        "; one agent runs per node (sbatch --nodes)");
    if (!world_given) out.cfg.world = out.cfg.elastic.nodes * std::max(1, job.tasks_per_node);
  }
  if (!out.help) validate(out.cfg);
  if (!out.help && (out.coordinators > 1 || !out.join_token.empty())) {
    const std::string what = out.coordinators > 1 ? "--coordinators" : "--join-token";
    // A standby takes the job over through etcd; without it there is nothing to take over.
    if (out.cfg.etcd.endpoints.empty())
      throw usage_error("troupe " + command + ": " + what +
                        " needs --etcd (the coordinators elect their leader there); add --etcd "
                        "local to try it on one machine");
    if (slurm)
      throw usage_error("troupe " + command + ": " + what + " is not supported with --slurm yet");
    if (out.cfg.resume)
      throw usage_error("troupe " + command + ": " + what +
                        " is not supported with --resume yet; resume with one coordinator");
  }
  return out;
}

std::string main_help() {
  return R"(troupe: a fault-tolerant, elastic training runtime

usage: troupe <command> [options]

commands:
  run           train on this machine: a coordinator, an agent and --world worker processes
  coordinator   run only the coordinator of a job; agents connect to it
  agent         run the agent of one node: starts that node's workers
  worker        one rank (started by an agent; not usually run by hand)
  bench comm    collectives benchmark (like nccl-tests): time, algbw, busbw per size
  ckpt          inspect, verify, diff and garbage-collect a run's checkpoints (ls, gc, ...)
  report        one self-contained HTML report of a run (charts, timeline, headline numbers)
  status        a job's state now: step, world, layout, ranks, phases, last events
  top           the same, redrawn every second until Ctrl-C or the job ends

Run `troupe <command> --help` for a command's options.
)";
}

namespace {
const char* job_flags =
    R"(  --config FILE          JSON config file (keys as in `--set`); options below override it
  --world N              worker ranks (default 2)
  --steps N              training steps (default 400)
  --seed N               seed for initialisation and data order (default 1337)
  --batch N              global batch in sequences per step, for any world size (default 16)
  --micro-batch N        sequences per forward/backward (default 4)
  --lr X                 peak learning rate (default 0.003)
  --layers N, --heads N, --d-model N, --context N    model shape (default 4, 4, 128, 64)
  --data FILE            training text (default: the King James Bible corpus built at setup)
  --run-dir DIR          where events.jsonl and checkpoints go (default runs/latest)
  --resume               continue from the latest committed checkpoint in --run-dir
  --checkpoint-every K   checkpoint every K steps; 0 = only at the end (default 100)
  --exit-after-step N    stop cleanly after step N with a checkpoint (the schedule still
                         runs to --steps; --resume continues); 0 = off
  --keep-last K          committed checkpoints kept; older ones and their unshared chunks
                         are removed after each commit; 0 = keep all (default 3)
  --keep-every N         also keep every checkpoint whose step is a multiple of N
  --checkpoint-overlap wait|skip   a checkpoint due while the previous one is still being
                         written or committed waits for it, or is skipped (default wait)
  --verify-checkpoints after-write|off   each rank reads every chunk it wrote back from the
                         disk (not its cache) and checks it before the checkpoint may be
                         committed (default off; costs one read of what was written)
  --checkpoint-chunk-kib K   chunk size of the deduplicating checkpoint store (default 1024;
                         boxes under K/4 KiB share chunks, larger ones are deduplicated alone);
                         --set checkpoint_async=false writes inside the step instead
  --replicate-checkpoints   also hold each rank's latest checkpoint chunks in the memory
                         of a rank on another node (needs --nodes 2+); a restore after a
                         loss reads them from there before the disk
  --freeze PATTERN       parameters whose name matches (substring, '*' wildcard) are not
                         trained; their checkpoint chunks are then shared, not rewritten
  --eval-every K         validation loss every K steps; 0 = only at the end (default 100)
  --zero 0|1             1 = ZeRO-1: optimizer state sharded over the data-parallel ranks
  --tp N, --pp N, --ep N tensor, pipeline and expert parallel sizes; dp is the rest of the
                         world. The layout planner checks them (and picks them when left
                         at 1), naming the constraint a layout breaks (exit 2)
  --micro-batches M      pipeline micro-batches per step (default batch / micro-batch)
  --schedule gpipe|1f1b  pipeline schedule (default 1f1b)
  --experts E, --top-k K MoE MLP with E experts (0 = dense) routing each token to K
  --metrics-port PORT    Prometheus metrics on 127.0.0.1:PORT/metrics; 0 = off (default 9400)
  --metrics-host HOST    address the metrics endpoint binds (default 127.0.0.1)
  --metrics-token FILE   GET /metrics needs "Authorization: Bearer <the file's first line>"
                         (the file must be mode 0600; Prometheus: authorization.credentials_file)
  --metrics-rank-labels N   per-rank series (heartbeat age, straggler score) up to N ranks;
                         above N, one series per node with its worst rank (default 64)
  --peak-flops F          one rank's peak FLOP/s for the MFU estimate (troupe_mfu); default:
                         measured when the job starts (a short single-threaded sgemm x
                         --blas-threads)
  --step-timeout-ms MS   deadline for one step's collectives (default 60000)
  --on-divergence stop|rollback   a step with a non-finite loss or gradient norm, or a
                         negative loss, is never committed: stop (exit 3, default), or roll
                         back to the last committed checkpoint and skip the batch that diverged
  --max-rollbacks K      rollbacks before the job stops with exit 3 anyway (default 3)
  --data-plane-auth tcp-md5|none   the data plane's TCP pairs between nodes: signed with a key
                         from the job's secret while they connect, so the kernel drops a
                         stranger's connection (default tcp-md5), or open to whoever is first

elastic recovery (a lost rank is replaced in place; the job goes on with the same model):
  --nodes N              agents (simulated nodes) this machine runs, sharing the ranks (default 1)
  --min-ranks N          fewer live ranks than this ends the job (default 1)
  --max-ranks N          the world grows back up to this when workers join (default --world)
  --spares K             K started, idle workers that take a lost rank's place (default 0)
  --max-restarts N       each agent restarts a dead worker up to N times; it rejoins (default 0)
  --heartbeat-timeout-ms MS   a worker silent this long is declared hung and replaced (default 2000)
  --coordinator-timeout-ms MS workers and agents wait this long for a silent coordinator before
                         they fence themselves and exit (with --coordinators K, workers and
                         agents look for the new leader after a heartbeat timeout of silence,
                         for as long as this, then fence); a coordinator paused for less
                         (SIGSTOP, a VM stall) costs only the pause. Workers and agents give the
                         coordinator longer than it gives them: it must be longer than the
                         heartbeat timeout (default 5 x --heartbeat-timeout-ms)
  --join-timeout-ms MS   every first worker must join within this; a worker that dies before
                         it joins is restarted (--max-restarts) or left out while --min-ranks
                         allows, else the job fails naming it (default 60000)
  --replacement-wait-ms MS    with --max-restarts: a recovery waits this long for a crashed
                         worker's restart, which takes its old place (default 1000; 0 = shrink at once)
  --straggler-policy P   warn | rebalance | evict a rank whose compute stays 1.3x the median (default warn)
  --fault SPEC           inject a fault (repeatable): kill:rank=1:step=8, kill:node=1:step=12,
                         stop:rank=2:step=5[:for=3s], slow:rank=0:factor=2:from=10,
                         kill:coordinator:step=15 (the leader, when there are several),
                         kill:coordinator:step=15:commits=1 (the leader dies in the middle of
                         committing step 15, its commit sent to one rank), random:kills=10:seed=3,
                         diverge:step=8[:rank=0] (that step's batch gives a NaN loss)

coordinator leadership through etcd (one coordinator leads; standbys take a running job over):
  --etcd ENDPOINTS       comma-separated http:// or https:// URLs of an etcd cluster, or
                         `local` for one etcd member of the job's own (/usr/bin/etcd, data in
                         RUN_DIR/etcd, log in RUN_DIR/etcd.log, stopped with the job). The
                         coordinator is elected leader before it supervises and mirrors the
                         job's config and state to /troupe/JOB_ID/. A leader that cannot renew
                         its lease pauses the job (nothing is committed) until it leads again;
                         after --etcd-timeout-ms without etcd the job ends (exit 1)
  --coordinators K       run K coordinator processes (run only; needs --etcd): one leads, the
                         others stand by. When the leader dies or stalls past its lease, a
                         standby takes the job over: workers keep their processes and state,
                         and training goes on from the last committed step (default 1)
  --etcd-cacert FILE     CA that signed etcd's certificate (required for https)
  --etcd-cert FILE, --etcd-key FILE   client certificate and key (etcd --client-cert-auth)
  --etcd-timeout-ms MS   how long to wait for etcd and the election, and how long a job may go
                         without a leader before it ends (default 60000)
  --job-id ID            the job's name in etcd (default: the run directory's name)
  --set KEY=VALUE        any config field by its dotted name (e.g. optim.weight_decay=0)
  --no-progress          no progress line
  -h, --help             this help
)";
}

std::string run_help() {
  return std::string(R"(usage: troupe run [options]

Trains a GPT on this machine: starts a coordinator (in this process), one agent and
--world worker processes, shows progress, and ends with a summary. Its agents read
TROUPE_ADVERTISE, TROUPE_IFACE and GLOO_SOCKET_IFNAME as `troupe agent` does (see troupe
agent --help); across hosts, use `troupe coordinator` and one `troupe agent` per host, or
--slurm inside a Slurm job.

Signals: Ctrl-C (SIGINT) stops the job at the step boundary, after any checkpoint being
written (exit 130); a second Ctrl-C kills every process of the job at once. SIGTERM and
SIGUSR1 (a scheduler taking the nodes back: Slurm's scancel, preemption, or
`sbatch --signal=B:USR1@120` before the time limit) commit the next step with a checkpoint
and stop (exit 75, "requeue me"): --resume continues from exactly that step.

Exit codes: 0 done, 1 the job failed, 2 bad usage or config (also a limit on open files,
`ulimit -n`, too low for the job even at its hard limit), 3 a step diverged (see
--on-divergence), 4 trained, but a checkpoint failed and none committed after it, 75 stopped
for the scheduler with a checkpoint (requeue the job and --resume), 130 interrupted. Only 75
asks to be requeued.

Under Slurm (deploy/slurm/troupe.sbatch runs it for you):
  --slurm                the job is this Slurm allocation: the coordinator runs here (the
                         batch script, on the allocation's first node), listens on this node's
                         address (the one SLURMD_NODENAME resolves to; --host, TROUPE_ADVERTISE
                         or TROUPE_IFACE name another), writes RUN_DIR/rendezvous.json, and
                         starts one agent per node with `srun --no-kill` (a lost node does not
                         end the step). RUN_DIR must be on a file system every node shares.
                         --nodes defaults to the allocation's nodes, --world to nodes x
                         SLURM_NTASKS_PER_NODE (sbatch --ntasks-per-node: ranks per node; 1
                         when unset); an option or the config file wins, and more nodes than
                         the allocation holds is refused (exit 2).
  --host HOST, --port PORT   with --slurm: where the coordinator listens (default this node's
                         address, any free port)

options:
)") + job_flags;
}

std::string coordinator_help() {
  return std::string(R"(usage: troupe coordinator [options]

Runs the job's coordinator and waits for an agent (`troupe agent --coordinator HOST:PORT`)
to start the workers. Takes every option of `troupe run` (signals and exit codes as there:
SIGTERM and SIGUSR1 checkpoint the next step and exit 75), plus:
  --host HOST            address to listen on (default 127.0.0.1); across hosts, one the
                         agents reach (0.0.0.0: every address; workers then reach the store
                         at the address their agent was given)
  --port PORT            port to listen on; 0 = any free port, printed at start (default 0)
  --slurm                as `troupe run --slurm`, without starting the agents: listens on this
                         node's address and writes RUN_DIR/rendezvous.json, where
                         `srun --no-kill --ntasks-per-node=1 troupe agent --run-dir RUN_DIR`
                         finds it
  --join-token FILE      with --etcd: one of several coordinators of a job whose run directory
                         `troupe run --coordinators K` prepared (its RUN_DIR/join.token). It
                         stands by (members and agents asking it are sent on), campaigns, and
                         when elected takes the job over; it writes RUN_DIR/coordinators/PID.addr.
                         Exit 76 when it stops without ending the job (it stood by, or another
                         coordinator leads now)

options:
)") + job_flags;
}

namespace {
const char* node_address_flags =
    R"(  --iface NAME       the network interface whose IPv4 address this node's workers bind
                     and advertise to their peers: every listener they open (gloo's pairs,
                     pipeline stage links, checkpoint replicas, state transfer)
  --advertise ADDR   that address itself: an IPv4 address of this host (or a name that
                     resolves to one)
                     Without either option, the environment is read: TROUPE_ADVERTISE=ADDR,
                     TROUPE_IFACE=NAME, then GLOO_SOCKET_IFNAME=NAME (as torchrun reads it;
                     one interface); empty values count as unset. Without any of them, the
                     address of this host's route toward the coordinator. An interface that
                     does not exist, is down or has no IPv4 address, or an address this host
                     does not hold, is refused (exit 2), never replaced by another.
)";
}  // namespace

std::string agent_help() {
  return std::string(R"(usage: troupe agent --coordinator HOST:PORT --join-token FILE [--ranks K]
                    [--iface NAME | --advertise ADDR]
       srun --no-kill --ntasks-per-node=1 troupe agent [--run-dir RUN_DIR]   (Slurm)

Runs the agent of this node: asks the coordinator which workers to run, starts them as
worker processes, reports their exits, and stops them when the job ends or the
coordinator is lost. With --ranks K it joins a running job with K more workers, which the
job admits at the next step boundary (the layout grows up to --max-ranks; the others wait
as spares). Across hosts, start one agent per host, each pointed at the coordinator:

  host A:  troupe coordinator --host 10.0.0.1 --port 29400 --world 4 --nodes 2
  host B:  troupe agent --coordinator 10.0.0.1:29400 --join-token join.token
  host C:  troupe agent --coordinator 10.0.0.1:29400 --join-token join.token --iface eth1

options:
  --coordinator HOST:PORT   where the coordinator listens (it prints this at start); a
                     comma-separated list for a job with standby coordinators: the leader
                     among them takes this agent on, and when it is lost the agent rejoins
                     the next leader without stopping its workers
  --join-token FILE  the job's join token (the coordinator writes RUN_DIR/join.token; copy
                     it to this host with mode 0600)
  --ranks K          offer K workers to a running job (default: this node's share)
  --run-dir DIR      the job's run directory, on a file system this node shares with the
                     coordinator's: its join.token stands for --join-token, and under Slurm
                     its rendezvous.json for --coordinator (default TROUPE_RUN_DIR, then
                     runs/latest under a scheduler)
)") + node_address_flags +
         R"(
Under a scheduler, what the options leave out comes from the environment; an option given is
honoured, or refused with exit 2, never replaced:
  coordinator   --coordinator, else TROUPE_COORDINATOR=HOST:PORT, else (Slurm: SLURM_JOB_ID
                set) RUN_DIR/rendezvous.json of this job and attempt (SLURM_JOB_ID,
                SLURM_RESTART_COUNT), written by `troupe run --slurm` or `troupe coordinator
                --slurm` on the allocation's first node; waited for up to 60 s
                (TROUPE_AGENT_WAIT_MS=MS sets how long)
  join token    --join-token, else RUN_DIR/join.token (mode 0600; never on a command line);
                under a scheduler waited for as long
  node          SLURM_NODEID of SLURM_STEP_NUM_NODES (Slurm) or JOB_COMPLETION_INDEX (a
                Kubernetes Indexed Job) names this node in the agent's log; the coordinator
                numbers nodes as they join. One agent runs per node: a task with SLURM_LOCALID
                above 0 (srun --ntasks-per-node above 1) and no --coordinator says so and
                exits 0
  signals       under Slurm, SIGTERM and SIGUSR1 ask the coordinator to checkpoint the next
                step and stop the job (exit 75) instead of stopping this node's workers, and
                the workers leave a SIGTERM or SIGUSR1 that does not come from their agent to
                the coordinator; the coordinator's stop, or its loss, stops them)";
}

std::string bench_help() {
  return R"(usage: troupe bench comm [options]

Benchmarks the data plane's collectives (all_reduce, all_gather, reduce_scatter,
all_to_all) across real processes on this machine, like nccl-tests: for each size, the
time, the algorithm bandwidth and the bus bandwidth (and busbw as a fraction of this
machine's memcpy bandwidth). bench/comm_bench.sh runs it side by side with PyTorch's gloo
and Open MPI in the same session.

options:
  --ranks 2,4            process counts to run (default 2,4)
  --ops LIST             all_reduce,all_gather,reduce_scatter,all_to_all (default all)
  --min-bytes 4K         smallest message (K, M suffixes)
  --max-bytes 256M       largest message; sizes step by 4x
  --batches 5            timed batches per size (the median is reported)
  --batch-seconds 0.2    target length of one batch
  --transport tcp,shm    data planes to compare: tcp (gloo), tcp-signed (gloo, pairs connected
                         with TCP signatures as between nodes), shm (shared memory), hier
                         (shm inside simulated nodes, gloo across: what a job spanning
                         nodes gets)
  --nodes 2              hier: how many simulated nodes the ranks are cut into

across real nodes (network namespaces or hosts), one `troupe bench comm` per node:
  --node K               run only node K's ranks (0-based; consecutive ranks per node)
  --serve-store H:P      serve the ranks' store at H:P (one node does), or
  --store H:P            meet the other nodes' ranks in the store at H:P
  --bind ADDR            address the data plane's pairs listen on (this node's address)
)";
}

std::string worker_help() {
  return std::string(
             R"(usage: troupe worker --coordinator HOST:PORT --join-token FILE (--member M | --standby)
                     [--node N] [--iface NAME | --advertise ADDR]

One rank of a job. Agents start workers (passing on their --iface/--advertise as the
address it names); run one by hand only to debug.
  --standby   start, connect and wait: the member id comes as one line on stdin (an agent
              keeps one standby ready to replace a worker that dies; end of input: exit)
)") + node_address_flags;
}

std::string ckpt_help(const std::string& subcommand) {
  if (subcommand.empty())
    return R"(usage: troupe ckpt <subcommand> RUN_DIR [options]

Offline tools for the checkpoints of a run directory (RUN_DIR/checkpoints, e.g. of
runs/latest). Only gc and scrub change anything, and they refuse while a job holds the run.

subcommands:
  ls RUN_DIR                     committed checkpoints, oldest first, with their sizes
  inspect RUN_DIR [--step N]     one checkpoint's manifest (default: the one LATEST names)
  verify RUN_DIR [--step N]      reads back every chunk or shard and checks its hash
  diff RUN_DIR [A B]             what two checkpoints share and how far their values differ
  gc RUN_DIR [--keep-last K] [--keep-every N]   drops old checkpoints and unreferenced chunks
  scrub RUN_DIR                  verifies everything, moves damaged checkpoints aside, repairs
                                 LATEST

Exit codes: 0 ok, 1 an error or a damaged checkpoint, 2 bad usage.
Run `troupe ckpt <subcommand> --help` for details.
)";
  static const std::map<std::string, std::string> subcommands = {
      {"ls", R"(usage: troupe ckpt ls RUN_DIR

One line per committed checkpoint, oldest first: its step, LATEST on the one LATEST names,
format version, layout, AdamW's step count, distinct chunks, the bytes of those chunks on
disk, and the bytes of chunks the previous listed checkpoint does not reference (what this
checkpoint added). Format 1 checkpoints show their shard files' bytes. A last line gives the
chunk store's size on disk, then the quarantined checkpoints (checkpoints/damaged/, with
why each was moved there) and anything moved out of a write's way. Exit 1 when LATEST or a
manifest cannot be read.
)"},
      {"inspect", R"(usage: troupe ckpt inspect RUN_DIR [--step N]

Prints a checkpoint's manifest: step, format, world, layout, seed, adam_t, chunk size, the
size of the flat state, and per tensor its shape and, for params, exp_avg and exp_avg_sq,
how many pieces hold it and which ranks wrote them (format 1: the shard files).
  --step N    the checkpoint of step N (default: the one LATEST names)
)"},
      {"verify", R"(usage: troupe ckpt verify RUN_DIR [--step N]

Reads back every object of every committed checkpoint (or only step N): the manifest and
each chunk (or format 1 shard) against its hash. Prints "step N: ok" or each damaged file
and what is wrong with it. Without --step, a LATEST that is unreadable or points at no
checkpoint is a problem too. Exit 0 only when everything verified is intact, else 1.
  --step N    verify only the checkpoint of step N
)"},
      {"diff", R"(usage: troupe ckpt diff RUN_DIR [A B]

Compares the checkpoints of steps A and B (default: the two newest committed ones): the
bytes of the chunks they share and of those only one of them holds, then per tensor and
array whether the chunks are identical ("same"), and where they are not, the largest
absolute difference of the values (both are read back whole and verified). Format 1
checkpoints are compared by value only.
)"},
      {"gc", R"(usage: troupe ckpt gc RUN_DIR [--keep-last K] [--keep-every N]

Removes committed checkpoints that the retention policy does not keep (their manifests
first), then every chunk no remaining checkpoint references and any chunk temporary files
left by a writer that died. Refuses (exit 1) while a job holds the run directory's lock.
  --keep-last K    keep the newest K checkpoints (default 0: keep every checkpoint and
                   remove only unreferenced chunks)
  --keep-every N   with --keep-last, also keep every step that is a multiple of N
Retention removes only checkpoints older than one that reads back intact, and never the
newest intact one.
)"},
      {"scrub", R"(usage: troupe ckpt scrub RUN_DIR

Reads back every committed checkpoint, newest first, like verify. Each damaged one is moved
to checkpoints/damaged/step-NNNNNNNN-REASON (never deleted; ls lists it; its chunks are
kept), so that a resumed job replays and commits that step afresh. Then LATEST is made to
name the newest intact checkpoint at or before the one it named (removed when none is
intact), and entries of the chunk store that troupe did not put there (links, directories)
are reported. Refuses (exit 1) while a job holds the run directory's lock.
Exit 0 when nothing was damaged, 1 when something was (and was dealt with, as printed).
)"},
  };
  auto it = subcommands.find(subcommand);
  return it == subcommands.end() ? "" : it->second;
}

}  // namespace troupe::cli
