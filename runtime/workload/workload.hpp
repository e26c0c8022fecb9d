#pragma once
// The seam between troupe's runtime and what it trains (docs/WORKLOAD.md): a workload declares
// its state as named tensors, computes a step on the samples the runtime hands it, exposes its
// gradients for the data plane to reduce in place, and changes its state only when the runtime
// says the step committed. Membership, generations, the step transaction, the data plane,
// checkpoints, recovery and state transfer stay the runtime's; the built-in GPT
// (strategies/gpt_workload.hpp), a user's C++ workload and a PyTorch script (python/) are
// workloads.
//
// DRAFT (issue 39, docs/WORKLOAD.md stage 1). Floor 1: this header includes nothing above
// runtime/, so ckpt::box and ckpt::placed_piece become aliases of state_box and placed_box
// here, and strategies::connect_fn of troupe::connect_fn.
//
// Threads. Every call below is made by the thread that drives the worker (the rank actor's
// thread for a native worker; the script's thread for a Python one), except
// workload_generation::abort(), which any thread may call, and gradient_sink::ready(), which
// the workload calls from wherever its backward runs. The runtime reduces gradient buckets on
// a thread of its own and never calls into the workload from it.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/comm/communicator.hpp"

namespace troupe {

/// A workload refused what it was given: a state table it cannot hold, a tensor of a dtype or
/// device it cannot train, a setting it does not support. The message names the tensor or
/// setting and what to do; the worker turns it into a failed `reconfigured` or vote.
class workload_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The user's own code failed (a Python script raised, a program threw): a redo would fail the
/// same way, so the job ends with these words rather than recovering.
class program_error : public workload_error {
 public:
  using workload_error::workload_error;
};

// ---- tensors and state -------------------------------------------------------------------

/// Element types a state tensor may have. Only f32 tensors are reduced by the data plane and
/// may be held in parts by different ranks; a rank holds a tensor of any other dtype whole,
/// and the checkpoint carries it as one row of 4-byte words.
enum class dtype : uint8_t { f32, f64, f16, bf16, i64, i32, i16, i8, u8, boolean };

/// Bytes of one element.
constexpr size_t dtype_bytes(dtype t) {
  switch (t) {
    case dtype::f64:
    case dtype::i64:
      return 8;
    case dtype::f32:
    case dtype::i32:
      return 4;
    case dtype::f16:
    case dtype::bf16:
    case dtype::i16:
      return 2;
    case dtype::i8:
    case dtype::u8:
    case dtype::boolean:
      return 1;
  }
  return 0;
}

/// The name a manifest and the Python module use ("f32", "bf16", "bool", ...).
constexpr std::string_view dtype_name(dtype t) {
  switch (t) {
    case dtype::f32:
      return "f32";
    case dtype::f64:
      return "f64";
    case dtype::f16:
      return "f16";
    case dtype::bf16:
      return "bf16";
    case dtype::i64:
      return "i64";
    case dtype::i32:
      return "i32";
    case dtype::i16:
      return "i16";
    case dtype::i8:
      return "i8";
    case dtype::u8:
      return "u8";
    case dtype::boolean:
      return "bool";
  }
  return "?";
}

/// The dtype dtype_name() calls `name`; nullopt for any other text.
constexpr std::optional<dtype> parse_dtype(std::string_view name) {
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i64, dtype::i32,
                  dtype::i16, dtype::i8, dtype::u8, dtype::boolean})
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

/// What a tensor is to the job; metrics, `troupe ckpt` and the Python module read it, the
/// runtime treats every role alike.
enum class tensor_role : uint8_t {
  parameter,  ///< trained: has a gradient
  optimizer,  ///< optimizer state (moments, step counts)
  buffer,     ///< model state that is not trained (running statistics, masks)
  extra,      ///< anything else the workload wants back on resume (a scheduler's tensors)
};

/// One tensor of the workload's state, as a checkpoint lists it: global (the single-rank
/// model's) shape, whatever layout holds it now.
struct tensor_decl {
  /// Unique in the workload: "h.0.attn.qkv.weight" (GPT), "model/fc.weight" or
  /// "optim/state/3/exp_avg" (Python, docs/WORKLOAD.md "Checkpoint format").
  std::string name;
  /// The state array that holds it: a Python job's "model" | "optim" | "extra" (each tensor in
  /// one). "" = in every state array of the workload: the GPT's tensors are each in "params",
  /// "exp_avg" and "exp_avg_sq" (manifest format 2's rule).
  std::string array;
  std::vector<int64_t> shape;  ///< row-major; empty = a scalar
  dtype type = dtype::f32;
  tensor_role role = tensor_role::parameter;

