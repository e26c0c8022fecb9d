// The key-value store across processes: a peer process on the other end of every key, and a
// store server in a process that gets killed.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <optional>
#include <thread>

#include "runtime/comm/store.hpp"
#include "tests/runtime/comm/child_process.hpp"

using namespace troupe;
using namespace troupe::comm;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

template <class Cond>
bool eventually(Cond cond, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = clock_type::now() + timeout;
  while (!cond()) {
    if (clock_type::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

void expect_clean_exit(test::child_process& p, std::chrono::milliseconds timeout = 30s) {
  const auto status = p.wait_exit(timeout);
  ASSERT_TRUE(status.has_value()) << "peer still running after " << timeout.count() << " ms";
  EXPECT_EQ(*status, 0) << "peer " << test::describe_status(*status);
}

TEST(store_multiproc, set_get_wait_add_across_processes) {
  tcp_store_server server;
  auto c = connect_tcp_store("127.0.0.1", server.port(), 5s);
  auto peer = test::child_process::spawn(
      {COMM_PEER_PATH, "127.0.0.1:" + std::to_string(server.port()), "1", "2", "store_ops"});

  // Our get is parked on the server before the peer can possibly set the key: the peer sets
  // it only after it has read "from_test", which we write only once our get is waiting.
  std::atomic<bool> released{false};
  auto got = std::async(std::launch::async, [&] {
    auto own = connect_tcp_store("127.0.0.1", server.port(), 5s);
    auto v = own->get_string("from_peer/a", 20s);
    return std::make_pair(v, released.load());
  });
  ASSERT_TRUE(eventually([&] { return server.waiting() >= 1; }));
  released = true;
  c->set_string("from_test", "hello");
  const auto [value, after_release] = got.get();
  EXPECT_EQ(value, "alpha");
  EXPECT_TRUE(after_release);
  EXPECT_EQ(c->add("counter", 1), 6);  // the peer added 5

  c->set_string("from_test2", "x");
  c->set_string("from_test3", "y");  // releases the peer's wait on both keys
  EXPECT_EQ(c->get_string("done", 20s), std::to_string(peer.pid()));
  expect_clean_exit(peer);
}

TEST(store_multiproc, killed_server_is_a_typed_error_not_a_hang) {
  auto server = test::child_process::spawn({COMM_PEER_PATH, "serve"}, true);
  const auto line = server.read_line(20s);
  ASSERT_TRUE(line.has_value()) << "store server process printed no port";
  ASSERT_EQ(line->rfind("port ", 0), 0u) << *line;
  const auto port = static_cast<uint16_t>(std::stoi(line->substr(5)));

  auto c = connect_tcp_store("127.0.0.1", port, 5s);
  c->set_string("k", "v");
  ASSERT_EQ(c->get_string("k", 1s), "v");

  auto blocked = connect_tcp_store("127.0.0.1", port, 5s);
  auto outcome = std::async(std::launch::async, [&]() -> std::optional<store_errc> {
    try {
      blocked->get("never", 30s);
    } catch (const store_error& e) {
      return e.code();
    }
    return std::nullopt;
  });
  // Whether or not the get reached the server before the kill, it must end in an error soon.
  const auto start = clock_type::now();
  server.kill();
  ASSERT_EQ(outcome.wait_for(5s), std::future_status::ready) << "get hung on a dead server";
  const auto code = outcome.get();
  ASSERT_TRUE(code.has_value());
  EXPECT_TRUE(*code == store_errc::connection_lost || *code == store_errc::unreachable)
      << to_string(*code);
  EXPECT_LT(clock_type::now() - start, 3s);

  try {
    c->set_string("k2", "v2");
    FAIL() << "set succeeded on a dead server";
  } catch (const store_error& e) {
    EXPECT_TRUE(e.code() == store_errc::connection_lost || e.code() == store_errc::unreachable)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
}

}  // namespace
