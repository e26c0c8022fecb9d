// The built-in GPT through the workload seam (strategies/gpt_workload.hpp) against the same
// GPT through its training engine: ranks are threads of this process over real gloo
// communicators. At every layout family (dp, ZeRO-1, tp, pp, ep) the two give the same losses,
// learning rates, gradient norms and final state, bit for bit: the seam adds no arithmetic.
// The state a generation declares maps back to the engine's own state map and buffers.

#include "strategies/gpt_workload.hpp"

#include <gtest/gtest.h>

#include <mutex>
#include <thread>

#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/store.hpp"
#include "strategies/state_layout.hpp"
#include "tests/strategies/gather_state.hpp"
#include "tests/strategies/tiny_job.hpp"

namespace troupe::strategies {
namespace {

using namespace std::chrono_literals;

train_config tiny_config() { return testing::tiny_config(2); }
using testing::tiny_data;

struct run_result {
  std::vector<double> loss_sums, counts, lrs, norms;  // per step, summed over ranks
  testing::full_model_state full;
  double eval_sum = 0;
  int64_t eval_batches = 0;
};

// One step of one rank, whichever way it runs.
struct rank_run {
  virtual ~rank_run() = default;
  virtual void init(uint64_t seed) = 0;
  virtual std::pair<double, int64_t> step(int64_t s, const comm::op_options& opts) = 0;
  virtual double lr(int64_t s) = 0;
  virtual double norm() = 0;
  virtual std::pair<double, int64_t> eval() = 0;
  virtual void place(const model_config& model, testing::full_model_state& into,
                     std::mutex& mu) = 0;
};

struct through_engine final : rank_run {
  const token_dataset& data;
  training_engine engine;
  through_engine(const train_config& cfg, const token_dataset& d, const layout_plan& plan, int r,
                 const connect_fn& connect)
      : data(d),
        engine(cfg, plan.shape, r, 1, connect,
               micro_batching{plan.micro_batch_size, plan.replica_micro_batches}) {}
  void init(uint64_t seed) override { engine.init(seed); }
  std::pair<double, int64_t> step(int64_t s, const comm::op_options& opts) override {
    const grad_result g = engine.compute(data, s - 1);
    engine.reduce(opts);
    engine.apply(s - 1, opts);
    if (!engine.reports_loss()) return {0.0, 0};
    return {g.loss_sum, g.tokens};
  }
  double lr(int64_t s) override { return engine.learning_rate(s - 1); }
  double norm() override { return engine.local_grad_norm(); }
  std::pair<double, int64_t> eval() override {
    const eval_share e = engine.evaluate(data);
    return {e.loss_sum, e.batches};
  }
  void place(const model_config& model, testing::full_model_state& into, std::mutex& mu) override {
    testing::place_rank_state(engine, model, into, mu);
  }
};

struct through_workload final : rank_run {
  gpt_workload workload;
  std::unique_ptr<workload_generation> gen;
  through_workload(const train_config& cfg, const token_dataset& d, const layout_plan& plan, int r,
                   const connect_fn& connect)
      : workload(cfg, d) {
    generation_env env;
    env.generation = 1;
    env.rank = r;
    env.world = plan.shape.world();
    env.plan_json = to_json(plan);
    env.connect = connect;
    gen = workload.make_generation(env);
  }
  void init(uint64_t seed) override { gen->init(seed); }
  std::pair<double, int64_t> step(int64_t s, const comm::op_options& opts) override {
    step_work work;
    work.step = s;
    work.data_position = s - 1;
    const step_outcome out = gen->compute(work);
    gen->reduce({opts});
    gen->apply({s, 0, opts});
    return {out.loss_sum, out.count};
  }
  double lr(int64_t s) override { return gen->learning_rate(s); }
  double norm() override { return gen->local_grad_norm(); }
  std::pair<double, int64_t> eval() override {
    const eval_result e = gen->evaluate({});
    return {e.loss_sum, e.batches};
  }
  // Through the state the generation declares, mapped back: the checkpoint's view of it.
  struct view_engine {
    state_view view;
    ckpt::state_map state_map() const { return state_map_of(view); }
    local_state state() const { return local_state_of(view); }
  };
  void place(const model_config& model, testing::full_model_state& into, std::mutex& mu) override {
    view_engine v{gen->state()};
    auto& engine = static_cast<gpt_generation&>(*gen).engine();
    // The declared state is the engine's, in place.
    const auto mine = engine.state_map();
    const auto back = v.state_map();
    for (size_t a = 0; a < mine.arrays.size(); ++a) {
      ASSERT_EQ(back.arrays[a].size(), mine.arrays[a].size());
      for (size_t i = 0; i < mine.arrays[a].size(); ++i) {
        EXPECT_EQ(back.arrays[a][i].tensor, mine.arrays[a][i].tensor);
        EXPECT_EQ(back.arrays[a][i].where, mine.arrays[a][i].where);
        EXPECT_EQ(back.arrays[a][i].local_offset, mine.arrays[a][i].local_offset);
        EXPECT_EQ(back.arrays[a][i].replicas, mine.arrays[a][i].replicas);
        EXPECT_EQ(back.arrays[a][i].replica_index, mine.arrays[a][i].replica_index);
      }
      EXPECT_EQ(v.state().buffers[a].data(), engine.state().buffers[a].data());
    }
    EXPECT_EQ(v.state().adam_t, engine.state().adam_t);
    testing::place_rank_state(v, model, into, mu);
  }
};

run_result train(const train_config& cfg, const layout_plan& plan, bool workload) {
  const int world = plan.shape.world();
  comm::tcp_store_server server;
  const token_dataset data = tiny_data();
  run_result out;
  const auto n = static_cast<size_t>(cfg.steps);
  out.loss_sums.assign(n, 0.0);
  out.counts.assign(n, 0.0);
  out.lrs.assign(n, 0.0);
  out.norms.assign(n, 0.0);
  std::mutex m, full_mu;
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        auto store = comm::connect_tcp_store("127.0.0.1", server.port(), 10s);
        connect_fn connect = [&](const comm::comm_identity& id) {
          return comm::make_gloo_communicator(*store, id);
        };
        std::unique_ptr<rank_run> run;
        if (workload)
          run = std::make_unique<through_workload>(cfg, data, plan, r, connect);
        else
          run = std::make_unique<through_engine>(cfg, data, plan, r, connect);
        run->init(cfg.seed);
        const comm::op_options opts{20s};
        for (int64_t s = 1; s <= cfg.steps; ++s) {
          const auto [loss, count] = run->step(s, opts);
          const double lr = run->lr(s), norm = run->norm();
          std::lock_guard lock(m);
          out.loss_sums[static_cast<size_t>(s - 1)] += loss;
          out.counts[static_cast<size_t>(s - 1)] += static_cast<double>(count);
          if (r == 0) out.lrs[static_cast<size_t>(s - 1)] = lr;
          out.norms[static_cast<size_t>(s - 1)] += norm;
        }
        const auto [eval_sum, eval_batches] = run->eval();
        run->place(cfg.model, out.full, full_mu);
        std::lock_guard lock(m);
        out.eval_sum += eval_sum;
        out.eval_batches += eval_batches;
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  return out;
}

struct case_t {
  const char* name;
  int dp, tp, pp, ep, zero, experts;
};

class GptWorkload : public ::testing::TestWithParam<case_t> {};

TEST_P(GptWorkload, GivesTheEnginesResultsBitForBit) {
  set_blas_threads(1);
  const case_t c = GetParam();
  train_config cfg = tiny_config();
  cfg.parallel.zero = c.zero;
  cfg.model.experts = c.experts;
  layout shape;
  shape.dp = c.dp;
  shape.tp = c.tp;
  shape.pp = c.pp;
  shape.ep = c.ep;
  const layout_plan plan = make_plan(shape, cfg.model, constraints_from(cfg));
  const run_result engine = train(cfg, plan, false);
  const run_result seam = train(cfg, plan, true);
  EXPECT_EQ(seam.loss_sums, engine.loss_sums);
  EXPECT_EQ(seam.counts, engine.counts);
  EXPECT_EQ(seam.lrs, engine.lrs);
  EXPECT_EQ(seam.norms, engine.norms);
  EXPECT_EQ(seam.eval_sum, engine.eval_sum);
  EXPECT_EQ(seam.eval_batches, engine.eval_batches);
  EXPECT_EQ(seam.full.params, engine.full.params);
  EXPECT_EQ(seam.full.exp_avg, engine.full.exp_avg);
  EXPECT_EQ(seam.full.exp_avg_sq, engine.full.exp_avg_sq);
  EXPECT_GT(engine.counts.front(), 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, GptWorkload,
    ::testing::Values(case_t{"one_rank", 1, 1, 1, 1, 0, 0}, case_t{"dp2", 2, 1, 1, 1, 0, 0},
                      case_t{"dp2_zero1", 2, 1, 1, 1, 1, 0}, case_t{"tp2", 1, 2, 1, 1, 0, 0},
                      case_t{"pp2", 1, 1, 2, 1, 0, 0}, case_t{"dp2_ep2_moe", 2, 1, 1, 2, 0, 2}),
    [](const auto& param_info) { return std::string(param_info.param.name); });

TEST(GptWorkloadTraits, SaysWhatTheGptIs) {
  const train_config cfg = tiny_config();
  const token_dataset data = tiny_data();
  const auto t = gpt_workload(cfg, data).traits();
  EXPECT_EQ(t.name, "gpt");
  EXPECT_EQ(t.layouts, layout_support::planned);
  EXPECT_EQ(t.reduces, reduction::by_workload);
  EXPECT_EQ(t.count_unit, "tokens");
  EXPECT_FALSE(t.host_driven);
  EXPECT_FALSE(t.dynamic_state);
}

TEST(GptWorkloadState, ARegionOfAnotherDtypeIsRefusedByName) {
  state_view v;
  state_region r;
  r.array = "model";
  r.type = dtype::i64;
  v.regions.push_back(r);
  try {
    (void)state_map_of(v);
    ADD_FAILURE() << "an i64 region was taken for the GPT's";
  } catch (const workload_error& e) {
    EXPECT_NE(std::string(e.what()).find("state array 'model' (i64)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace troupe::strategies
