#include "actors/worker/runtime_reduced.hpp"

#include <utility>

#include "strategies/bucket_reducer.hpp"

namespace troupe::actors {
namespace {

class runtime_reduced final : public workload_generation {
 public:
  runtime_reduced(std::unique_ptr<workload_generation> inner, const generation_env& env)
      : inner_(std::move(inner)) {
    if (env.dp.size > 1)
      dp_ = env.connect({env.generation, env.dp.group, env.dp.index, env.dp.size});
    // One replica too: its buckets need no sum, but the reducer's thread measures each
    // bucket's share of the gradient norm as compute finishes it, off the step's path.
    reducer_ = std::make_unique<strategies::bucket_reducer>(dp_.get(), inner_->gradient_buckets(),
                                                            env.op_timeout);
  }

  // The reducer stops touching the workload's buckets before the workload frees them.
  ~runtime_reduced() override { reducer_.reset(); }

  workload_generation& inner() { return *inner_; }

  state_view state() override { return inner_->state(); }
  void init(uint64_t seed) override { inner_->init(seed); }
  void keep_state(workload_generation& previous) override {
    // The workload is shown its own kind of generation, not this wrapper.
    auto* wrapped = dynamic_cast<runtime_reduced*>(&previous);
    inner_->keep_state(wrapped ? wrapped->inner() : previous);
  }
  void begin_restore(std::span<const tensor_decl> incoming, std::string_view extras) override {
    inner_->begin_restore(incoming, extras);
  }
  void end_restore() override { inner_->end_restore(); }
  void cancel_restore() noexcept override { inner_->cancel_restore(); }

  step_outcome compute(const step_work& work) override {
    reducer_->begin_step();
    step_work mine = work;
    mine.sink = reducer_.get();
    try {
      return inner_->compute(mine);
    } catch (...) {
      // The step failed before its buckets were all announced: peers that did announce theirs
      // wait in a collective this rank will not join, so the generation ends here.
      reducer_->abort();
      throw;
    }
  }
  std::vector<gradient_bucket> gradient_buckets() override { return inner_->gradient_buckets(); }
  void reduce(const reduce_env& env) override {
    (void)env;  // the reducer holds the step timeout as its deadline
    norm_ = reducer_->finish().grad_norm;
  }
  double local_grad_norm() const override { return norm_; }

  void apply(const apply_env& env) override { inner_->apply(env); }
  double learning_rate(int64_t step) const override { return inner_->learning_rate(step); }
  eval_result evaluate(const eval_env& env) override { return inner_->evaluate(env); }

  void abort() noexcept override {
    reducer_->abort();
    if (dp_) dp_->abort();
    inner_->abort();
  }
  comm::communicator* replica_group() override { return dp_.get(); }
  size_t optimizer_state_bytes() const override { return inner_->optimizer_state_bytes(); }

 private:
  std::unique_ptr<comm::communicator> dp_;
  std::unique_ptr<workload_generation> inner_;
  std::unique_ptr<strategies::bucket_reducer> reducer_;
  double norm_ = 0;
};

}  // namespace

std::unique_ptr<workload_generation> reduced_by_runtime(std::unique_ptr<workload_generation> inner,
                                                        const generation_env& env) {
  return std::make_unique<runtime_reduced>(std::move(inner), env);
}

}  // namespace troupe::actors
