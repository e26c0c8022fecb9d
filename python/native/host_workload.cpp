#include "python/native/host_workload.hpp"

#include <cmath>
#include <optional>
#include <utility>

#include "runtime/comm/collective_math.hpp"
#include "strategies/bucket_reducer.hpp"

namespace troupe::python {
namespace {

class host_generation final : public workload_generation {
 public:
  host_generation(std::shared_ptr<host_link> link, const generation_env& env)
      : link_(std::move(link)), env_(env) {
    link_->set_superseded(false);
    link_->await_buckets();
    if (env_.dp.size > 1)
      dp_ = env_.connect({env_.generation, env_.dp.group, env_.dp.index, env_.dp.size});
    // One replica too: its buckets need no sum, but the reducer's thread measures each
    // bucket's share of the gradient norm as backward finishes it, off the step's path.
    reducer_ =
        std::make_unique<strategies::bucket_reducer>(dp_.get(), link_->buckets(), env_.op_timeout);
  }

  ~host_generation() override { reducer_.reset(); }

  // Asked afresh each time: the script's tables change (an optimizer makes its state at its
  // first step, a restore swaps tensors in), and walking them every step would cost the step.
  state_view state() override {
    link_->request(asking(ask_kind::state));
    return link_->view(env_.dp.size, env_.dp.index);
  }

  void init(uint64_t seed) override {
    (void)seed;  // the script seeded torch before it built its model (troupe.init)
    link_->request(asking(ask_kind::init));
  }

  // The script's model and optimizer outlive generations: its state is already here.
  void keep_state(workload_generation& previous) override { (void)previous; }

  void begin_restore(std::span<const tensor_decl> incoming, std::string_view extras) override {
    ask a = asking(ask_kind::begin_restore);
    a.tensors.assign(incoming.begin(), incoming.end());
    a.extras_json = std::string(extras);
    link_->request(std::move(a));
  }
  void end_restore() override { link_->request(asking(ask_kind::end_restore)); }
  void cancel_restore() noexcept override {
    try {
      link_->request(asking(ask_kind::cancel_restore));
    } catch (...) {  // the script failed or left: it holds no scratch memory worth keeping
    }
  }

  step_outcome compute(const step_work& work) override {
    reducer_->begin_step();
    sink_ = reducer_.get();
    link_->set_sink(sink_);
    ask a = asking(ask_kind::step);
    a.work = work;
    a.work.share = env_.share;
    a.work.sink = nullptr;
    const answer got = link_->request(std::move(a));
    return {got.loss_sum, got.count, 0.0};
  }

  std::vector<gradient_bucket> gradient_buckets() override { return link_->buckets(); }

  void reduce(const reduce_env& env) override {
    (void)env;  // the reducer holds the step timeout as its deadline
    link_->set_sink(nullptr);
    norm_ = reducer_->finish().grad_norm;
  }
  double local_grad_norm() const override { return norm_; }

  void apply(const apply_env& env) override {
    ask a = asking(ask_kind::apply);
    a.work.step = env.step;
    a.job_loss = env.job_loss;
    link_->request(std::move(a));
  }

  void abort() noexcept override {
    link_->set_superseded(true);
    if (reducer_) reducer_->abort();
    if (dp_) dp_->abort();
  }

  comm::communicator* replica_group() override { return dp_.get(); }

 private:
  ask asking(ask_kind kind) const {
    ask a;
    a.kind = kind;
    a.generation = env_.generation;
    a.rank = env_.rank;
    a.world = env_.world;
    return a;
  }

  std::shared_ptr<host_link> link_;
  generation_env env_;
  std::unique_ptr<comm::communicator> dp_;
  std::unique_ptr<strategies::bucket_reducer> reducer_;
  gradient_sink* sink_ = nullptr;
  double norm_ = 0;
};

class host_workload final : public workload {
 public:
  host_workload(std::shared_ptr<host_link> link, std::string name)
      : link_(std::move(link)), name_(std::move(name)) {}

  workload_traits traits() const override {
    workload_traits t;
    t.name = name_;
    t.layouts = layout_support::data_parallel;
    t.reduces = reduction::by_runtime;
    t.count_unit = "samples";
    t.dynamic_state = true;
    t.host_driven = true;
    return t;
  }

  std::unique_ptr<workload_generation> make_generation(const generation_env& env) override {
    return std::make_unique<host_generation>(link_, env);
  }

 private:
  std::shared_ptr<host_link> link_;
  std::string name_;
};

}  // namespace

std::unique_ptr<workload> make_host_workload(std::shared_ptr<host_link> link, std::string name) {
  return std::make_unique<host_workload>(std::move(link), std::move(name));
}

}  // namespace troupe::python
