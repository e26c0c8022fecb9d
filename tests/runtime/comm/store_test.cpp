// The key-value store within one process: server and clients on threads.
#include "runtime/comm/store.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "tests/runtime/comm/child_process.hpp"

using namespace troupe::comm;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

std::unique_ptr<kv_store> client(const tcp_store_server& s) {
  return connect_tcp_store("127.0.0.1", s.port(), 5s);
}

/// Polls `cond` until it holds or `timeout` passes.
template <class Cond>
bool eventually(Cond cond, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = clock_type::now() + timeout;
  while (!cond()) {
    if (clock_type::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(store, set_then_get) {
  tcp_store_server server;
  auto c = client(server);
  c->set_string("a", "alpha");
  EXPECT_EQ(c->get_string("a", 1s), "alpha");
  c->set_string("a", "again");
  EXPECT_EQ(c->get_string("a", 1s), "again");
  c->set("empty", {});
  EXPECT_TRUE(c->get("empty", 1s).empty());
}

TEST(store, large_binary_value) {
  tcp_store_server server;
  auto c = client(server);
  std::vector<char> big(10 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131);
  c->set("big", big);
  EXPECT_EQ(c->get("big", 5s), big);
}

TEST(store, get_blocks_until_another_client_sets) {
  tcp_store_server server;
  auto reader = client(server);
  auto writer = client(server);
  std::atomic<bool> set_done{false};
  auto got = std::async(std::launch::async, [&] {
    auto v = reader->get_string("late", 10s);
    return std::make_pair(v, set_done.load());
  });
  ASSERT_TRUE(eventually([&] { return server.waiting() == 1; }));
  set_done = true;
  writer->set_string("late", "here");
  const auto [value, was_set] = got.get();
  EXPECT_EQ(value, "here");
  EXPECT_TRUE(was_set);
  EXPECT_EQ(server.waiting(), 0u);
}

TEST(store, wait_for_several_keys) {
  tcp_store_server server;
  auto a = client(server);
  auto b = client(server);
  auto done = std::async(std::launch::async, [&] { a->wait({"x", "y", "z"}, 10s); });
  ASSERT_TRUE(eventually([&] { return server.waiting() == 1; }));
  b->set_string("y", "1");
  b->set_string("x", "1");
  EXPECT_EQ(done.wait_for(0ms), std::future_status::timeout);
  EXPECT_FALSE(b->check({"x", "y", "z"}));
  b->set_string("z", "1");
  done.get();
  EXPECT_TRUE(b->check({"x", "y", "z"}));
}

TEST(store, get_times_out_with_a_typed_error) {
  tcp_store_server server;
  auto c = client(server);
  const auto start = clock_type::now();
  try {
    c->get("never", 200ms);
    FAIL() << "get of a missing key returned";
  } catch (const store_error& e) {
    EXPECT_EQ(e.code(), store_errc::timeout);
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
  const auto took = clock_type::now() - start;
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, 2s);
  EXPECT_EQ(server.waiting(), 0u);
  // The connection is still good after a timeout.
  c->set_string("k", "v");
  EXPECT_EQ(c->get_string("k", 1s), "v");
}

TEST(store, interruptible_store_gives_up_when_cancelled_and_otherwise_waits_in_full) {
  tcp_store_server server;
  auto c = client(server);
  std::atomic<bool> cancel{false};
  interruptible_store s(
      *c, [&] { return cancel.load(); }, 20ms);
  // A key set a few slices later is still read.
  std::thread setter([&] {
    std::this_thread::sleep_for(60ms);
    client(server)->set_string("later", "v");
  });
  EXPECT_EQ(s.get_string("later", 5s), "v");
  setter.join();
  // Cancelled while waiting: get gives up within a slice, long before its timeout.
  std::thread canceller([&] {
    std::this_thread::sleep_for(100ms);
    cancel = true;
  });
  auto start = clock_type::now();
  try {
    (void)s.get("never", 30s);
    ADD_FAILURE() << "a cancelled get returned";
  } catch (const store_error& e) {
    EXPECT_EQ(e.code(), store_errc::cancelled) << e.what();
  }
  EXPECT_LT(clock_type::now() - start, 5s);
  canceller.join();
  try {
    s.wait({"never", "later"}, 30s);
    ADD_FAILURE() << "a cancelled wait returned";
  } catch (const store_error& e) {
    EXPECT_EQ(e.code(), store_errc::cancelled) << e.what();
  }
  // Not cancelled: the timeout is the whole timeout, not one slice, and says so.
  cancel = false;
  start = clock_type::now();
  try {
    (void)s.get("never", 200ms);
    ADD_FAILURE() << "get of a missing key returned";
  } catch (const store_error& e) {
    EXPECT_EQ(e.code(), store_errc::timeout);
    EXPECT_NE(std::string(e.what()).find("200 ms in all"), std::string::npos) << e.what();
  }
  EXPECT_GE(clock_type::now() - start, 200ms);
  EXPECT_TRUE(eventually([&] { return server.waiting() == 0; }));
  c->set_string("k", "v");  // the connection is still good
  EXPECT_EQ(s.get_string("k", 1s), "v");
}

TEST(store, add_is_atomic_across_clients) {
  tcp_store_server server;
  constexpr int threads = 8;
  constexpr int adds = 100;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      auto c = client(server);
      for (int i = 0; i < adds; ++i) c->add("n", 1);
    });
  }
  for (auto& w : workers) w.join();
  auto c = client(server);
  EXPECT_EQ(c->add("n", 0), threads * adds);
  EXPECT_EQ(c->get_string("n", 1s), std::to_string(threads * adds));
  c->set_string("text", "not a number");
  try {
    c->add("text", 1);
    FAIL() << "add on a non-counter succeeded";
  } catch (const store_error& e) {
    EXPECT_EQ(e.code(), store_errc::protocol);
  }
}