  [[nodiscard]] size_t numel() const {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    return n;
  }
  [[nodiscard]] size_t bytes() const { return numel() * dtype_bytes(type); }
  /// 4-byte words the checkpoint's chunks give it: numel for f32, the bytes rounded up to a
  /// whole word for every other dtype (such a tensor is one row of words, held whole).
  [[nodiscard]] size_t words() const { return (bytes() + 3) / 4; }
  friend bool operator==(const tensor_decl&, const tensor_decl&) = default;
};

/// A rectangle of a tensor's 2-D view: [rows, cols] with cols the product of the trailing
/// dimensions for an f32 tensor; [1, words()] for any other dtype.
struct state_box {
  int64_t row = 0;
  int64_t col = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  [[nodiscard]] size_t numel() const {
    return static_cast<size_t>(rows) * static_cast<size_t>(cols);
  }
  friend bool operator==(const state_box&, const state_box&) = default;
};

/// A box of tensor `tensor` held contiguously (row-major) in a region at `local_offset`
/// (elements of the region: floats, or words for a region of another dtype). Ranks holding
/// the same values (data-parallel replicas) are `replicas` in number, and each checkpoints
/// its balanced share of the box (index `replica_index`), so every value is written once.
struct placed_box {
  std::string tensor;
  state_box where;
  size_t local_offset = 0;
  int replicas = 1;
  int replica_index = 0;
  bool saved = true;  ///< false: restored but written by another rank (a tied copy)
  friend bool operator==(const placed_box&, const placed_box&) = default;
};

/// Memory of one state array on this rank and the boxes in it. The GPT has one region per
/// array (a flat buffer of many tensors); a Python job has one region per tensor.
struct state_region {
  std::string array;
  dtype type = dtype::f32;
  /// Valid until the generation ends or the next call that may reallocate (begin_restore).
  /// A region of another dtype than f32 is padded to whole words: size % 4 == 0.
  std::span<std::byte> bytes;
  std::vector<placed_box> pieces;
};

/// A named integer the workload's state includes outside any tensor (the GPT's AdamW step
/// count "adam_t"). Checkpointed and transferred with the state.
struct state_counter {
  std::string name;
  int64_t* value = nullptr;
};

/// This rank's whole training state, in place: what a checkpoint snapshots, a peer sends to
/// a newcomer, and a restore fills.
struct state_view {
  /// Every tensor of the workload (the global table, not only what this rank holds).
  std::vector<tensor_decl> tensors;
  std::vector<state_region> regions;
  std::vector<state_counter> counters;
  /// Non-tensor state as JSON (a Python job's state tree with its tensors replaced by
  /// references, its optimizer's hyper-parameters, the sampler's dataset length). At most
  /// max_extras_bytes; "" = none. The same on every data-parallel replica.
  std::string extras_json;

  static constexpr size_t max_extras_bytes = size_t{1} << 20;

  [[nodiscard]] size_t bytes() const {
    size_t n = extras_json.size() + counters.size() * sizeof(int64_t);
    for (const auto& r : regions) n += r.bytes.size();
    return n;
  }
};

/// The region of one whole tensor that every one of `dp_size` data-parallel replicas holds
/// (replica `dp_index` writes its share to a checkpoint): how a data-parallel workload
/// declares each of its tensors.
inline state_region replicated_region(const tensor_decl& t, std::span<std::byte> memory,
                                      int dp_size, int dp_index) {
  if (memory.size() < t.bytes())
    throw workload_error("tensor " + t.name + " needs " + std::to_string(t.bytes()) +
                         " bytes, its memory has " + std::to_string(memory.size()));
  if (t.array.empty())
    throw workload_error("tensor " + t.name + " names no state array for its region");
  state_region r;
  r.array = t.array;
  r.type = t.type;
  r.bytes = memory;
  placed_box whole;
  whole.tensor = t.name;
  if (t.type == dtype::f32) {
    const int64_t rows = t.shape.size() > 1 ? t.shape.front() : 1;
    whole.where = {0, 0, rows, static_cast<int64_t>(t.numel()) / std::max<int64_t>(rows, 1)};
  } else {
    whole.where = {0, 0, 1, static_cast<int64_t>(t.words())};
  }
  whole.replicas = dp_size;
  whole.replica_index = dp_index;
  r.pieces.push_back(std::move(whole));
  return r;
}

// ---- gradients ----------------------------------------------------------------------------

