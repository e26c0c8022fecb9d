// The expert backend: an MoE model over dp x ep (tp = pp = 1). Each ep group computes whole
// micro-batches of the one-rank run together (ep_sample_plan), its ranks holding E / ep experts
// each and a replica of every other tensor; the dp / ep copies of a group split the step's
// micro-batches as the coordinator's plan gives them to their replicas (micro_batching), in
// the plan's micro-batch size. The result equals the one-rank step with that micro-batch size
// up to floating-point reassociation.
//
// Gradients. Rank (e, x) runs its slice of micro-batch k with grad_scale B_k / (G ep): the
// one-rank scale B_k / G, divided by ep because the ep ranks of a micro-batch each hold the
// mean over their own tokens (reduce_expert_parallel_grads explains why averaging over the
// ep group then gives the micro-batch's gradient). So after compute:
//   replicated tensors: the sum over the whole dp group (every micro-batch, every slice);
//   expert tensors:     the sum over the edp group (the copies of that shard), as each expert
//                       already holds the contributions of every ep rank's tokens.
// Loss: every rank reports its slice, loss_sum = (lm_slice + coef * aux_k) * tokens_slice;
// summed over the ranks that is the one-rank loss_sum (aux_k is the whole micro-batch's).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>

#include "runtime/comm/timed_communicator.hpp"
#include "runtime/model/gpt.hpp"
#include "runtime/optim/adamw.hpp"
#include "strategies/data_parallel.hpp"
#include "strategies/engine_backend.hpp"
#include "strategies/expert_parallel/expert_parallel.hpp"
#include "strategies/state_layout.hpp"

namespace troupe::strategies {
namespace {

class expert_backend final : public engine_backend {
 public:
  expert_backend(const train_config& cfg, const layout& shape, int rank, uint64_t generation,
                 const connect_fn& connect, const micro_batching& batching);

  void init(uint64_t seed) override { model_->init_params(seed); }
  void restore(const ckpt::full_state& full) override;
  grad_result compute(const token_dataset& data, int64_t step0) override;
  void reduce(const comm::op_options& opts) override;
  double local_grad_norm() const override {
    return adamw::grad_norm(model_->grads(), model_->num_params());
  }
  void apply(int64_t step0, const comm::op_options& opts) override;
  double learning_rate(int64_t step0) const override {
    return optim_->learning_rate(step0, cfg_.steps);
  }
  eval_share evaluate(const token_dataset& data) override;
  ckpt::state_map state_map() const override;
  local_state state() override { return state_of(model_->params(), model_->num_params(), *optim_); }
  // Every rank reports the loss of its own slice: the slices partition the step's tokens.
  bool reports_loss() const override { return true; }
  size_t num_full_params() const override { return full_numel_; }
  size_t optimizer_state_bytes() const override {
    return (optim_->exp_avg().capacity() + optim_->exp_avg_sq().capacity()) * sizeof(float);
  }
  double take_model_comm_seconds() override { return ep_comm_->take_seconds(); }
  expert_load take_expert_load() override;
  void abort() override;

 private:
  // One local tensor and where it sits in the one-rank flat layout.
  struct placement {
    size_t local = 0, full = 0, numel = 0;
    bool expert = false;
  };

  ep_sample_plan plan_of_batching(const micro_batching& batching, const std::string& where) const;
  void pack(bool experts, std::vector<float>& out) const;
  void unpack(bool experts, const std::vector<float>& in);

