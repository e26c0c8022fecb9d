#include "cli/options.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "runtime/settings.hpp"
#include "runtime/sys/printable.hpp"

namespace troupe::cli {
namespace {

namespace fs = std::filesystem;

// What `troupe run` and `troupe coordinator` take besides the settings table.
void declare_command_options(command_line& cl) {
  for (const auto& s : settings()) {
    if (s.flag.empty()) continue;  // set by troupe itself (config files and --set still reach it)
    if (s.is_switch())
      cl.flag(s.flag);
    else
      cl.value(s.flag);
  }
  for (const char* v :
       {"--config", "--set", "--host", "--port", "--coordinators", "--join-token", "--log-level"})
    cl.value(v);
  for (const char* f : {"--slurm", "--print-config"}) cl.flag(f);
}

// One setting given on the command line: a switch sets its value, an option its text.
void apply_setting(const command_line& cl, train_config& cfg, const setting& s,
                   const std::string& value) {
  try {
    if (s.is_switch())
      s.set(cfg, nlohmann::json(s.switch_sets));
    else
      set_config_field(cfg, s.key, value);
  } catch (const config_error& e) {
    throw usage_error(cl.command() + ": bad value for " + s.flag + ": '" + value + "' (" +
                      e.what() + ")");
  }
}

// The run directory a resume continues: --run-dir, else the config file's, else the default.
std::string run_dir_of(const command_line& cl, const train_config& from_file) {
  if (auto dir = cl.last("--run-dir")) return *dir;
  return from_file.run_dir;
}

// --resume: the run's own config (RUN_DIR/config.json) is where the options start from. A run
// without one (written before troupe kept it) starts from the defaults, as it was started.
std::optional<train_config> saved_config(const std::string& run_dir) {
  const fs::path path = fs::path(run_dir) / "config.json";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) {
    if (fs::exists(fs::path(run_dir) / "checkpoints", ec)) {
      std::fprintf(stderr,
                   "troupe: resume: %s has checkpoints but no config.json; the options given "
                   "(and the defaults) describe the run\n",
                   sys::printable(run_dir).c_str());
      return std::nullopt;
    }
    throw config_error("resume: no run to continue in " + run_dir +
                       ": it holds no config.json and no committed checkpoint; point --run-dir "
                       "at a run, or leave out --resume to start one");
  }
  // The run directory is input too: a FIFO there would hang the open, a link point anywhere.
  if (!fs::is_regular_file(fs::symlink_status(path, ec)))
    throw config_error("resume: " + path.string() +
                       " is not a regular file (a link, a FIFO or a directory); troupe writes "
                       "it as a plain file: restore it from a copy, or remove it and give the "
                       "run's options");
  train_config saved;
  try {
    load_config_file(path.string(), saved);
  } catch (const config_error& e) {
    throw config_error("resume: the run's own config cannot be read: " + std::string(e.what()) +
                       "; repair or remove it (then the options given decide everything)");
  }
  // What one session asked for is not the run's: a fault or an early exit is given again.
  saved.exit_after_step = 0;
  saved.elastic.faults.clear();
  saved.resume = true;
  return saved;
}

}  // namespace

