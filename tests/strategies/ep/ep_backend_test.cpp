// The expert backend (make_expert_backend) against the one-rank reference trainer: ranks are
// threads with gloo communicators. Layouts ep2, dp2xep2 and dp2 (ep 1) of an MoE model that
// drops tokens must give the reference's loss every step, its parameters after training
// (assembled from each rank's state map), its validation loss, and whole-step expert loads; a
// restore from the reference's state must continue it. Also the sample mapping itself, and
// that a plan's micro-batching (not the config's micro_batch) decides the split.

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <future>
#include <iostream>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/store.hpp"
#include "runtime/optim/adamw.hpp"
#include "runtime/trainer.hpp"
#include "strategies/engine_backend.hpp"
#include "strategies/expert_parallel/expert_parallel.hpp"
#include "tests/strategies/gather_state.hpp"

namespace troupe {
namespace {

using namespace std::chrono_literals;
namespace ts = strategies;

TEST(ep_sample_plan, ep_groups_cover_each_micro_batch_in_order) {
  // G = 16, mb = 4, ep = 2, dp / ep = 2: copy x takes micro-batches [2x, 2x + 2), ep rank e
  // the e-th half of each; together every sample exactly once.
  std::vector<int> seen(16, 0);
  for (int x = 0; x < 2; ++x)
    for (int e = 0; e < 2; ++e) {
      const auto p = ts::plan_ep_samples(16, 4, 2, 2, e, x);
      EXPECT_EQ(p.count, 2);
      EXPECT_EQ(p.slice, 2);
      for (int i = 0; i < p.count; ++i) {
        const int k = p.first_micro_batch + i;
        EXPECT_EQ(p.first_sample(i), k * 4 + e * 2);
        for (int s = 0; s < p.slice; ++s) ++seen[static_cast<size_t>(p.first_sample(i) + s)];
      }
    }
  for (int n : seen) EXPECT_EQ(n, 1);
}

TEST(ep_sample_plan, rejects_batches_that_do_not_split) {
  EXPECT_NE(ts::check_ep_batch(16, 3, 1, 1).find("micro_batch (3) must divide batch (16)"),
            std::string::npos);
  EXPECT_NE(ts::check_ep_batch(16, 2, 4, 1).find("ep (4) must divide micro_batch (2)"),
            std::string::npos);
  EXPECT_NE(ts::check_ep_batch(8, 4, 2, 4).find("dp / ep (4) must divide the 2 micro-batches"),
            std::string::npos);
  EXPECT_EQ(ts::check_ep_batch(8, 4, 2, 2), "");
  EXPECT_THROW(ts::plan_ep_samples(16, 2, 4, 1, 0, 0), std::invalid_argument);
}

TEST(ep_sample_plan, a_plan_gives_each_ep_group_its_replicas_micro_batches) {
  // An even plan in the config's micro-batch size splits exactly as the config does.
  for (int x = 0; x < 2; ++x)
    for (int e = 0; e < 2; ++e) {
      const auto from_plan = ts::plan_ep_samples({2, 2, 2, 2}, 2, 2, e, x);
      const auto from_config = ts::plan_ep_samples(16, 2, 2, 2, e, x);
      EXPECT_EQ(from_plan.micro_batches, from_config.micro_batches);
      EXPECT_EQ(from_plan.first_micro_batch, from_config.first_micro_batch);
      EXPECT_EQ(from_plan.count, from_config.count);
      EXPECT_EQ(from_plan.slice, from_config.slice);
      EXPECT_EQ(from_plan.slice_offset, from_config.slice_offset);
    }
  // Copies may run different counts: replicas {0, 1} run 2 micro-batches of 4 each, replicas
  // {2, 3} one each, so ep group 0 runs micro-batches [0, 4), group 1 [4, 6).
  std::vector<int> seen(24, 0);
  for (int x = 0; x < 2; ++x)
    for (int e = 0; e < 2; ++e) {
      const auto p = ts::plan_ep_samples({2, 2, 1, 1}, 4, 2, e, x);
      EXPECT_EQ(p.micro_batches, 6);
      EXPECT_EQ(p.first_micro_batch, x == 0 ? 0 : 4);
      EXPECT_EQ(p.count, x == 0 ? 4 : 2);
      EXPECT_EQ(p.slice, 2);
      for (int i = 0; i < p.count; ++i)
        for (int s = 0; s < p.slice; ++s) ++seen[static_cast<size_t>(p.first_sample(i) + s)];
    }
  for (int n : seen) EXPECT_EQ(n, 1);
}

TEST(ep_sample_plan, refuses_plans_an_ep_group_cannot_share) {
  const auto why = [](std::vector<int> counts, int mb, int ep) {
    return ts::check_ep_batching(counts, mb, ep);
  };
  EXPECT_EQ(why({2, 2, 1, 1}, 4, 2), "");
  EXPECT_NE(why({2, 1, 1}, 4, 2).find("3 data-parallel replicas, which is not a multiple of ep"),
            std::string::npos);
  EXPECT_NE(why({2, 2}, 1, 2).find("ep (2) must divide the plan's micro-batch size (1)"),
            std::string::npos);
  // A straggler's lighter load cannot be given to one rank of an ep group.
  EXPECT_NE(why({1, 2, 2, 2}, 4, 2).find("replica 0 1 micro-batches but replica 1"),
            std::string::npos);
  EXPECT_NE(why({0, 0}, 4, 2).find("no micro-batch"), std::string::npos);
  EXPECT_THROW(ts::plan_ep_samples({1, 2}, 4, 2, 0, 0), std::invalid_argument);
  EXPECT_THROW(ts::plan_ep_samples({2, 2}, 4, 2, 0, 1), std::invalid_argument);
}

train_config tiny_moe() {
  train_config cfg;
  cfg.model.n_layer = 2;
  cfg.model.n_head = 2;
  cfg.model.d_model = 32;
  cfg.model.context = 16;
  cfg.model.experts = 4;
  cfg.model.top_k = 2;
  cfg.model.capacity_factor = 0.6;  // low enough that tokens are dropped
  cfg.batch = 8;
  cfg.micro_batch = 4;
  cfg.steps = 4;
  cfg.eval_batches = 3;
  cfg.optim.warmup_steps = 2;
  cfg.optim.grad_clip = 0.5;  // so clipping by the global norm really happens
  cfg.step_timeout_ms = 30000;
  return cfg;
}

token_dataset corpus() {
  std::vector<uint8_t> bytes(20000);
  uint32_t h = 12345;
  for (auto& b : bytes) {
    h = h * 1664525u + 1013904223u;
    b = static_cast<uint8_t>('a' + (h >> 24) % 26);
  }
  return token_dataset::from_bytes(std::move(bytes), 0.2);
}

struct reference_run {
  std::vector<double> losses;              // per step
  std::vector<std::vector<float>> params;  // after each step
  ckpt::full_state state;                  // after the last step
  double val = 0;
};

reference_run run_reference(const train_config& cfg, const token_dataset& data, int steps) {
  reference_run out;
  gpt m(cfg.model);
  m.init_params(cfg.seed);
  adamw opt(cfg.optim, m.param_table(), m.num_params());
  for (int s = 0; s < steps; ++s) {
    const grad_result g = compute_gradients(m, data, cfg, s, 0, 1);
    out.losses.push_back(g.loss_sum / static_cast<double>(g.tokens));
    opt.clip_gradients(m.grads(), m.num_params());
    opt.step(m.params(), m.grads(), s, cfg.steps);
    out.params.emplace_back(m.params(), m.params() + m.num_params());
  }
  out.val = evaluate(m, data, cfg);
  out.state.params = out.params.back();
  out.state.exp_avg = opt.exp_avg();
  out.state.exp_avg_sq = opt.exp_avg_sq();
  out.state.adam_t = opt.t();
  out.state.step = steps;
  return out;
}

struct layout_run {
  std::vector<double> losses;
  std::vector<float> params;  // full one-rank layout after the last step
  double val = 0;
  std::vector<std::vector<int64_t>> tokens;  // per step: [block * E] summed over reports
  std::vector<int64_t> dropped;              // per step, all blocks
};

std::atomic<uint64_t> next_generation{1};

// Trains `steps` steps of `shape` (optionally from `from`, optionally as a plan divides the
// steps), ranks as threads.
layout_run run_layout(const train_config& cfg, const token_dataset& data, ts::layout shape,
                      int steps, const ckpt::full_state* from = nullptr,
                      const ts::micro_batching& batching = {}) {
  const int world = shape.world();
  const uint64_t generation = next_generation++;
  const int first_step = from ? static_cast<int>(from->step) : 0;
  comm::tcp_store_server server;
  layout_run out;
  out.params.assign(0, 0.0f);
  std::vector<double> loss_sum(static_cast<size_t>(steps), 0.0);
  std::vector<int64_t> tokens(static_cast<size_t>(steps), 0);
  const size_t per_step = static_cast<size_t>(cfg.model.n_layer * cfg.model.experts);
  out.tokens.assign(static_cast<size_t>(steps), std::vector<int64_t>(per_step, 0));
  out.dropped.assign(static_cast<size_t>(steps), 0);
  double val_sum = 0;
  int64_t val_batches = 0;
  testing::full_model_state full;
  std::mutex full_mu;
  std::mutex mu;
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto store = comm::connect_tcp_store("127.0.0.1", server.port(), 10s);
      auto connect = [&](const comm::comm_identity& id) {
        return comm::make_gloo_communicator(*store, id);
      };
      auto b = ts::make_expert_backend(cfg, shape, r, generation, connect, batching);
      b->init(cfg.seed);
      if (from) b->restore(*from);
      const comm::op_options opts{30s};
      for (int s = 0; s < steps; ++s) {
        const grad_result g = b->compute(data, first_step + s);
        auto load = b->take_expert_load();
        b->reduce(opts);
        b->apply(first_step + s, opts);
        std::lock_guard lock(mu);
        if (b->reports_loss()) {
          loss_sum[static_cast<size_t>(s)] += g.loss_sum;
          tokens[static_cast<size_t>(s)] += g.tokens;
        }
        for (size_t l = 0; l < load.tokens.size(); ++l) {
          for (size_t e = 0; e < load.tokens[l].size(); ++e)
            out.tokens[static_cast<size_t>(s)][l * static_cast<size_t>(cfg.model.experts) + e] +=
                load.tokens[l][e];
          out.dropped[static_cast<size_t>(s)] += load.dropped[l];
        }
      }
      const ts::eval_share share = b->evaluate(data);
      testing::place_rank_state(*b, cfg.model, full, full_mu);
      std::lock_guard lock(mu);
      val_sum += share.loss_sum;
      val_batches += share.batches;
    }));
  }
  for (auto& f : ranks) f.get();
  for (int s = 0; s < steps; ++s)
    out.losses.push_back(loss_sum[static_cast<size_t>(s)] /
                         static_cast<double>(tokens[static_cast<size_t>(s)]));
  out.val = val_sum / static_cast<double>(val_batches);
  out.params = full.params;
  return out;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return worst / std::max(scale, 1e-12);
}