  train_config cfg_;
  layout shape_;
  rank_view view_;
  int ep_ = 1, edp_ = 1;  // group sizes
  ep_sample_plan plan_;
  comm::op_options exchange_opts_;
  std::unique_ptr<comm::communicator> dp_comm_, edp_comm_;
  std::unique_ptr<comm::timed_communicator> ep_comm_;
  std::unique_ptr<ep_exchange> exchange_;  // before model_: the model uses it until destroyed
  std::unique_ptr<gpt> model_;
  std::optional<adamw> optim_;
  gradient_allreducer allreducer_;
  size_t full_numel_ = 0;
  std::vector<placement> where_;
  std::vector<float> staging_;
  expert_load load_;
};

expert_backend::expert_backend(const train_config& cfg, const layout& shape, int rank,
                               uint64_t generation, const connect_fn& connect,
                               const micro_batching& batching)
    : cfg_(cfg),
      shape_(shape),
      view_(view_of(shape, rank)),
      exchange_opts_{std::chrono::milliseconds(cfg.step_timeout_ms)},
      allreducer_(static_cast<size_t>(cfg.bucket_bytes)) {
  const std::string where = "layout " + describe(shape) + ": ";
  if (cfg.model.experts <= 0)
    throw std::invalid_argument(
        where + "expert parallelism (ep " + std::to_string(shape.ep) +
        ") needs an MoE model (model.experts > 0); use ep = 1 for a dense model");
  if (shape.tp != 1 || shape.pp != 1)
    throw std::invalid_argument(
        where + "an MoE model runs over dp x ep only (tp = pp = 1), not tp " +
        std::to_string(shape.tp) + " x pp " + std::to_string(shape.pp) +
        "; shard the experts with ep instead, or use a dense model for tp/pp");
  if (cfg.parallel.zero != 0)
    throw std::invalid_argument(where +
                                "ZeRO-1 is not supported for MoE models; use parallel.zero = 0 "
                                "(ep already shards the experts' optimizer state)");
  ep_ = static_cast<int>(view_.ep.ranks.size());
  edp_ = static_cast<int>(view_.edp.ranks.size());
  if (cfg.model.experts % ep_ != 0)
    throw std::invalid_argument(where + "ep (" + std::to_string(ep_) +
                                ") must divide model.experts (" +
                                std::to_string(cfg.model.experts) + ")");
  if (batching.empty()) {
    // Built without a plan (tests): the even division the config implies.
    if (auto why = check_ep_batch(cfg.batch, cfg.micro_batch, ep_, edp_); !why.empty())
      throw std::invalid_argument(where + why);
    plan_ = plan_ep_samples(cfg.batch, cfg.micro_batch, ep_, edp_, view_.at.ep, view_.at.edp);
  } else {
    plan_ = plan_of_batching(batching, where);
  }

  const auto join = [&](const group& g) {
    return connect({generation, g.name, g.index, static_cast<int>(g.ranks.size())});
  };
  dp_comm_ = join(view_.dp);
  edp_comm_ = join(view_.edp);
  ep_comm_ = std::make_unique<comm::timed_communicator>(join(view_.ep));
  if (ep_ > 1) exchange_ = std::make_unique<ep_exchange>(*ep_comm_, exchange_opts_);
  model_ = std::make_unique<gpt>(cfg.model, exchange_.get());
  optim_.emplace(cfg.optim, model_->param_table(), model_->num_params());

  // The one-rank layout, for checkpoints: a model alone holds every expert. Only its table
  // is kept; parameters are allocated but never touched, and freed at once.
  const gpt whole(cfg.model);
  full_numel_ = whole.num_params();
  for (const param_tensor& t : model_->param_table()) {
    placement p;
    p.local = t.offset;
    p.full = whole.tensor(t.name).offset;
    p.numel = t.numel;
    p.expert = is_expert_param(t);
    where_.push_back(p);
  }
  load_.tokens.assign(static_cast<size_t>(cfg.model.n_layer),
                      std::vector<int64_t>(static_cast<size_t>(cfg.model.experts), 0));
  load_.dropped.assign(static_cast<size_t>(cfg.model.n_layer), 0);
}

ep_sample_plan expert_backend::plan_of_batching(const micro_batching& batching,
                                                const std::string& where) const {
  const auto& counts = batching.replica_micro_batches;
  const auto str = [](auto v) { return std::to_string(v); };
  if (static_cast<int>(counts.size()) != shape_.dp)
    throw std::invalid_argument(where + "the plan divides the batch among " + str(counts.size()) +
                                " replicas, the layout has " + str(shape_.dp));
  if (auto why = check_ep_batching(counts, batching.micro_batch_size, ep_); !why.empty())
    throw std::invalid_argument(where + why);
  // compute() scales each micro-batch by its share of cfg.batch: the plan must make it up.
  const int64_t sequences =
      std::accumulate(counts.begin(), counts.end(), int64_t{0}) * batching.micro_batch_size;
  if (sequences != cfg_.batch)
    throw std::invalid_argument(where + "the plan's micro-batches hold " + str(sequences) +
                                " sequences, but a step is batch (" + str(cfg_.batch) + ")");
  // Validation batches keep the config's size whatever the plan, as on one rank, and are
  // sliced over the ep group like a training micro-batch.
  if (cfg_.micro_batch % ep_ != 0)
    throw std::invalid_argument(where + "ep (" + str(ep_) + ") must divide micro_batch (" +
                                str(cfg_.micro_batch) +
                                "): the ep ranks share each validation batch equally");
  return plan_ep_samples(counts, batching.micro_batch_size, ep_, view_.at.ep, view_.at.edp);
}

void expert_backend::restore(const ckpt::full_state& full) {
  if (full.params.size() != full_numel_ || full.exp_avg.size() != full_numel_ ||
      full.exp_avg_sq.size() != full_numel_)
    throw std::runtime_error("checkpoint holds " + std::to_string(full.params.size()) +
                             " parameters but the model has " + std::to_string(full_numel_));
  for (const placement& p : where_) {
    const auto first = static_cast<std::ptrdiff_t>(p.full),
               last = static_cast<std::ptrdiff_t>(p.full + p.numel);
    std::copy(full.params.begin() + first, full.params.begin() + last, model_->params() + p.local);
    std::copy(full.exp_avg.begin() + first, full.exp_avg.begin() + last,
              optim_->exp_avg().begin() + static_cast<std::ptrdiff_t>(p.local));
    std::copy(full.exp_avg_sq.begin() + first, full.exp_avg_sq.begin() + last,
              optim_->exp_avg_sq().begin() + static_cast<std::ptrdiff_t>(p.local));
  }
  optim_->t() = full.adam_t;
}

grad_result expert_backend::compute(const token_dataset& data, int64_t step0) {
  ep_comm_->take_seconds();  // an evaluation's or checkpoint's exchanges are not this step's
  const int G = cfg_.batch, T = cfg_.model.context, S = plan_.slice;
  std::vector<token_id> inputs(static_cast<size_t>(S) * static_cast<size_t>(T)),
      targets(inputs.size());
  for (auto& row : load_.tokens) std::fill(row.begin(), row.end(), 0);
  std::fill(load_.dropped.begin(), load_.dropped.end(), 0);

  grad_result r;
  model_->zero_grads();
  const auto start = std::chrono::steady_clock::now();
  // B_k / G of the one-rank step, over ep: see the header comment.
  const auto scale = static_cast<float>(static_cast<double>(plan_.micro_batch) / G / ep_);
  for (int i = 0; i < plan_.count; ++i) {
    data.fill_train(cfg_.seed, step0, plan_.first_sample(i), S, T, inputs.data(), targets.data());
    const double mean = model_->forward_backward(inputs.data(), targets.data(), S, T, scale);
    r.loss_sum += mean * S * T;
    r.tokens += static_cast<int64_t>(S) * T;
    for (int l = 0; l < cfg_.model.n_layer; ++l) {
      const auto& routed = model_->tokens_per_expert(l);
      auto& row = load_.tokens[static_cast<size_t>(l)];
      for (size_t e = 0; e < routed.size(); ++e) row[e] += routed[e];
      load_.dropped[static_cast<size_t>(l)] += model_->moe_layer(l).dropped_tokens();
    }
  }
  r.compute_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

expert_load expert_backend::take_expert_load() {
  // The figures are the whole ep group's, the same on each of its ranks: one of them speaks
  // for the group (its copies x cover the other micro-batches and speak for theirs).
  if (view_.at.ep != 0) return {};
  return load_;
}

void expert_backend::pack(bool experts, std::vector<float>& out) const {
  out.clear();
  for (const placement& p : where_)
    if (p.expert == experts)
      out.insert(out.end(), model_->grads() + p.local, model_->grads() + p.local + p.numel);
}

void expert_backend::unpack(bool experts, const std::vector<float>& in) {
  size_t at = 0;
  for (const placement& p : where_) {
    if (p.expert != experts) continue;
    std::memcpy(model_->grads() + p.local, in.data() + at, p.numel * sizeof(float));
    at += p.numel;
  }
}

void expert_backend::reduce(const comm::op_options& opts) {
  if (ep_ == 1) {
    // Every tensor is replicated over dp (= edp): one reduction of the whole buffer.
    allreducer_.all_reduce(*dp_comm_, model_->grads(), model_->num_params(), opts);
    return;
  }
  // Replicated tensors interleave with the experts block by block; each kind is gathered
  // into one buffer so its group pays for one bucketed all-reduce.
  pack(false, staging_);
  allreducer_.all_reduce(*dp_comm_, staging_.data(), staging_.size(), opts);
  unpack(false, staging_);
  if (edp_ > 1) {
    pack(true, staging_);
    allreducer_.all_reduce(*edp_comm_, staging_.data(), staging_.size(), opts);
    unpack(true, staging_);
  }
}

void expert_backend::apply(int64_t step0, const comm::op_options& opts) {
  // The global norm of the whole model: replicated tensors once (every rank has them all),
  // each expert once (summed over the ep group, whose ranks hold disjoint experts).
  double replicated = 0, experts = 0;
  for (const placement& p : where_) {
    const double n = adamw::grad_norm(model_->grads() + p.local, p.numel);
    (p.expert ? experts : replicated) += n * n;
  }
  // Added in rank order, so every rank derives the same factor.
  experts = comm::sum_in_rank_order(*ep_comm_, experts, opts);
  optim_->clip_to_norm(model_->grads(), model_->num_params(), std::sqrt(replicated + experts));
  optim_->step(model_->params(), model_->grads(), step0, cfg_.steps);
}

eval_share expert_backend::evaluate(const token_dataset& data) {
  // Validation batch b belongs to copy b % (dp / ep); its ep group splits it like a training
  // micro-batch, so every ep rank runs the same number of (collective) forwards. Each rank
  // adds its slice's mean / ep; one rank per group counts the batch. Summed over the ranks
  // that is the one-rank evaluate.
  eval_share out;
  const int B = cfg_.micro_batch, T = cfg_.model.context, S = B / ep_;
  std::vector<token_id> inputs(static_cast<size_t>(S) * static_cast<size_t>(T)),
      targets(inputs.size());
  for (int b = view_.at.edp; b < cfg_.eval_batches; b += edp_) {
    data.fill_val(cfg_.seed, b, view_.at.ep * S, S, T, inputs.data(), targets.data());
    out.loss_sum += model_->forward_loss(inputs.data(), targets.data(), S, T) / ep_;
    if (view_.at.ep == 0) ++out.batches;
  }
  return out;
}

ckpt::state_map expert_backend::state_map() const {
  // Every rank holds the dense tensors; the dp replicas of an ep rank hold its experts.
  std::vector<ckpt::placed_piece> params;
  const auto& table = model_->param_table();
  for (size_t i = 0; i < table.size(); ++i) {
    const param_tensor& t = table[i];
    if (t.numel == 0) continue;
    const auto [rows, cols] = ckpt::as_matrix(t.shape);
    const bool expert = where_[i].expert;
    params.push_back({t.name,
                      {0, 0, rows, cols},
                      t.offset,
                      expert ? edp_ : shape_.world(),
                      expert ? view_.at.edp : view_.rank,
                      true});
  }
  return replicated_state_map(std::move(params));
}

void expert_backend::abort() {
  if (dp_comm_) dp_comm_->abort();
  if (edp_comm_) edp_comm_->abort();
  if (ep_comm_) ep_comm_->abort();
}

}  // namespace

std::unique_ptr<engine_backend> make_expert_backend(const train_config& cfg, const layout& shape,
                                                    int rank, uint64_t generation,
                                                    const connect_fn& connect,
                                                    const micro_batching& batching) {
  return std::make_unique<expert_backend>(cfg, shape, rank, generation, connect, batching);
}

}  // namespace troupe::strategies
