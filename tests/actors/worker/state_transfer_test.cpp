// A rank's state handed to the rank that takes its place: through the data-parallel group the
// two already share (no new connect on the recovery's path), or through a pair group of their
// own when they share none. Every rank is a thread; the data plane is shared memory.
#include "actors/worker/state_transfer.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <numeric>

#include "runtime/comm/shm_communicator.hpp"
#include "runtime/comm/store.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t generation = 5;

// A state of two buffers (a parameter vector and a moment), filled from `seed`.
struct held_state {
  std::vector<float> params = std::vector<float>(300000), moment = std::vector<float>(1000);
  int64_t adam_t = 0;
  explicit held_state(float seed) {
    std::iota(params.begin(), params.end(), seed);
    std::iota(moment.begin(), moment.end(), -seed);
    adam_t = static_cast<int64_t>(seed);
  }
  strategies::local_state view() { return {{params, moment}, &adam_t}; }
};

// Runs ranks 0..size-1 of a generation on threads: each joins the group "dp" made of
// `dp_ranks` (if it is one of them), then body(rank, connect, group).
template <class Body>
int run_ranks(int size, const std::vector<int>& dp_ranks, Body body) {
  comm::tcp_store_server server;
  std::atomic<int> connects = 0;
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < size; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto store = comm::connect_tcp_store("127.0.0.1", server.port(), 5s);
      comm::shm_options o;
      o.connect_timeout = 10s;
      strategies::connect_fn connect = [&](const comm::comm_identity& id) {
        ++connects;
        return comm::make_shm_communicator(*store, id, o);
      };
      std::unique_ptr<comm::communicator> dp;
      const auto at = std::find(dp_ranks.begin(), dp_ranks.end(), r);
      if (at != dp_ranks.end())
        dp = connect({generation, "dp", static_cast<int>(at - dp_ranks.begin()),
                      static_cast<int>(dp_ranks.size())});
      body(r, connect, actors::shared_group{dp.get(), dp ? dp_ranks : std::vector<int>{}});
    }));
  }
  for (auto& f : ranks) f.get();  // rethrows a rank's failure
  return connects.load();
}

TEST(StateTransfer, ThroughTheSharedGroupWithoutANewConnect) {
  const comm::op_options opts{10s};
  held_state source(7.0f), target(0.0f);
  // Ranks 0, 1 and 2 form the dp group; 0 hands its state to 2 while 1 stays out of it.
  const int connects = run_ranks(3, {0, 1, 2}, [&](int r, auto& connect, const auto& via) {
    if (r == 0) {
      EXPECT_EQ(actors::send_state(connect, generation, 0, 2, source.view(), opts, via),
                source.view().bytes());
    }
    if (r == 2) {
      EXPECT_EQ(actors::receive_state(connect, generation, 0, 2, target.view(), opts, via),
                target.view().bytes());
    }
  });
  EXPECT_EQ(connects, 3) << "only the dp group's three members connected";
  EXPECT_EQ(target.params, source.params);
  EXPECT_EQ(target.moment, source.moment);
  EXPECT_EQ(target.adam_t, 7);
}

TEST(StateTransfer, ThroughAPairGroupWhenTheRanksShareNone) {
  const comm::op_options opts{10s};
  held_state source(3.0f), target(0.0f);
  // Rank 2 is not in the dp group of 0 and 1: the two connect a pair of their own.
  const int connects = run_ranks(3, {0, 1}, [&](int r, auto& connect, const auto& via) {
    if (r == 0) actors::send_state(connect, generation, 0, 2, source.view(), opts, via);
    if (r == 2) actors::receive_state(connect, generation, 0, 2, target.view(), opts, via);
  });
  EXPECT_EQ(connects, 2 + 2) << "the dp group's two members, then the pair's two";
  EXPECT_EQ(target.params, source.params);
  EXPECT_EQ(target.adam_t, 3);
}

TEST(StateTransfer, ShapesThatDifferAreRefused) {
  const comm::op_options opts{10s};
  held_state source(1.0f), target(0.0f);
  target.moment.resize(999);
  std::string error;
  run_ranks(2, {0, 1}, [&](int r, auto& connect, const auto& via) {
    try {
      if (r == 0) actors::send_state(connect, generation, 0, 1, source.view(), {2s}, via);
      if (r == 1) actors::receive_state(connect, generation, 0, 1, target.view(), opts, via);
    } catch (const std::exception& e) {
      if (r == 1) error = e.what();
    }
  });
  EXPECT_NE(error.find("layout mismatch"), std::string::npos) << error;
}

// Any workload's state goes the same way: regions of other dtypes (here i64 and a bool mask of
// an odd size) and named counters, byte for byte.
TEST(StateTransfer, AnyWorkloadsStateRegionsAndCounters) {
  const comm::op_options opts{10s};
  struct mixed {
    std::vector<int64_t> steps = std::vector<int64_t>(7);
    std::vector<uint8_t> mask = std::vector<uint8_t>(13);
    std::vector<float> weights = std::vector<float>(1001);
    int64_t epoch = 0, seen = 0;
    state_view view() {
      state_view v;
      for (auto bytes : {std::as_writable_bytes(std::span<int64_t>(steps)),
                         std::as_writable_bytes(std::span<uint8_t>(mask)),
                         std::as_writable_bytes(std::span<float>(weights))}) {
        state_region r;
        r.bytes = bytes;
        v.regions.push_back(r);
      }
      v.counters = {{"epoch", &epoch}, {"seen", &seen}};
      return v;
    }
  } source, target;
  std::iota(source.steps.begin(), source.steps.end(), int64_t{1} << 40);
  std::iota(source.mask.begin(), source.mask.end(), uint8_t{3});
  std::iota(source.weights.begin(), source.weights.end(), 0.5f);
  source.epoch = 9;
  source.seen = -4;
  uint64_t sent = 0, received = 0;
  run_ranks(2, {0, 1}, [&](int r, auto& connect, const auto& via) {
    if (r == 0) sent = actors::send_state(connect, generation, 0, 1, source.view(), opts, via);
    if (r == 1)
      received = actors::receive_state(connect, generation, 0, 1, target.view(), opts, via);
  });
  EXPECT_EQ(target.steps, source.steps);
  EXPECT_EQ(target.mask, source.mask);
  EXPECT_EQ(target.weights, source.weights);
  EXPECT_EQ(target.epoch, 9);
  EXPECT_EQ(target.seen, -4);
  EXPECT_EQ(sent, received);
  EXPECT_EQ(sent, 7 * 8 + 13 + 1001 * 4 + 2 * 8u);
}

}  // namespace
