// leader_election against a real etcd: one leader among candidates, handover with a strictly
// larger epoch after resign or a killed leader, fencing, and stepping down before the lease can
// have expired when etcd stops answering.

#include "runtime/etcd/leader_election.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <mutex>

#include "tests/runtime/etcd/etcd_cluster.hpp"
#include "tests/runtime/sys/eventually.hpp"

namespace troupe::etcd {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using sys::testing::eventually;
using testing::etcd_cluster;
using testing::options_for;
using testing::wait_ready;

#define REQUIRE_ETCD()       \
  if (!testing::have_etcd()) \
  GTEST_SKIP() << testing::kEtcd << " is missing (apt-get install etcd-server)"

/// What one candidate's callbacks saw.
struct candidate_log {
  std::mutex mutex;
  std::vector<std::int64_t> elected;
  std::vector<std::string> lost;
  clock_type::time_point lost_at{};

  void attach(election_options& o) {
    o.on_elected = [this](std::int64_t epoch) {
      std::lock_guard lock(mutex);
      elected.push_back(epoch);
    };
    o.on_lost = [this](const std::string& reason) {
      std::lock_guard lock(mutex);
      lost.push_back(reason);
      lost_at = clock_type::now();
    };
  }
  std::size_t losses() {
    std::lock_guard lock(mutex);
    return lost.size();
  }
  std::size_t wins() {
    std::lock_guard lock(mutex);
    return elected.size();
  }
};

election_options candidate(const std::string& job, const std::string& id, candidate_log& log,
                           std::chrono::seconds ttl = 2s) {
  election_options o;
  o.job = job;
  o.id = id;
  o.address = id + ".example:7000";
  o.ttl = ttl;
  log.attach(o);
  return o;
}

TEST(LeaderElection, OneLeadsAndResignHandsOverWithALargerEpoch) {
  REQUIRE_ETCD();
  etcd_cluster cluster(1);
  etcd_client client(options_for(cluster.urls()));
  ASSERT_TRUE(wait_ready(client)) << cluster.logs();

  candidate_log log_a, log_b;
  leader_election a(client, candidate("job1", "a", log_a));
  leader_election b(client, candidate("job1", "b", log_b));
  a.start();
  b.start();
  ASSERT_TRUE(eventually([&] { return a.is_leader() || b.is_leader(); }));
  // Give the loser time to have campaigned too: still exactly one leader.
  std::this_thread::sleep_for(300ms);
  ASSERT_NE(a.is_leader(), b.is_leader());
  leader_election& first = a.is_leader() ? a : b;
  leader_election& second = a.is_leader() ? b : a;
  candidate_log& first_log = a.is_leader() ? log_a : log_b;

  const auto seen = first.leader();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->id, &first == &a ? "a" : "b");
  EXPECT_EQ(seen->address, seen->id + ".example:7000");
  EXPECT_EQ(seen->epoch, first.epoch());
  EXPECT_EQ(second.leader()->epoch, first.epoch());
  EXPECT_EQ(second.epoch(), 0);

  // The fence admits the leader's writes.
  txn_request fenced;
  fenced.compares.push_back(first.fence());
  fenced.then.push_back(txn_op::put("/troupe/job1/state", "from the first leader"));
  EXPECT_TRUE(client.txn(fenced).succeeded);

  const std::int64_t old_epoch = first.epoch();
  first.resign();
  EXPECT_FALSE(first.is_leader());
  ASSERT_EQ(first_log.losses(), 1u);
  EXPECT_EQ(first_log.lost[0], "resigned");
  // Revoked, not expired: the standby takes over well inside the TTL.
  ASSERT_TRUE(eventually([&] { return second.is_leader(); }, 1500ms));
  EXPECT_GT(second.epoch(), old_epoch);
  EXPECT_EQ(second.leader()->epoch, second.epoch());
  // The deposed leader's fence no longer holds.
  EXPECT_FALSE(client.txn(fenced).succeeded);
  EXPECT_EQ(client.get("/troupe/job1/state")->value, "from the first leader");
}

