// The dense backend: data parallelism (bucketed all-reduce or ZeRO-1) and tensor
// parallelism, for layouts without pipeline stages or experts. The fastest path for those.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <optional>
#include <stdexcept>

#include "runtime/comm/timed_communicator.hpp"
#include "runtime/model/gpt.hpp"
#include "runtime/optim/adamw.hpp"
#include "strategies/data_parallel.hpp"
#include "strategies/engine_backend.hpp"
#include "strategies/exact_reducer.hpp"
#include "strategies/state_layout.hpp"
#include "strategies/tensor_parallel/tp_gpt.hpp"
#include "strategies/tensor_parallel/tp_train.hpp"
#include "strategies/zero.hpp"

namespace troupe::strategies {
namespace {

class dense_backend final : public engine_backend {
 public:
  dense_backend(const train_config& cfg, const layout& shape, int rank, uint64_t generation,
                const connect_fn& connect, const micro_batching& batching);

  void init(uint64_t seed) override;
  void restore(const ckpt::full_state& full) override;
  grad_result compute(const token_dataset& data, int64_t step0) override;
  void reduce(const comm::op_options& opts) override;
  double local_grad_norm() const override { return grad_norm_; }
  std::optional<double> reduced_loss_sum() const override { return reduced_loss_; }
  void apply(int64_t step0, const comm::op_options& opts) override;
  double learning_rate(int64_t step0) const override;
  eval_share evaluate(const token_dataset& data) override;
  ckpt::state_map state_map() const override;
  local_state state() override;
  bool reports_loss() const override { return view_.tp.index == 0; }
  size_t num_full_params() const override { return full_numel_; }
  size_t optimizer_state_bytes() const override;
  double take_model_comm_seconds() override { return tp_comm_ ? tp_comm_->take_seconds() : 0.0; }
  void abort() override;
  comm::communicator* replica_group() override { return dp_comm_.get(); }

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
  // --reduction exact: the tree over the step's micro-batches, the buffer the model's next
  // micro-batch gradient is swapped into, and the job's loss sum after reduce (on the first
  // replica; 0 on the others, so that the coordinator's sum in any order is exact).
  std::optional<exact_reducer> exact_;
  std::vector<float> leaf_;
  std::vector<uint8_t> counted_;  // tp: per local value, 1 if it counts in the full model's norm
  std::optional<double> reduced_loss_;
  std::optional<sample_share> share_;     // this replica's samples, when the plan says
  double grad_norm_ = 0;                  // of the local gradients after the last reduce
  std::atomic<bool> interrupted_{false};  // raised by abort(): the model's pass stops
};

dense_backend::dense_backend(const train_config& cfg, const layout& shape, int rank,
                             uint64_t generation, const connect_fn& connect,
                             const micro_batching& batching)
    : cfg_(cfg),
      shape_(shape),
      view_(view_of(shape, rank)),
      allreducer_(static_cast<size_t>(cfg.bucket_bytes)) {
  if (shape.pp != 1 || shape.ep != 1 || cfg.model.experts > 0 ||
      (shape.tp > 1 && cfg.parallel.zero == 1))
    throw std::logic_error("dense_backend: layout " + describe(shape) +
                           " belongs to another backend");
  const bool exact = backend_reduces_exactly(cfg, shape, !batching.empty(), "dense_backend");
  const auto& dp = view_.dp;
  dp_comm_ = connect({generation, dp.name, dp.index, static_cast<int>(dp.ranks.size())});
  if (shape.tp > 1) {
    const auto& tp = view_.tp;
    tp_comm_ = std::make_unique<comm::timed_communicator>(
        connect({generation, tp.name, tp.index, static_cast<int>(tp.ranks.size())}));
    tp_ = std::make_unique<tensor_parallel::tp_gpt>(cfg.model, *tp_comm_);
    tp_->sum_in_rank_order(exact);
    full_numel_ = tp_->full_num_params();
    replicated_.emplace(cfg.optim, tp_->param_table(), tp_->num_params());
  } else {
    dense_ = std::make_unique<gpt>(cfg.model);
    dense_->set_interrupt(&interrupted_);
    full_numel_ = dense_->num_params();
    if (cfg.parallel.zero == 1) {
      // The exact reduction's shards hold whole norm blocks and clip as dp does.
      const zero_options how = exact ? zero_options{norm_block, true} : zero_options{};
      zero_.emplace(cfg.optim, dense_->param_table(), full_numel_, dp.index,
                    static_cast<int>(dp.ranks.size()), how);
    } else {
      replicated_.emplace(cfg.optim, dense_->param_table(), full_numel_);
    }
  }
  if (!batching.empty()) {
    if (static_cast<int>(batching.replica_micro_batches.size()) != shape.dp)
      throw std::invalid_argument("dense_backend: the plan divides the batch among " +
                                  std::to_string(batching.replica_micro_batches.size()) +
                                  " replicas, the layout has " + std::to_string(shape.dp));
    share_ =
        replica_share(batching.replica_micro_batches, batching.micro_batch_size, view_.dp.index);
  }
  if (exact) {
    // Under tp each rank sums its own shard over its dp group: the tp peers' shards are
    // disjoint, and the model's tp sums are the same at a fixed tp degree whatever the dp.
    const size_t n = tp_ ? tp_->num_params() : full_numel_;
    exact_.emplace(batching.replica_micro_batches, view_.dp.index, n,
                   static_cast<size_t>(std::max(cfg.bucket_bytes, 4)) / sizeof(float));
    leaf_.resize(n);
    if (tp_) {
      // The pipeline backend's norm (fixed blocks, then the tp peers' sums in rank order), so
      // that tp with ZeRO-1, which that backend runs, gives these bits.
      counted_.assign(n, 0);
      const auto& table = tp_->param_table();
      for (size_t i = 0; i < table.size(); ++i)
        if (tp_->counts_in_norm(i))
          std::fill_n(counted_.begin() + static_cast<std::ptrdiff_t>(table[i].offset),
                      table[i].numel, 1);
    }
  }
}

void dense_backend::init(uint64_t seed) {
  if (tp_)
    tp_->init_params(seed);
  else
    dense_->init_params(seed);
}

void dense_backend::restore(const ckpt::full_state& full) {
  if (full.params.size() != full_numel_)
    throw std::runtime_error("checkpoint holds " + std::to_string(full.params.size()) +
                             " parameters but the model has " + std::to_string(full_numel_));
  if (tp_) {
    // The checkpoint is in the single-rank layout; load_from_full cuts this rank's slices.
    // It writes into the parameter buffer, so the moments pass through it first.
    auto cut = [&](const std::vector<float>& full_vector, std::vector<float>& local) {
      tp_->load_from_full(full_vector.data());
      std::copy(tp_->params(), tp_->params() + tp_->num_params(), local.begin());
    };
    cut(full.exp_avg, replicated_->exp_avg());
    cut(full.exp_avg_sq, replicated_->exp_avg_sq());
    tp_->load_from_full(full.params.data());
    replicated_->t() = full.adam_t;
    return;
  }
  std::copy(full.params.begin(), full.params.end(), dense_->params());
  if (zero_) {
    const auto& sh = zero_->shard();
    auto first = static_cast<std::ptrdiff_t>(sh.offset),
         last = static_cast<std::ptrdiff_t>(sh.offset + sh.count);
    std::copy(full.exp_avg.begin() + first, full.exp_avg.begin() + last, zero_->exp_avg().begin());
    std::copy(full.exp_avg_sq.begin() + first, full.exp_avg_sq.begin() + last,
              zero_->exp_avg_sq().begin());
    zero_->t() = full.adam_t;
  } else {
    replicated_->exp_avg() = full.exp_avg;
    replicated_->exp_avg_sq() = full.exp_avg_sq;
    replicated_->t() = full.adam_t;
  }
}

grad_result dense_backend::compute(const token_dataset& data, int64_t step0) {
  if (exact_) {
    exact_->begin_step();
    reduced_loss_.reset();
    const auto leaves = [&](auto& model) {
      return compute_share_gradients(model, data, cfg_, step0, *share_,
                                     [&](int index, double loss_sum) {
                                       model.swap_grads(leaf_);
                                       exact_->add_micro_batch(index, leaf_, loss_sum);
                                       model.zero_grads();
                                     });
    };
    return tp_ ? leaves(*tp_) : leaves(*dense_);
  }
  if (share_) {
    if (tp_) return compute_share_gradients(*tp_, data, cfg_, step0, *share_);
    return compute_share_gradients(*dense_, data, cfg_, step0, *share_);
  }
  const int dp_rank = view_.dp.index, dp_size = static_cast<int>(view_.dp.ranks.size());
  if (tp_) return tensor_parallel::compute_tp_gradients(*tp_, data, cfg_, step0, dp_rank, dp_size);
  return compute_gradients(*dense_, data, cfg_, step0, dp_rank, dp_size);
}

void dense_backend::reduce(const comm::op_options& opts) {
  if (exact_) {
    const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
    if (zero_) {
      exact_->reduce_scatter(*dp_comm_, zero_->shard().block, zero_->grad_shard(), opts);
      // This rank's part only (finite exactly when its values are): the divergence check's.
      grad_norm_ = adamw::grad_norm(zero_->grad_shard(), zero_->shard().count);
    } else if (tp_) {
      exact_->all_reduce(*dp_comm_, tp_->grads(), opts);
      // This shard's part, for the divergence check (apply clips with the blocks' norm).
      grad_norm_ = adamw::grad_norm(tp_->grads(), tp_->num_params());
    } else {
      exact_->all_reduce(*dp_comm_, dense_->grads(), opts);
      // The whole reduced gradient's norm, in the blocks a ZeRO-1 shard sums too.
      grad_norm_ = exact_grad_norm(dense_->grads(), dense_->num_params());
    }
    const double total = exact_->job_loss_sum(*dp_comm_, remaining(deadline, opts));
    reduced_loss_ = view_.dp.index == 0 ? total : 0.0;
  } else if (zero_) {
    zero_->reduce_gradients(*dp_comm_, dense_->grads(), opts);
    grad_norm_ = adamw::grad_norm(dense_->grads(), dense_->num_params());
  } else if (tp_) {
    allreducer_.all_reduce(*dp_comm_, tp_->grads(), tp_->num_params(), opts);
    grad_norm_ = adamw::grad_norm(tp_->grads(), tp_->num_params());
  } else {
    allreducer_.all_reduce(*dp_comm_, dense_->grads(), dense_->num_params(), opts);
    // The whole reduced gradient: its norm is the global one, which apply clips with.
    grad_norm_ = adamw::grad_norm(dense_->grads(), dense_->num_params());
  }
}

void dense_backend::apply(int64_t step0, const comm::op_options& opts) {
  if (zero_ && exact_) {
    zero_->apply(*dp_comm_, dense_->params(), step0, cfg_.steps, opts,
                 [&](const float* g, const zero_shard& s) {
                   return exact_grad_norm(*dp_comm_, g, s.offset, s.count, s.block, opts);
                 });
  } else if (zero_) {
    zero_->apply(*dp_comm_, dense_->params(), step0, cfg_.steps, opts);
  } else if (tp_ && exact_) {
    const double sq = comm::sum_in_rank_order(
        *tp_comm_, exact_sq_sum(tp_->grads(), tp_->num_params(), counted_.data()), opts);
    replicated_->clip_to_norm(tp_->grads(), tp_->num_params(), std::sqrt(sq));
    replicated_->step(tp_->params(), tp_->grads(), step0, cfg_.steps);
  } else if (tp_) {
    tensor_parallel::clip_tp_gradients(*tp_, *replicated_);
    replicated_->step(tp_->params(), tp_->grads(), step0, cfg_.steps);
  } else {
    // clip_gradients would compute the same norm again (reduce did, for the vote).
    replicated_->clip_to_norm(dense_->grads(), dense_->num_params(), grad_norm_);
    replicated_->step(dense_->params(), dense_->grads(), step0, cfg_.steps);
  }
}

double dense_backend::learning_rate(int64_t step0) const {
  return zero_ ? zero_->learning_rate(step0, cfg_.steps)
               : replicated_->learning_rate(step0, cfg_.steps);
}

eval_share dense_backend::evaluate(const token_dataset& data) {
  // Batch b belongs to replica b % dp, so the set of batches is the same for every layout.
  eval_share out;
  const int B = cfg_.micro_batch, T = cfg_.model.context;
  const int dp_rank = view_.dp.index, dp_size = static_cast<int>(view_.dp.ranks.size());
  std::vector<token_id> in(static_cast<size_t>(B) * static_cast<size_t>(T)), tgt(in.size());
  std::vector<double> losses;
  for (int b = dp_rank; b < cfg_.eval_batches; b += dp_size) {
    data.fill_val(cfg_.seed, b, 0, B, T, in.data(), tgt.data());
    losses.push_back(tp_ ? tp_->forward_loss(in.data(), tgt.data(), B, T)
                         : dense_->forward_loss(in.data(), tgt.data(), B, T));
    out.loss_sum += losses.back();
    ++out.batches;
  }
  if (exact_) {
    // In batch order on the first replica, nothing on the others: the coordinator's sum in
    // arrival order is then exact too.
    const comm::op_options opts{std::chrono::milliseconds(cfg_.step_timeout_ms)};
    const double total = exact_eval_sum(*dp_comm_, losses, cfg_.eval_batches, opts);
    out = dp_rank == 0 ? eval_share{total, cfg_.eval_batches} : eval_share{};
  }
  if (!reports_loss()) out = {};
  return out;
}

ckpt::state_map dense_backend::state_map() const {
  const int dp = static_cast<int>(view_.dp.ranks.size());
  if (tp_) return replicated_state_map(pieces_of(*tp_, dp, view_.dp.index));
  auto params = pieces_of(*dense_, dp, view_.dp.index);
  if (zero_)
    return zero_state_map(std::move(params), zero_->shard().offset, zero_->shard().count, dp);
  return replicated_state_map(std::move(params));
}

local_state dense_backend::state() {
  float* params = tp_ ? tp_->params() : dense_->params();
  const size_t n = tp_ ? tp_->num_params() : dense_->num_params();
  return zero_ ? state_of(params, n, *zero_) : state_of(params, n, *replicated_);
}

size_t dense_backend::optimizer_state_bytes() const {
  if (zero_) return zero_->state_bytes();
  return (replicated_->exp_avg().capacity() + replicated_->exp_avg_sq().capacity()) * sizeof(float);
}

void dense_backend::abort() {
  interrupted_.store(true);
  if (dp_comm_) dp_comm_->abort();
  if (tp_comm_) tp_comm_->abort();
}

}  // namespace

std::unique_ptr<engine_backend> make_dense_backend(const train_config& cfg, const layout& shape,
                                                   int rank, uint64_t generation,
                                                   const connect_fn& connect,
                                                   const micro_batching& batching) {
  return std::make_unique<dense_backend>(cfg, shape, rank, generation, connect, batching);
}

}  // namespace troupe::strategies