/// Gradients the runtime sums over the data-parallel group, in place: bucket k is reduced as
/// one collective, buckets strictly in index order on every rank (so the collectives match
/// whatever order a backward finishes them in). Float32 only: the data plane's all-reduce is.
struct gradient_bucket {
  std::span<float> values;
};

/// Told by the workload, during compute, that every gradient of a bucket is final for this
/// step, so its reduction can overlap the rest of the backward. Optional: buckets never
/// announced are reduced when compute returns. Thread-safe and cheap (no collective, no
/// allocation); it never blocks on the data plane.
class gradient_sink {
 public:
  virtual ~gradient_sink() = default;
  /// Bucket `bucket` (an index into gradient_buckets()) is final. Announcing a bucket twice in
  /// one step is an error the step fails with (a gradient changed after its reduction began).
  virtual void ready(size_t bucket) = 0;
};

// ---- what the runtime tells a workload ----------------------------------------------------

/// Builds a communicator for a group of the current generation (store rendezvous, transport
/// choice, fault injection: the runtime's business).
using connect_fn = std::function<std::unique_ptr<comm::communicator>(const comm::comm_identity&)>;

/// Which samples of a step's global batch one data-parallel replica computes: [first, first +
/// count) in micro-batches of `micro_batch` (the last may be shorter). `first` is a multiple of
/// micro_batch, so micro-batch j of a step (samples [j * micro_batch, ...)) is the same set of
/// samples whatever the world size: what makes per-micro-batch randomness world-independent.
struct sample_span {
  int first = 0;
  int count = 0;
  int micro_batch = 1;
  friend bool operator==(const sample_span&, const sample_span&) = default;
};

/// This rank's place in the data-parallel group of a generation.
struct data_parallel_place {
  int index = 0;           ///< rank within the group
  int size = 1;            ///< replicas
  std::vector<int> ranks;  ///< the generation's ranks of the group, in group order
  std::string group;       ///< the group's name for connect_fn ("dp0", ...)
};

/// The job's settings a workload may read (the validated config, trimmed). What a Python
/// script gets from troupe.init() and a C++ workload's factory from its argument.
struct job_settings {
  int64_t steps = 0;        ///< the schedule's length (steps of the whole job)
  int64_t last_step = 0;    ///< the last step this session trains (exit_after_step)
  int global_batch = 0;     ///< samples per step, whatever the world
  int micro_batch = 0;      ///< samples per forward/backward
  uint64_t seed = 0;        ///< everything random derives from it
  int bucket_bytes = 0;     ///< gradient bucket size for runtime-reduced workloads
  int compute_threads = 1;  ///< BLAS / intra-op threads per rank (blas_threads)
  std::string run_dir;      ///< the job's run directory (read-only for a workload)
  std::string config_json;  ///< the whole worker config, for workloads with settings of
                            ///< their own (the GPT reads model.*, optim.*, data)
};

/// What a generation is for this rank; handed to workload::make_generation.
struct generation_env {
  uint64_t generation = 0;
  int rank = 0;
  int world = 1;
  data_parallel_place dp;
  sample_span share;  ///< this replica's samples of every step of the generation
  int global_batch = 0;
  /// The whole layout plan (strategies::to_json of a layout_plan): for a workload with
  /// layout_support::planned, which builds tp/pp/ep groups from it. Data-parallel workloads
  /// need only `dp` and `share`.
  std::string plan_json;
  connect_fn connect;
  std::chrono::milliseconds op_timeout{60000};  ///< a collective's deadline (step_timeout_ms)
};

/// One step's work for compute().
struct step_work {
  int64_t step = 0;           ///< 1-based; a redone step comes again with the same number
  int64_t data_position = 0;  ///< the step's batch (step - 1, moved on by skipped batches)
  sample_span share;          ///< this rank's samples of that batch (the generation's)
  int global_batch = 0;       ///< G: scale each micro-batch's mean loss by its size / G
  uint64_t seed = 0;
  /// by_runtime workloads: where to announce final buckets (overlap). Null otherwise.
  gradient_sink* sink = nullptr;
};

/// What compute() produced on this rank.
struct step_outcome {
  double loss_sum = 0;      ///< sum over this rank's samples (or tokens) of the loss
  int64_t count = 0;        ///< samples (or tokens) in loss_sum; the job's loss is the ratio
  double model_comm_s = 0;  ///< seconds of collectives inside compute (tp, pp, ep)
};

