// ZeRO-1 against replicated AdamW: ranks as threads over real Gloo communicators. The
// sharded update (reduce-scatter, local AdamW with global-norm clipping, all-gather) must
// give the same parameters as all-reduce + AdamW on every rank, while each rank holds only
// its shard of the optimizer state.

#include "strategies/zero.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>

#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/store.hpp"

namespace troupe::strategies {
namespace {

using namespace std::chrono_literals;

std::vector<param_tensor> toy_table(size_t n) {
  // Two "weights" with decay and a "bias" without, covering [0, n).
  size_t a = n / 2, b = n / 3;
  return {{"w1", {static_cast<int64_t>(a)}, 0, a, true},
          {"b1", {static_cast<int64_t>(b)}, a, b, false},
          {"w2", {static_cast<int64_t>(n - a - b)}, a + b, n - a - b, true}};
}

TEST(ZeroShardTest, ShardsTileTheLayout) {
  for (size_t n : {1u, 7u, 64u, 1001u})
    for (int dp : {1, 2, 3, 4, 8}) {
      size_t next = 0;
      for (int r = 0; r < dp; ++r) {
        auto s = zero_shard_of(n, r, dp);
        EXPECT_EQ(s.block, (n + dp - 1) / dp);
        EXPECT_EQ(s.offset, std::min(n, next));
        next = s.offset + s.count;
        EXPECT_LE(s.count, s.block);
      }
      EXPECT_EQ(next, n);
    }
  // Aligned (the exact reduction's norm blocks): every shard starts at a multiple of the
  // alignment and they still tile the layout, the last ones maybe empty.
  for (size_t n : {1u, 1000u, 5000u, 70000u})
    for (int dp : {1, 2, 3, 4, 8}) {
      size_t next = 0;
      for (int r = 0; r < dp; ++r) {
        auto s = zero_shard_of(n, r, dp, 1024);
        EXPECT_EQ(s.block % 1024, 0u);
        EXPECT_GE(s.block * static_cast<size_t>(dp), n);
        EXPECT_EQ(s.offset, std::min(n, next));
        EXPECT_EQ(s.offset % 1024 == 0 || s.offset == n, true);
        next = s.offset + s.count;
      }
      EXPECT_EQ(next, n);
    }
  auto table = shard_table(toy_table(100), zero_shard_of(100, 1, 2));  // [50, 100)
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table[0].name, "b1");
  EXPECT_EQ(table[0].offset, 0u);
  EXPECT_EQ(table[0].numel, 33u);
  EXPECT_FALSE(table[0].decay);
  EXPECT_EQ(table[1].offset, 33u);
  EXPECT_EQ(table[1].numel, 17u);
}

void run_ranks(int world, uint64_t generation, comm::tcp_store_server& server,
               const std::function<void(comm::communicator&)>& body) {
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        auto store = comm::connect_tcp_store("127.0.0.1", server.port(), 10s);
        auto c = comm::make_gloo_communicator(*store, {generation, "dp", r, world});
        body(*c);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(ZeroOptimizerTest, MatchesReplicatedAdamW) {
  comm::tcp_store_server server("127.0.0.1", 0);
  const size_t n = 1003;  // not divisible by 2, 3 or 4: exercises the padding
  optim_config cfg;
  cfg.grad_clip = 0.5;  // small enough that clipping is active
  uint64_t generation = 0;
  for (int world : {2, 3, 4}) {
    std::vector<std::vector<float>> zero_params(static_cast<size_t>(world)),
        ref_params(static_cast<size_t>(world));
    std::vector<size_t> state(static_cast<size_t>(world));
    run_ranks(world, ++generation, server, [&](comm::communicator& c) {
      const int r = c.rank();
      std::mt19937 init(7);
      std::normal_distribution<float> dist(0.f, 1.f);
      std::vector<float> p(n);
      for (auto& x : p) x = dist(init);
      std::vector<float> q = p;  // the replicated reference
      zero1_optimizer zero(cfg, toy_table(n), n, r, world);
      adamw replicated(cfg, toy_table(n), n);
      std::mt19937 grads_rng(100 + static_cast<unsigned>(r));
      for (int step = 0; step < 5; ++step) {
        std::vector<float> g(n);
        for (auto& x : g) x = dist(grads_rng);
        std::vector<float> summed = g;
        c.all_reduce(summed.data(), n, comm::reduce_op::sum, {});
        replicated.clip_gradients(summed.data(), n);
        replicated.step(q.data(), summed.data(), step, 10);
        zero.reduce_gradients(c, g.data(), {});
        zero.apply(c, p.data(), step, 10, {});
      }
      zero_params[static_cast<size_t>(r)] = p;
      ref_params[static_cast<size_t>(r)] = q;
      state[static_cast<size_t>(r)] = zero.state_bytes();
    });
    for (int r = 0; r < world; ++r) {
      const auto& zp = zero_params[static_cast<size_t>(r)];
      const auto& rp = ref_params[static_cast<size_t>(r)];
      ASSERT_EQ(zp.size(), n);
      EXPECT_EQ(zp, zero_params[0]) << "ranks disagree after the all-gather";
      for (size_t i = 0; i < n; ++i)
        ASSERT_NEAR(zp[i], rp[i], 1e-5f * (1 + std::fabs(rp[i])))
            << "world " << world << " i " << i;
      EXPECT_LE(state[static_cast<size_t>(r)], 2 * ((n + world - 1) / world) * sizeof(float));
    }
  }
}

}  // namespace
}  // namespace troupe::strategies
