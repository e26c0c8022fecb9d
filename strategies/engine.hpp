#pragma once
// One rank's part of a training step for a given layout: its shard of the model (dense or
// tensor-parallel), its communicators (one per group it belongs to), its optimizer
// (replicated or ZeRO-1), and how each stage of the step runs on them.

#include "checkpoint/checkpoint.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/comm/timed_communicator.hpp"
#include "runtime/config.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/model/gpt.hpp"
#include "runtime/optim/adamw.hpp"
#include "runtime/trainer.hpp"
#include "strategies/data_parallel.hpp"
#include "strategies/mesh.hpp"
#include "strategies/zero.hpp"

#include <functional>
#include <memory>
#include <optional>

namespace troupe::tensor_parallel {
class tp_gpt;
}

namespace troupe::strategies {

/// Builds a communicator for a group; the rank's actor supplies it (store, generation).
using connect_fn = std::function<std::unique_ptr<comm::communicator>(const comm::comm_identity&)>;

/// A rank's part of a validation estimate.
struct eval_share {
  double loss_sum = 0;  ///< sum of per-batch mean losses
  int64_t batches = 0;
};

/// Everything one rank owns for one generation. Replaced as a whole when the layout or
/// the generation changes; nothing in it is global.
class training_engine {
 public:
  /// Builds the communicators of every group `rank` belongs to in `shape` and the model
  /// shard. Throws std::invalid_argument for a layout this engine cannot run.
  training_engine(const train_config& cfg, const layout& shape, int rank, uint64_t generation,
                  const connect_fn& connect);
  ~training_engine();

  /// Parameters of the full model, from the seed (every layout gets the same ones).
  void init(uint64_t seed);
  /// Loads a checkpoint's full flat state (of the single-rank layout) into this shard.
  void restore(const ckpt::full_state& full);

  /// Stage 2: forward and backward over this rank's share of step `step0` (0-based).
  grad_result compute(const byte_dataset& data, int64_t step0);
  /// Stage 3: sums gradients over the data-parallel group (or reduce-scatters them, ZeRO).
  void reduce(const comm::op_options& opts);
  /// Stage 4, after the commit: clip by the global norm and apply AdamW.
  void apply(int64_t step0, const comm::op_options& opts);
  double learning_rate(int64_t step0) const;

  /// This rank's part of the validation loss (a collective for tensor parallelism).
  eval_share evaluate(const byte_dataset& data);
  /// What this rank checkpoints: its owned range of the full flat layout (a collective for
  /// tensor parallelism, which gathers the shards first).
  ckpt::shard_state checkpoint_shard(int64_t step);

  /// Whether this rank's loss and validation figures count (one rank per replica reports,
  /// so tensor-parallel peers computing the same loss are not added twice).
  bool reports_loss() const { return view_.tp.index == 0; }
  size_t num_full_params() const { return full_numel_; }
  size_t optimizer_state_bytes() const;
  /// Seconds spent in collectives inside the model (tensor parallelism) since the last
  /// call: part of stage 3, though it runs during stage 2.
  double take_model_comm_seconds() { return tp_comm_ ? tp_comm_->take_seconds() : 0.0; }
  /// Aborts every communicator (thread-safe); collectives in flight fail promptly.
  void abort();

 private:
  train_config cfg_;
  layout shape_;
  rank_view view_;
  size_t full_numel_ = 0;
  std::unique_ptr<comm::communicator> dp_comm_;
  std::unique_ptr<comm::timed_communicator> tp_comm_;
  std::unique_ptr<gpt> dense_;
  std::unique_ptr<tensor_parallel::tp_gpt> tp_;
  std::optional<adamw> replicated_;
  std::optional<zero1_optimizer> zero_;
  gradient_allreducer allreducer_;
  ckpt::shard_range owned_;  // of the full flat layout, over the whole world
};

}  // namespace troupe::strategies
