#pragma once
// The built-in GPT as a workload (runtime/workload/workload.hpp, docs/WORKLOAD.md): every
// layout the planner plans (dp, ZeRO-1, tp, pp, ep), its own reduction, its state the flat
// params and AdamW moments of each rank with the boxes of the single-rank model they hold.
// A generation wraps one training_engine; what only the GPT has (the pipeline stage link, the
// expert load, the pipeline trace, format-1 restores) stays reachable through engine().

#include <memory>

#include "runtime/config.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/workload/workload.hpp"
#include "strategies/engine.hpp"
#include "strategies/planner.hpp"

namespace troupe::strategies {

/// One generation of the GPT on one rank.
class gpt_generation final : public workload_generation {
 public:
  gpt_generation(const train_config& cfg, const token_dataset& data, const layout_plan& plan,
                 int rank, uint64_t generation, const connect_fn& connect);

  state_view state() override;
  void init(uint64_t seed) override { engine_.init(seed); }
  step_outcome compute(const step_work& work) override;
  void reduce(const reduce_env& env) override { engine_.reduce(env.opts); }
  double local_grad_norm() const override { return engine_.local_grad_norm(); }
  std::optional<double> reduced_loss_sum() const override {
    return engine_.reports_loss() ? engine_.reduced_loss_sum() : std::nullopt;
  }
  void apply(const apply_env& env) override { engine_.apply(env.step - 1, env.opts); }
  double learning_rate(int64_t step) const override { return engine_.learning_rate(step - 1); }
  eval_result evaluate(const eval_env& env) override;
  void abort() noexcept override;
  comm::communicator* replica_group() override { return engine_.replica_group(); }
  size_t optimizer_state_bytes() const override { return engine_.optimizer_state_bytes(); }

  /// The engine underneath, for what only the GPT has.
  training_engine& engine() { return engine_; }

 private:
  const train_config& cfg_;
  const token_dataset& data_;
  training_engine engine_;
};

/// The GPT of a job's config over its byte dataset (both outlive the workload).
class gpt_workload final : public workload {
 public:
  /// Throws data_error when the data holds token ids the model's vocabulary does not.
  gpt_workload(const train_config& cfg, const token_dataset& data) : cfg_(cfg), data_(data) {
    if (data.vocab() > cfg.model.vocab)
      throw data_error("corpus '" + data.path() + "' has a vocabulary of " +
                       std::to_string(data.vocab()) + " token ids, more than the model's " +
                       std::to_string(cfg.model.vocab) + " (--vocab)");
  }
  workload_traits traits() const override;
  /// env.plan_json is the generation's layout_plan (strategies::to_json).
  std::unique_ptr<workload_generation> make_generation(const generation_env& env) override;

 private:
  const train_config& cfg_;
  const token_dataset& data_;
};

/// The GPT's state in a workload's terms: the tensor table of `model` (each tensor in every
/// state array: params, exp_avg, exp_avg_sq), one f32 region per array over `buffers` with the
/// pieces of `map`, and AdamW's step count as the counter "adam_t".
state_view gpt_state_view(const model_config& model, const ckpt::state_map& map,
                          const local_state& buffers);

/// The inverse for a state of f32 regions named after ckpt::array_names: the state map and
/// the buffers the checkpoint and transfer code take. Throws workload_error for a region of
/// another dtype or name.
ckpt::state_map state_map_of(const state_view& view);
local_state local_state_of(const state_view& view);

}  // namespace troupe::strategies
