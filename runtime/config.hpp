#pragma once
// The job's configuration: one struct with every knob and its default, loaded from a
// JSON file plus command-line overrides, and validated before anything starts.

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe {

/// Shape of the GPT. Shapes are named once: B (micro-batch), T (context), C (d_model),
/// V (vocab), L (layers), NH (heads).
struct model_config {
  int n_layer = 4;
  int n_head = 4;
  int d_model = 128;
  int context = 64;               ///< T: tokens per sequence
  int vocab = 256;                ///< byte-level
  int experts = 0;                ///< E: experts per MoE MLP; 0 = dense MLP
  int top_k = 1;                  ///< experts each token is routed to (1 or 2)
  double capacity_factor = 1.25;  ///< expert capacity = ceil(factor * tokens * top_k / E)
  double aux_loss_coef = 0.01;    ///< weight of the load-balancing loss
};

/// The parallel layout dp x tp x pp x ep. dp is whatever the world leaves.
struct parallel_config {
  int tp = 1;
  int pp = 1;
  int ep = 1;
  int micro_batches = 0;          ///< pipeline micro-batches per step; 0 = batch / micro_batch
  std::string schedule = "1f1b";  ///< gpipe | 1f1b
  int zero = 0;                   ///< 0 = replicated optimizer state, 1 = sharded over dp
  /// How a step's micro-batch gradients are summed: "fast" (each rank folds its own, the
  /// collective adds the ranks' totals: the bits depend on the world), "exact" (one binary
  /// tree over the global micro-batch index, strategies/exact_reducer.hpp: the same bits on
  /// any world, any split and any transport), or "auto": exact where it is supported, fast
  /// elsewhere (strategies::reduces_exactly).
  std::string reduction = "auto";
};

/// Elastic recovery: how many agents, how far the world may shrink and grow, spares, failure
/// detection and injected faults.
struct elastic_config {
  int nodes = 1;                    ///< agents troupe run starts on this machine (simulated nodes)
  int min_ranks = 1;                ///< fewer live ranks than this ends the job
  int max_ranks = 0;                ///< the world never grows past this; 0 = world
  int spares = 0;                   ///< started idle workers that replace a lost rank
  int max_restarts = 0;             ///< times each agent restarts a worker that died (it rejoins)
  int heartbeat_timeout_ms = 2000;  ///< a worker silent this long is lost (hang)
  /// How long workers and agents wait for a silent coordinator before they fence themselves;
  /// 0 = 5 x heartbeat_timeout_ms. Longer than the coordinator waits for them, so that a pause
  /// of the coordinator (SIGSTOP, a VM stall) shorter than this costs only the pause.
  int coordinator_timeout_ms = 0;
  /// An agent cut off from every coordinator for the coordinator timeout stops its workers but
  /// keeps looking for the leader this long, then rejoins the job with new workers (the job
  /// grows back); past it, the agent exits. 0 = it exits at once.
  int rejoin_timeout_ms = 600000;
  /// Every first worker must have joined this long after the coordinator started; one that
  /// died before it joined is replaced by its agent's restart or left out (--min-ranks).
  int join_timeout_ms = 60000;
  /// With max_restarts: how long a recovery waits for a crashed worker's restart to rejoin
  /// (one generation at the old world instead of a shrink and a grow); 0 = never waits.
  int replacement_wait_ms = 1000;
  /// Aggregation through the agents: each agent carries its node's votes and heartbeats to the
  /// coordinator in one message and hands out one commit per node (actors/agent/node_relay).
  bool relay = false;
  std::string straggler_policy = "warn";  ///< warn | rebalance | evict
  /// A rank is a straggler when its compute stays this many times the others' (CPU time).
  double straggler_factor = 1.3;
  std::string faults;  ///< injected faults (chaos/fault_spec.hpp), ';'-separated
};

/// Where the coordinator leads the job through etcd (runtime/etcd/leader_election.hpp).
/// No endpoints: no etcd, the coordinator leads without an election.
struct etcd_config {
  /// Comma-separated http:// or https:// URLs, or "local": the coordinator starts one etcd
  /// member of its own under the run directory.
  std::string endpoints;
  std::string cacert;  ///< PEM CA that signed etcd's certificate; needed for https
  std::string cert;    ///< PEM client certificate (etcd --client-cert-auth); needs key
  std::string key;     ///< PEM key of cert
  /// How long the coordinator waits to be elected (and for etcd to answer) before it gives up.
  int timeout_ms = 60000;
};

struct optim_config {
  double lr = 3e-3;           ///< peak learning rate
  double min_lr_ratio = 0.1;  ///< cosine decays to lr * min_lr_ratio
  int warmup_steps = 20;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  ///< global L2 norm; 0 = off
  /// Parameters not trained: comma-separated patterns, each a substring of the tensor name or,
  /// with '*', a glob of the whole name ("h.0.*"). Their moments stay zero.
  std::string freeze;
  /// Set by troupe, never by hand: a resume that changed `steps` after the warm-up goes on
  /// from the rate the run had reached. From rebase_step on, the cosine decays from
  /// rebase_lr to the floor at `steps`. 0 = the plain schedule.
  int rebase_step = 0;
  double rebase_lr = 0;
};

struct train_config {
  model_config model;
  optim_config optim;
  parallel_config parallel;
  elastic_config elastic;
  int world = 2;  ///< number of worker ranks
  int steps = 400;
  int batch = 16;       ///< global batch in sequences per step (any world size)
  int micro_batch = 4;  ///< sequences per forward/backward on one rank
  uint64_t seed = 1337;
  std::string data;  ///< corpus path; empty = the default corpus
  /// Validation corpus: empty = the last val_fraction of `data` (or, for a token file named
  /// train.bin, a val.bin beside it: coordinator/job_data.cpp fills it in).
  std::string val_data;
  /// What the workers run: empty = the built-in GPT (`troupe worker`); otherwise the user's
  /// program (`troupe run ... -- python3 train.py ARGS`), which hosts the worker through the
  /// `troupe` Python module or libtroupe (docs/WORKLOAD.md). Such a job is data-parallel only.
  std::vector<std::string> workload_command;
  bool external_workload() const { return !workload_command.empty(); }
  double val_fraction = 0.05;  ///< tail of the corpus held out for validation
  int eval_every = 100;        ///< steps between validation losses; 0 = only at the end
  int eval_batches = 8;        ///< micro-batches per validation estimate
  std::string run_dir = "runs/latest";
  bool resume = false;
  int checkpoint_every = 100;    ///< 0 = only at the end
  int exit_after_step = 0;       ///< stop cleanly (with a checkpoint) after this step; 0 = off.
                                 ///< The schedule still runs to `steps`, so --resume continues it.
  bool checkpoint_async = true;  ///< write in the background; false = in the step
  std::string checkpoint_overlap = "wait";  ///< wait | skip: a snapshot due mid-write
  /// after-write | off: each rank reads back (from the disk, not its cache) every chunk it
  /// wrote before reporting it durable
  std::string verify_checkpoints = "off";
  int checkpoint_chunk_kib = 1024;     ///< chunk size of the content-addressed store
  int keep_last = 3;                   ///< committed checkpoints kept; 0 = all
  int keep_every = 0;                  ///< also keep steps that are multiples; 0 = off
  bool replicate_checkpoints = false;  ///< also hold each rank's chunks in a peer's memory
  int metrics_port = 9400;             ///< 0 = off
  std::string metrics_host = "127.0.0.1";
  std::string metrics_token_file;  ///< when set, GET /metrics needs this file's bearer token
  /// Per-rank metric labels up to this many ranks; above it, one series per node
  int metrics_rank_labels = 64;
  int blas_threads = 1;
  /// Each rank's peak FLOP/s for the MFU estimate; 0 = measured at the start (a short sgemm)
  double peak_flops = 0;
  int step_timeout_ms = 60000;  ///< deadline for one step's collectives and votes
  int bucket_bytes = 4 << 20;   ///< gradient all-reduce bucket size
  bool progress = true;         ///< progress line on stderr
  /// A step whose loss or gradient norm is not finite, or whose cross-entropy is below zero,
  /// is never committed: `stop` ends the job (exit 3), `rollback` restores the last committed
  /// checkpoint and trains on past the batch that diverged, at most max_rollbacks times.
  std::string on_divergence = "stop";
  int max_rollbacks = 3;
  /// How gloo's TCP pairs (the data plane between nodes) keep strangers out while they
  /// connect: `tcp-md5` signs their segments with a key from the job's secret, so the kernel
  /// drops a stranger's (runtime/comm/tcp_signature.hpp); `none` accepts whoever connects first.
  std::string data_plane_auth = "tcp-md5";
  /// The job's name in etcd (/troupe/<job_id>/). A new job without one gets the run
  /// directory's name and eight random hex digits (config.json keeps it for --resume and the
  /// standby coordinators); empty only in runs written before.
  std::string job_id;
  etcd_config etcd;
};

/// The coordinator timeout in effect: coordinator_timeout_ms, or its default when 0.
int coordinator_timeout_ms(const elastic_config& e);

/// How long each side of a job waits for the other, as durations: the one place the elastic
/// settings become them. Every process takes its waits from here.
struct liveness_timeouts {
  std::chrono::milliseconds heartbeat;    ///< a member silent this long is lost (hang)
  std::chrono::milliseconds coordinator;  ///< members and agents give a silent coordinator this
  std::chrono::milliseconds rejoin;       ///< a cut-off agent looks for the leader this long
  /// A member that hears nothing from its only coordinator this long stops computing: the
  /// coordinator declared it lost at one heartbeat timeout of the same silence.
  std::chrono::milliseconds stop_computing() const { return std::min(2 * heartbeat, coordinator); }
  /// A control connection whose sent data stays unacknowledged this long is given up: both
  /// sides have acted on the cut by then (TCP_USER_TIMEOUT).
  std::chrono::milliseconds dead_connection() const { return 2 * coordinator; }
};
liveness_timeouts liveness_of(const elastic_config& e);

/// The job's name in etcd: job_id, or else (a run from before ids were drawn) the run
/// directory's last component made safe for a key (anything but [A-Za-z0-9._-] becomes '_').
std::string etcd_job_id(const train_config& c);

/// A configuration error names the field and the fix; the CLI prints it and exits 2.
class config_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A mistake on the command line or in what a scheduler's environment says (a malformed
/// SLURM_* variable): printed as it is, exit 2.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Reads a JSON config file into `cfg` (keys not present keep their value), within limits:
/// at most 1 MiB, nested at most 64 deep (counted before parsing), no key twice in an object,
/// every value of its field's JSON type. Throws config_error naming the file or the key.
void load_config_file(const std::string& path, train_config& cfg);

/// Sets one field by its dotted name ("steps", "model.n_layer", "optim.lr", ...)
/// from its text form. Throws config_error on an unknown name or a bad value.
void set_config_field(train_config& cfg, const std::string& name, const std::string& value);

/// Checks every constraint between fields (heads divide d_model, the global batch
/// splits over the world in whole micro-batches, ...). Throws config_error naming
/// the field and the fix.
void validate(const train_config& cfg);

/// The last step this session trains: exit_after_step when set, else steps.
inline int64_t session_last_step(const train_config& c) {
  return c.exit_after_step > 0 ? c.exit_after_step : c.steps;
}

/// The config as a JSON object: every field, sections as nested objects. Written to the run
/// directory (config.json), the job_start event and the checkpoint manifest, and sent to the
/// workers as its dump().
nlohmann::json to_json(const train_config& cfg);
/// The config as a file that load_config_file reads back (--print-config): to_json without
/// the settings that are empty for "not set" (an explicit "" is refused in a file).
nlohmann::json to_config_file(const train_config& cfg);
/// Parses the text of what to_json returned.
train_config config_from_json(const std::string& text);

}  // namespace troupe
