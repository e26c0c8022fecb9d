// fake_etcd through the real etcd_client and leader_election: the store keeps etcd's revisions
// and lease rules, watches see its changes, failures come on cue, a store left by another
// incarnation is served as given, and an election over it notices a lost lease.

#include "tests/runtime/etcd/fake_etcd.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <optional>

#include "runtime/etcd/leader_election.hpp"
#include "tests/runtime/etcd/fake_etcd_store.hpp"
#include "tests/runtime/sys/eventually.hpp"

namespace troupe::etcd {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using sys::testing::eventually;
using testing::failure;
using testing::fake_etcd;
using testing::fake_options;

client_options options_for(const fake_etcd& fake, std::chrono::milliseconds timeout = 1000ms) {
  client_options o;
  o.endpoints = {fake.url()};
  o.request_timeout = timeout;
  return o;
}

template <class F>
std::string expect_error(error_kind kind, F f) {
  try {
    f();
  } catch (const etcd_error& e) {
    EXPECT_EQ(to_string(e.kind()), std::string(to_string(kind))) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no etcd_error was thrown";
  return {};
}

fake_options manual_leases() {
  fake_options o;
  o.expire_leases = false;
  return o;
}

TEST(FakeEtcd, KeyValueCallsKeepEtcdsRevisions) {
  fake_etcd fake;
  etcd_client client(options_for(fake));
  EXPECT_EQ(client.get_prefix("/").revision, 1);  // a new cluster is at revision 1

  EXPECT_EQ(client.put("/k/a", std::string("x\0y", 3)), 2);
  EXPECT_EQ(client.put("/k/a", "again"), 3);
  const auto a = client.get("/k/a");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->value, "again");
  EXPECT_EQ(a->create_revision, 2);
  EXPECT_EQ(a->mod_revision, 3);
  EXPECT_EQ(a->version, 2);
  client.put("/k/b", "");
  client.put("/k/c", "3");
  const auto two = client.get_prefix("/k/", 2);
  EXPECT_EQ(two.kvs.size(), 2u);
  EXPECT_EQ(two.count, 3);
  EXPECT_EQ(two.revision, 5);
  EXPECT_EQ(client.get("/k/b")->value, "");

  // Create-if-absent, as a campaign writes it: one revision for the put and the read after it,
  // which sees the put.
  txn_request create;
  create.compares.push_back(compare::created("/k/new", compare::op::equal, 0));
  create.then = {txn_op::put("/k/new", "mine"), txn_op::get("/k/new")};
  create.otherwise = {txn_op::get("/k/new")};
  const auto won = client.txn(create);
  EXPECT_TRUE(won.succeeded);
  EXPECT_EQ(won.revision, 6);
  ASSERT_EQ(won.results.size(), 2u);
  ASSERT_EQ(won.results[1].kvs.size(), 1u);
  EXPECT_EQ(won.results[1].kvs[0].create_revision, 6);
  const auto lost = client.txn(create);
  EXPECT_FALSE(lost.succeeded);
  EXPECT_EQ(lost.revision, 6);  // a txn that only reads takes no revision
  EXPECT_FALSE(client.txn({{compare::valued("/k/none", compare::op::equal, "")}, {}, {}})
                   .succeeded);  // a value compare on a missing key fails, as in etcd

  txn_request twice;
  twice.then = {txn_op::put("/k/a", "1"), txn_op::del("/k/", true)};
  expect_error(error_kind::invalid_argument, [&] { client.txn(twice); });
  expect_error(error_kind::invalid_argument, [&] { client.put("", "no key"); });

  EXPECT_EQ(client.del("/k/zzz"), 0);
  EXPECT_EQ(fake.revision(), 6);  // deleting nothing takes no revision
  EXPECT_EQ(client.del("/k/", true), 4);
  EXPECT_EQ(fake.revision(), 7);
  client.compact(7);
  expect_error(error_kind::compacted, [&] { client.compact(3); });
}

TEST(FakeEtcd, LeasesAttachDetachAndDeleteTheirKeys) {
  fake_etcd fake(manual_leases());
  etcd_client client(options_for(fake));
  const std::int64_t lease = client.lease_grant(5s);
  EXPECT_GT(client.lease_time_to_live(lease), 3);
  client.put("/l/a", "a", lease);
  client.put("/l/b", "b", lease);
  client.put("/l/b", "b");  // a put without the lease takes the key off it, as in etcd
  EXPECT_EQ(client.get("/l/a")->lease, lease);
  EXPECT_EQ(client.lease_keepalive_once(lease), 5);

  const std::int64_t before = fake.revision();
  ASSERT_TRUE(fake.expire_lease(lease));
  EXPECT_EQ(fake.revision(), before + 1);  // its keys go in one revision
  EXPECT_FALSE(client.get("/l/a").has_value());
  EXPECT_EQ(client.get("/l/b")->value, "b");
  EXPECT_EQ(client.lease_keepalive_once(lease), 0);
  EXPECT_EQ(client.lease_time_to_live(lease), -1);
  client.lease_revoke(lease);  // gone already: not an error
  expect_error(error_kind::lease_not_found, [&] { client.put("/l/c", "c", lease); });

  // By itself a lease runs out after its TTL, not before.
  fake_etcd timed;
  etcd_client timed_client(options_for(timed));
  const auto granted = clock_type::now();
  timed_client.put("/l/t", "t", timed_client.lease_grant(1s));
  ASSERT_TRUE(eventually([&] { return !timed.get("/l/t"); }, 3s));
  EXPECT_GE(clock_type::now() - granted, 900ms);
}

TEST(FakeEtcd, WatchSeesPutsDeletesAndExpiries) {
  fake_etcd fake(manual_leases());
  etcd_client client(options_for(fake));
  std::mutex mutex;
  std::vector<watch_event> seen;
  std::vector<error_kind> errors;
  const auto on_events = [&](const std::vector<watch_event>& batch) {
    std::lock_guard lock(mutex);
    seen.insert(seen.end(), batch.begin(), batch.end());
  };
  const auto on_error = [&](const etcd_error& e) {
    std::lock_guard lock(mutex);
    errors.push_back(e.kind());
  };
  const auto count = [&] {
    std::lock_guard lock(mutex);
    return seen.size();
  };
  auto watch = client.watch({"/w/", true, 0, 10s, 50ms}, on_events, on_error);
  ASSERT_TRUE(eventually([&] { return watch->next_revision() > 0; }));
  const std::int64_t lease = client.lease_grant(10s);
  client.put("/w/a", "1", lease);
  client.put("/elsewhere", "not watched");
  fake.put("/w/b", "2");  // the test's own writes are seen too
  fake.expire_lease(lease);
  ASSERT_TRUE(eventually([&] { return count() == 3; }));
  {
    std::lock_guard lock(mutex);
    EXPECT_EQ(seen[0].kv.key, "/w/a");
    EXPECT_EQ(seen[1].kv.key, "/w/b");
    EXPECT_EQ(seen[2].what, watch_event::type::del);
    EXPECT_EQ(seen[2].kv.key, "/w/a");
    EXPECT_EQ(watch->next_revision(), seen[2].kv.mod_revision + 1);
  }
  EXPECT_EQ(fake.open_watches(), 1u);
  watch->cancel();
  EXPECT_TRUE(eventually([&] { return fake.open_watches() == 0; }));

  fake.compact(fake.revision());
  auto old = client.watch({"/w/", true, 2, 10s, 50ms}, on_events, on_error);
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mutex);
    return !errors.empty();
  }));
  std::lock_guard lock(mutex);
  EXPECT_EQ(errors.front(), error_kind::compacted);
}

