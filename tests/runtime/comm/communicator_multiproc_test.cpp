// The data plane across real processes, on the backend this binary is built for (backend.hpp:
// comm_gloo_multiproc_test, comm_shm_multiproc_test): correctness against a local reference on
// 2, 3 and 4 ranks, bit-identical all-reduce results, and the failure modes the supervisor
// relies on (a killed peer, a silent peer, abort from another thread, rebuilding a generation
// on the same store).
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "runtime/comm/shm_staging.hpp"
#include "runtime/comm/store.hpp"
#include "tests/runtime/comm/peer_group.hpp"

using namespace troupe;
using namespace troupe::comm;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

/// How much later than its deadline a failing collective may return (scheduling, teardown).
constexpr auto slack = 2s;

using group = test::peer_group;
using test::join_and_warm_up;

class collectives : public group, public ::testing::WithParamInterface<int> {};

TEST_P(collectives, match_the_local_reference) {
  const int size = GetParam();
  for (int r = 0; r < size; ++r) spawn(r, size, "collectives");
  expect_peers_succeed(150s);
}

INSTANTIATE_TEST_SUITE_P(processes, collectives, ::testing::Values(2, 3, 4),
                         [](const auto& p) { return std::to_string(p.param) + "_ranks"; });

class bitwise : public group, public ::testing::WithParamInterface<int> {};

TEST_P(bitwise, all_reduce_gives_every_rank_the_same_bits) {
  spawn_all(GetParam(), "bitwise");
  expect_peers_succeed(150s);
}

INSTANTIATE_TEST_SUITE_P(processes, bitwise, ::testing::Values(2, 3, 4),
                         [](const auto& p) { return std::to_string(p.param) + "_ranks"; });

TEST_F(group, generations_on_one_store_do_not_collide) {
  for (int r = 0; r < 3; ++r) spawn(r, 3, "generations");
  expect_peers_succeed(150s);
}

TEST_F(group, killed_peer_fails_the_collective_within_its_deadline) {
  spawn(1, 3, "expect_lost");
  spawn(2, 3, "hang");
  auto store = client();
  auto c = join_and_warm_up(*store, 3);
  peer(1).kill();  // SIGKILL and reap: rank 2 is certainly gone

  const auto timeout = 5s;
  auto v = test::contributions(0, (size_t{1} << 20) + 3);
  const auto start = clock_type::now();
  try {
    c->all_reduce(v.data(), v.size(), reduce_op::sum, {timeout});
    FAIL() << "all_reduce succeeded with a dead peer";
  } catch (const comm_error& e) {
    EXPECT_TRUE(e.code() == comm_errc::peer_lost || e.code() == comm_errc::timeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("generation 1"), std::string::npos) << e.what();
  }
  EXPECT_LT(clock_type::now() - start, timeout + slack);

  // Dead now: later calls fail at once.
  EXPECT_THROW(c->barrier({1s}), comm_error);
  // Rank 1 was in the same all-reduce and must have seen peer_lost too (it checks itself).
  const auto status = peer(0).wait_exit(15s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0) << test::describe_status(*status);
}

TEST_F(group, silent_peer_times_out_at_the_deadline) {
  spawn(1, 2, "hang");
  auto store = client();
  auto c = join_and_warm_up(*store, 2);
  peer(0).signal(SIGSTOP);  // alive, connected, and silent

  const auto timeout = 1500ms;
  std::vector<float> v(1000, 1.0f);
  const auto start = clock_type::now();
  try {
    c->all_reduce(v.data(), v.size(), reduce_op::sum, {timeout});
    FAIL() << "all_reduce succeeded against a stopped peer";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::timeout) << e.what();
  }
  const auto took = clock_type::now() - start;
  EXPECT_GE(took, timeout - 50ms);
  EXPECT_LT(took, timeout + slack);
  try {
    c->barrier({30s});
    FAIL() << "a timed-out communicator accepted another op";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::timeout) << e.what();
  }
}

