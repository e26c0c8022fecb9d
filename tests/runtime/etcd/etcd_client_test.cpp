// etcd_client against real etcd servers: key-value calls, leases, watches across a restart,
// failover inside a 3-member cluster, deadlines on a paused server, and TLS. And its kept-alive
// connections: counted through a relay in front of a real etcd, and against fake_etcd for
// the server closing them at the worst moments.

#include "runtime/etcd/etcd_client.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "tests/runtime/etcd/etcd_cluster.hpp"
#include "tests/runtime/etcd/fake_etcd.hpp"
#include "tests/runtime/etcd/tcp_proxy.hpp"
#include "tests/runtime/sys/eventually.hpp"

namespace troupe::etcd {
namespace {

using namespace std::chrono_literals;
using sys::testing::eventually;
using testing::etcd_cluster;
using testing::failure;
using testing::fake_etcd;
using testing::options_for;
using testing::tcp_proxy;
using testing::wait_ready;

#define REQUIRE_ETCD()       \
  if (!testing::have_etcd()) \
  GTEST_SKIP() << testing::kEtcd << " is missing (apt-get install etcd-server)"

/// Expects `f` to throw etcd_error of `kind` and returns its message.
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

/// Events seen by a watch, for tests to wait on.
struct event_log {
  std::mutex mutex;
  std::vector<watch_event> events;
  std::vector<std::string> errors;

  watch_callback on_events() {
    return [this](const std::vector<watch_event>& batch) {
      std::lock_guard lock(mutex);
      events.insert(events.end(), batch.begin(), batch.end());
    };
  }
  watch_error_callback on_error() {
    return [this](const etcd_error& e) {
      std::lock_guard lock(mutex);
      errors.push_back(std::string(to_string(e.kind())) + ": " + e.what());
    };
  }
  bool has(watch_event::type what, const std::string& key) {
    std::lock_guard lock(mutex);
    for (const auto& e : events) {
      if (e.what == what && e.kv.key == key) return true;
    }
    return false;
  }
  bool has_error(error_kind kind) {
    std::lock_guard lock(mutex);
    for (const auto& e : errors) {
      if (e.rfind(to_string(kind), 0) == 0) return true;
    }
    return false;
  }
  std::vector<watch_event> snapshot() {
    std::lock_guard lock(mutex);
    return events;
  }
};

TEST(EtcdClient, PutGetPrefixTxnDelete) {
  REQUIRE_ETCD();
  etcd_cluster cluster(1);
  etcd_client client(options_for(cluster.urls()));
  ASSERT_TRUE(wait_ready(client)) << cluster.logs();

  EXPECT_FALSE(client.get("/t/a").has_value());
  const std::int64_t rev = client.put("/t/a", std::string("one\0two", 7));
  EXPECT_GT(rev, 0);
  const auto a = client.get("/t/a");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->value, std::string("one\0two", 7));  // bytes survive base64
  EXPECT_EQ(a->create_revision, rev);
  EXPECT_EQ(a->version, 1);

  client.put("/t/b", "");  // the gateway leaves empty values out: still a key with ""
  client.put("/t/c", "3");
  client.put("/u/x", "elsewhere");
  const auto all = client.get_prefix("/t/");
  ASSERT_EQ(all.kvs.size(), 3u);
  EXPECT_EQ(all.count, 3);
  EXPECT_EQ(all.kvs[0].key, "/t/a");
  EXPECT_EQ(all.kvs[1].value, "");
  EXPECT_EQ(all.kvs[2].key, "/t/c");
  EXPECT_GE(all.revision, rev);
  const auto first_two = client.get_prefix("/t/", 2);
  EXPECT_EQ(first_two.kvs.size(), 2u);
  EXPECT_EQ(first_two.count, 3);

