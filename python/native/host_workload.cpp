#include "python/native/host_workload.hpp"

#include <optional>
#include <utility>

namespace troupe::python {
namespace {

class host_generation final : public workload_generation {
 public:
  // The runtime wraps it (actors/worker/runtime_reduced.hpp): the data-parallel group and the
  // bucket reducer over the script's buckets are the runtime's, as for any by_runtime workload.
  host_generation(std::shared_ptr<host_link> link, const generation_env& env)
      : link_(std::move(link)), env_(env) {
    link_->set_superseded(false);
    link_->await_buckets();
  }

  // No hook of the script's may reach a reducer that is gone.
  ~host_generation() override { link_->set_sink(nullptr); }

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

  // The script's hooks announce its buckets to the runtime's reducer, from the script's thread,
  // while the script computes; only then.
  step_outcome compute(const step_work& work) override {
    link_->set_sink(work.sink);
    ask a = asking(ask_kind::step);
    a.work = work;
    a.work.share = env_.share;
    a.work.sink = nullptr;
    struct unset {
      host_link& link;
      ~unset() { link.set_sink(nullptr); }
    } after{*link_};
    const answer got = link_->request(std::move(a));
    return {got.loss_sum, got.count, 0.0};
  }

  std::vector<gradient_bucket> gradient_buckets() override { return link_->buckets(); }

  void apply(const apply_env& env) override {
    ask a = asking(ask_kind::apply);
    a.work.step = env.step;
    a.job_loss = env.job_loss;
    link_->request(std::move(a));
  }

  void abort() noexcept override { link_->set_superseded(true); }

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
