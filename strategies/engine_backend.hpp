#pragma once
// The part of a training step that depends on the layout: one implementation per family of
// layouts (dense with dp/ZeRO/tp, pipeline stages, experts), chosen by training_engine.
// Every backend computes the same model as one rank with the same global batch.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/config.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/trainer.hpp"
#include "strategies/mesh.hpp"

namespace troupe::strategies {

struct pipeline_observer;

/// Builds a communicator for a group; the rank's actor supplies it (store, generation).
using connect_fn = std::function<std::unique_ptr<comm::communicator>(const comm::comm_identity&)>;

/// A rank's part of a validation estimate.
struct eval_share {
  double loss_sum = 0;  ///< sum of per-batch mean losses
  int64_t batches = 0;
};

/// Tokens routed to each expert during one step, per MoE block (expert parallelism only).
struct expert_load {
  std::vector<std::vector<int64_t>> tokens;  ///< [block][expert], summed over micro-batches
  std::vector<int64_t> dropped;              ///< [block] choices dropped by capacity
};

/// How a step's micro-batches are divided among data-parallel replicas: the plan's
/// (strategies/planner.hpp), handed down so that no backend plans again. Replica r runs
/// replica_micro_batches[r] micro-batches of micro_batch_size sequences. Empty: the even
/// split the config implies.
struct micro_batching {
  int micro_batch_size = 0;
  std::vector<int> replica_micro_batches;
  bool empty() const { return replica_micro_batches.empty(); }
};

/// A rank's own training state, in place: its parameters and AdamW moments as flat buffers in
/// a fixed order, and AdamW's step count. Two ranks whose pieces have the same coordinates
/// (same tp/pp/ep index and sizes, same ZeRO shard) have buffers of the same sizes, so one can
/// take the other's place by copying them (elastic recovery).
struct local_state {
  std::vector<std::span<float>> buffers;
  int64_t* adam_t = nullptr;
  size_t bytes() const {
    size_t n = sizeof(int64_t);
    for (const auto& b : buffers) n += b.size_bytes();
    return n;
  }
};

/// The local_state of `n` parameters at `params` and the AdamW moments and step count of
/// `optimizer` (adamw, or a ZeRO-1 shard of it: anything with exp_avg(), exp_avg_sq(), t()).
template <class Optimizer>
local_state state_of(float* params, size_t n, Optimizer& optimizer) {
  local_state s;
  s.buffers.emplace_back(params, n);
  s.buffers.emplace_back(optimizer.exp_avg().data(), optimizer.exp_avg().size());
  s.buffers.emplace_back(optimizer.exp_avg_sq().data(), optimizer.exp_avg_sq().size());
  s.adam_t = &optimizer.t();
  return s;
}

/// One rank's share of the model for one layout and one generation. Collective calls must be
/// made by every rank of the layout in the same order (see training_engine).
class engine_backend {
 public:
  virtual ~engine_backend() = default;

  virtual void init(uint64_t seed) = 0;
  virtual void restore(const ckpt::full_state& full) = 0;
  virtual grad_result compute(const token_dataset& data, int64_t step0) = 0;
  virtual void reduce(const comm::op_options& opts) = 0;
  /// The L2 norm, in double, of every gradient value this rank holds after reduce(), with no
  /// communication: the global norm where a rank holds the whole reduced gradient, a partial
  /// figure otherwise. Finite exactly when every value is, and a non-finite value anywhere in
  /// the reduced gradient reaches some rank's buffer, so the divergence check needs no more.
  virtual double local_grad_norm() const = 0;
  /// After reduce(), where the backend sums the step's loss itself (--reduction exact): this
  /// rank's loss sum for the vote, in place of compute()'s. nullopt: compute()'s stands.
  virtual std::optional<double> reduced_loss_sum() const { return std::nullopt; }
  virtual void apply(int64_t step0, const comm::op_options& opts) = 0;
  virtual double learning_rate(int64_t step0) const = 0;
  virtual eval_share evaluate(const token_dataset& data) = 0;
  /// Which boxes of the single-rank model this rank's state buffers hold, and which share of
  /// them it writes to a checkpoint (checkpoint/state_map.hpp). No communication.
  virtual ckpt::state_map state_map() const = 0;
  /// This rank's state buffers (see local_state); valid while the backend lives.
  virtual local_state state() = 0;

  virtual bool reports_loss() const = 0;
  virtual size_t num_full_params() const = 0;
  virtual size_t optimizer_state_bytes() const = 0;
  /// Seconds spent in collectives inside stage 2 since the last call.
  virtual double take_model_comm_seconds() { return 0.0; }
  /// The last step's expert load; empty for a dense model.
  virtual expert_load take_expert_load() { return {}; }
  /// A Chrome trace of this session's pipeline passes on this rank; empty without pp.
  virtual std::string pipeline_trace() const { return {}; }
  /// Told around every pipeline pass from now on (not owned; null = nobody); ignored without pp.
  virtual void set_pipeline_observer(pipeline_observer* observer) { (void)observer; }
  /// Aborts every communicator and, where the backend can, the model's pass in flight
  /// (thread-safe); the engine is not used for training afterwards.
  virtual void abort() = 0;
  /// The communicator of this rank's data-parallel group (view_of(...).dp), whose members hold
  /// the same state; nullptr where the backend has none that fits.
  virtual comm::communicator* replica_group() { return nullptr; }
};

/// Dense model: dp, ZeRO-1 and tp (without ZeRO) over `shape` with pp = ep = 1.
std::unique_ptr<engine_backend> make_dense_backend(const train_config& cfg, const layout& shape,
                                                   int rank, uint64_t generation,
                                                   const connect_fn& connect,
                                                   const micro_batching& batching = {});
/// Dense model over any dp x tp x pp layout, ZeRO-1 allowed: pipeline stages of tp shards.
std::unique_ptr<engine_backend> make_pipeline_backend(const train_config& cfg, const layout& shape,
                                                      int rank, uint64_t generation,
                                                      const connect_fn& connect,
                                                      const micro_batching& batching = {});
/// MoE model over dp x ep (tp = pp = 1), ZeRO-1 not supported. Each ep group runs the
/// micro-batches the plan gives its replicas (check_ep_batching says which plans it can run).
std::unique_ptr<engine_backend> make_expert_backend(const train_config& cfg, const layout& shape,
                                                    int rank, uint64_t generation,
                                                    const connect_fn& connect,
                                                    const micro_batching& batching = {});

}  // namespace troupe::strategies
