// The job's state in etcd as the coordinator mirrors it (coordinator/ha/state_mirror.hpp),
// against the fake etcd and, where one is installed, a real one: whose state a read finds (this
// run's, another run's that still runs or has ended), fenced writes after the leadership's
// lease is lost, a stale epoch, and damaged numbers.

#include "coordinator/ha/state_mirror.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/config.hpp"
#include "tests/runtime/etcd/etcd_cluster.hpp"
#include "tests/runtime/etcd/fake_etcd.hpp"
#include "tests/runtime/sys/eventually.hpp"

namespace troupe::coordinator::ha {
namespace {

using namespace std::chrono_literals;
using etcd::testing::fake_etcd;
using sys::testing::eventually;

const job_identity ours{"job", "inc-ours", "/runs/ours", "host-a"};

etcd::client_options options_for(const std::string& url) {
  etcd::client_options o;
  o.endpoints = {url};
  o.request_timeout = 1000ms;
  return o;
}

fake_etcd manual() {
  etcd::testing::fake_options o;
  o.expire_leases = false;
  return fake_etcd(o);
}

// A leadership of our own making: the leader key on a lease, and the fence that holds while
// it lives (as leader_election::fence() builds it).
struct leadership {
  int64_t lease = 0;
  int64_t epoch = 0;
  fence_fn fence() const {
    return [epoch = epoch] {
      return etcd::compare::created("/troupe/job/leader", etcd::compare::op::equal, epoch);
    };
  }
};

leadership lead(fake_etcd& fake) {
  leadership l;
  l.lease = fake.grant_lease(30s);
  fake.put("/troupe/job/leader", R"({"id":"me"})", l.lease);
  l.epoch = fake.get("/troupe/job/leader")->create_revision;
  return l;
}

events::generation generation(uint64_t number, int world, int64_t start_step) {
  events::generation g;
  g.number = number;
  g.world = world;
  g.start_step = start_step;
  return g;
}

events::checkpoint checkpoint(int64_t step) {
  events::checkpoint c;
  c.step = step;
  return c;
}

nlohmann::json state_in(const fake_etcd& fake) {
  const auto kv = fake.get("/troupe/job/state");
  return kv ? nlohmann::json::parse(kv->value) : nlohmann::json();
}

TEST(StateMirror, ReadsBackItsOwnState) {
  fake_etcd fake;
  fake.put("/troupe/job/state",
           R"({"generation":4,"committed_step":120,"checkpoint_step":100,"world":3,)"
           R"("skipped_steps":[17],"epoch":9,"incarnation":"inc-ours"})");
  etcd::etcd_client client(options_for(fake.url()));
  state_mirror mirror(client, ours, 5000ms);
  EXPECT_NE(mirror.read_found().find("\"committed_step\":120"), std::string::npos);
  const auto p = mirror.progress();
  EXPECT_EQ(p.generation, 4u);
  EXPECT_EQ(p.committed_step, 120);
  EXPECT_EQ(p.checkpoint_step, 100);
  EXPECT_EQ(p.world, 3);
  EXPECT_EQ(p.skipped_steps, std::vector<int64_t>{17});
}

TEST(StateMirror, AnotherRunningIncarnationIsRefusedByName) {
  fake_etcd fake;
  fake.put("/troupe/job/state",
           R"({"committed_step":55,"incarnation":"inc-other","run_dir":"/runs/other",)"
           R"("host":"host-b"})");
  etcd::etcd_client client(options_for(fake.url()));
  state_mirror mirror(client, ours, 5000ms);
  for (auto read : {+[](state_mirror& m) { m.refuse_another_job(); },
                    +[](state_mirror& m) { (void)m.read_found(); }}) {
    try {
      read(mirror);
      ADD_FAILURE() << "another job's running state was taken";
    } catch (const config_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("job id 'job' is in use by another job"), std::string::npos) << what;
      EXPECT_NE(what.find("/runs/other"), std::string::npos) << what;
      EXPECT_NE(what.find("host-b"), std::string::npos) << what;
      EXPECT_NE(what.find("--job-id"), std::string::npos) << what;
    }
  }
  EXPECT_EQ(mirror.progress().committed_step, 0);
}

TEST(StateMirror, AnEndedIncarnationsStateIsReplacedNotRead) {
  fake_etcd fake = manual();
  fake.put("/troupe/job/state",
           R"({"committed_step":55,"generation":7,"ended":0,"incarnation":"inc-other"})");
  etcd::etcd_client client(options_for(fake.url()));
  state_mirror mirror(client, ours, 5000ms);
  EXPECT_NO_THROW(mirror.refuse_another_job());
  EXPECT_EQ(mirror.read_found(), "");
  EXPECT_EQ(mirror.progress().committed_step, 0);
  EXPECT_EQ(mirror.progress().generation, 0u);
  const auto me = lead(fake);
  ASSERT_TRUE(mirror.mark("", me.epoch, me.fence()));
  const auto doc = state_in(fake);
  EXPECT_EQ(doc["incarnation"], "inc-ours");
  EXPECT_EQ(doc["epoch"], me.epoch);
  EXPECT_FALSE(doc.contains("committed_step"));
}

TEST(StateMirror, WritesStopWhenTheLeadershipsLeaseIsLost) {
  fake_etcd fake = manual();
  etcd::etcd_client client(options_for(fake.url()));
  state_mirror mirror(client, ours, 5000ms);
  const auto me = lead(fake);
  ASSERT_TRUE(mirror.mark("", me.epoch, me.fence()));
  mirror.start(me.fence(), me.epoch);
  mirror.observe(generation(2, 4, 10));
  ASSERT_TRUE(eventually([&] { return state_in(fake).value("generation", 0) == 2; }));
  EXPECT_EQ(state_in(fake)["world"], 4);
  EXPECT_EQ(state_in(fake)["epoch"], me.epoch);

  // The lease runs out behind the coordinator's back: its leader key goes, and with it every
  // write it fences. A newer leader's state stays as that leader wrote it.
  fake.expire_lease(me.lease);
  fake.put("/troupe/job/state", R"({"generation":3,"epoch":99,"incarnation":"inc-ours"})");
  const auto txns = fake.requests("/v3/kv/txn");
  mirror.observe(checkpoint(40));
  ASSERT_TRUE(eventually([&] { return fake.requests("/v3/kv/txn") > txns; }));
  mirror.stop();
  EXPECT_EQ(state_in(fake)["generation"], 3);
  EXPECT_EQ(state_in(fake)["epoch"], 99);
  EXPECT_FALSE(mirror.put_config("{}", me.fence()));
}

TEST(StateMirror, AStaleEpochOrAnEndedJobIsNotOursToResume) {
  fake_etcd fake = manual();
  etcd::etcd_client client(options_for(fake.url()));
  state_mirror mirror(client, ours, 5000ms);
  const auto me = lead(fake);
  // Another leader marked the state in between: epoch 7 is not the 5 this one led under.
  fake.put("/troupe/job/state", R"({"epoch":7,"incarnation":"inc-ours"})");
  EXPECT_FALSE(mirror.still_ours(5, me.epoch, me.fence()));
  // The job ended meanwhile.
  fake.put("/troupe/job/state", R"({"epoch":5,"ended":0,"incarnation":"inc-ours"})");
  EXPECT_FALSE(mirror.still_ours(5, me.epoch, me.fence()));
  // Another incarnation's state under the same epoch number.
  fake.put("/troupe/job/state", R"({"epoch":5,"incarnation":"inc-other"})");
  EXPECT_FALSE(mirror.still_ours(5, me.epoch, me.fence()));
  // No state at all, and etcd failing: not known, so not ours.
  fake.del("/troupe/job/state");
  EXPECT_FALSE(mirror.still_ours(5, me.epoch, me.fence()));
  fake.put("/troupe/job/state", R"({"epoch":5,"incarnation":"inc-ours"})");
  fake.fail_next(3, etcd::testing::failure::unavailable());
  EXPECT_FALSE(mirror.still_ours(5, me.epoch, me.fence()));
  fake.clear_failures();
  // Still the one it led under: it is marked with the new epoch at once.
  EXPECT_TRUE(mirror.still_ours(5, me.epoch, me.fence()));
  EXPECT_EQ(state_in(fake)["epoch"], me.epoch);
}

TEST(StateMirror, DamagedNumbersAreReadAsNothing) {
  fake_etcd fake;
  fake.put("/troupe/job/state",
           R"({"generation":"x","committed_step":[1],"world":-0.5e999,"skipped_steps":["a"],)"
           R"("incarnation":"inc-ours"})");
  etcd::etcd_client client(options_for(fake.url()));
  state_mirror mirror(client, ours, 5000ms);
  EXPECT_NO_THROW((void)mirror.read_found());
  const auto p = mirror.progress();
  EXPECT_EQ(p.generation, 0u);
  EXPECT_EQ(p.committed_step, 0);
  EXPECT_TRUE(p.skipped_steps.empty());
}

// The same round trip through a real etcd: written under a fence, read back by the next
// coordinator of the same run, refused to another run.
TEST(StateMirrorRealEtcd, RoundTripAndAnotherRunRefused) {
  if (!etcd::testing::have_etcd()) GTEST_SKIP() << "no /usr/bin/etcd";
  etcd::testing::etcd_cluster cluster(1);
  etcd::etcd_client client(etcd::testing::options_for(cluster.urls()));
  ASSERT_TRUE(etcd::testing::wait_ready(client));
  const int64_t lease = client.lease_grant(30s);
  client.put("/troupe/job/leader", "me", lease);
  const int64_t epoch = client.get("/troupe/job/leader")->create_revision;
  const fence_fn fence = [epoch] {
    return etcd::compare::created("/troupe/job/leader", etcd::compare::op::equal, epoch);
  };
  {
    state_mirror mirror(client, ours, 5000ms);
    ASSERT_TRUE(mirror.mark(mirror.read_found(), epoch, fence));
    mirror.start(fence, epoch);
    mirror.observe(generation(3, 2, 30));
    mirror.observe(checkpoint(40));
  }  // stopping writes what is pending
  state_mirror next(client, ours, 5000ms);
  (void)next.read_found();
  EXPECT_EQ(next.progress().generation, 3u);
  EXPECT_EQ(next.progress().checkpoint_step, 40);
  state_mirror other(client, {"job", "inc-other", "/runs/other", "host-b"}, 5000ms);
  EXPECT_THROW(other.refuse_another_job(), config_error);
}

}  // namespace
}  // namespace troupe::coordinator::ha