job_options parse_job_options(const std::vector<std::string>& args, bool coordinator_only,
                              const env_reader& env) {
  job_options out;
  const std::string command = coordinator_only ? "coordinator" : "run";
  // `troupe run [options] -- PROGRAM ARGS`: what follows the first `--` is the workers' program.
  std::vector<std::string> own = args, program;
  if (const auto dash = std::find(args.begin(), args.end(), "--"); dash != args.end()) {
    own.assign(args.begin(), dash);
    program.assign(dash + 1, args.end());
    if (program.empty() || program.front().empty())
      throw usage_error("troupe " + command +
                        ": `--` must be followed by the workers' program, e.g. -- python3 "
                        "train.py ARGS");
  }
  command_line cl("troupe " + command);
  declare_command_options(cl);
  cl.parse(own);
  if (cl.help()) {
    out.help = true;
    return out;
  }
  out.print_config = cl.has("--print-config");
  out.log_level = cl.last("--log-level").value_or("");
  // `troupe run --slurm` is a coordinator too: it takes --host and --port.
  const bool slurm = cl.has("--slurm");
  const bool listens = coordinator_only || slurm;
  // Where the settings start from: the defaults, or with --resume the run's own config; then
  // the config file; then every option in command-line order.
  train_config from_file;
  if (auto file = cl.last("--config")) load_config_file(*file, from_file);
  const bool resume = cl.has("--resume") || from_file.resume;
  if (resume) {
    out.saved = saved_config(run_dir_of(cl, from_file));
    out.cfg = out.saved ? *out.saved : train_config{};
    if (auto file = cl.last("--config")) load_config_file(*file, out.cfg);
  } else {
    out.cfg = from_file;
  }
  bool world_given = false, nodes_given = false, vocab_given = false;
  for (const auto& [flag, value] : cl.given()) {
    vocab_given = vocab_given || flag == "--vocab" ||
                  (flag == "--set" && value.rfind("model.vocab=", 0) == 0);
    world_given =
        world_given || flag == "--world" || (flag == "--set" && value.rfind("world=", 0) == 0);
    nodes_given = nodes_given || flag == "--nodes" ||
                  (flag == "--set" && value.rfind("elastic.nodes=", 0) == 0);
  }
  for (const auto& [flag, value] : cl.given()) {
    if (flag == "--config" || flag == "--slurm" || flag == "--print-config" ||
        flag == "--log-level")
      continue;
    if (const setting* s = find_setting_by_flag(flag)) {
      apply_setting(cl, out.cfg, *s, value);
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
    } else if (flag == "--host" || flag == "--port") {
      throw usage_error("troupe run: " + flag +
                        " is an option of the coordinator: troupe coordinator, or troupe run "
                        "--slurm (whose coordinator the agents of other nodes reach)");
    } else {
      throw cl.error("option " + flag + " is not one of troupe " + command + "'s");
    }
  }
  // Left out, the vocabulary is the data's (runtime/data/corpus_plan.cpp); a resumed run keeps
  // the one it was planned with.
  vocab_given = vocab_given || from_file.model.vocab != train_config{}.model.vocab;
  if (!vocab_given && !out.saved) out.cfg.model.vocab = 0;
  if (!program.empty()) out.cfg.workload_command = program;
  if (out.cfg.external_workload() && out.cfg.replicate_checkpoints)
    // Replicas serve layouts whose ranks hold different shards; refused rather than kept as a
    // copy nobody reads.
    throw usage_error("troupe " + command +
                      ": --replicate-checkpoints has nothing to add for a workload of your own "
                      "(`-- PROGRAM`): its job is data-parallel, so every live rank holds the "
                      "whole state and a lost rank is restored from a peer's memory already; "
                      "leave it out (checkpoints still go to the disk)");
  if (out.saved) {
    // A resume changes only what may change; the rest is the run's and shapes its math.
    for (const auto& c : changed_settings(*out.saved, out.cfg))
      if (!c.what->resumable)
        throw usage_error(
            "troupe " + command + " --resume: " + c.what->key +
            (c.what->flag.empty() ? std::string() : " (" + c.what->flag + ")") +
            " cannot change on a resume: the run in " + out.cfg.run_dir + " has " + c.before +
            ", given " + c.after +
            "; it shapes what is computed. Leave it out to continue the run, or start a new "
            "run in another --run-dir");
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
  tokenize      train a SentencePiece tokenizer on a text corpus, write it as token files
  sample        generate text from a run's checkpoint (a KV cache; bytes or its tokenizer)
  eval          loss and perplexity of a run's checkpoint on its validation split or a file

Run `troupe <command> --help` for a command's options.
)";
}

namespace {

// `text` wrapped to lines of at most `width` characters, each after `indent` spaces (the
// first line's indent is the caller's).
std::string wrapped(const std::string& text, size_t indent, size_t first_used, size_t width) {
  std::string out, line;
  size_t used = first_used;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(' ', at);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(at, end - at);
    if (!line.empty() && used + 1 + word.size() > width) {
      out += line + "\n" + std::string(indent, ' ');
      line.clear();
      used = indent;
    }
    if (!line.empty()) {
      line += ' ';
      ++used;
    }
    line += word;
    used += word.size();
    at = end + 1;
  }
  return out + line + "\n";
}

std::string number_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", x);
  return buf;
}

// "(1..1024)" or "(0, 1]" from a setting's bounds; "" when it has none.
std::string range_text(const setting& s) {
  if (std::isnan(s.lo) || s.lo == s.hi) return "";
  if (s.lo_open || s.hi_open)
    return std::string(s.lo_open ? "(" : "[") + number_text(s.lo) + ", " + number_text(s.hi) +
           (s.hi_open ? ")" : "]");
  return number_text(s.lo) + ".." + number_text(s.hi);
}

constexpr size_t help_width = 96;
constexpr size_t help_column = 27;