TEST(LeaderElection, KilledLeaderProcessIsReplacedAfterItsLeaseExpires) {
  REQUIRE_ETCD();
  etcd_cluster cluster(1);
  etcd_client client(options_for(cluster.urls()));
  ASSERT_TRUE(wait_ready(client)) << cluster.logs();

  auto peer = test::child_process::spawn(
      {ELECTION_PEER_PATH, cluster.urls()[0], "job2", "peer", "2"}, /*capture_stdout=*/true);
  const auto line = peer.read_line(10s);
  ASSERT_TRUE(line.has_value()) << cluster.logs();
  ASSERT_EQ(line->rfind("elected ", 0), 0u) << *line;
  const std::int64_t peer_epoch = std::stoll(line->substr(8));

  candidate_log log_b;
  leader_election b(client, candidate("job2", "b", log_b));
  b.start();
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(b.is_leader());
  EXPECT_EQ(b.leader()->id, "peer");

  peer.kill();  // no resign, no revoke: the lease has to run out
  const auto killed = clock_type::now();
  ASSERT_TRUE(eventually([&] { return b.is_leader(); }, 6s)) << cluster.logs();
  EXPECT_GE(clock_type::now() - killed, 1s);  // not before the peer's lease could expire
  EXPECT_GT(b.epoch(), peer_epoch);
  EXPECT_EQ(b.leader()->id, "b");
}

TEST(LeaderElection, LeaderStepsDownBeforeItsLeaseCanExpireWhenEtcdStops) {
  REQUIRE_ETCD();
  etcd_cluster cluster(1);
  etcd_client client(options_for(cluster.urls(), 300ms));
  ASSERT_TRUE(wait_ready(client)) << cluster.logs();

  candidate_log log;
  auto options = candidate("job3", "a", log, 3s);
  options.safety_margin = 1000ms;
  options.keepalive_interval = 500ms;
  leader_election a(client, options);
  a.start();
  ASSERT_TRUE(eventually([&] { return a.is_leader(); }));
  const std::int64_t first_epoch = a.epoch();
  std::this_thread::sleep_for(700ms);  // at least one keepalive has gone through
  ASSERT_TRUE(a.is_leader());

  // etcd freezes: nothing answers, nothing is refused. The last keepalive that succeeded was
  // sent before this instant, so the lease cannot expire before paused + ttl.
  cluster.member(0).pause();
  const auto paused = clock_type::now();
  ASSERT_TRUE(eventually([&] { return log.losses() > 0; }, 5s));
  cluster.member(0).resume();
  const auto lost_after = [&] {
    std::lock_guard lock(log.mutex);
    return log.lost_at - paused;
  }();
  std::printf(
      "[ measure  ] stepped down %lld ms after etcd was paused (ttl 3000 ms, margin "
      "1000 ms, keepalive every 500 ms)\n",
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(lost_after).count()));
  EXPECT_LT(lost_after, 3s - 500ms) << "stepped down too late: the lease could have expired";
  EXPECT_GT(lost_after, 500ms) << "stepped down although keepalives could still succeed";
  EXPECT_FALSE(a.is_leader());
  EXPECT_NE(log.lost[0].find("keepalive"), std::string::npos) << log.lost[0];

  // etcd is back: the old lease either expired or is revoked, and the candidate wins again
  // under a larger epoch.
  ASSERT_TRUE(eventually([&] { return a.is_leader(); }, 10s)) << cluster.logs();
  EXPECT_GT(a.epoch(), first_epoch);
}

TEST(LeaderElection, LeaderStepsDownWhenEveryMemberIsKilled) {
  REQUIRE_ETCD();
  etcd_cluster cluster(3);
  etcd_client client(options_for(cluster.urls(), 300ms));
  for (int i = 0; i < 3; ++i) {
    etcd_client one(options_for({cluster.member(i).client_url()}));
    ASSERT_TRUE(wait_ready(one)) << cluster.logs();
  }
  candidate_log log;
  auto options = candidate("job4", "a", log, 3s);
  options.safety_margin = 1000ms;
  options.keepalive_interval = 500ms;
  leader_election a(client, options);
  a.start();
  ASSERT_TRUE(eventually([&] { return a.is_leader(); }, 10s)) << cluster.logs();
  std::this_thread::sleep_for(700ms);
  ASSERT_TRUE(a.is_leader());
  for (int i = 0; i < 3; ++i) cluster.member(i).kill();
  const auto killed = clock_type::now();
  ASSERT_TRUE(eventually([&] { return !a.is_leader(); }, 5s));
  EXPECT_LT(clock_type::now() - killed, 3s - 500ms);
  ASSERT_TRUE(eventually([&] { return log.losses() > 0; }, 2s));
}

TEST(LeaderElection, RefusesATtlThatLeavesNoTimeToRenew) {
  etcd_client client(options_for({"http://127.0.0.1:1"}));
  candidate_log log;
  auto options = candidate("job5", "a", log, 1s);
  options.safety_margin = 900ms;
  EXPECT_THROW(leader_election(client, options), etcd_error);
}

}  // namespace
}  // namespace troupe::etcd
