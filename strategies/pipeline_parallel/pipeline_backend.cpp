// The pipeline backend: any dp x tp x pp layout of the dense model, with ZeRO-1 or without.
// Each rank holds the tensor-parallel shard of its stage's layers (tp_gpt with a stage_span);
// a step runs the GPipe or 1F1B schedule over the replica's micro-batches, sums the tied
// embedding's gradient between the first and last stage, then reduces over the dp group.
// Under --reduction exact each backward pass's gradient is kept apart and summed along the
// tree over the dp group first, and the tied embedding's sums of the two stages are added
// after: the same bits at any dp size, for a fixed tp and pp.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/comm/timed_communicator.hpp"
#include "runtime/optim/adamw.hpp"
#include "strategies/data_parallel.hpp"
#include "strategies/engine_backend.hpp"
#include "strategies/exact_reducer.hpp"
#include "strategies/pipeline_parallel/pipeline_executor.hpp"
#include "strategies/planner.hpp"
#include "strategies/state_layout.hpp"
#include "strategies/tensor_parallel/tp_gpt.hpp"
#include "strategies/zero.hpp"

namespace troupe::strategies {
namespace {

class pipeline_backend final : public engine_backend {
 public:
  pipeline_backend(const train_config& cfg, const layout& shape, int rank, uint64_t generation,
                   const connect_fn& connect, const micro_batching& batching);

  void init(uint64_t seed) override { model_->init_params(seed); }
  void restore(const ckpt::full_state& full) override;
  grad_result compute(const token_dataset& data, int64_t step0) override;
  void reduce(const comm::op_options& opts) override;
  double local_grad_norm() const override {
    return exact_ ? grad_norm_ : adamw::grad_norm(model_->grads(), model_->num_params());
  }
  std::optional<double> reduced_loss_sum() const override { return reduced_loss_; }
  void apply(int64_t step0, const comm::op_options& opts) override;
  double learning_rate(int64_t step0) const override {
    return zero_ ? zero_->learning_rate(step0, cfg_.steps)
                 : replicated_->learning_rate(step0, cfg_.steps);
  }
  eval_share evaluate(const token_dataset& data) override;
  ckpt::state_map state_map() const override;
  local_state state() override {
    return zero_ ? state_of(model_->params(), model_->num_params(), *zero_)
                 : state_of(model_->params(), model_->num_params(), *replicated_);
  }
  bool reports_loss() const override { return last_stage() && view_.tp.index == 0; }
  size_t num_full_params() const override { return model_->full_num_params(); }
  size_t optimizer_state_bytes() const override;
  double take_model_comm_seconds() override {
    return tp_comm_->take_seconds() + pp_comm_->take_seconds();
  }
  std::string pipeline_trace() const override;
  void set_pipeline_observer(pipeline_observer* observer) override { observer_ = observer; }
  void abort() override;
  comm::communicator* replica_group() override { return dp_comm_.get(); }

 private:
  bool last_stage() const { return view_.at.pp == shape_.pp - 1; }
  void reduce_exactly(const comm::op_options& opts);
  double global_norm(const float* grads, size_t offset, size_t count, bool sharded_over_dp,
                     const comm::op_options& opts);