std::string option_line(const std::string& left, const std::string& text) {
  std::string head = "  " + left;
  if (head.size() + 1 > help_column)
    return head + "\n" + std::string(help_column, ' ') +
           wrapped(text, help_column, help_column, help_width);
  head += std::string(help_column - head.size(), ' ');
  return head + wrapped(text, help_column, help_column, help_width);
}

}  // namespace

std::string job_options_help() {
  std::string out =
      "job options (in brackets: the config file's key; `fixed`: it shapes the math, and a\n"
      "--resume keeps the run's value):\n";
  for (const auto& group : setting_groups()) {
    out += "\n " + group + ":\n";
    for (const auto& s : settings()) {
      if (s.group != group || s.flag.empty()) continue;
      std::string text = s.help;
      if (const auto range = range_text(s); !range.empty()) text += "; " + range;
      text += " [" + s.key + (s.resumable ? "" : ", fixed") + "]";
      out += option_line(s.flag + (s.is_switch() ? "" : " " + s.value_name), text);
    }
  }
  out += R"(
 the command line:
  --config FILE            JSON config file (keys as in brackets above); options override it
  --set KEY=VALUE          any setting by its key (e.g. --set optim.weight_decay=0)
  --print-config           print the effective config as JSON (a file --config reads back),
                           with --resume the run's own with the changes given, and exit
  --log-level LEVEL        debug, info, warn or error (default info; TROUPE_LOG_LEVEL too)
  -h, --help               this help

Every option takes its value as `--opt VALUE` or `--opt=VALUE`.
)";
  return out;
}

std::string run_help() {
  return std::string(R"(usage: troupe run [options]
       troupe run [options] -- PROGRAM [ARGS...]

Trains on this machine: starts a coordinator (in this process), one agent and --world
worker processes, shows progress, and ends with a summary. Without a PROGRAM the workers
train troupe's built-in GPT; with one (after `--`, e.g. `-- python3 train.py --lr 3e-4`)
each worker is that program, which joins the job through the `troupe` Python module
(troupe.init(); see docs/PYTHON.md). Such a job is data-parallel only: --tp, --pp, --ep,
--zero and --experts are refused (exit 2). The program is stored as the setting
workload.command, so --resume runs it again unless another `-- PROGRAM` is given. Its agents read
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

Standby coordinators (with --etcd):
  --coordinators K       run K coordinator processes: one leads, the others stand by. When
                         the leader dies or stalls past its lease, a standby takes the job
                         over: workers keep their processes and state, and training goes on
                         from the last committed step (default 1). Coordinator i serves its
                         metrics on --metrics-port + i

)") + job_options_help();
}