  // Create-if-absent: the first txn writes, the second finds the key and reads it instead.
  txn_request create;
  create.compares.push_back(compare::created("/t/new", compare::op::equal, 0));
  create.then.push_back(txn_op::put("/t/new", "mine"));
  create.otherwise.push_back(txn_op::get("/t/new"));
  const auto won = client.txn(create);
  EXPECT_TRUE(won.succeeded);
  ASSERT_EQ(won.results.size(), 1u);
  EXPECT_EQ(won.results[0].what, txn_op::kind::put);
  create.then[0].value = "theirs";
  const auto lost = client.txn(create);
  EXPECT_FALSE(lost.succeeded);
  ASSERT_EQ(lost.results.size(), 1u);
  ASSERT_EQ(lost.results[0].kvs.size(), 1u);
  EXPECT_EQ(lost.results[0].kvs[0].value, "mine");
  EXPECT_EQ(lost.results[0].kvs[0].create_revision, won.revision);

  // Value, version and mod_revision compares, and a delete inside a txn.
  const auto c = *client.get("/t/c");
  txn_request guarded;
  guarded.compares = {compare::valued("/t/c", compare::op::equal, "3"),
                      compare::versioned("/t/c", compare::op::equal, 1),
                      compare::modified("/t/c", compare::op::equal, c.mod_revision)};
  guarded.then = {txn_op::del("/t/c"), txn_op::put("/t/d", "4")};
  const auto done = client.txn(guarded);
  EXPECT_TRUE(done.succeeded);
  ASSERT_EQ(done.results.size(), 2u);
  EXPECT_EQ(done.results[0].deleted, 1);
  EXPECT_FALSE(client.get("/t/c").has_value());
  EXPECT_FALSE(client.txn(guarded).succeeded);  // /t/c is gone: the compares fail

  // A txn touching one key twice is malformed: etcd says so and it is not retried elsewhere.
  txn_request twice;
  twice.then = {txn_op::put("/t/a", "1"), txn_op::del("/t/a")};
  expect_error(error_kind::invalid_argument, [&] { client.txn(twice); });
  expect_error(error_kind::invalid_argument, [&] { client.put("", "no key"); });

