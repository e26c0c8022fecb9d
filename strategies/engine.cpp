#include "strategies/engine.hpp"

#include "strategies/tensor_parallel/tp_gpt.hpp"
#include "strategies/tensor_parallel/tp_train.hpp"

#include <algorithm>
#include <stdexcept>

namespace troupe::strategies {

training_engine::training_engine(const train_config& cfg, const layout& shape, int rank, uint64_t generation,
                                 const connect_fn& connect)
    : cfg_(cfg),
      shape_(shape),
      view_(view_of(shape, rank)),
      allreducer_(static_cast<size_t>(cfg.bucket_bytes)) {
  if (shape.pp != 1 || shape.ep != 1 || cfg.model.experts > 0)
    throw std::invalid_argument("layout " + describe(shape) +
                                ": pipeline and expert parallelism are not wired into the step loop yet");
  if (shape.tp > 1 && cfg.parallel.zero == 1)
    throw std::invalid_argument("layout " + describe(shape) + ": ZeRO-1 together with tensor parallelism is not "
                                "supported yet; use --zero 0 or --tp 1");
  const auto& dp = view_.dp;
  dp_comm_ = connect({generation, dp.name, dp.index, static_cast<int>(dp.ranks.size())});
  if (shape.tp > 1) {
    const auto& tp = view_.tp;
    tp_comm_ = std::make_unique<comm::timed_communicator>(
        connect({generation, tp.name, tp.index, static_cast<int>(tp.ranks.size())}));
    tp_ = std::make_unique<tensor_parallel::tp_gpt>(cfg.model, *tp_comm_);
    full_numel_ = tp_->full_num_params();
    replicated_.emplace(cfg.optim, tp_->param_table(), tp_->num_params());
  } else {
    dense_ = std::make_unique<gpt>(cfg.model);
    full_numel_ = dense_->num_params();
    if (cfg.parallel.zero == 1) {
      zero_.emplace(cfg.optim, dense_->param_table(), full_numel_, dp.index, static_cast<int>(dp.ranks.size()));
      owned_ = {zero_->shard().offset, zero_->shard().count};
    } else {
      replicated_.emplace(cfg.optim, dense_->param_table(), full_numel_);
    }
  }
  if (!zero_) owned_ = ckpt::owned_range(full_numel_, rank, shape.world());
}

training_engine::~training_engine() = default;

void training_engine::init(uint64_t seed) {
  if (tp_)
    tp_->init_params(seed);
  else
    dense_->init_params(seed);
}

void training_engine::restore(const ckpt::full_state& full) {
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
    auto first = static_cast<std::ptrdiff_t>(sh.offset), last = static_cast<std::ptrdiff_t>(sh.offset + sh.count);
    std::copy(full.exp_avg.begin() + first, full.exp_avg.begin() + last, zero_->exp_avg().begin());
    std::copy(full.exp_avg_sq.begin() + first, full.exp_avg_sq.begin() + last, zero_->exp_avg_sq().begin());
    zero_->t() = full.adam_t;
  } else {
    replicated_->exp_avg() = full.exp_avg;
    replicated_->exp_avg_sq() = full.exp_avg_sq;
    replicated_->t() = full.adam_t;
  }
}

grad_result training_engine::compute(const byte_dataset& data, int64_t step0) {
  const int dp_rank = view_.dp.index, dp_size = static_cast<int>(view_.dp.ranks.size());
  if (tp_) return tensor_parallel::compute_tp_gradients(*tp_, data, cfg_, step0, dp_rank, dp_size);
  return compute_gradients(*dense_, data, cfg_, step0, dp_rank, dp_size);
}

void training_engine::reduce(const comm::op_options& opts) {
  if (zero_) {
    zero_->reduce_gradients(*dp_comm_, dense_->grads(), opts);
  } else if (tp_) {
    allreducer_.all_reduce(*dp_comm_, tp_->grads(), tp_->num_params(), opts);
  } else {
    allreducer_.all_reduce(*dp_comm_, dense_->grads(), dense_->num_params(), opts);
  }
}

void training_engine::apply(int64_t step0, const comm::op_options& opts) {
  if (zero_) {
    zero_->apply(*dp_comm_, dense_->params(), step0, cfg_.steps, opts);
  } else if (tp_) {
    tensor_parallel::clip_tp_gradients(*tp_, *replicated_);
    replicated_->step(tp_->params(), tp_->grads(), step0, cfg_.steps);
  } else {
    replicated_->clip_gradients(dense_->grads(), dense_->num_params());
    replicated_->step(dense_->params(), dense_->grads(), step0, cfg_.steps);
  }
}

double training_engine::learning_rate(int64_t step0) const {
  return zero_ ? zero_->learning_rate(step0, cfg_.steps) : replicated_->learning_rate(step0, cfg_.steps);
}

eval_share training_engine::evaluate(const byte_dataset& data) {
  // Batch b belongs to replica b % dp, so the set of batches is the same for every layout.
  eval_share out;
  const int B = cfg_.micro_batch, T = cfg_.model.context;
  const int dp_rank = view_.dp.index, dp_size = static_cast<int>(view_.dp.ranks.size());
  std::vector<uint8_t> in(static_cast<size_t>(B) * static_cast<size_t>(T)), tgt(in.size());
  for (int b = dp_rank; b < cfg_.eval_batches; b += dp_size) {
    data.fill_val(cfg_.seed, b, 0, B, T, in.data(), tgt.data());
    out.loss_sum += tp_ ? tp_->forward_loss(in.data(), tgt.data(), B, T)
                        : dense_->forward_loss(in.data(), tgt.data(), B, T);
    ++out.batches;
  }
  if (!reports_loss()) out = {};
  return out;
}

ckpt::shard_state training_engine::checkpoint_shard(int64_t step) {
  ckpt::shard_state s;
  s.rank = view_.rank;
  s.world = shape_.world();
  s.step = step;
  s.seed = cfg_.seed;
  s.rng_state = cfg_.seed;  // samples are a function of (seed, step): no hidden RNG state
  s.global_numel = full_numel_;
  s.range = owned_;
  auto take = [&](const float* p) { return std::vector<float>(p, p + s.range.count); };
  if (tp_) {
    // The checkpoint keeps the single-rank layout, so any later layout can restore it.
    std::vector<float> full(full_numel_);
    tp_->gather_full(tp_->params(), full.data());
    s.params = take(full.data() + s.range.offset);
    tp_->gather_full(replicated_->exp_avg().data(), full.data());
    s.exp_avg = take(full.data() + s.range.offset);
    tp_->gather_full(replicated_->exp_avg_sq().data(), full.data());
    s.exp_avg_sq = take(full.data() + s.range.offset);
    s.adam_t = replicated_->t();
    return s;
  }
  s.params = take(dense_->params() + s.range.offset);
  if (zero_) {
    s.exp_avg = take(zero_->exp_avg().data());
    s.exp_avg_sq = take(zero_->exp_avg_sq().data());
    s.adam_t = zero_->t();
  } else {
    s.exp_avg = take(replicated_->exp_avg().data() + s.range.offset);
    s.exp_avg_sq = take(replicated_->exp_avg_sq().data() + s.range.offset);
    s.adam_t = replicated_->t();
  }
  return s;
}

size_t training_engine::optimizer_state_bytes() const {
  if (zero_) return zero_->state_bytes();
  return (replicated_->exp_avg().capacity() + replicated_->exp_avg_sq().capacity()) * sizeof(float);
}

void training_engine::abort() {
  if (dp_comm_) dp_comm_->abort();
  if (tp_comm_) tp_comm_->abort();
}

}  // namespace troupe::strategies
