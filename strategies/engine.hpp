#pragma once
// One rank's part of a training step for a given layout: its shard of the model, its
// communicators (one per group it belongs to), its optimizer, and how each stage of the step
// runs on them. The layout picks the backend (strategies/engine_backend.hpp).

#include <memory>
#include <string>

#include "strategies/engine_backend.hpp"

namespace troupe::strategies {

/// Everything one rank owns for one generation. Replaced as a whole when the layout or
/// the generation changes; nothing in it is global.
class training_engine {
 public:
  /// Builds the communicators of every group `rank` belongs to in `shape` and the model
  /// shard. Throws std::invalid_argument for a layout no backend can run.
  training_engine(const train_config& cfg, const layout& shape, int rank, uint64_t generation,
                  const connect_fn& connect, const micro_batching& batching = {});

  /// Parameters of the full model, from the seed (every layout gets the same ones).
  void init(uint64_t seed) { backend_->init(seed); }
  /// Loads a checkpoint's full flat state (of the single-rank layout) into this shard.
  void restore(const ckpt::full_state& full) { backend_->restore(full); }

  /// Stage 2: forward and backward over this rank's share of step `step0` (0-based).
  grad_result compute(const token_dataset& data, int64_t step0) {
    return backend_->compute(data, step0);
  }
  /// Stage 3: sums gradients over the data-parallel group (or reduce-scatters them, ZeRO).
  void reduce(const comm::op_options& opts) { backend_->reduce(opts); }
  /// After reduce: the norm of this rank's gradients, for the divergence check (no collective).
  double local_grad_norm() const { return backend_->local_grad_norm(); }
  /// After reduce: the loss sum the backend settled (--reduction exact), else nullopt.
  std::optional<double> reduced_loss_sum() const { return backend_->reduced_loss_sum(); }
  /// Stage 4, after the commit: clip by the global norm and apply AdamW.
  void apply(int64_t step0, const comm::op_options& opts) { backend_->apply(step0, opts); }
  double learning_rate(int64_t step0) const { return backend_->learning_rate(step0); }

  /// This rank's part of the validation loss (a collective for tp, pp and ep).
  eval_share evaluate(const token_dataset& data) { return backend_->evaluate(data); }
  /// Where this rank's state sits in the single-rank model, for checkpoints (no collective).
  ckpt::state_map state_map() const { return backend_->state_map(); }

  /// Whether this rank's loss and validation figures count (one rank per replica reports,
  /// so peers computing or sharing the same loss are not added twice).
  bool reports_loss() const { return backend_->reports_loss(); }
  size_t num_full_params() const { return backend_->num_full_params(); }
  size_t optimizer_state_bytes() const { return backend_->optimizer_state_bytes(); }
  /// Seconds spent in collectives inside the model (tp, pp, ep) since the last call: part
  /// of stage 3, though it runs during stage 2.
  double take_model_comm_seconds() { return backend_->take_model_comm_seconds(); }
  expert_load take_expert_load() { return backend_->take_expert_load(); }
  std::string pipeline_trace() const { return backend_->pipeline_trace(); }
  void set_pipeline_observer(pipeline_observer* observer) {
    backend_->set_pipeline_observer(observer);
  }
  /// This rank's state buffers, for handing to the rank that takes its place.
  local_state state() { return backend_->state(); }
  /// Aborts every communicator (thread-safe); collectives in flight fail promptly.
  void abort() { backend_->abort(); }
  /// The data-parallel group's communicator, already connected (nullptr if none fits): a
  /// replica sends its state to a newcomer through it.
  comm::communicator* replica_group() { return backend_->replica_group(); }

 private:
  std::unique_ptr<engine_backend> backend_;
};

}  // namespace troupe::strategies