struct layout_case {
  const char* name;
  ts::layout shape;
};

class expert_backend : public ::testing::TestWithParam<layout_case> {};

TEST_P(expert_backend, matches_the_one_rank_trainer) {
  const train_config cfg = tiny_moe();
  const auto data = corpus();
  const reference_run ref = run_reference(cfg, data, cfg.steps);
  const layout_run run = run_layout(cfg, data, GetParam().shape, cfg.steps);
  const layout_run one = run_layout(cfg, data, ts::layout{1, 1, 1, 1}, cfg.steps);
  for (int s = 0; s < cfg.steps; ++s) {
    EXPECT_NEAR(run.losses[static_cast<size_t>(s)], ref.losses[static_cast<size_t>(s)],
                1e-5 * ref.losses[static_cast<size_t>(s)])
        << "step " << s;
    // Whole-step loads: every token's top_k choices, once, and the same drops as one rank.
    int64_t total = 0;
    for (int64_t v : run.tokens[static_cast<size_t>(s)]) total += v;
    EXPECT_EQ(total, int64_t{cfg.model.n_layer} * cfg.batch * cfg.model.context * cfg.model.top_k);
    EXPECT_EQ(run.tokens[static_cast<size_t>(s)], one.tokens[static_cast<size_t>(s)])
        << "step " << s;
    EXPECT_EQ(run.dropped[static_cast<size_t>(s)], one.dropped[static_cast<size_t>(s)])
        << "step " << s;
    EXPECT_GT(run.dropped[static_cast<size_t>(s)], 0)
        << "capacity should drop tokens at step " << s;
  }
  double worst = 0;
  for (int s = 0; s < cfg.steps; ++s)
    worst = std::max(
        worst,
        std::abs(run.losses[static_cast<size_t>(s)] / ref.losses[static_cast<size_t>(s)] - 1));
  std::cout << GetParam().name << ": loss " << worst << ", parameters "
            << max_rel_diff(run.params, ref.params.back()) << ", validation "
            << std::abs(run.val / ref.val - 1) << " (relative to one rank); dropped "
            << std::accumulate(run.dropped.begin(), run.dropped.end(), int64_t{0}) << " choices\n";
  EXPECT_LT(max_rel_diff(run.params, ref.params.back()),
            1e-4);  // measured ~8e-6: AdamW magnifies noise
  EXPECT_NEAR(run.val, ref.val, 1e-5 * ref.val);

  // Restoring the reference's state after step 2 and training the rest matches it too.
  const reference_run half = run_reference(cfg, data, 2);
  const layout_run resumed = run_layout(cfg, data, GetParam().shape, cfg.steps - 2, &half.state);
  EXPECT_NEAR(resumed.losses.back(), ref.losses.back(), 1e-5 * ref.losses.back());
  EXPECT_LT(max_rel_diff(resumed.params, ref.params.back()), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(layouts, expert_backend,
                         ::testing::Values(layout_case{"ep2", ts::layout{2, 1, 1, 2}},
                                           layout_case{"dp2xep2", ts::layout{4, 1, 1, 2}},
                                           layout_case{"dp2", ts::layout{2, 1, 1, 1}},
                                           layout_case{"ep4", ts::layout{4, 1, 1, 4}}),
                         [](const auto& c) { return std::string(c.param.name); });

struct plan_case {
  const char* name;
  ts::layout shape;
  int batch;
  ts::micro_batching batching;
};

class expert_backend_plan : public ::testing::TestWithParam<plan_case> {};

// The coordinator's plan decides the micro-batching, not cfg.micro_batch: a plan in
// micro-batches of 2 trains what one rank trains with micro_batch 2, though the config says 4
// (MoE capacity and aux loss are figures of a micro-batch, so the two really differ).
TEST_P(expert_backend_plan, follows_the_plans_micro_batching) {
  train_config cfg = tiny_moe();
  cfg.batch = GetParam().batch;
  cfg.micro_batch = 4;
  train_config planned = cfg;
  planned.micro_batch = GetParam().batching.micro_batch_size;
  const auto data = corpus();
  const reference_run ref = run_reference(planned, data, cfg.steps);
  const reference_run config_said = run_reference(cfg, data, cfg.steps);
  const layout_run run =
      run_layout(cfg, data, GetParam().shape, cfg.steps, nullptr, GetParam().batching);
  const layout_run one = run_layout(planned, data, ts::layout{1, 1, 1, 1}, cfg.steps);
  double apart = 0;
  for (int s = 0; s < cfg.steps; ++s) {
    const auto at = static_cast<size_t>(s);
    EXPECT_NEAR(run.losses[at], ref.losses[at], 1e-5 * ref.losses[at]) << "step " << s;
    EXPECT_EQ(run.tokens[at], one.tokens[at]) << "step " << s;
    EXPECT_EQ(run.dropped[at], one.dropped[at]) << "step " << s;
    apart = std::max(apart, std::abs(config_said.losses[at] / ref.losses[at] - 1));
  }
  EXPECT_LT(max_rel_diff(run.params, ref.params.back()), 1e-4);
  EXPECT_GT(apart, 1e-4) << "micro_batch 4 and the plan's micro-batches should train differently";
}

INSTANTIATE_TEST_SUITE_P(
    plans, expert_backend_plan,
    ::testing::Values(plan_case{"ep2_mb2", ts::layout{2, 1, 1, 2}, 8, {2, {2, 2}}},
                      // Uneven copies: ep group 0 runs 4 micro-batches, group 1 runs 2.
                      plan_case{"dp2xep2_uneven", ts::layout{4, 1, 1, 2}, 12, {2, {2, 2, 1, 1}}}),
    [](const auto& c) { return std::string(c.param.name); });

TEST(expert_backend_layout, refuses_plans_it_cannot_run_with_the_reason) {
  const train_config cfg = tiny_moe();  // batch 8, micro_batch 4
  const auto never = [](const comm::comm_identity&) -> std::unique_ptr<comm::communicator> {
    throw std::logic_error("no communicator should be built for a refused plan");
  };
  const auto reason = [&](const train_config& c, ts::layout l, ts::micro_batching b) {
    try {
      ts::make_expert_backend(c, l, 0, 1, never, b);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(reason(cfg, {2, 1, 1, 2}, {4, {1, 1, 1}}).find("among 3 replicas, the layout has 2"),
            std::string::npos);
  EXPECT_NE(reason(cfg, {4, 1, 1, 4}, {2, {1, 1, 1, 1}})
                .find("ep (4) must divide the plan's micro-batch size (2)"),
            std::string::npos);
  EXPECT_NE(reason(cfg, {2, 1, 1, 2}, {2, {3, 1}}).find("of the same ep group"), std::string::npos);
  EXPECT_NE(
      reason(cfg, {2, 1, 1, 2}, {2, {1, 1}}).find("hold 4 sequences, but a step is batch (8)"),
      std::string::npos);
  train_config single = cfg;  // validation batches of 1 sequence cannot be split over ep 2
  single.micro_batch = 1;
  EXPECT_NE(reason(single, {2, 1, 1, 2}, {4, {1, 1}}).find("each validation batch"),
            std::string::npos);
}

TEST(expert_backend_layout, rejects_what_it_cannot_run_with_the_reason) {
  train_config cfg = tiny_moe();
  const auto never = [](const comm::comm_identity&) -> std::unique_ptr<comm::communicator> {
    throw std::logic_error("no communicator should be built for a rejected layout");
  };
  const auto reason = [&](const train_config& c, ts::layout l) {
    try {
      ts::make_expert_backend(c, l, 0, 1, never);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(reason(cfg, {1, 2, 1, 1}).find("tp = pp = 1"), std::string::npos);
  EXPECT_NE(reason(cfg, {1, 1, 2, 1}).find("tp = pp = 1"), std::string::npos);
  train_config zero = cfg;
  zero.parallel.zero = 1;
  EXPECT_NE(reason(zero, {2, 1, 1, 2}).find("parallel.zero = 0"), std::string::npos);
  train_config odd = cfg;
  odd.micro_batch = 2;
  EXPECT_NE(reason(odd, {4, 1, 1, 4}).find("ep (4) must divide micro_batch (2)"),
            std::string::npos);
  train_config dense = cfg;
  dense.model.experts = 0;
  EXPECT_NE(reason(dense, {2, 1, 1, 2}).find("needs an MoE model"), std::string::npos);
}

}  // namespace
}  // namespace troupe