TEST(FakeEtcd, FailsOnCueAndCounts) {
  fake_etcd fake;
  etcd_client client(options_for(fake, 500ms));
  client.put("/f/k", "v");

  fake.fail_next(1, failure::unavailable());
  expect_error(error_kind::server, [&] { client.get("/f/k"); });
  fake.fail_next(1, failure::error(3, "etcdserver: bad request"), "/v3/kv/put");
  client.get("/f/k");  // another path: not this one's failure
  expect_error(error_kind::invalid_argument, [&] { client.put("/f/k", "w"); });
  EXPECT_EQ(client.get("/f/k")->value, "v");  // refused requests are not applied

  // Applied, then the connection closed: the client reports it and does not send it again,
  // and the store has it.
  fake.fail_next(1, failure::applied_then_closed(), "/v3/kv/put");
  expect_error(error_kind::unreachable, [&] { client.put("/f/k", "applied"); });
  EXPECT_EQ(fake.get("/f/k")->value, "applied");

  fake.fail_next(1, failure::hung());
  const auto start = clock_type::now();
  expect_error(error_kind::timeout,
               [&] { client.get("/f/k", call_options{clock_type::now() + 200ms}); });
  EXPECT_LT(clock_type::now() - start, 450ms);
  // The client gave up on the hung connection: the fake sees it closed, and the next call
  // gets through on a new one.
  EXPECT_TRUE(eventually([&] { return fake.open_connections() == 0; }));
  EXPECT_EQ(client.get("/f/k")->value, "applied");

  fake.stop_serving();
  expect_error(error_kind::unreachable, [&] { client.get("/f/k"); });
  fake.resume_serving();
  EXPECT_EQ(client.get("/f/k")->value, "applied");

  EXPECT_EQ(fake.requests("/v3/kv/put"), 3u);
  EXPECT_EQ(fake.requests("/v3/kv/range"), 6u);  // the refused and the hung one included
  EXPECT_EQ(fake.requests(), 9u);
  EXPECT_EQ(fake.connections_accepted(), 4u);  // first, after the close, the hang, the stop
}