std::string coordinator_help() {
  return std::string(R"(usage: troupe coordinator [options]

Runs the job's coordinator and waits for an agent (`troupe agent --coordinator HOST:PORT`)
to start the workers. Takes every option of `troupe run`, and its `-- PROGRAM ARGS` (signals and exit codes as there:
SIGTERM and SIGUSR1 checkpoint the next step and exit 75; `troupe help options` lists
them), plus:
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
)");
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
worker processes (troupe's own, or the job's program: `troupe run ... -- PROGRAM ARGS`, or
`troupe agent ... -- PROGRAM ARGS` to name it here), reports their exits, and stops them when the job ends or the
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
       troupe bench control-plane --members N [options]

Benchmarks the data plane's collectives (all_reduce, all_gather, reduce_scatter,
all_to_all) across real processes on this machine, like nccl-tests: for each size, the
time, the algorithm bandwidth and the bus bandwidth (and busbw as a fraction of this
machine's memcpy bandwidth). bench/comm_bench.sh runs it side by side with PyTorch's gloo
and Open MPI in the same session.

options:
  --ranks 2,4            process counts to run (default 2,4)
  --ops LIST             all_reduce,all_gather,reduce_scatter,all_to_all (default: these
                         four) and exact_all_reduce (--reduction exact's sum, one
                         micro-batch per rank, to compare with all_reduce)
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

troupe bench control-plane: the real coordinator (`troupe coordinator`, started here with a
job of N data-parallel ranks) against N simulated members that speak the control protocol
(hello, heartbeats, votes, commits, reports; TLS with the job's token) without training.
Each simulated node is one connection with --members-per-node members. Prints forming
time, the control plane's share of a step (last vote out to last commit in) p50/p99, a
loss's time to the next commit, the coordinator's CPU per step and memory per member.
  --members N                simulated members (required)
  --first-member K           their member ids start at K (default 0); with --coordinator,
                             for a job whose members 0..K-1 are real workers (an agent's
                             --ranks K) and which runs with TROUPE_TRANSPORT=null (their
                             data plane then does nothing, as the simulated members' does)
  --steps S                  steps (default 50)
  --step-ms MS               simulated compute of one step (default 200)
  --jitter-ms MS             each step's compute varies by up to +-MS (default 0)
  --members-per-node M       members sharing one connection (default 8; 1 = one per member)
  --aggregate                each node's relay (its agent) bundles its members' votes and
                             heartbeats and takes one commit for them: a message per node
                             instead of per member (default: every member talks directly)
  --vote-window-ms MS        with --aggregate, how long a relay holds a step's first vote for
                             the node's other ranks (default 100)
  --etcd                     the coordinator leads through its own etcd (--etcd local);
                             etcd's count of its writes per step and per loss is reported
  --lose K                   K members lost at once after step --lose-at (default the middle)
  --lose-at STEP
  --lose-percent P           P % of the members lost at once after --lose-percent-at
  --lose-percent-at STEP     (default three quarters into the run)
  --straggler F              the first simulated member's steps take F times as long
  --checkpoint-every K       as troupe run's (default 0: only at the end); each simulated
                             rank writes its share of the model's state, as a rank does
  --d-model D                the job's model width, 8..1024 (default 8): the size of its
                             checkpoints and how many pieces a manifest lists
  --heartbeat-timeout-ms MS  as troupe run's (default 2000)
  --connect-threads T        nodes connecting at once (default 8)
  --hello-timeout-s S        forming must finish within S seconds (default 600)
  --coordinator HOST:PORT    use a running coordinator instead (with --join-token FILE);
                             the coordinator's /proc figures are then left out, and the
                             events figures unless --run-dir names its run directory
  --join-token FILE
  --run-dir DIR              where the coordinator runs (default a temporary directory,
                             removed after a clean run)
  --json                     print one JSON object instead of the table
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
  hash RUN_DIR [--step N]        one digest of the training state: equal bits, equal digests
  gc RUN_DIR [--keep-last K] [--keep-every N]   drops old checkpoints and unreferenced chunks
  scrub RUN_DIR                  verifies everything, moves damaged checkpoints aside, repairs
                                 LATEST
  export RUN_DIR --format F OUT  the model as GPT-2 tensors for PyTorch (safetensors or torch)

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
      {"hash", R"(usage: troupe ckpt hash RUN_DIR [--step N]

Reads a checkpoint back whole (any layout, every chunk verified), in the single-rank
layout, and prints the step, AdamW's step count and a 64-bit digest (trp64) of each state
array's bytes (params, exp_avg, exp_avg_sq), then one of all of them with the counts:
  step 30 adam_t 30 params 1f0c... exp_avg 9a2e... exp_avg_sq 03b1... state 77d4...
Two runs trained to the same bits print the same line whatever their world or layout (with
--reduction exact, a job on 1 or 4 ranks, through losses and rejoins). A digest says whether
the bits are equal, not how far apart they are: troupe ckpt diff says that.
  --step N    the checkpoint of step N (default: the one LATEST names)
Exit 0 printed, 1 no such checkpoint or a damaged one, 2 bad usage.
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
      {"export", R"(usage: troupe ckpt export RUN_DIR [--step N] --format safetensors|torch OUT

Writes the parameters of a committed checkpoint of the built-in GPT (not the optimizer
state) to OUT under HuggingFace GPT-2's names and shapes (transformer.wte.weight,
transformer.h.0.attn.c_attn.weight, ..., lm_head.weight), in GPT-2's Conv1D orientation
([in, out]: c_attn.weight is [d_model, 3 d_model]). Any layout's checkpoint (dp, ZeRO-1,
tp, pp) gives the single-rank tensors; every chunk read is checked against its hash. OUT is
written to a temporary name and renamed into place. A Mixture-of-Experts model is refused.
  --step N          the checkpoint of step N (default: the newest at or before LATEST whose
                    parameters read back intact; damaged ones are passed over, said on stderr)
  --format F        safetensors (with metadata: step, d_model, n_head, n_layer, context,
                    vocab, gpt2_config) or torch (the file torch.save writes for an
                    OrderedDict of tensors; torch.load reads it)
Exit 0 written, 1 no intact checkpoint or a damaged one asked for, 2 bad usage, a step
with no checkpoint, or a model GPT-2 cannot hold.
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