  train_config cfg_;
  layout shape_;
  rank_view view_;
  int micro_batches_ = 0;  // per replica
  int micro_batch_size_ = 0;
  int first_sample_ = 0;  // the replica's first sample of a step
  std::unique_ptr<comm::communicator> dp_comm_, embd_comm_;
  std::unique_ptr<comm::timed_communicator> tp_comm_, pp_comm_;
  std::unique_ptr<tensor_parallel::tp_gpt> model_;
  std::unique_ptr<pipeline_executor> executor_;
  std::optional<adamw> replicated_;
  std::optional<zero1_optimizer> zero_;
  gradient_allreducer allreducer_;
  std::vector<uint8_t> counted_;  // per local value: 1 if it counts in the full model's norm
  // --reduction exact: the tree over the step's micro-batches, the buffer each backward pass's
  // gradient is swapped into, the job's loss (first replica) and this rank's gradient norm.
  std::optional<exact_reducer> exact_;
  std::vector<float> leaf_;
  std::optional<double> reduced_loss_;
  double grad_norm_ = 0;
  std::vector<timed_op> timeline_;
  pipeline_observer* observer_ = nullptr;
};

pipeline_backend::pipeline_backend(const train_config& cfg, const layout& shape, int rank,
                                   uint64_t generation, const connect_fn& connect,
                                   const micro_batching& batching)
    : cfg_(cfg),
      shape_(shape),
      view_(view_of(shape, rank)),
      allreducer_(static_cast<size_t>(cfg.bucket_bytes)) {
  if (cfg.model.experts > 0 || shape.ep > 1)
    throw std::logic_error("pipeline_backend: layout " + describe(shape) +
                           " belongs to the expert backend");
  const bool exact = backend_reduces_exactly(cfg, shape, !batching.empty(), "pipeline_backend");
  std::vector<layer_range> stages;
  if (!batching.empty()) {
    // The coordinator's plan (already checked there): this replica's count, possibly not the
    // even one, and the stages every plan of this pp has.
    if (static_cast<int>(batching.replica_micro_batches.size()) != shape.dp)
      throw std::invalid_argument("pipeline_backend: the plan divides the batch among " +
                                  std::to_string(batching.replica_micro_batches.size()) +
                                  " replicas, the layout has " + std::to_string(shape.dp));
    const auto share =
        replica_share(batching.replica_micro_batches, batching.micro_batch_size, view_.dp.index);
    micro_batch_size_ = batching.micro_batch_size;
    micro_batches_ = batching.replica_micro_batches[static_cast<size_t>(view_.dp.index)];
    first_sample_ = share.first;
    stages = stage_layers(cfg.model.n_layer, shape.pp);
  } else {
    // Built without a plan (tests): plan the even division here.
    const layout_plan plan =
        make_plan(shape, cfg.model, constraints_from(cfg));  // throws with the rule broken
    micro_batches_ = plan.micro_batches_per_replica;
    micro_batch_size_ = plan.micro_batch_size;
    first_sample_ = view_.dp.index * micro_batches_ * micro_batch_size_;
    stages = plan.stages;
  }

  auto make = [&](const group& g) {
    return connect({generation, g.name, g.index, static_cast<int>(g.ranks.size())});
  };
  tp_comm_ = std::make_unique<comm::timed_communicator>(make(view_.tp));
  pp_comm_ = std::make_unique<comm::timed_communicator>(make(view_.pp));
  dp_comm_ = make(view_.dp);
  if (shape.pp > 1 && view_.embd) embd_comm_ = make(*view_.embd);

  const layer_range layers = stages[static_cast<size_t>(view_.at.pp)];
  tensor_parallel::stage_span span;
  span.first_layer = layers.first;
  span.last_layer = layers.last;
  span.embedding = view_.at.pp == 0;
  span.head = last_stage();
  const comm::op_options opts{std::chrono::milliseconds(cfg.step_timeout_ms)};
  model_ = std::make_unique<tensor_parallel::tp_gpt>(cfg.model, *tp_comm_, opts, span);
  model_->sum_in_rank_order(exact);
  executor_ = std::make_unique<pipeline_executor>(
      *model_, *pp_comm_, parse_schedule_kind(cfg.parallel.schedule), micro_batches_,
      micro_batch_size_, cfg.model.context);
  // Validation runs micro-batches of cfg.micro_batch through slot 0.
  model_->reserve_slots(std::max(micro_batch_size_, cfg.micro_batch), executor_->slots());

  counted_.assign(model_->num_params(), 0);
  const auto& table = model_->param_table();
  for (size_t i = 0; i < table.size(); ++i)
    if (model_->counts_in_norm(i))
      std::fill_n(counted_.begin() + static_cast<std::ptrdiff_t>(table[i].offset), table[i].numel,
                  1);

  const int dp_size = static_cast<int>(view_.dp.ranks.size());
  if (cfg.parallel.zero == 1) {
    // The exact reduction's shards hold whole norm blocks and clip as dp does.
    const zero_options how = exact ? zero_options{norm_block, true} : zero_options{};
    zero_.emplace(cfg.optim, table, model_->num_params(), view_.dp.index, dp_size, how);
  } else {
    replicated_.emplace(cfg.optim, table, model_->num_params());
  }
  if (exact) {
    exact_.emplace(batching.replica_micro_batches, view_.dp.index, model_->num_params(),
                   static_cast<size_t>(std::max(cfg.bucket_bytes, 4)) / sizeof(float),
                   executor_->backward_descending());
    leaf_.resize(model_->num_params());
  }
}

void pipeline_backend::restore(const ckpt::full_state& full) {
  if (full.params.size() != model_->full_num_params())
    throw std::runtime_error("checkpoint holds " + std::to_string(full.params.size()) +
                             " parameters but the model has " +
                             std::to_string(model_->full_num_params()));
  // load_from_full cuts this rank's slices into the parameter buffer, so the moments pass
  // through it first.
  const size_t n = model_->num_params();
  auto cut = [&](const std::vector<float>& full_vector) {
    model_->load_from_full(full_vector.data());
    return std::vector<float>(model_->params(), model_->params() + n);
  };
  std::vector<float> m = cut(full.exp_avg), v = cut(full.exp_avg_sq);
  model_->load_from_full(full.params.data());
  if (zero_) {
    const auto& sh = zero_->shard();
    const auto first = static_cast<std::ptrdiff_t>(sh.offset),
               last = static_cast<std::ptrdiff_t>(sh.offset + sh.count);
    std::copy(m.begin() + first, m.begin() + last, zero_->exp_avg().begin());
    std::copy(v.begin() + first, v.begin() + last, zero_->exp_avg_sq().begin());
    zero_->t() = full.adam_t;
  } else {
    replicated_->exp_avg() = std::move(m);
    replicated_->exp_avg_sq() = std::move(v);
    replicated_->t() = full.adam_t;
  }
}

grad_result pipeline_backend::compute(const token_dataset& data, int64_t step0) {
  const int G = cfg_.batch, T = cfg_.model.context, B = micro_batch_size_;
  const int first = first_sample_;
  model_->zero_grads();
  const comm::op_options opts{std::chrono::milliseconds(cfg_.step_timeout_ms)};
  auto fill = [&](int index, token_id* in, token_id* tgt) {
    data.fill_train(cfg_.seed, step0, first + index * B, B, T, in, tgt);
  };
  // The same B/G scaling per micro-batch as the single-rank step (runtime/trainer.hpp).
  const auto scale = static_cast<float>(static_cast<double>(B) / G);
  after_backward_fn keep_apart;
  if (exact_) {
    exact_->begin_step();
    reduced_loss_.reset();
    keep_apart = [&](int micro_batch, double loss_sum) {
      model_->swap_grads(leaf_);
      exact_->add_micro_batch(first / B + micro_batch, leaf_, loss_sum);
      model_->zero_grads();
    };
  }
  stage_step s = executor_->run(fill, scale, opts, observer_, keep_apart);
  // Every step of the session, for the trace: a few dozen passes per step.
  for (timed_op& t : s.timeline) {
    t.step = step0 + 1;
    timeline_.push_back(t);
  }
  grad_result r;
  r.loss_sum = s.loss_sum;
  r.tokens = s.tokens;
  r.compute_s = s.compute_s;
  return r;
}

void pipeline_backend::reduce(const comm::op_options& opts) {
  if (exact_) return reduce_exactly(opts);
  // The tied embedding: the first stage's wte and the last stage's copy get the sum of both
  // gradients, so both apply the same update and stay equal.
  if (embd_comm_)
    embd_comm_->all_reduce(model_->grads() + model_->wte_offset(), model_->wte_numel(),
                           comm::reduce_op::sum, opts);
  if (zero_) {
    zero_->reduce_gradients(*dp_comm_, model_->grads(), opts);
  } else {
    allreducer_.all_reduce(*dp_comm_, model_->grads(), model_->num_params(), opts);
  }
}

// Each replica's gradient along the tree over dp, then the tied embedding: the first and last
// stage's tree sums added (in either order: the same bits on both). With ZeRO-1 the shard is
// reduce-scattered and the embedding's region, all-reduced and summed, overwrites its part.
void pipeline_backend::reduce_exactly(const comm::op_options& opts) {
  const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
  const auto rest = [&] { return remaining(deadline, opts); };
  float* grads = model_->grads();
  const size_t n = model_->num_params();
  size_t wte = 0, wte_end = 0;  // the tied embedding, on the first and last stage
  if (embd_comm_) {
    wte = model_->wte_offset();
    wte_end = wte + model_->wte_numel();
  }
  if (zero_) {
    const zero_shard& sh = zero_->shard();
    exact_->reduce_scatter(*dp_comm_, sh.block, zero_->grad_shard(), rest());
    if (embd_comm_) {
      exact_->all_reduce(*dp_comm_, grads, wte, wte_end, rest());
      embd_comm_->all_reduce(grads + wte, wte_end - wte, comm::reduce_op::sum, rest());
      const size_t lo = std::max(wte, sh.offset), hi = std::min(wte_end, sh.offset + sh.count);
      if (lo < hi) std::copy(grads + lo, grads + hi, zero_->grad_shard() + (lo - sh.offset));
    }
    // This rank's part only (finite exactly when its values are): the divergence check's.
    grad_norm_ = adamw::grad_norm(zero_->grad_shard(), sh.count);
  } else {
    exact_->all_reduce(*dp_comm_, grads, rest());
    if (embd_comm_)
      embd_comm_->all_reduce(grads + wte, wte_end - wte, comm::reduce_op::sum, rest());
    grad_norm_ = adamw::grad_norm(grads, n);
  }
  const double total = exact_->job_loss_sum(*dp_comm_, rest());
  reduced_loss_ = view_.dp.index == 0 ? total : 0.0;
}

double pipeline_backend::global_norm(const float* grads, size_t offset, size_t count,
                                     bool sharded_over_dp, const comm::op_options& opts) {
  double sq = 0;
  if (exact_) {
    // In fixed blocks (gathered over dp for a shard): the same bits at any dp size, and
    // ZeRO-1's the same as the replicated update's.
    sq = sharded_over_dp ? exact_sq_sum(*dp_comm_, grads, offset, count, zero_->shard().block, opts,
                                        counted_.data() + offset)
                         : exact_sq_sum(grads, count, counted_.data() + offset);
    sharded_over_dp = false;
  } else {
    for (size_t i = 0; i < count; ++i)
      if (counted_[offset + i] != 0) sq += static_cast<double>(grads[i]) * grads[i];
  }
  // Summed over the dp group (ZeRO shards), then tp, then pp: each sum is the same on every
  // member, so the norm, and with it every clipping factor, is the same on every rank.
  if (sharded_over_dp) sq = comm::sum_in_rank_order(*dp_comm_, sq, opts);
  sq = comm::sum_in_rank_order(*tp_comm_, sq, opts);
  sq = comm::sum_in_rank_order(*pp_comm_, sq, opts);
  return std::sqrt(sq);
}

void pipeline_backend::apply(int64_t step0, const comm::op_options& opts) {
  if (zero_) {
    zero_->apply(*dp_comm_, model_->params(), step0, cfg_.steps, opts,
                 [&](const float* g, const zero_shard& sh) {
                   return global_norm(g, sh.offset, sh.count, true, opts);
                 });
    return;
  }
  const double norm = global_norm(model_->grads(), 0, model_->num_params(), false, opts);
  if (!std::isfinite(norm)) return;
  replicated_->clip_to_norm(model_->grads(), model_->num_params(), norm);
  replicated_->step(model_->params(), model_->grads(), step0, cfg_.steps);
}

eval_share pipeline_backend::evaluate(const token_dataset& data) {
  // Batch b belongs to replica b % dp, so the set of batches is the same for every layout.
  eval_share out;
  const int B = cfg_.micro_batch, T = cfg_.model.context;
  const int dp_rank = view_.dp.index, dp_size = static_cast<int>(view_.dp.ranks.size());
  const comm::op_options opts{std::chrono::milliseconds(cfg_.step_timeout_ms)};
  std::vector<token_id> in(static_cast<size_t>(B) * static_cast<size_t>(T)), tgt(in.size());
  std::vector<double> losses;
  for (int b = dp_rank; b < cfg_.eval_batches; b += dp_size) {
    data.fill_val(cfg_.seed, b, 0, B, T, in.data(), tgt.data());
    losses.push_back(executor_->forward_only(in.data(), tgt.data(), B, opts));
    out.loss_sum += losses.back();
    ++out.batches;
  }
  if (exact_) {  // as the dense backend: in batch order, reported by the first replica
    const double total = exact_eval_sum(*dp_comm_, losses, cfg_.eval_batches, opts);
    out = dp_rank == 0 ? eval_share{total, cfg_.eval_batches} : eval_share{};
  }
  if (!reports_loss()) out = {};
  return out;
}

ckpt::state_map pipeline_backend::state_map() const {
  const int dp = static_cast<int>(view_.dp.ranks.size());
  auto params = pieces_of(*model_, dp, view_.dp.index);
  if (zero_)
    return zero_state_map(std::move(params), zero_->shard().offset, zero_->shard().count, dp);
  return replicated_state_map(std::move(params));
}

size_t pipeline_backend::optimizer_state_bytes() const {
  if (zero_) return zero_->state_bytes();
  return (replicated_->exp_avg().capacity() + replicated_->exp_avg_sq().capacity()) * sizeof(float);
}

std::string pipeline_backend::pipeline_trace() const {
  if (shape_.pp == 1) return {};
  return chrome_trace_json(timeline_);
}

void pipeline_backend::abort() {
  for (comm::communicator* c :
       {static_cast<comm::communicator*>(tp_comm_.get()),
        static_cast<comm::communicator*>(pp_comm_.get()), dp_comm_.get(), embd_comm_.get()})
    if (c != nullptr) c->abort();
}

}  // namespace

std::unique_ptr<engine_backend> make_pipeline_backend(const train_config& cfg, const layout& shape,
                                                      int rank, uint64_t generation,
                                                      const connect_fn& connect,
                                                      const micro_batching& batching) {
  return std::make_unique<pipeline_backend>(cfg, shape, rank, generation, connect, batching);
}

}  // namespace troupe::strategies
