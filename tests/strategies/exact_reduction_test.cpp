// --reduction exact (issue 42): the same bits whatever the world. Ranks are threads of this
// process over real communicators (shared memory and gloo over loopback TCP).
//  - exact_reducer alone: micro-batch gradients split among 1 to 4 replicas in every way the
//    tests name (even, uneven, a replica's several pieces, small buckets with empty slices)
//    sum to the bits one replica gives, and so does the loss.
//  - The built-in GPT's dense engine: 3 steps at dp 1 to 4 and at uneven plans, with and
//    without ZeRO-1, give the same parameters, AdamW moments and step losses, byte for byte;
//    so does tp 2 at dp 1 to 3, and pp 2 (GPipe and 1F1B, ZeRO-1 or not, tp 2 inside).
//  - The exact norm: a buffer's block sums, sharded at any count of shards, give its bits.

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/shm_communicator.hpp"
#include "runtime/comm/store.hpp"
#include "strategies/engine.hpp"
#include "strategies/exact_reducer.hpp"
#include "strategies/planner.hpp"
#include "tests/runtime/comm/tree_leaves.hpp"
#include "tests/strategies/gather_state.hpp"
#include "tests/strategies/tiny_job.hpp"

namespace troupe::strategies {
namespace {

using namespace std::chrono_literals;

// Runs body(rank, connect) on `world` threads, where connect builds a communicator over one
// transport through a shared store; every error is a failure.
void run_ranks(int world, const std::string& transport,
               const std::function<void(int, const connect_fn&)>& body) {
  comm::tcp_store_server server;
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        auto store = comm::connect_tcp_store("127.0.0.1", server.port(), 10s);
        const connect_fn connect = [&](const comm::comm_identity& id) {
          return transport == "shm" ? comm::make_shm_communicator(*store, id)
                                    : comm::make_gloo_communicator(*store, id);
        };
        body(r, connect);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

// Leaf i's gradient: values whose order of summation shows.
std::vector<float> leaf(int i, size_t n) { return test::tree_leaf(i, n); }

struct summed {
  std::vector<std::vector<float>> grads;  // per replica
  std::vector<double> losses;             // per replica
};

summed reduce_split(const std::vector<int>& counts, size_t n, size_t bucket,
                    const std::string& transport) {
  const int world = static_cast<int>(counts.size());
  summed out;
  out.grads.assign(counts.size(), std::vector<float>(n, -1.0f));
  out.losses.assign(counts.size(), 0.0);
  run_ranks(world, transport, [&](int r, const connect_fn& connect) {
    const auto c = connect({1, "dp", r, world});
    exact_reducer reducer(counts, r, n, bucket);
    for (int step = 0; step < 2; ++step) {  // the second step reuses every buffer
      reducer.begin_step();
      for (int i = reducer.first(); i < reducer.first() + reducer.count(); ++i) {
        std::vector<float> g = leaf(i + step, n);
        reducer.add_micro_batch(i, g, 1.0 / (i + 3.0) + step);
      }
      reducer.all_reduce(*c, out.grads[static_cast<size_t>(r)].data(), {10s});
      out.losses[static_cast<size_t>(r)] = reducer.job_loss_sum(*c, {10s});
    }
  });
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(ExactReducer, EverySplitGivesTheBitsOfOneReplica) {
  const size_t n = 1001;
  for (const std::string transport : {"shm", "gloo"}) {
    for (const int M : {4, 8}) {
      const summed one = reduce_split({M}, n, 4096, transport);
      const std::vector<std::vector<int>> splits =
          M == 4
              ? std::vector<std::vector<int>>{{2, 2}, {2, 1, 1}, {1, 1, 1, 1}, {1, 3}, {3, 1}}
              : std::vector<std::vector<int>>{{4, 4}, {3, 3, 2}, {2, 2, 2, 2}, {1, 6, 1}, {5, 3}};
      for (const auto& split : splits)
        for (const size_t bucket : {size_t{4096}, size_t{7}}) {
          const summed got = reduce_split(split, n, bucket, transport);
          for (size_t r = 0; r < split.size(); ++r) {
            EXPECT_TRUE(same_bits(got.grads[r], one.grads[0]))
                << transport << " M " << M << " split of " << split.size() << " replica " << r
                << " bucket " << bucket;
            EXPECT_EQ(got.losses[r], one.losses[0]) << transport << " M " << M;
          }
        }
    }
  }
  // Not vacuous: adding the leaves in rank order after each replica's own sum differs.
  std::vector<float> fold(n, 0.0f), half(n, 0.0f);
  for (int i = 0; i < 3; ++i) {
    const auto g = leaf(i, n);
    for (size_t j = 0; j < n; ++j) half[j] += g[j];
  }
  const auto last = leaf(3, n);
  for (size_t j = 0; j < n; ++j) fold[j] = half[j] + last[j];
  EXPECT_FALSE(same_bits(fold, reduce_split({4}, n, 4096, "shm").grads[0]))
      << "the leaves should be ones whose order of summation shows";
}

TEST(ExactReducer, AReplicaWithoutMicroBatchesTakesPart) {
  const summed one = reduce_split({4}, 50, 4096, "gloo");
  const summed got = reduce_split({2, 0, 2}, 50, 16, "gloo");
  for (size_t r = 0; r < 3; ++r) EXPECT_TRUE(same_bits(got.grads[r], one.grads[0])) << r;
}

TEST(ExactNorm, ShardsGiveTheBitsOfTheWholeBuffer) {
  const size_t n = 5 * norm_block + 321;
  const std::vector<float> g = leaf(7, n);
  const double whole = exact_grad_norm(g.data(), n);
  for (const int world : {1, 2, 3, 4})
    run_ranks(world, "gloo", [&](int r, const connect_fn& connect) {
      const auto c = connect({1, "dp", r, world});
      const size_t block = ((n + world - 1) / world + norm_block - 1) / norm_block * norm_block;
      const size_t offset = std::min(n, static_cast<size_t>(r) * block);
      const size_t count = std::min(n, offset + block) - offset;
      const double got = exact_grad_norm(*c, g.data() + offset, offset, count, block, {10s});
      EXPECT_EQ(got, whole) << "world " << world << " rank " << r;
    });
  EXPECT_THROW(block_sq_sums(g.data(), 3, 10), std::invalid_argument);
  // The masked sum (a pipeline stage's tied copy, a tp peer's replicas left out) is the
  // unmasked one when nothing is left out, and leaving a value out is adding its zero.
  std::vector<uint8_t> every(n, 1), some(n, 1);
  std::vector<float> zeroed = g;
  for (size_t i = 0; i < n; i += 3) {
    some[i] = 0;
    zeroed[i] = 0.0f;
  }
  EXPECT_EQ(exact_sq_sum(g.data(), n, every.data()), exact_sq_sum(g.data(), n));
  EXPECT_EQ(exact_sq_sum(g.data(), n, some.data()), exact_sq_sum(zeroed.data(), n));
}

// The validation loss in batch order at any dp: values whose sum depends on the grouping
// (per-batch losses are floats widened to double, whose short sums are exact in any order,
// but nothing guarantees that), batch b on replica b % dp.
TEST(ExactEval, TheValidationSumIsTheBatchOrderSumAtAnyDp) {
  const int batches = 7;
  const std::vector<double> loss{1e16, 1.0, -1e16, 3.0, 0.1, 1e-3, 2.5};
  double want = 0;
  for (const double v : loss) want += v;
  for (const int world : {1, 2, 3, 4}) {
    double grouped = 0;  // the fast way: each replica's sum, then the replicas'
    for (int r = 0; r < world; ++r) {
      double mine = 0;
      for (int b = r; b < batches; b += world) mine += loss[static_cast<size_t>(b)];
      grouped += mine;
    }
    if (world == 2) {
      EXPECT_NE(grouped, want) << "the values would not show a grouping";
    }
    run_ranks(world, "gloo", [&](int r, const connect_fn& connect) {
      const auto c = connect({1, "dp", r, world});
      std::vector<double> mine;
      for (int b = r; b < batches; b += world) mine.push_back(loss[static_cast<size_t>(b)]);
      EXPECT_EQ(exact_eval_sum(*c, mine, batches, {10s}), want) << "world " << world;
    });
  }
}

TEST(ExactReducer, MisuseIsRefused) {
  EXPECT_THROW(exact_reducer({2, 2}, 2, 10, 10), std::invalid_argument);
  EXPECT_THROW(exact_reducer({0, 0}, 0, 10, 10), std::invalid_argument);
  EXPECT_THROW(exact_reducer({2, -1}, 0, 10, 10), std::invalid_argument);
  exact_reducer r({2, 2}, 1, 10, 10);
  r.begin_step();
  std::vector<float> g(10);
  EXPECT_THROW(r.add_micro_batch(0, g, 0.0), std::invalid_argument) << "replica 1 holds 2 and 3";
}

// ---- the dense engine --------------------------------------------------------------------

struct trained {
  testing::full_model_state full;
  std::vector<double> losses;  // per step, summed over ranks as the coordinator does
};

trained train(train_config cfg, const std::vector<int>& counts, const std::string& transport,
              const std::string& reduction = "exact", int tp = 1, int pp = 1) {
  cfg.parallel.reduction = reduction;
  // The one-replica plan, divided as the test says (the planner would refuse 3 even replicas
  // of 4 micro-batches; a job's replan after a loss divides them unevenly like this).
  layout one;
  one.tp = tp;
  one.pp = pp;
  layout_plan plan = make_plan(one, cfg.model, constraints_from(cfg));
  plan.shape.dp = static_cast<int>(counts.size());
  plan.replica_micro_batches = counts;
  const int world = plan.shape.dp * tp * pp;
  const token_dataset data = testing::tiny_data();
  trained out;
  out.losses.assign(static_cast<size_t>(cfg.steps), 0.0);
  std::mutex mu;
  run_ranks(world, transport, [&](int r, const connect_fn& connect) {
    training_engine engine(cfg, plan.shape, r, 1, connect,
                           micro_batching{plan.micro_batch_size, plan.replica_micro_batches});
    engine.init(cfg.seed);
    for (int64_t s = 0; s < cfg.steps; ++s) {
      const grad_result g = engine.compute(data, s);
      engine.reduce({20s});
      const auto loss = engine.reduced_loss_sum();
      ASSERT_EQ(loss.has_value(), reduction == "exact");
      engine.apply(s, {20s});
      if (!engine.reports_loss()) continue;  // a tp peer's loss is its replica's first rank's
      std::lock_guard lock(mu);
      out.losses[static_cast<size_t>(s)] += loss.value_or(g.loss_sum);
    }
    testing::place_rank_state(engine, cfg.model, out.full, mu);
  });
  return out;
}

void expect_same(const trained& got, const trained& want, const std::string& what) {
  EXPECT_TRUE(same_bits(got.full.params, want.full.params)) << what << ": params";
  EXPECT_TRUE(same_bits(got.full.exp_avg, want.full.exp_avg)) << what << ": exp_avg";
  EXPECT_TRUE(same_bits(got.full.exp_avg_sq, want.full.exp_avg_sq)) << what << ": exp_avg_sq";
  EXPECT_EQ(got.losses, want.losses) << what << ": step losses";
}

TEST(ExactDenseEngine, EveryWorldAndSplitGivesTheBitsOfOneRank) {
  set_blas_threads(1);
  train_config cfg = testing::tiny_config(2);
  cfg.optim.eps = 1e-8;  // Adam's own: the last bit of a near-zero gradient shows
  const trained one = train(cfg, {4}, "gloo");
  ASSERT_FALSE(one.full.params.empty());
  EXPECT_LT(one.losses.back(), one.losses.front()) << "the model should train";
  for (const auto& split : std::vector<std::vector<int>>{{2, 2}, {2, 1, 1}, {1, 1, 1, 1}, {3, 1}})
    for (const std::string transport : {"shm", "gloo"})
      expect_same(train(cfg, split, transport), one,
                  transport + " split of " + std::to_string(split.size()));
  // 8 micro-batches of 1: replicas holding several pieces ([3, 3, 2]: 2, 2 and 1).
  cfg.micro_batch = 1;
  const trained eight = train(cfg, {8}, "shm");
  expect_same(train(cfg, {3, 3, 2}, "shm"), eight, "M 8 as 3, 3, 2");
  expect_same(train(cfg, {1, 6, 1}, "gloo"), eight, "M 8 as 1, 6, 1");
  // ZeRO-1 sums into shards of whole norm blocks and clips as dp does: dp's bits, any split.
  train_config zero = cfg;
  zero.parallel.zero = 1;
  for (const auto& split : std::vector<std::vector<int>>{{8}, {4, 4}, {3, 3, 2}, {2, 2, 2, 2}})
    expect_same(train(zero, split, "shm"), eight,
                "ZeRO-1, split of " + std::to_string(split.size()));
  // Not vacuous: the fast reduction on 4 replicas does not give one rank's bits.
  const trained fast = train(cfg, {2, 2, 2, 2}, "shm", "fast");
  EXPECT_FALSE(same_bits(fast.full.params, eight.full.params))
      << "the fast reduction gave one rank's bits: the comparison above would see nothing";
}

// Tensor parallelism at a fixed degree: each rank's shard is summed exactly over its dp
// group, and the model's tp sums do not depend on the dp size: tp 2 gives the same bits at
// dp 1, 2 and 3, over either transport.
TEST(ExactDenseEngine, TensorParallelGivesTheBitsOfOneReplicaAtAnyDp) {
  set_blas_threads(1);
  train_config cfg = testing::tiny_config(2);
  cfg.optim.eps = 1e-8;
  cfg.model.n_head = 2;
  cfg.micro_batch = 1;  // 8 micro-batches: [3, 3, 2] holds several pieces per replica
  const trained one = train(cfg, {8}, "shm", "exact", 2);
  ASSERT_FALSE(one.full.params.empty());
  EXPECT_LT(one.losses.back(), one.losses.front()) << "the model should train";
  expect_same(train(cfg, {4, 4}, "shm", "exact", 2), one, "tp 2 x dp 2 over shm");
  expect_same(train(cfg, {4, 4}, "gloo", "exact", 2), one, "tp 2 x dp 2 over gloo");
  expect_same(train(cfg, {3, 3, 2}, "shm", "exact", 2), one, "tp 2 x dp 3 as 3, 3, 2");
  const trained fast = train(cfg, {4, 4}, "shm", "fast", 2);
  EXPECT_FALSE(same_bits(fast.full.params, one.full.params))
      << "the fast reduction gave one replica's bits: the comparison above would see nothing";
}

// Three tp ranks: with the exact reduction the model's tp sums are the rank-order tree, so a
// tp group on shared memory (one node) and on the gloo ring (across nodes: sums above its
// 64 KiB small-message path, which the ring adds in an order that starts at each block's own
// rank) gives the same bits. Not vacuous: the fast reduction's tp sums differ between the two.
TEST(ExactDenseEngine, ThreeTensorParallelRanksGiveTheSameBitsOnEveryTransport) {
  set_blas_threads(1);
  train_config cfg = testing::tiny_config(1);
  cfg.optim.eps = 1e-8;
  cfg.model.n_head = 3;
  cfg.model.d_model = 48;
  cfg.model.vocab = 258;  // divisible by 3: the vocabulary-parallel embedding
  cfg.model.context = 64;
  cfg.micro_batch = 8;  // one micro-batch of 8 x 64 tokens: 24,576-float activation sums
  const trained shm = train(cfg, {1}, "shm", "exact", 3);
  ASSERT_FALSE(shm.full.params.empty());
  EXPECT_LT(shm.losses.back(), shm.losses.front()) << "the model should train";
  expect_same(train(cfg, {1}, "gloo", "exact", 3), shm, "tp 3 over gloo");
  const trained fast_shm = train(cfg, {1}, "shm", "fast", 3);
  const trained fast_gloo = train(cfg, {1}, "gloo", "fast", 3);
  EXPECT_FALSE(same_bits(fast_shm.full.params, fast_gloo.full.params))
      << "the fast reduction's tp sums gave the same bits on both transports: the comparison "
         "above would see nothing";
}

// Pipeline stages at a fixed pp (and tp): each stage's gradient summed along the tree over its
// dp group, the tied embedding's two stage sums added after, the norm in fixed blocks: the
// same bits at dp 1 to 3, under GPipe (backward passes from the last micro-batch down) and
// 1F1B alike, with ZeRO-1 or without, over either transport.
TEST(ExactPipelineEngine, StagesGiveTheBitsOfOneReplicaAtAnyDpScheduleAndZero) {
  set_blas_threads(1);
  train_config cfg = testing::tiny_config(2);
  cfg.optim.eps = 1e-8;
  cfg.micro_batch = 1;  // 8 micro-batches
  cfg.parallel.schedule = "gpipe";
  const trained one = train(cfg, {8}, "shm", "exact", 1, 2);
  ASSERT_FALSE(one.full.params.empty());
  EXPECT_LT(one.losses.back(), one.losses.front()) << "the model should train";
  expect_same(train(cfg, {4, 4}, "shm", "exact", 1, 2), one, "pp 2 x dp 2, gpipe");
  expect_same(train(cfg, {3, 3, 2}, "gloo", "exact", 1, 2), one, "pp 2 x dp 3, gpipe, gloo");
  train_config one_f_one_b = cfg;
  one_f_one_b.parallel.schedule = "1f1b";
  expect_same(train(one_f_one_b, {8}, "shm", "exact", 1, 2), one, "pp 2 x dp 1, 1f1b");
  expect_same(train(one_f_one_b, {4, 4}, "gloo", "exact", 1, 2), one, "pp 2 x dp 2, 1f1b");
  train_config zero = one_f_one_b;
  zero.parallel.zero = 1;
  expect_same(train(zero, {4, 4}, "shm", "exact", 1, 2), one, "pp 2 x dp 2, ZeRO-1");
  expect_same(train(zero, {3, 3, 2}, "shm", "exact", 1, 2), one, "pp 2 x dp 3, ZeRO-1");
  // tp 2 inside each stage, and tp with ZeRO-1 (the pipeline backend at pp 1).
  const trained tp_pp = train(cfg, {8}, "shm", "exact", 2, 2);
  expect_same(train(zero, {4, 4}, "shm", "exact", 2, 2), tp_pp, "tp 2 x pp 2 x dp 2, ZeRO-1");
  const trained tp_zero = train(zero, {8}, "shm", "exact", 2, 1);
  expect_same(train(zero, {4, 4}, "gloo", "exact", 2, 1), tp_zero, "tp 2 x dp 2, ZeRO-1");
  // The dense backend runs tp without ZeRO-1: the same norm, so the same bits (this config
  // clips every step).
  expect_same(train(cfg, {4, 4}, "shm", "exact", 2, 1), tp_zero, "tp 2 x dp 2 (dense backend)");
  const trained fast = train(cfg, {4, 4}, "shm", "fast", 1, 2);
  EXPECT_FALSE(same_bits(fast.full.params, one.full.params))
      << "the fast reduction gave one replica's bits: the comparison above would see nothing";
}

TEST(ExactDenseEngine, WithoutThePlansMicroBatchesItIsRefused) {
  train_config cfg = testing::tiny_config(2);
  cfg.parallel.reduction = "exact";
  connect_fn connect = [](const comm::comm_identity&) -> std::unique_ptr<comm::communicator> {
    return nullptr;
  };
  try {
    training_engine engine(cfg, layout{}, 0, 1, connect, micro_batching{});
    ADD_FAILURE() << "--reduction exact without the plan's micro-batches was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--reduction exact"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe::strategies
