// A gloo group that cannot connect (issue 25): it fails within its connect deadline with an
// error that names the peer's address and says why (refused, timed out, a loopback address
// facing another host), as a connect_error whose class the coordinator compares across
// generations; a newer generation ends the wait for a pair at once. The peer here is a rank
// that published its pair address in the store and never came: the test writes that address.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <future>

#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/store.hpp"

using namespace troupe;
using namespace troupe::comm;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

/// A port on `host` that nothing listens on (bound, then closed).
uint16_t closed_port(const char* host) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, host, &a.sin_addr);
  socklen_t n = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0)
    ADD_FAILURE() << "cannot bind a probe socket on " << host;
  ::close(fd);
  return ntohs(a.sin_port);
}

/// What gloo publishes for rank 1 of a 2-rank group: one pair address (a sockaddr_storage and
/// a sequence number).
std::vector<char> pair_address(const char* host, uint16_t port) {
  sockaddr_storage s{};
  auto& a = reinterpret_cast<sockaddr_in&>(s);
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, host, &a.sin_addr);
  std::vector<char> out(sizeof(sockaddr_storage) + sizeof(ssize_t), 0);
  std::memcpy(out.data(), &s, sizeof s);
  return out;
}

struct attempt {
  std::string what;
  std::string cause;  // connect_error::cause(), "" for another comm_error
  comm_errc code = comm_errc::internal;
  std::chrono::milliseconds took{0};
};

/// Rank 0 of group "pairs" (generation 5), listening on `bind_host`; rank 1 "published"
/// `peer_host:peer_port` and is never there.
attempt connect_rank0(const std::string& bind_host, const char* peer_host, uint16_t peer_port,
                      std::chrono::milliseconds timeout, cancel_check cancelled = {}) {
  tcp_store_server server;
  auto store = connect_tcp_store("127.0.0.1", server.port(), 5s);
  store->set("g5/pairs/1", pair_address(peer_host, peer_port));
  gloo_options opts;
  opts.bind_host = bind_host;
  opts.connect_timeout = timeout;
  opts.cancelled = std::move(cancelled);
  attempt out;
  const auto start = clock_type::now();
  try {
    make_gloo_communicator(*store, {5, "pairs", 0, 2}, opts);
    out.what = "connected";
  } catch (const connect_error& e) {
    out.what = e.what();
    out.cause = e.cause();
    out.code = e.code();
  } catch (const comm_error& e) {
    out.what = e.what();
    out.code = e.code();
  }
  out.took = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start);
  std::printf("after %lld ms: %s\n", static_cast<long long>(out.took.count()), out.what.c_str());
  return out;
}

// gloo's rule: of a pair, the side with the higher address connects, the lower one listens.
// Rank 0 on 127.0.0.2 connects to a peer on 127.0.0.1; on 127.0.0.1 it waits for 127.0.0.2.

TEST(gloo_connect, a_refused_connection_names_the_address_at_once) {
  const uint16_t port = closed_port("127.0.0.1");
  const auto got = connect_rank0("127.0.0.2", "127.0.0.1", port, 10s);
  EXPECT_EQ(got.cause, "refused 127.0.0.1") << got.what;
  EXPECT_NE(got.what.find("rank 1 at 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << got.what;
  EXPECT_NE(got.what.find("refused"), std::string::npos) << got.what;
  EXPECT_LT(got.took, 5s) << "a refusal must not wait for the deadline";
}

TEST(gloo_connect, a_peer_that_never_connects_times_out_at_the_deadline_naming_both_addresses) {
  const auto got = connect_rank0("127.0.0.1", "127.0.0.2", 4567, 1500ms);
  EXPECT_EQ(got.cause, "timed-out 127.0.0.2") << got.what;
  EXPECT_EQ(got.code, comm_errc::timeout);
  EXPECT_NE(got.what.find("rank 1 at 127.0.0.2:4567"), std::string::npos) << got.what;
  EXPECT_NE(got.what.find("listens on 127.0.0.1"), std::string::npos) << got.what;
  EXPECT_GE(got.took, 1400ms);
  EXPECT_LT(got.took, 3s) << "the connect deadline was not kept";
}

TEST(gloo_connect, a_newer_generation_ends_the_wait_for_a_pair) {
  const auto start = clock_type::now();
  const auto got = connect_rank0("127.0.0.1", "127.0.0.2", 4567, 30s,
                                 [start] { return clock_type::now() - start > 300ms; });
  EXPECT_EQ(got.code, comm_errc::aborted) << got.what;
  EXPECT_EQ(got.cause, "");
  EXPECT_NE(got.what.find("newer generation"), std::string::npos) << got.what;
  EXPECT_LT(got.took, 2s) << "cancelled at 0.3 s, the wait for the pair went on";
}

TEST(gloo_connect, a_loopback_address_facing_another_host_fails_at_once) {
  const auto got = connect_rank0("127.0.0.1", "10.1.2.3", 4567, 10s);
  EXPECT_EQ(got.cause, "loopback 10.1.2.3") << got.what;
  EXPECT_NE(got.what.find("rank 1 listens on 10.1.2.3:4567"), std::string::npos) << got.what;
  EXPECT_NE(got.what.find("--iface"), std::string::npos) << got.what;
  EXPECT_LT(got.took, 5s);
}

TEST(gloo_connect, two_ranks_that_can_meet_still_connect) {
  tcp_store_server server;
  std::array<std::future<std::string>, 2> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks[r] = std::async(std::launch::async, [&server, r]() -> std::string {
      auto store = connect_tcp_store("127.0.0.1", server.port(), 5s);
      gloo_options opts;
      opts.bind_host = r == 0 ? "127.0.0.1" : "127.0.0.2";  // one connects, one listens
      opts.connect_timeout = 10s;
      opts.cancelled = [] { return false; };
      try {
        auto c = make_gloo_communicator(*store, {6, "pairs", r, 2}, opts);
        std::vector<float> v{1.0f + static_cast<float>(r)};
        c->all_reduce(v.data(), 1, reduce_op::sum, {10s});
        return v[0] == 3.0f ? "" : "wrong sum " + std::to_string(v[0]);
      } catch (const std::exception& e) {
        return e.what();
      }
    });
  }
  for (auto& f : ranks) EXPECT_EQ(f.get(), "");
}

}  // namespace
