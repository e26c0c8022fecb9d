#pragma once
// Runs one stage's program of a pipeline schedule (strategies/pipeline_schedule.hpp) for one
// step: the forward and backward passes of its micro-batches on a stage model, with the
// activations and their gradients moved to the neighbouring stages by send/recv.

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "strategies/pipeline_schedule.hpp"
#include "strategies/tensor_parallel/tp_gpt.hpp"

namespace troupe::strategies {

/// Fills micro-batch `index` of this replica's step: B sequences of T input bytes and the
/// T target bytes of each.
using micro_batch_fn = std::function<void(int index, token_id* inputs, token_id* targets)>;

/// Called after each backward pass with the replica's micro-batch index and, on the last
/// stage, that micro-batch's loss summed over its tokens (0 elsewhere); it may take the
/// model's gradients and zero them (the exact reduction keeps micro-batches apart).
using after_backward_fn = std::function<void(int micro_batch, double loss_sum)>;

/// Told before and after every pass of the schedule (the stage actor listens to these).
struct pipeline_observer {
  virtual ~pipeline_observer() = default;
  /// A pass needs its input from a neighbour: called before the receive is posted, or just
  /// after it when a held send had to go out in the same exchange. Throws to fail the step.
  virtual void waiting(const pipe_op& op) { (void)op; }
  virtual void done(const timed_op& op) { (void)op; }
};

/// What one stage's part of a step produced.
struct stage_step {
  double loss_sum = 0;   ///< last stage: sum of per-token losses; others 0
  int64_t tokens = 0;    ///< last stage: tokens whose loss is in loss_sum
  double compute_s = 0;  ///< seconds in forward and backward passes
  std::vector<timed_op>
      timeline;  ///< each pass, in steady-clock seconds (comparable across processes)
};

/// One pipeline stage: model span, neighbours on `pp` (stage s is rank s of it), schedule.
class pipeline_executor {
 public:
  /// `model` and `pp` must outlive the executor. `micro_batches` m of `batch` sequences of
  /// `context` tokens each step. Reserves the model's activation slots for the schedule's
  /// peak (m for GPipe, at most p - s for 1F1B). Throws std::invalid_argument for a bad
  /// schedule size.
  pipeline_executor(tensor_parallel::tp_gpt& model, comm::communicator& pp, pipe_schedule_kind kind,
                    int micro_batches, int batch, int context);

  /// Runs this stage's program for one step. Gradients accumulate into the model's grads()
  /// (the caller zeroes them); the head scales micro-batch losses by grad_scale. Throws
  /// comm::comm_error when a neighbour fails or the deadline in `opts` passes.
  stage_step run(const micro_batch_fn& fill, float grad_scale, const comm::op_options& opts,
                 pipeline_observer* observer = nullptr,
                 const after_backward_fn& after_backward = {});
  /// Whether this stage's backward passes run from the last micro-batch down (GPipe) rather
  /// than up (1F1B).
  bool backward_descending() const;

  /// Forward only, one micro-batch of B sequences at a time through every stage, for the
  /// validation loss: returns the mean loss on the last stage (0 elsewhere).
  double forward_only(const token_id* inputs, const token_id* targets, int B,
                      const comm::op_options& opts);

  int stage() const { return stage_; }
  int stages() const { return stages_; }
  const std::vector<pipe_op>& program() const { return program_; }
  int slots() const { return slots_; }

 private:
  tensor_parallel::tp_gpt& model_;
  comm::communicator& pp_;
  int stage_ = 0, stages_ = 1;
  int micro_batches_ = 0, batch_ = 0, context_ = 0;
  int slots_ = 1;
  std::vector<pipe_op> program_;
  std::vector<token_id> inputs_, targets_;  // [slots][batch * context]
  std::vector<float> grad_out_;             // staging for the gradient sent to the previous stage
  std::vector<double> losses_;              // last stage: this step's, per micro-batch
};

}  // namespace troupe::strategies
