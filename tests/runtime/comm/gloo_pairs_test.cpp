// gloo's TCP pairs facing a stranger (issue 10). Gloo accepts whoever connects to a pair's
// listening socket first. A stranger who reads the port (from /proc/net/tcp, or by scanning)
// before the rightful peer connects takes its place, and garbage it then sends reaches
// gloo's decoder. The test gives the stranger the best possible timing: it connects to
// every pair address at the moment gloo publishes it, before any peer can have read it.
// With a pair key the kernel drops its SYN; without one it gets in.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <future>
#include <regex>

#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/store.hpp"
#include "runtime/comm/tcp_signature.hpp"
#include "tests/runtime/comm/patterns.hpp"

using namespace troupe;
using namespace troupe::comm;
using namespace std::chrono_literals;

namespace {

/// Tries to connect to `address` as a stranger would (no key); true if the connection was
/// established within `wait`. The socket is closed at once without sending anything.
bool stranger_connects(const sockaddr_storage& address, std::chrono::milliseconds wait) {
  const int fd = socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const socklen_t length =
      address.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  bool connected = false;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), length) == 0) {
    connected = true;
  } else if (errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, static_cast<int>(wait.count())) == 1) {
      int error = 0;
      socklen_t n = sizeof(error);
      connected = getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &n) == 0 && error == 0;
    }
  }
  ::close(fd);
  return connected;
}

/// A store client that, when gloo publishes a rank's pair addresses, first lets a stranger
/// try each of them.
class stranger_at_the_door final : public kv_store {
 public:
  stranger_at_the_door(std::unique_ptr<kv_store> base, std::atomic<int>& tried,
                       std::atomic<int>& got_in)
      : base_(std::move(base)), tried_(tried), got_in_(got_in) {}

  void set(const std::string& key, const std::vector<char>& value) override {
    static const std::regex pair_addresses(".*/pairs/[0-9]+");
    constexpr size_t entry = sizeof(sockaddr_storage) + sizeof(ssize_t);
    if (std::regex_match(key, pair_addresses) && !value.empty() && value.size() % entry == 0) {
      for (size_t at = 0; at < value.size(); at += entry) {
        sockaddr_storage address;
        std::memcpy(&address, value.data() + at, sizeof(address));
        ++tried_;
        if (stranger_connects(address, 300ms)) ++got_in_;
      }
    }
    base_->set(key, value);
  }
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return base_->get(key, timeout);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    base_->wait(keys, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override { return base_->add(key, delta); }
  bool check(const std::vector<std::string>& keys) override { return base_->check(keys); }

 private:
  std::unique_ptr<kv_store> base_;
  std::atomic<int>& tried_;
  std::atomic<int>& got_in_;
};

struct outcome {
  int built = 0;
  std::vector<std::string> errors;
};

/// Builds a 2-rank group "pairs" (each rank a thread, each with its own key) with a stranger
/// at the door, runs `body` on each communicator that was built.
template <class Body>
outcome build_pairs(const std::array<std::string, 2>& keys, std::atomic<int>& tried,
                    std::atomic<int>& got_in, std::chrono::milliseconds timeout, Body body) {
  tcp_store_server server;
  std::array<std::future<std::string>, 2> ranks;
  std::atomic<int> built{0};
  for (int r = 0; r < 2; ++r) {
    ranks[r] = std::async(std::launch::async, [&, r]() -> std::string {
      stranger_at_the_door store(connect_tcp_store("127.0.0.1", server.port(), 5s), tried, got_in);
      gloo_options opts;
      opts.pair_key = keys[r];
      opts.connect_timeout = timeout;
      try {
        auto c = make_gloo_communicator(store, {3, "pairs", r, 2}, opts);
        ++built;
        body(r, *c);
        return "";
      } catch (const comm_error& e) {
        return e.what();
      }
    });
  }
  outcome out;
  for (auto& f : ranks) {
    auto e = f.get();
    if (!e.empty()) out.errors.push_back(e);
  }
  out.built = built;
  return out;
}

class gloo_pairs : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!tcp_signatures_supported(&why)) GTEST_SKIP() << why;
  }
};

TEST_F(gloo_pairs, a_stranger_cannot_take_a_signed_pair_and_the_data_is_intact) {
  const long dropped_before = comm::tcp_signature_drops();
  std::atomic<int> tried{0}, got_in{0};
  const std::string key(32, 'k');
  const auto out = build_pairs({key, key}, tried, got_in, 10s, [](int r, communicator& c) {
    // Big enough for the segmented ring, and several rounds: after the keys are removed the
    // connections carry data in both directions with nothing dropped or stalled.
    for (const size_t count : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
      for (int round = 0; round < 3; ++round) {
        auto v = test::contributions(r, count);
        c.all_reduce(v.data(), count, reduce_op::sum, {10s});
        ASSERT_EQ(test::check_reduced(v, 2, reduce_op::sum), "") << count << " floats";
      }
    }
  });
  EXPECT_EQ(out.built, 2) << (out.errors.empty() ? "" : out.errors.front());
  EXPECT_TRUE(out.errors.empty()) << out.errors.front();
  EXPECT_EQ(tried, 2) << "the stranger should have tried each rank's one pair address";
  EXPECT_EQ(got_in, 0) << "a stranger without the key connected to a signed pair";
  if (dropped_before >= 0) {
    EXPECT_GE(comm::tcp_signature_drops(), dropped_before + 2)
        << "the kernel should count the stranger's dropped SYNs";
  }
}

TEST_F(gloo_pairs, without_a_key_the_stranger_gets_in_and_the_build_fails) {
  // The control: what the signature prevents. The stranger takes a pair's place (and could
  // send gloo anything); the group cannot form.
  std::atomic<int> tried{0}, got_in{0};
  const auto out = build_pairs({"", ""}, tried, got_in, 3s, [](int, communicator&) {});
  EXPECT_EQ(tried, 2);
  EXPECT_GE(got_in, 1) << "an unsigned pair refused the stranger: the test shows nothing";
  EXPECT_LT(out.built, 2) << "a group formed although a stranger held one of its pairs";
}

TEST_F(gloo_pairs, a_member_with_another_jobs_key_is_never_answered) {
  std::atomic<int> tried{0}, got_in{0};
  const auto started = std::chrono::steady_clock::now();
  const auto out = build_pairs({std::string(32, 'a'), std::string(32, 'b')}, tried, got_in, 2s,
                               [](int, communicator&) {});
  EXPECT_EQ(out.built, 0);
  ASSERT_EQ(out.errors.size(), 2u);
  for (const auto& e : out.errors) EXPECT_NE(e.find("signed"), std::string::npos) << e;
  // Both ranks run in this network namespace, whose kernel counted the dropped segments: the
  // errors say so (not only "timed out"), and name the peer's address (issue 25).
  for (const auto& e : out.errors) {
    EXPECT_NE(e.find("signed with another key, or not signed"), std::string::npos) << e;
    EXPECT_NE(e.find(" at 127.0.0.1:"), std::string::npos) << e;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s)
      << "the 2 s connect deadline was not kept";
  EXPECT_EQ(got_in, 0);
}

TEST_F(gloo_pairs, a_key_the_kernel_cannot_take_is_refused) {
  tcp_store_server server;
  auto store = connect_tcp_store("127.0.0.1", server.port(), 5s);
  gloo_options opts;
  opts.pair_key = std::string(81, 'x');
  EXPECT_THROW(make_gloo_communicator(*store, {1, "pairs", 0, 1}, opts), comm_error);
}

}  // namespace