TEST(store, prefix_store_keeps_namespaces_apart) {
  tcp_store_server server;
  auto c = client(server);
  prefix_store g1(*c, "g1/world");
  prefix_store g2(*c, "g2/world");
  g1.set_string("k", "one");
  g2.set_string("k", "two");
  EXPECT_EQ(g1.get_string("k", 1s), "one");
  EXPECT_EQ(g2.get_string("k", 1s), "two");
  EXPECT_EQ(c->get_string("g1/world/k", 1s), "one");
  EXPECT_FALSE(g2.check({"only_in_g1"}));
  g1.set_string("only_in_g1", "x");
  EXPECT_FALSE(g2.check({"only_in_g1"}));
  EXPECT_THROW(g2.get("only_in_g1", 50ms), store_error);
}

TEST(store, stopped_server_gives_connection_lost_not_a_hang) {
  auto server = std::make_unique<tcp_store_server>();
  auto c = client(*server);
  c->set_string("k", "v");
  auto blocked = std::async(std::launch::async, [&]() -> std::optional<store_errc> {
    try {
      c->get("never", 30s);
    } catch (const store_error& e) {
      return e.code();
    }
    return std::nullopt;
  });
  ASSERT_TRUE(eventually([&] { return server->waiting() == 1; }));
  const auto start = clock_type::now();
  server->stop();
  ASSERT_EQ(blocked.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(blocked.get(), store_errc::connection_lost);
  EXPECT_LT(clock_type::now() - start, 2s);
  // Later calls try to reconnect once and say nothing answers.
  try {
    c->get("k", 1s);
    FAIL() << "get succeeded on a stopped server";
  } catch (const store_error& e) {
    EXPECT_EQ(e.code(), store_errc::unreachable) << e.what();
  }
}

TEST(store, connect_to_nothing_names_the_address) {
  const uint16_t port = troupe::test::unused_port();
  const auto start = clock_type::now();
  try {
    connect_tcp_store("127.0.0.1", port, 300ms);
    FAIL() << "connected to a port nobody listens on";
  } catch (const store_error& e) {
    EXPECT_EQ(e.code(), store_errc::unreachable);
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
  const auto took = clock_type::now() - start;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 2s);
}

TEST(store, client_connects_to_a_server_that_starts_later) {
  const uint16_t port = troupe::test::unused_port();
  auto connecting =
      std::async(std::launch::async, [&] { return connect_tcp_store("127.0.0.1", port, 10s); });
  // The client is retrying (it cannot have connected: nothing listens yet).
  EXPECT_EQ(connecting.wait_for(50ms), std::future_status::timeout);
  tcp_store_server server("127.0.0.1", port);
  auto c = connecting.get();
  c->set_string("k", "v");
  EXPECT_EQ(c->get_string("k", 1s), "v");
}

}  // namespace