/// What one candidate's callbacks saw.
struct candidate_log {
  std::mutex mutex;
  std::vector<std::int64_t> elected;
  std::vector<std::string> lost;
  clock_type::time_point lost_at{};

  election_options options(const std::string& id, std::chrono::seconds ttl) {
    election_options o;
    o.job = "job";
    o.id = id;
    o.address = id + ":7000";
    o.ttl = ttl;
    o.on_elected = [this](std::int64_t epoch) {
      std::lock_guard lock(mutex);
      elected.push_back(epoch);
    };
    o.on_lost = [this](const std::string& reason) {
      std::lock_guard lock(mutex);
      lost.push_back(reason);
      lost_at = clock_type::now();
    };
    return o;
  }
  std::size_t losses() {
    std::lock_guard lock(mutex);
    return lost.size();
  }
};

TEST(FakeEtcd, ElectionNoticesAnExpiredLeaseAndHandsOver) {
  fake_etcd fake(manual_leases());
  etcd_client client(options_for(fake, 300ms));
  candidate_log log_a, log_b;
  leader_election a(client, log_a.options("a", 2s));
  leader_election b(client, log_b.options("b", 2s));
  a.start();
  ASSERT_TRUE(eventually([&] { return a.is_leader(); }));
  b.start();
  const auto held = fake.get("/troupe/job/leader");
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->create_revision, a.epoch());
  EXPECT_FALSE(b.is_leader());

  // The lease is lost behind the leader's back (etcd expired it while the leader's renewals
  // were delayed): the leader notices. Then both campaign, the deposed leader too, and
  // whichever wins leads under a larger epoch.
  fake.expire_lease(held->lease);
  ASSERT_TRUE(eventually([&] { return log_a.losses() > 0; }, 3s));
  ASSERT_TRUE(eventually([&] { return a.is_leader() || b.is_leader(); }, 3s));
  EXPECT_NE(a.is_leader(), b.is_leader());
  leader_election& now = a.is_leader() ? a : b;
  EXPECT_GT(now.epoch(), held->create_revision);
  EXPECT_EQ(fake.get("/troupe/job/leader")->create_revision, now.epoch());
}