TEST_F(group, abort_from_another_thread_unblocks_a_collective_in_flight) {
  spawn(1, 2, "hang");  // after the warm-up it never joins another op
  auto store = client();
  auto c = join_and_warm_up(*store, 2);

  // The delay only makes it likely that the call is already blocked when abort() lands; the
  // call must throw `aborted` promptly either way.
  const auto abort_after = 300ms;
  auto aborter = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(abort_after);
    c->abort();
  });
  auto v = test::contributions(0, (size_t{1} << 20) + 3);
  const auto start = clock_type::now();
  try {
    c->all_reduce(v.data(), v.size(), reduce_op::sum, {30s});
    FAIL() << "all_reduce finished without its peer";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::aborted) << e.what();
  }
  EXPECT_LT(clock_type::now() - start, abort_after + slack);
  aborter.get();
  EXPECT_TRUE(c->aborted());
  try {
    c->barrier({1s});
    FAIL() << "an aborted communicator accepted another op";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::aborted) << e.what();
  }
  c->abort();  // idempotent
}

TEST_F(group, abort_while_idle_fails_the_peers_promptly) {
  spawn(1, 2, "expect_lost");  // its next all_reduce must end in peer_lost, well before 20 s
  auto store = client();
  auto c = join_and_warm_up(*store, 2);
  c->abort();
  EXPECT_TRUE(c->aborted());
  const auto status = peer(0).wait_exit(15s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0) << test::describe_status(*status);
}

TEST_F(group, survivors_rebuild_as_generation_2_on_the_same_store) {
  spawn(1, 3, "survivor");
  spawn(2, 3, "hang");
  auto store = client();
  auto c1 = join_and_warm_up(*store, 3);
  const auto staging_in_use = comm::shm_detail::staging_pool::process().current();
  peer(1).kill();
  std::vector<float> v(1000, 1.0f);
  EXPECT_THROW(c1->all_reduce(v.data(), v.size(), reduce_op::sum, {10s}), comm_error);
  c1.reset();

  const auto staging_before = comm::shm_detail::staging_pool::process().current();
  if (test::backend() == "shm") {
    // The killed peer's staging is unmapped here; the survivor's stays mapped.
    EXPECT_EQ(staging_before.peers, staging_in_use.peers - 1);
  }
  auto c2 = test::connect(*store, {2, "world", 0, 2});
  if (test::backend() == "shm") {
    // The rebuilt group stages through the memory generation 1 used, and the survivor's is
    // still mapped here: no new memory, no new mapping, no page to fault in again.
    const auto now = comm::shm_detail::staging_pool::process().current();
    EXPECT_EQ(now.own, staging_before.own);
    EXPECT_EQ(now.peers, staging_before.peers);
  }
  for (const size_t count : {size_t{1000}, (size_t{1} << 20) + 3}) {
    auto w = test::contributions(0, count);
    c2->all_reduce(w.data(), count, reduce_op::average, {30s});
    EXPECT_EQ(test::check_reduced(w, 2, reduce_op::average), "") << count;
  }
  c2->barrier({30s});
  const auto status = peer(0).wait_exit(30s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0) << test::describe_status(*status);
}

/// A peer SIGKILLed while this rank waits for it (not before, as above): the wait must end
/// with peer_lost long before a long deadline, not at it.
TEST_F(group, peer_killed_during_a_wait_gives_peer_lost_well_before_the_deadline) {
  spawn(1, 2, "hang");
  auto store = client();
  auto c = join_and_warm_up(*store, 2);
  auto killer = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(300ms);  // likely blocked by then; the result holds either way
    peer(0).kill();
  });
  std::vector<float> v(1000, 1.0f);
  const auto start = clock_type::now();
  try {
    c->all_reduce(v.data(), v.size(), reduce_op::sum, {60s});
    FAIL() << "all_reduce succeeded with a dead peer";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::peer_lost) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0 of 2"), std::string::npos) << e.what();
  }
  killer.get();
  // shm watches its peers' processes; gloo sees the connection close.
  EXPECT_LT(clock_type::now() - start, 300ms + slack);
}

TEST_F(group, missing_rank_times_out_the_connect) {
  auto store = client();
  const auto start = clock_type::now();
  try {
    test::connect(*store, {1, "world", 0, 2}, 500ms);
    FAIL() << "connected without rank 1";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::timeout) << e.what();
  }
  EXPECT_LT(clock_type::now() - start, 500ms + slack);
}

}  // namespace