/// The workload's own reduction (reduction::by_workload) and its deadline.
struct reduce_env {
  comm::op_options opts;  ///< the deadline of the whole reduction
};

/// The committed step to apply.
struct apply_env {
  int64_t step = 0;         ///< 1-based
  int64_t total_steps = 0;  ///< the schedule's length, for learning-rate schedules
  comm::op_options opts;    ///< for an apply that communicates (ZeRO's all-gather)
  double job_loss = 0;      ///< the job's mean loss of the step, as the coordinator committed it
};

/// A validation estimate's share for this rank.
struct eval_env {
  uint64_t seed = 0;
  int batches = 0;  ///< validation batches of the whole job; replica i takes b % size == i
  data_parallel_place dp;
};
struct eval_result {
  double loss_sum = 0;  ///< sum of per-batch mean losses
  int64_t batches = 0;  ///< 0 = this workload does not evaluate (no eval event)
};

// ---- the workload -------------------------------------------------------------------------

/// Which layouts a workload can run; the coordinator plans within them.
enum class layout_support : uint8_t {
  data_parallel,  ///< dp only (tp = pp = ep = 1, no ZeRO): every user workload, at first
  planned,        ///< whatever strategies/planner.hpp plans for it (the built-in GPT)
};

/// Who sums the gradients over the data-parallel group.
enum class reduction : uint8_t {
  by_runtime,   ///< gradient_buckets(), overlapped through the gradient_sink
  by_workload,  ///< reduce() (the GPT: bucketed all-reduce, ZeRO-1's reduce-scatter, tp)
};

/// What a workload is, once per process.
struct workload_traits {
  std::string name;  ///< for logs and the job_start event: "gpt", "python train.py", ...
  layout_support layouts = layout_support::data_parallel;
  reduction reduces = reduction::by_runtime;
  /// A loss below zero is divergence (a cross-entropy): such a step is never committed.
  /// Off for a loss that may be negative (a log-likelihood bound, a regression offset).
  bool nonnegative_loss = true;
  std::string count_unit = "samples";  ///< what step_outcome::count counts: "tokens" | "samples"
  /// The state table may differ between processes of the job (a PyTorch optimizer's state
  /// appears at its first step): a restore or transfer sends the table first and calls
  /// begin_restore() with it. Off: every rank's table is fixed by the config (the GPT).
  bool dynamic_state = false;
  /// The host (a Python script) runs compute and apply itself between the runtime's calls
  /// (docs/WORKLOAD.md "Two drivers"); compute() and apply() are never called.
  bool host_driven = false;
};

/// One generation's part of a workload on this rank: its communicators, its share of the
/// batch, and (for layouts that shard it) its state. Replaced as a whole when the generation
/// changes; the runtime keeps the previous one alive until the new one has its state.
class workload_generation {
 public:
  virtual ~workload_generation() = default;

  /// This rank's state, in place. The same view (same table and region sizes) until
  /// begin_restore() or the end of the generation.
  virtual state_view state() = 0;

  /// The job's initial state (source `init`): a pure function of the seed, the same on every
  /// rank. May use the data-parallel group (a Python job checks that every replica built the
  /// same model).
  virtual void init(uint64_t seed) = 0;

  /// Source `self`: this process held this rank's state at the start step in `previous` (same
  /// coordinates). Default: copies every region of previous.state() into state(), which must
  /// have the same table; a workload whose state outlives generations (Python) does nothing.
  virtual void keep_state(workload_generation& previous);

  /// Before a restore (checkpoint or peer) fills state(): the incoming table and extras. A
  /// dynamic_state workload makes state() match `incoming` (scratch memory that end_restore()
  /// moves into the live objects, so a failed restore leaves them untouched). Default: throws
  /// workload_error unless `incoming` equals state().tensors.
  virtual void begin_restore(std::span<const tensor_decl> incoming, std::string_view extras_json);
  /// After every byte of state() was filled and the counters set.
  virtual void end_restore() {}
  /// A restore begun with begin_restore() failed (a peer lost, a damaged chunk, a mismatch):
  /// drop what it made. state() is the live state again; the generation is not trained.
  virtual void cancel_restore() noexcept {}

  /// Forward and backward over this rank's share of a step, gradients scaled so that their sum
  /// over ranks is the gradient of the global batch's mean loss. Leaves parameters and
  /// optimizer state unchanged. Throws to fail the step (comm::comm_error for a collective).
  virtual step_outcome compute(const step_work& work) = 0;