  EXPECT_EQ(client.del("/t/", true), 4);  // a, b, new, d
  EXPECT_EQ(client.get_prefix("/t/").kvs.size(), 0u);
  EXPECT_EQ(client.del("/t/a"), 0);
  EXPECT_TRUE(client.get("/u/x").has_value());
}

TEST(EtcdClient, LeaseGrantKeepaliveExpiryRevoke) {
  REQUIRE_ETCD();
  etcd_cluster cluster(1);
  etcd_client client(options_for(cluster.urls()));
  ASSERT_TRUE(wait_ready(client)) << cluster.logs();

  const std::int64_t kept = client.lease_grant(2s);
  const std::int64_t dropped = client.lease_grant(2s);
  EXPECT_NE(kept, dropped);
  client.put("/l/kept", "k", kept);
  client.put("/l/dropped", "d", dropped);
  EXPECT_EQ(client.get("/l/kept")->lease, kept);
  EXPECT_GT(client.lease_time_to_live(kept), 0);

  // Renew one lease and not the other: only the unrenewed key goes, within its TTL plus etcd's
  // expiry sweep (every 500 ms).
  const auto start = std::chrono::steady_clock::now();
  bool dropped_gone = false;
  while (std::chrono::steady_clock::now() - start < 6s) {
    EXPECT_GT(client.lease_keepalive_once(kept), 0);
    if (!client.get("/l/dropped")) {
      dropped_gone = true;
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(dropped_gone);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 1500ms);  // not before its TTL
  EXPECT_TRUE(client.get("/l/kept").has_value());
  EXPECT_EQ(client.lease_keepalive_once(dropped), 0);  // gone: zero, not an error
  EXPECT_EQ(client.lease_time_to_live(dropped), -1);

  client.lease_revoke(kept);
  EXPECT_FALSE(client.get("/l/kept").has_value());
  client.lease_revoke(kept);  // already gone: not an error
  expect_error(error_kind::lease_not_found, [&] { client.put("/l/x", "x", kept); });
}

TEST(EtcdClient, WatchSeesPutsAndDeletesAndResumesAfterRestart) {
  REQUIRE_ETCD();
  etcd_cluster cluster(1);
  etcd_client client(options_for(cluster.urls()));
  ASSERT_TRUE(wait_ready(client)) << cluster.logs();
  const std::int64_t before = client.put("/w/before", "0");

  event_log log;
  watch_request request;
  request.key = "/w/";
  request.prefix = true;
  request.start_revision = before;  // history from a revision on: the first put is seen too
  auto watch = client.watch(request, log.on_events(), log.on_error());
  client.put("/other", "not watched");
  client.put("/w/a", "1");
  client.del("/w/a");
  ASSERT_TRUE(eventually([&] { return log.has(watch_event::type::del, "/w/a"); }));
  EXPECT_TRUE(log.has(watch_event::type::put, "/w/before"));
  EXPECT_TRUE(log.has(watch_event::type::put, "/w/a"));

  // The server goes away and comes back with its data: the watch reopens by itself from the
  // revision after the last event it delivered, so it neither loses nor repeats events.
  cluster.member(0).kill();
  ASSERT_TRUE(eventually([&] { return log.has_error(error_kind::unreachable); }, 10s));
  cluster.restart(0);
  ASSERT_TRUE(wait_ready(client)) << cluster.logs();
  client.put("/w/b", "2");
  client.put("/w/c", "3");
  ASSERT_TRUE(eventually([&] { return log.has(watch_event::type::put, "/w/c"); }, 10s))
      << cluster.logs();
  const auto events = log.snapshot();
  std::int64_t last = 0;
  for (const auto& e : events) {
    EXPECT_GT(e.kv.mod_revision, last) << "an event repeated or out of order: " << e.kv.key;
    last = e.kv.mod_revision;
    EXPECT_EQ(e.kv.key.rfind("/w/", 0), 0u);
  }
  EXPECT_EQ(events.size(), 5u);  // before, a, del a, b, c
  EXPECT_EQ(watch->next_revision(), last + 1);

  // Cancelled, it delivers nothing more.
  watch->cancel();
  client.put("/w/d", "4");
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(log.has(watch_event::type::put, "/w/d"));
}

TEST(EtcdClient, QuietWatchReopensWithoutReportingErrors) {
  REQUIRE_ETCD();
  etcd_cluster cluster(1);
  etcd_client client(options_for(cluster.urls()));
  ASSERT_TRUE(wait_ready(client)) << cluster.logs();
  event_log log;
  auto watch = client.watch({"/q/k", false, 0, 100ms, 50ms}, log.on_events(), log.on_error());
  ASSERT_TRUE(eventually([&] { return watch->next_revision() > 0; }));
  std::this_thread::sleep_for(600ms);  // several idle periods: the stream is reopened each time
  client.put("/q/k", "v");
  ASSERT_TRUE(eventually([&] { return log.has(watch_event::type::put, "/q/k"); }));
  std::lock_guard lock(log.mutex);
  EXPECT_EQ(log.events.size(), 1u);
  EXPECT_TRUE(log.errors.empty()) << log.errors.front();
}

TEST(EtcdClient, WatchFromCompactedRevisionReportsCompacted) {
  REQUIRE_ETCD();
  etcd_cluster cluster(1);
  etcd_client client(options_for(cluster.urls()));
  ASSERT_TRUE(wait_ready(client)) << cluster.logs();
  const std::int64_t first = client.put("/c/k", "1");
  client.put("/c/k", "2");
  const std::int64_t third = client.put("/c/k", "3");
  client.compact(third);
  event_log log;
  auto watch = client.watch({"/c/k", false, first, 10s, 50ms}, log.on_events(), log.on_error());
  ASSERT_TRUE(eventually([&] { return log.has_error(error_kind::compacted); }));
  expect_error(error_kind::compacted, [&] { client.compact(first); });
}

TEST(EtcdClient, FailsOverToAnotherMemberWhenOneIsKilled) {
  REQUIRE_ETCD();
  etcd_cluster cluster(3);
  etcd_client client(options_for(cluster.urls()));
  for (int i = 0; i < 3; ++i) {
    etcd_client one(options_for({cluster.member(i).client_url()}));
    ASSERT_TRUE(wait_ready(one)) << cluster.logs();
  }
  client.put("/f/k", "before");
  event_log log;
  watch_request request;
  request.key = "/f/k";
  auto watch = client.watch(request, log.on_events(), log.on_error());
  ASSERT_TRUE(eventually([&] { return watch->next_revision() > 0; }));

  cluster.member(0).kill();  // the first endpoint, the one the client and the watch use
  const auto start = std::chrono::steady_clock::now();
  client.put("/f/k", "after");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_EQ(client.get("/f/k")->value, "after");
  // The watch moved to another member and resumed from where it was.
  ASSERT_TRUE(eventually(
      [&] {
        for (const auto& e : log.snapshot()) {
          if (e.kv.value == "after") return true;
        }
        return false;
      },
      10s));

  // Once every member is gone, the error says so and names them.
  cluster.member(1).kill();
  cluster.member(2).kill();
  const std::string message = expect_error(error_kind::unreachable, [&] { client.get("/f/k"); });
  for (const auto& url : cluster.urls()) EXPECT_NE(message.find(url), std::string::npos);
}

TEST(EtcdClient, PausedServerTimesOutWithinTheDeadline) {
  REQUIRE_ETCD();
  etcd_cluster cluster(1);
  etcd_client client(options_for(cluster.urls(), 500ms));
  ASSERT_TRUE(wait_ready(client)) << cluster.logs();
  cluster.member(0).pause();
  const auto start = std::chrono::steady_clock::now();
  const std::string message = expect_error(error_kind::timeout, [&] { client.get("/p"); });
  const auto took = std::chrono::steady_clock::now() - start;
  cluster.member(0).resume();
  EXPECT_LT(took, 1500ms);
  EXPECT_NE(message.find(cluster.urls()[0]), std::string::npos) << message;

  // A call's own deadline is shorter than the per-endpoint timeout.
  cluster.member(0).pause();
  const auto again = std::chrono::steady_clock::now();
  expect_error(error_kind::timeout,
               [&] { client.get("/p", call_options{std::chrono::steady_clock::now() + 100ms}); });
  EXPECT_LT(std::chrono::steady_clock::now() - again, 400ms);
  cluster.member(0).resume();
}

TEST(EtcdClient, RefusesAnswersLargerThanItsLimit) {
  REQUIRE_ETCD();
  etcd_cluster cluster(1);
  auto options = options_for(cluster.urls());
  etcd_client client(options);
  ASSERT_TRUE(wait_ready(client)) << cluster.logs();
  client.put("/big", std::string(64 * 1024, 'x'));
  options.max_response_bytes = 4096;
  etcd_client small(options);
  expect_error(error_kind::protocol, [&] { small.get("/big"); });
  EXPECT_EQ(client.get("/big")->value.size(), 64u * 1024);
}

TEST(EtcdClient, NothingListeningIsUnreachable) {
  const std::string url = "http://127.0.0.1:" + std::to_string(test::unused_port());
  etcd_client client(options_for({url}));
  const std::string message = expect_error(error_kind::unreachable, [&] { client.get("/k"); });
  EXPECT_NE(message.find(url), std::string::npos) << message;
  expect_error(error_kind::invalid_argument, [] { etcd_client bad(options_for({"tcp://x:1"})); });
}

TEST(EtcdClient, TlsWithClientCertificates) {
  REQUIRE_ETCD();
  testing::temp_dir certs;
  const auto tls = testing::make_tls_files(certs.path());
  etcd_cluster cluster(1, &tls);
  auto options = options_for(cluster.urls());
  options.ca_file = tls.ca;
  options.cert_file = tls.client_cert;
  options.key_file = tls.client_key;
  etcd_client client(options);
  ASSERT_TRUE(wait_ready(client)) << cluster.logs();
  client.put("/tls/k", "secret");
  EXPECT_EQ(client.get("/tls/k")->value, "secret");
  event_log log;
  auto watch = client.watch({"/tls/k", false, 0, 10s, 50ms}, log.on_events(), log.on_error());
  ASSERT_TRUE(eventually([&] { return watch->next_revision() > 0; }));
  client.put("/tls/k", "changed");
  ASSERT_TRUE(eventually([&] { return log.has(watch_event::type::put, "/tls/k"); }));

  // By name, the certificate's DNS name is checked instead of its IP address.
  auto by_name = options;
  by_name.endpoints = {"https://localhost:" +
                       cluster.urls()[0].substr(cluster.urls()[0].rfind(':') + 1)};
  etcd_client named(by_name);
  EXPECT_EQ(named.get("/tls/k")->value, "changed");

  auto wrong_ca = options;
  wrong_ca.ca_file = tls.other_ca;
  etcd_client stranger(wrong_ca);
  const std::string message = expect_error(error_kind::tls, [&] { stranger.get("/tls/k"); });
  EXPECT_NE(message.find("ca_file"), std::string::npos) << message;
  EXPECT_NE(message.find(cluster.urls()[0]), std::string::npos) << message;

  auto no_cert = options;
  no_cert.cert_file.clear();
  no_cert.key_file.clear();
  etcd_client anonymous(no_cert);
  expect_error(error_kind::tls, [&] { anonymous.get("/tls/k"); });

  auto missing = options;
  missing.ca_file = (certs.path() / "absent.crt").string();
  expect_error(error_kind::tls, [&] { etcd_client broken(missing); });
}

// ---- kept-alive connections ----

/// Every kind of unary call, `rounds` times over; returns how many requests that was.
std::size_t every_unary_call(etcd_client& client, int rounds) {
  const std::int64_t lease = client.lease_grant(10s);
  for (int i = 0; i < rounds; ++i) {
    const std::string key = "/ka/" + std::to_string(i);
    client.put(key, "v", lease);
    EXPECT_TRUE(client.get(key).has_value());
    EXPECT_EQ(client.get_prefix("/ka/").kvs.size(), 1u);
    txn_request t;
    t.compares.push_back(compare::created(key, compare::op::greater, 0));
    t.then.push_back(txn_op::get(key));
    EXPECT_TRUE(client.txn(t).succeeded);
    EXPECT_GT(client.lease_keepalive_once(lease), 0);
    EXPECT_GT(client.lease_time_to_live(lease), 0);
    EXPECT_EQ(client.del(key), 1);
  }
  client.lease_revoke(lease);
  return 2 + 7 * static_cast<std::size_t>(rounds);
}

TEST(EtcdKeepAlive, OneConnectionCarriesEveryUnaryCall) {
  fake_etcd fake;
  etcd_client client(options_for({fake.url()}));
  const std::size_t calls = every_unary_call(client, 5);
  EXPECT_EQ(fake.requests(), calls);
  EXPECT_EQ(fake.connections_accepted(), 1u);
}

TEST(EtcdKeepAlive, ReplacesAConnectionTheServerClosedWhileIdle) {
  fake_etcd fake;
  etcd_client client(options_for({fake.url()}));
  client.put("/ka/k", "1");
  fake.close_idle_connections();
  ASSERT_EQ(fake.open_connections(), 0u);
  // A write too: the closed connection is seen before anything is sent on it.
  txn_request create;
  create.compares.push_back(compare::created("/ka/new", compare::op::equal, 0));
  create.then.push_back(txn_op::put("/ka/new", "once"));
  EXPECT_TRUE(client.txn(create).succeeded);
  EXPECT_EQ(fake.requests("/v3/kv/txn"), 1u);
  EXPECT_EQ(fake.connections_accepted(), 2u);
}

TEST(EtcdKeepAlive, ResendsAReadButNeverAWriteTheServerMayHaveApplied) {
  fake_etcd fake;
  etcd_client client(options_for({fake.url()}));
  client.put("/ka/k", "v");

  // The kept-alive connection closes after the request went out and before any answer: a
  // read is sent again on a new connection, once.
  fake.fail_next(1, failure::closed(), "/v3/kv/range");
  EXPECT_EQ(client.get("/ka/k")->value, "v");
  EXPECT_EQ(fake.requests("/v3/kv/range"), 2u);
  fake.fail_next(1, failure::closed(), "/v3/lease/keepalive");
  EXPECT_EQ(client.lease_keepalive_once(client.lease_grant(5s)), 5);
  fake.fail_next(2, failure::closed(), "/v3/kv/range");
  expect_error(error_kind::unreachable, [&] { client.get("/ka/k"); });
  EXPECT_EQ(fake.requests("/v3/kv/range"), 4u);  // the new connection's failure is final

  // A write in the same place may have been applied (here it was): it fails instead of
  // running twice, and the caller reads what is there.
  client.put("/ka/warm", "a connection to reuse");
  fake.fail_next(1, failure::applied_then_closed(), "/v3/kv/txn");
  txn_request create;
  create.compares.push_back(compare::created("/ka/new", compare::op::equal, 0));
  create.then.push_back(txn_op::put("/ka/new", "once"));
  expect_error(error_kind::unreachable, [&] { client.txn(create); });
  EXPECT_EQ(fake.requests("/v3/kv/txn"), 1u);
  EXPECT_EQ(client.get("/ka/new")->version, 1);
}

TEST(EtcdKeepAlive, AHungKeptAliveConnectionKeepsTheCallsDeadline) {
  fake_etcd fake;
  etcd_client client(options_for({fake.url()}, 2000ms));
  client.put("/ka/k", "v");
  fake.fail_next(1, failure::hung());
  const auto start = std::chrono::steady_clock::now();
  expect_error(error_kind::timeout, [&] {
    client.get("/ka/k", call_options{std::chrono::steady_clock::now() + 150ms});
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 400ms);
  EXPECT_EQ(fake.requests("/v3/kv/range"), 1u);  // after a timeout, never sent again
  EXPECT_EQ(client.get("/ka/k")->value, "v");
  EXPECT_EQ(fake.connections_accepted(), 2u);
}

TEST(EtcdKeepAlive, ConcurrentCallsShareASmallPool) {
  fake_etcd fake;
  etcd_client client(options_for({fake.url()}));
  constexpr int kThreads = 4;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        const std::string key = "/ka/" + std::to_string(t);
        try {
          client.put(key, std::to_string(i));
          if (client.get(key)->value != std::to_string(i)) ++failures;
        } catch (const etcd_error&) {
          ++failures;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  // No more connections than calls under way at once, and they stay for later calls.
  const std::size_t opened = fake.connections_accepted();
  EXPECT_LE(opened, static_cast<std::size_t>(kThreads));
  for (int i = 0; i < 10; ++i) client.get("/ka/0");
  EXPECT_EQ(fake.connections_accepted(), opened);
}

/// A real etcd, plain or TLS, seen through a relay that counts connections: one carries every
/// call, and when it is cut the next call gets through on a new one.
void one_connection_to_real_etcd(const testing::tls_files* tls) {
  etcd_cluster cluster(1, tls);
  tcp_proxy proxy(cluster.urls()[0]);
  auto options = options_for({proxy.url(tls ? "https" : "http")});
  if (tls) {
    options.ca_file = tls->ca;
    options.cert_file = tls->client_cert;
    options.key_file = tls->client_key;
  }
  etcd_client client(options);
  ASSERT_TRUE(wait_ready(client)) << cluster.logs();
  const std::size_t ready = proxy.connections_accepted();
  every_unary_call(client, 3);
  EXPECT_EQ(proxy.connections_accepted(), ready);
  proxy.cut_all();
  txn_request create;
  create.compares.push_back(compare::created("/ka/after", compare::op::equal, 0));
  create.then.push_back(txn_op::put("/ka/after", "cut"));
  EXPECT_TRUE(client.txn(create).succeeded);
  EXPECT_EQ(client.get("/ka/after")->version, 1);
  EXPECT_EQ(proxy.connections_accepted(), ready + 1);
}

TEST(EtcdKeepAlive, RealEtcdKeepsOneConnection) {
  REQUIRE_ETCD();
  one_connection_to_real_etcd(nullptr);
}

TEST(EtcdKeepAlive, RealEtcdKeepsOneTlsConnection) {
  REQUIRE_ETCD();
  testing::temp_dir certs;
  const auto tls = testing::make_tls_files(certs.path());
  one_connection_to_real_etcd(&tls);
}

TEST(EtcdCodec, Base64AndPrefixRanges) {
  for (const std::string s : {"", "f", "fo", "foo", "foob", "fooba", "foobar"}) {
    EXPECT_EQ(base64_decode(base64_encode(s)), s);
  }
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode(std::string("\xff\x00", 2)), "/wA=");
  EXPECT_THROW(base64_decode("!!"), etcd_error);
  EXPECT_EQ(prefix_range_end("/a/"), "/a0");
  EXPECT_EQ(prefix_range_end("a\xff"), "b");
  EXPECT_EQ(prefix_range_end(""), std::string(1, '\0'));
}

}  // namespace
}  // namespace troupe::etcd