TEST(FakeEtcd, LeaderStepsDownBeforeItsLeaseExpiresWhenKeepalivesHang) {
  fake_etcd fake;
  etcd_client client(options_for(fake, 300ms));
  candidate_log log;
  auto options = log.options("a", 3s);
  options.safety_margin = 1000ms;
  options.keepalive_interval = 500ms;
  // What the fake's lease has left at the moment the leader lets go of it.
  std::atomic<std::int64_t> lease{0};
  std::optional<std::chrono::milliseconds> left_at_step_down;
  options.on_lost = [&, inner = options.on_lost](const std::string& reason) {
    left_at_step_down = fake.lease_remaining(lease.load());
    inner(reason);
  };
  leader_election a(client, options);
  a.start();
  ASSERT_TRUE(eventually([&] { return a.is_leader(); }));
  lease = fake.get("/troupe/job/leader")->lease;
  const std::int64_t first_epoch = a.epoch();

  fake.fail_next(1000, failure::hung(), "/v3/lease/keepalive");
  ASSERT_TRUE(eventually([&] { return log.losses() > 0; }, 4s));
  ASSERT_TRUE(left_at_step_down.has_value()) << "the lease had expired before the step-down";
  EXPECT_GT(*left_at_step_down, 300ms);
  EXPECT_NE(log.lost[0].find("keepalive"), std::string::npos) << log.lost[0];

  fake.clear_failures();
  ASSERT_TRUE(eventually([&] { return a.is_leader(); }, 5s));
  EXPECT_GT(a.epoch(), first_epoch);
}

TEST(FakeEtcd, ServesTheStoreAnotherIncarnationLeft) {
  fake_etcd fake(manual_leases());
  const std::int64_t old_lease = fake.grant_lease(30s);
  key_value leader;
  leader.key = "/troupe/job/leader";
  leader.value = "old-coordinator";
  leader.create_revision = 40;
  leader.mod_revision = 40;
  leader.lease = old_lease;
  key_value state;
  state.key = "/troupe/job/state";
  state.value = R"({"epoch":40})";
  state.create_revision = 12;
  state.mod_revision = 41;
  state.version = 9;
  fake.seed({leader, state}, 57);

  etcd_client client(options_for(fake, 300ms));
  const auto read = client.get("/troupe/job/state");
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->create_revision, 12);
  EXPECT_EQ(read->version, 9);
  EXPECT_EQ(client.get_prefix("/troupe/").revision, 57);

  candidate_log log;
  leader_election candidate(client, log.options("new", 2s));
  EXPECT_EQ(candidate.leader()->id, "old-coordinator");
  EXPECT_EQ(candidate.leader()->epoch, 40);
  candidate.start();
  std::this_thread::sleep_for(200ms);  // campaigning against a held key changes nothing
  EXPECT_FALSE(candidate.is_leader());
  fake.expire_lease(old_lease);
  ASSERT_TRUE(eventually([&] { return candidate.is_leader(); }, 3s));
  EXPECT_GT(candidate.epoch(), 57);
}

// A standby waits on a leader key written long ago: once a compaction passed that key's
// revision, a watch from it would fail as compacted at once, and a campaign that watched from
// there would read and watch again without pause (about 1,800 times a second, measured).
TEST(FakeEtcd, AStandbyDoesNotSpinOnALeaderKeyOlderThanTheCompaction) {
  fake_etcd fake(manual_leases());
  etcd_client client(options_for(fake, 300ms));
  candidate_log log_a, log_b;
  leader_election a(client, log_a.options("a", 5s));
  a.start();
  ASSERT_TRUE(eventually([&] { return a.is_leader(); }));
  for (int i = 0; i < 5; ++i) fake.put("/troupe/other/key" + std::to_string(i), "x");
  fake.compact(fake.revision());
  leader_election b(client, log_b.options("b", 5s));
  const auto before = fake.requests();
  b.start();
  std::this_thread::sleep_for(500ms);
  // a's keepalives (every ttl / 4) and b's first read and watch; a spinning b makes hundreds.
  EXPECT_LT(fake.requests() - before, 30u);
  EXPECT_FALSE(b.is_leader());
}

TEST(FakeEtcdStore, SeedRefusesKeysOfUnknownLeases) {
  testing::fake_store store;
  key_value kv;
  kv.key = "/k";
  kv.lease = 99;
  EXPECT_THROW(store.seed({kv}), testing::store_error);
  kv.lease = store.grant(std::chrono::seconds(5));
  store.seed({kv});
  EXPECT_EQ(store.get("/k")->create_revision, 2);
  EXPECT_EQ(store.revision(), 2);
}

}  // namespace
}  // namespace troupe::etcd