  /// reduction::by_runtime: the gradient memory, in buckets; stable for the generation.
  virtual std::vector<gradient_bucket> gradient_buckets() { return {}; }
  /// reduction::by_workload: sums gradients over the data-parallel group (and whatever else
  /// the layout needs) within env's deadline.
  virtual void reduce(const reduce_env& env) {
    (void)env;
    throw std::logic_error(
        "workload_generation::reduce: this workload's gradients are reduced "
        "by the runtime (reduction::by_runtime)");
  }
  /// reduction::by_workload: the L2 norm of the gradients this rank holds after reduce(),
  /// without communication (the runtime computes it itself for by_runtime).
  virtual double local_grad_norm() const { return 0.0; }
  /// reduction::by_workload: where reduce() also summed the step's loss over the group (the
  /// GPT's --reduction exact, which sums it in one order on any world), this rank's part of
  /// it for the vote in place of compute()'s loss_sum; nullopt (the default) keeps that.
  virtual std::optional<double> reduced_loss_sum() const { return std::nullopt; }

  /// The committed step: update parameters and optimizer state. Only after the runtime's
  /// commit; an exception here leaves the rank's state unusable (the job restores it).
  virtual void apply(const apply_env& env) = 0;
  /// The learning rate step `step` applies with (reported in the vote; 0 = not known).
  virtual double learning_rate(int64_t step) const {
    (void)step;
    return 0.0;
  }

  /// This rank's part of a validation estimate, after an apply (collective for some layouts).
  virtual eval_result evaluate(const eval_env& env) {
    (void)env;
    return {};
  }

  /// Makes compute, reduce and apply in flight fail promptly (aborts the generation's
  /// communicators; a workload that can also stops its forward/backward). Any thread,
  /// idempotent; the generation is not used for training afterwards.
  virtual void abort() noexcept = 0;

  /// The data-parallel group's communicator, whose members hold the same state: state goes
  /// to a newcomer through it, and a shrink starts from it. Null if there is none.
  virtual comm::communicator* replica_group() { return nullptr; }
  /// Bytes of optimizer state this rank holds, for the vote's figures.
  virtual size_t optimizer_state_bytes() const { return 0; }
};

/// What is trained, once per worker process: data, model definition, settings. Makes one
/// workload_generation per generation the process takes a rank in.
class workload {
 public:
  virtual ~workload() = default;
  virtual workload_traits traits() const = 0;
  /// Builds this rank's part of a generation (its communicators, through env.connect) without
  /// touching the state of the generation before; throws (comm::connect_error, workload_error)
  /// when it cannot. State comes next: init, keep_state, or a restore.
  virtual std::unique_ptr<workload_generation> make_generation(const generation_env& env) = 0;
};

/// Makes the workload of a worker process once the coordinator has sent the job's settings.
using workload_factory = std::function<std::unique_ptr<workload>(const job_settings&)>;

// ---- defaults -----------------------------------------------------------------------------

inline void workload_generation::keep_state(workload_generation& previous) {
  state_view from = previous.state();
  state_view to = state();
  if (from.tensors != to.tensors || from.regions.size() != to.regions.size() ||
      from.counters.size() != to.counters.size())
    throw workload_error(
        "the state to keep has another table than the new generation's (a layout mismatch)");
  for (size_t i = 0; i < from.regions.size(); ++i) {
    if (from.regions[i].bytes.size() != to.regions[i].bytes.size())
      throw workload_error("state array " + to.regions[i].array +
                           " has another size in the new generation (a layout mismatch)");
    std::memcpy(to.regions[i].bytes.data(), from.regions[i].bytes.data(),
                from.regions[i].bytes.size());
  }
  for (size_t i = 0; i < from.counters.size(); ++i) *to.counters[i].value = *from.counters[i].value;
}

inline void workload_generation::begin_restore(std::span<const tensor_decl> incoming,
                                               std::string_view extras_json) {
  (void)extras_json;
  const state_view mine = state();
  if (!std::equal(incoming.begin(), incoming.end(), mine.tensors.begin(), mine.tensors.end())) {
    for (const tensor_decl& t : incoming) {
      const auto it = std::find_if(mine.tensors.begin(), mine.tensors.end(),
                                   [&](const tensor_decl& m) { return m.name == t.name; });
      if (it == mine.tensors.end())
        throw workload_error("the state to restore has tensor " + t.name +
                             ", which this workload does not");
      if (!(*it == t))
        throw workload_error("tensor " + t.name +
                             " has another shape, dtype or array in the state to restore");
    }
    throw workload_error("the state to restore lacks tensors this workload has");
  }
}

}  // namespace troupe
