// The control plane's TLS transport and the join token, inside one process: two actor systems
// that hold the job's credentials talk over mutual TLS; a stranger's garbage, CAF's crashing
// handshake header and a silent connection are refused, counted and closed, and the members'
// connection keeps working; the join token refuses files others can read, damaged files and
// tokens of another protocol version, each by name.

#include "actors/wire/tls_transport.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "actors/wire/connect.hpp"
#include "actors/wire/messages.hpp"
#include "runtime/auth/credentials.hpp"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

struct temp_dir {
  fs::path path;
  temp_dir() {
    char tmpl[] = "/tmp/troupe-tls-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~temp_dir() { fs::remove_all(path); }
};

caf::behavior add_one(caf::event_based_actor*) {
  return {[](int32_t x) { return x + 1; }};
}

// Opens a plain TCP connection to 127.0.0.1:port; -1 when refused.
int dial(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the peer closes `fd` within `limit` (reads until end of stream).
bool closed_within(int fd, std::chrono::milliseconds limit) {
  timeval tv{static_cast<time_t>(limit.count() / 1000),
             static_cast<suseconds_t>((limit.count() % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[512];
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return true;
    if (n < 0) return false;  // timed out
  }
  return false;
}

class TlsTransportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new temp_dir;
    auth::set_process_credentials(auth::create_join_token((dir_->path / "join.token").string()));
  }
  static void TearDownTestSuite() { delete dir_; }

  void SetUp() override {
    server_cfg_.use_network();
    client_cfg_.use_network();
    server_ = std::make_unique<caf::actor_system>(server_cfg_);
    client_ = std::make_unique<caf::actor_system>(client_cfg_);
    actor_ = server_->spawn(add_one);
    auto port = publish_for_job(*server_, actor_, 0, "127.0.0.1", false, "test");
    ASSERT_TRUE(port) << server_->render(port.error());
    port_ = *port;
  }
  void TearDown() override {
    caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
    actor_ = nullptr;
  }

  // A round trip from the client system to the published actor.
  int32_t ask(int32_t x) {
    auto remote = remote_job_actor(*client_, "127.0.0.1", port_);
    EXPECT_TRUE(remote) << client_->render(remote.error());
    if (!remote) return -1;
    caf::scoped_actor self{*client_};
    int32_t answer = -1;
    self->request(*remote, 5s, x)
        .receive([&](int32_t r) { answer = r; },
                 [&](caf::error& e) { ADD_FAILURE() << client_->render(e); });
    return answer;
  }

  static temp_dir* dir_;
  system_config server_cfg_, client_cfg_;
  std::unique_ptr<caf::actor_system> server_, client_;
  caf::actor actor_;
  uint16_t port_ = 0;
};
temp_dir* TlsTransportTest::dir_ = nullptr;

TEST_F(TlsTransportTest, MembersTalkOverTls) { EXPECT_EQ(ask(41), 42); }

TEST_F(TlsTransportTest, GarbageIsRefusedCountedAndHarmless) {
  ASSERT_EQ(ask(1), 2);  // the members' connection exists before the attack
  const uint64_t before = tls_rejected_connections();
  // The 112-byte message that crashed CAF's own decoder: a BASP server handshake header with
  // payload length 0, then zeros.
  std::vector<char> crash(112, 0);
  std::mt19937 rng(7);
  for (int i = 0; i < 40; ++i) {
    const int fd = dial(port_);
    ASSERT_GE(fd, 0);
    std::vector<char> junk = crash;
    if (i > 0) {
      junk.resize(1 + rng() % 5000);
      for (auto& c : junk) c = static_cast<char>(rng());
    }
    ASSERT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(junk.size()));
    EXPECT_TRUE(closed_within(fd, 5s)) << "garbage " << i << " was not refused";
    ::close(fd);
  }
  EXPECT_GE(tls_rejected_connections(), before + 40);
  EXPECT_EQ(ask(2), 3);  // and the members never noticed
}

TEST_F(TlsTransportTest, SilentConnectionsAreClosedAtTheHandshakeDeadline) {
  const uint64_t before = tls_rejected_connections();
  const int fd = dial(port_);
  ASSERT_GE(fd, 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(closed_within(fd, tls_handshake_deadline + 3s));
  EXPECT_GE(std::chrono::steady_clock::now() - start, tls_handshake_deadline - 100ms);
  ::close(fd);
  EXPECT_GE(tls_rejected_connections(), before + 1);
  EXPECT_EQ(ask(5), 6);
}

TEST_F(TlsTransportTest, HandshakesBeyondTheCapAreRefusedAtOnce) {
  std::vector<int> held;
  for (int i = 0; i < max_pending_handshakes; ++i) held.push_back(dial(port_));
  const int extra = dial(port_);
  ASSERT_GE(extra, 0);
  EXPECT_TRUE(closed_within(extra, 2s));
  ::close(extra);
  for (int fd : held) ::close(fd);
}

// A stage or worker reaching a peer that is too busy to take its handshake now (here: the
// peer's pending-handshake cap is full) retries until its deadline instead of failing the
// generation on the first refusal.
TEST_F(TlsTransportTest, AReachThatIsRefusedOnceIsRetriedUntilItsDeadline) {
  std::vector<int> held;
  for (int i = 0; i < max_pending_handshakes; ++i) held.push_back(dial(port_));
  EXPECT_FALSE(remote_job_actor(*client_, "127.0.0.1", port_)) << "the cap refuses one attempt";
  std::thread release([&] {
    std::this_thread::sleep_for(300ms);  // the busy spell the retries must outlast
    for (int fd : held) ::close(fd);
  });
  const auto start = std::chrono::steady_clock::now();
  auto remote =
      remote_job_actor_until(*client_, "127.0.0.1", port_, std::chrono::steady_clock::now() + 10s);
  release.join();
  ASSERT_TRUE(remote && *remote) << (remote ? "null actor" : client_->render(remote.error()));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms);
  EXPECT_EQ(ask(7), 8);

  // Past its deadline it gives up with the last error (a port nobody listens on; the client
  // caches the connection it has, so the cap cannot be used twice).
  const int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::getsockname(probe, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(probe);
  const auto before = std::chrono::steady_clock::now();
  EXPECT_FALSE(remote_job_actor_until(*client_, "127.0.0.1", ntohs(addr.sin_port), before + 500ms));
  EXPECT_GE(std::chrono::steady_clock::now() - before, 450ms) << "it retried until the deadline";
  EXPECT_LT(std::chrono::steady_clock::now() - before, 5s);
}

// ---- the join token ----

TEST(JoinTokenTest, RoundTripsAndRefusesBadFilesByName) {
  temp_dir dir;
  const std::string path = (dir.path / "join.token").string();
  const auto made = auth::create_join_token(path);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const auto loaded = auth::load_join_token(path);
  EXPECT_EQ(loaded.job_id, made.job_id);
  EXPECT_EQ(loaded.secret, made.secret);
  EXPECT_EQ(loaded.protocol, auth::protocol_version);
  EXPECT_EQ(auth::derive_key(loaded, "x"), auth::derive_key(made, "x"));
  EXPECT_NE(auth::derive_key(loaded, "x"), auth::derive_key(made, "y"));

  auto refused = [](const std::string& p) {
    try {
      auth::load_join_token(p);
    } catch (const auth::credentials_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ::chmod(path.c_str(), 0644);
  EXPECT_NE(refused(path).find("chmod 600"), std::string::npos);
  ::chmod(path.c_str(), 0600);

  std::string text;
  {
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& name, const std::string& body) {
    const std::string p = (dir.path / name).string();
    std::ofstream(p) << body;
    ::chmod(p.c_str(), 0600);
    return p;
  };
  std::string other_version = text;
  other_version.replace(other_version.find("protocol "),
                        10 + std::to_string(auth::protocol_version).size() - 1, "protocol 1");
  EXPECT_NE(refused(write("old.token", other_version)).find("protocol version 1"),
            std::string::npos);
  EXPECT_NE(refused(write("junk.token", "hello\n")).find("not a troupe join token"),
            std::string::npos);
  EXPECT_NE(refused(write("cut.token", text.substr(0, text.size() / 2))).find("damaged"),
            std::string::npos);
  EXPECT_NE(refused((dir.path / "missing.token").string()).find("missing.token"),
            std::string::npos);
}

}  // namespace
}  // namespace troupe::actors
