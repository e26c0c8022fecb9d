#include "strategies/pipeline_parallel/pipeline_executor.hpp"

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

namespace troupe::strategies {
namespace {

// One tag serves both directions: between stages s and s+1, s only ever sends activations
// and s+1 only ever sends gradients, and matching is per (peer, tag) in call order.
constexpr uint32_t activation_tag = 1;
constexpr uint32_t gradient_tag = 1;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// One half of a point-to-point transfer; none when peer < 0.
struct transfer {
  void* data = nullptr;
  size_t bytes = 0;
  int peer = -1;
  uint32_t tag = 0;
  explicit operator bool() const { return peer >= 0; }
};

}  // namespace

pipeline_executor::pipeline_executor(tensor_parallel::tp_gpt& model, comm::communicator& pp,
                                     pipe_schedule_kind kind, int micro_batches, int batch,
                                     int context)
    : model_(model),
      pp_(pp),
      stage_(pp.rank()),
      stages_(pp.size()),
      micro_batches_(micro_batches),
      batch_(batch),
      context_(context) {
  if (micro_batches < 1 || batch < 1 || context < 1)
    throw std::invalid_argument(
        "pipeline: need at least one micro-batch of at least one sequence, got " +
        std::to_string(micro_batches) + " of " + std::to_string(batch));
  const auto schedule = make_schedule(kind, stages_, micro_batches);
  if (const std::string why = check_schedule(schedule); !why.empty())
    throw std::logic_error("pipeline: the schedule is broken: " + why);
  program_ = schedule[static_cast<size_t>(stage_)];
  slots_ = peak_live_activations(schedule)[static_cast<size_t>(stage_)];
  model_.reserve_slots(batch, slots_);
  const size_t tokens = static_cast<size_t>(batch) * static_cast<size_t>(context);
  inputs_.assign(tokens * static_cast<size_t>(slots_), 0);
  targets_.assign(inputs_.size(), 0);
  grad_out_.assign(tokens * static_cast<size_t>(model.config().d_model), 0.0f);
}

bool pipeline_executor::backward_descending() const {
  int last = -1;
  for (const pipe_op& op : program_) {
    if (op.pass != pipe_pass::backward) continue;
    if (last >= 0) return op.micro_batch < last;
    last = op.micro_batch;
  }
  return false;
}

stage_step pipeline_executor::run(const micro_batch_fn& fill, float grad_scale,
                                  const comm::op_options& opts, pipeline_observer* observer,
                                  const after_backward_fn& after_backward) {
  const int B = batch_, T = context_;
  const size_t tokens = static_cast<size_t>(B) * static_cast<size_t>(T);
  const size_t act_bytes = tokens * static_cast<size_t>(model_.config().d_model) * sizeof(float);
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  stage_step out;
  transfer pending;  // a send held back to pair with the next op's receive
  losses_.assign(static_cast<size_t>(micro_batches_), 0.0);

  auto exchange = [&](const transfer& in) {
    if (pending && in) {
      pp_.send_recv(pending.data, pending.bytes, pending.peer, in.data, in.bytes, in.peer, in.tag,
                    opts);
    } else {
      if (pending) pp_.send(pending.data, pending.bytes, pending.peer, pending.tag, opts);
      if (in) pp_.recv(in.data, in.bytes, in.peer, in.tag, opts);
    }
    pending = transfer{};
  };

  for (const pipe_op& op : program_) {
    const int slot = op.micro_batch % slots_;
    token_id* in = inputs_.data() + tokens * static_cast<size_t>(slot);
    token_id* tgt = targets_.data() + tokens * static_cast<size_t>(slot);
    const bool fwd = op.pass == pipe_pass::forward;
    transfer need;
    if (fwd && !first)
      need = transfer{model_.stage_input(slot), act_bytes, stage_ - 1, activation_tag};
    if (!fwd && !last) need = transfer{model_.output_grad(), act_bytes, stage_ + 1, gradient_tag};
    // The neighbour's notice gates the receive, except when this stage still holds a send:
    // that send must be posted first (the neighbour may be blocked on it), so the pair goes
    // out together and the notice is taken after it.
    const bool gate = observer != nullptr && need && !pending;
    const bool confirm = observer != nullptr && need && pending;
    if (gate) observer->waiting(op);
    exchange(need);
    if (confirm) observer->waiting(op);

    timed_op t;
    t.stage = stage_;
    t.op = op;
    t.start = now_s();
    if (fwd) {
      fill(op.micro_batch, in, tgt);
      const double mean = model_.forward_stage(slot, in, tgt, B, T);
      if (last) {
        out.loss_sum += mean * static_cast<double>(tokens);
        out.tokens += static_cast<int64_t>(tokens);
        losses_[static_cast<size_t>(op.micro_batch)] = mean * static_cast<double>(tokens);
      } else {
        pending = transfer{const_cast<float*>(model_.stage_output(slot)), act_bytes, stage_ + 1,
                           activation_tag};
      }
    } else {
      model_.backward_stage(slot, in, tgt, B, T, grad_scale);
      if (!first) {
        std::memcpy(grad_out_.data(), model_.input_grad(), act_bytes);
        pending = transfer{grad_out_.data(), act_bytes, stage_ - 1, gradient_tag};
      }
      if (after_backward)
        after_backward(op.micro_batch, losses_[static_cast<size_t>(op.micro_batch)]);
    }
    t.end = now_s();
    out.compute_s += t.end - t.start;
    out.timeline.push_back(t);
    if (observer != nullptr) observer->done(t);
  }
  exchange(transfer{});
  return out;
}

double pipeline_executor::forward_only(const token_id* inputs, const token_id* targets, int B,
                                       const comm::op_options& opts) {
  const size_t act_bytes = static_cast<size_t>(B) * static_cast<size_t>(context_) *
                           static_cast<size_t>(model_.config().d_model) * sizeof(float);
  if (stage_ > 0) pp_.recv(model_.stage_input(0), act_bytes, stage_ - 1, activation_tag, opts);
  const double loss = model_.forward_stage(0, inputs, targets, B, context_);
  if (stage_ < stages_ - 1)
    pp_.send(model_.stage_output(0), act_bytes, stage_ + 1, activation_tag, opts);
  return loss;
}

}  // namespace troupe::strategies
