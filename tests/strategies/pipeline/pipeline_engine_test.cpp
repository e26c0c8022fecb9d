// Pipeline layouts against one rank, through the training engine: ranks are threads of this
// process with real gloo communicators (through a store server on a free port). Every
// layout must give the single-rank loss at every step and the single-rank parameters after
// the steps, gathered from the ranks' checkpoint shards in the single-rank layout.

#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <thread>

#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/store.hpp"
#include "strategies/engine.hpp"
#include "strategies/pipeline_parallel/pipeline_executor.hpp"
#include "tests/strategies/gather_state.hpp"
#include "tests/strategies/tiny_job.hpp"

namespace troupe::strategies {
namespace {

using namespace std::chrono_literals;

train_config tiny_config() { return testing::tiny_config(3); }
using testing::tiny_data;

struct run_result {
  std::vector<double> losses;  // per step, global mean
  std::vector<float> params;   // final, single-rank layout
  std::vector<float> exp_avg;
  double eval = 0;
};

/// Trains cfg.steps steps of `shape` with one thread per rank.
run_result train(const train_config& cfg, const layout& shape) {
  const int world = shape.world();
  comm::tcp_store_server server;
  const token_dataset data = tiny_data();
  run_result out;
  out.losses.assign(static_cast<size_t>(cfg.steps), 0.0);
  std::vector<double> tokens(static_cast<size_t>(cfg.steps), 0.0);
  testing::full_model_state full;
  std::mutex full_mu;
  std::vector<std::string> errors(static_cast<size_t>(world));
  double eval_sum = 0, eval_batches = 0;
  std::mutex m;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        auto store = comm::connect_tcp_store("127.0.0.1", server.port(), 10s);
        auto connect = [&](const comm::comm_identity& id) {
          return comm::make_gloo_communicator(*store, id);
        };
        training_engine engine(cfg, shape, r, 1, connect);
        engine.init(cfg.seed);
        const comm::op_options opts{20s};
        for (int64_t s = 0; s < cfg.steps; ++s) {
          grad_result g = engine.compute(data, s);
          engine.reduce(opts);
          engine.apply(s, opts);
          if (engine.reports_loss()) {
            std::lock_guard lock(m);
            out.losses[static_cast<size_t>(s)] += g.loss_sum;
            tokens[static_cast<size_t>(s)] += static_cast<double>(g.tokens);
          }
        }
        eval_share e = engine.evaluate(data);
        testing::place_rank_state(engine, cfg.model, full, full_mu);
        std::lock_guard lock(m);
        eval_sum += e.loss_sum;
        eval_batches += static_cast<double>(e.batches);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  for (size_t s = 0; s < out.losses.size(); ++s) out.losses[s] /= tokens[s];
  out.eval = eval_sum / eval_batches;
  out.params = full.params;
  out.exp_avg = full.exp_avg;
  return out;
}

double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

struct case_t {
  const char* name;
  int dp, tp, pp;
  const char* schedule;
  int zero;
  int micro_batches;
};

class PipelineLayouts : public ::testing::TestWithParam<case_t> {};

TEST_P(PipelineLayouts, MatchOneRank) {
  set_blas_threads(1);
  const case_t c = GetParam();
  train_config cfg = tiny_config();
  const run_result one = train(cfg, layout{});
  cfg.parallel.schedule = c.schedule;
  cfg.parallel.zero = c.zero;
  cfg.parallel.micro_batches = c.micro_batches;
  layout shape;
  shape.dp = c.dp;
  shape.tp = c.tp;
  shape.pp = c.pp;
  const run_result got = train(cfg, shape);
  ASSERT_EQ(got.params.size(), one.params.size());
  for (size_t s = 0; s < one.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], one.losses[s], 1e-5 * one.losses[s]) << "step " << s + 1;
  EXPECT_LT(relative_l2(got.params, one.params), 1e-5);
  EXPECT_LT(relative_l2(got.exp_avg, one.exp_avg), 1e-4);
  EXPECT_NEAR(got.eval, one.eval, 1e-5 * one.eval);
}

INSTANTIATE_TEST_SUITE_P(Layouts, PipelineLayouts,
                         ::testing::Values(case_t{"pp2_gpipe", 1, 1, 2, "gpipe", 0, 4},
                                           case_t{"pp2_1f1b", 1, 1, 2, "1f1b", 0, 4},
                                           case_t{"pp3_1f1b_uneven", 1, 1, 3, "1f1b", 0, 4},
                                           case_t{"pp3_gpipe", 1, 1, 3, "gpipe", 0, 8},
                                           case_t{"tp2xpp2", 1, 2, 2, "1f1b", 0, 4},
                                           case_t{"dp2xpp2_zero1", 2, 1, 2, "1f1b", 1, 4},
                                           case_t{"tp2_zero1", 2, 2, 1, "1f1b", 1, 0},
                                           case_t{"dp2xtp2xpp2", 2, 2, 2, "1f1b", 0, 4}),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

}  // namespace
}  // namespace troupe::strategies
