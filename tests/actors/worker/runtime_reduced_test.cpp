// The runtime's reduction around a by_runtime workload (actors/worker/runtime_reduced.hpp):
// the workload only fills its buckets and announces them; the wrapper sums them over the
// data-parallel group in place, measures the norm, and forwards everything else. Two ranks are
// threads; the data plane is shared memory.
#include "actors/worker/runtime_reduced.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <future>

#include "runtime/comm/shm_communicator.hpp"
#include "runtime/comm/store.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

// Two buckets whose gradients are rank + 1 everywhere; announces them from compute, or not at
// all (`silent`: the wrapper must still reduce them), or throws.
class toy_generation final : public workload_generation {
 public:
  explicit toy_generation(int rank, bool silent = false) : rank_(rank), silent_(silent) {}
  state_view state() override {
    state_view v;
    v.tensors.push_back({"w", "model", {2}});
    v.regions.push_back(replicated_region(v.tensors.back(),
                                          std::as_writable_bytes(std::span<float>(weights)), 1, 0));
    return v;
  }
  void init(uint64_t) override { weights = {1, 2}; }
  step_outcome compute(const step_work& work) override {
    ++computed;
    if (fail) throw workload_error("the toy failed");
    sink_seen = work.sink != nullptr;
    for (auto* bucket : {&a, &b})
      for (float& x : *bucket) x = static_cast<float>(rank_ + 1);
    if (!silent_ && work.sink) {
      work.sink->ready(1);  // any order
      work.sink->ready(0);
    }
    return {1.0, 1, 0.0};
  }
  std::vector<gradient_bucket> gradient_buckets() override {
    return {gradient_bucket{std::span<float>(a)}, gradient_bucket{std::span<float>(b)}};
  }
  void apply(const apply_env&) override { ++applied; }
  void abort() noexcept override { aborted = true; }

  std::vector<float> a = std::vector<float>(1000), b = std::vector<float>(3);
  std::array<float, 2> weights{};
  int computed = 0, applied = 0;
  bool sink_seen = false, aborted = false, fail = false;

 private:
  int rank_;
  bool silent_;
};

template <class Body>
void two_ranks(Body body) {
  comm::tcp_store_server server;
  std::vector<std::future<void>> ranks;
  ranks.reserve(2);
  for (int r = 0; r < 2; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto store = comm::connect_tcp_store("127.0.0.1", server.port(), 5s);
      comm::shm_options o;
      o.connect_timeout = 10s;
      generation_env env;
      env.generation = 1;
      env.rank = r;
      env.world = 2;
      env.dp = {r, 2, {0, 1}, "dp"};
      env.op_timeout = 10s;
      env.connect = [&](const comm::comm_identity& id) {
        return comm::make_shm_communicator(*store, id, o);
      };
      body(r, env);
    }));
  for (auto& f : ranks) f.get();
}

TEST(RuntimeReduced, SumsTheAnnouncedBucketsInPlaceAndMeasuresTheNorm) {
  two_ranks([](int r, const generation_env& env) {
    auto toy = std::make_unique<toy_generation>(r);
    auto* seen = toy.get();
    auto work = actors::reduced_by_runtime(std::move(toy), env);
    ASSERT_NE(work->replica_group(), nullptr);
    EXPECT_EQ(work->replica_group()->size(), 2);
    work->init(0);
    for (int step = 1; step <= 2; ++step) {
      work->compute({step, step - 1, {}, 4, 0, nullptr});
      work->reduce({comm::op_options{10s}});
      EXPECT_TRUE(seen->sink_seen);
      for (float x : seen->a) ASSERT_EQ(x, 3.0f);  // 1 + 2, in the workload's own memory
      for (float x : seen->b) ASSERT_EQ(x, 3.0f);
      EXPECT_DOUBLE_EQ(work->local_grad_norm(), std::sqrt(9.0 * 1003));
      work->apply({step, 2, {}, 0.0});
    }
    EXPECT_EQ(seen->applied, 2);
    EXPECT_EQ(work->state().tensors.front().name, "w");
  });
}

TEST(RuntimeReduced, BucketsNeverAnnouncedAreReducedAtTheEnd) {
  two_ranks([](int r, const generation_env& env) {
    auto toy = std::make_unique<toy_generation>(r, /*silent=*/true);
    auto* seen = toy.get();
    auto work = actors::reduced_by_runtime(std::move(toy), env);
    work->compute({1, 0, {}, 4, 0, nullptr});
    work->reduce({comm::op_options{10s}});
    EXPECT_EQ(seen->a.front(), 3.0f);
    EXPECT_EQ(seen->b.back(), 3.0f);
  });
}

TEST(RuntimeReduced, OneReplicaMeasuresTheNormWithoutAGroup) {
  generation_env env;
  env.dp = {0, 1, {0}, "dp"};
  env.connect = [](const comm::comm_identity&) -> std::unique_ptr<comm::communicator> {
    ADD_FAILURE() << "one replica connects no group";
    return nullptr;
  };
  auto toy = std::make_unique<toy_generation>(1);
  auto* seen = toy.get();
  auto work = actors::reduced_by_runtime(std::move(toy), env);
  EXPECT_EQ(work->replica_group(), nullptr);
  work->compute({1, 0, {}, 4, 0, nullptr});
  work->reduce({comm::op_options{1s}});
  EXPECT_EQ(seen->a.front(), 2.0f) << "nothing to sum";
  EXPECT_DOUBLE_EQ(work->local_grad_norm(), std::sqrt(4.0 * 1003));
}

TEST(RuntimeReduced, AFailedComputeAbortsTheReductionAndAbortReachesTheWorkload) {
  generation_env env;
  env.dp = {0, 1, {0}, "dp"};
  auto toy = std::make_unique<toy_generation>(0);
  auto* seen = toy.get();
  auto work = actors::reduced_by_runtime(std::move(toy), env);
  seen->fail = true;
  EXPECT_THROW(work->compute({1, 0, {}, 4, 0, nullptr}), workload_error);
  EXPECT_THROW(work->reduce({comm::op_options{1s}}), std::exception);
  work->abort();
  EXPECT_TRUE(seen->aborted);
}

// keep_state shows the workload its own previous generation, not the wrapper around it.
TEST(RuntimeReduced, KeepStateSeesThePreviousWorkloadGeneration) {
  generation_env env;
  env.dp = {0, 1, {0}, "dp"};
  auto before = actors::reduced_by_runtime(std::make_unique<toy_generation>(0), env);
  before->init(0);
  auto after = actors::reduced_by_runtime(std::make_unique<toy_generation>(0), env);
  after->keep_state(*before);  // the default: copies the regions of the same table
  const auto v = after->state();
  const auto* w = reinterpret_cast<const float*>(v.regions.front().bytes.data());
  EXPECT_EQ(w[0], 1.0f);
  EXPECT_EQ(w[1], 2.0f);
}

}  // namespace
