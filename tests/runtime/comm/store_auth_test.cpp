// The store as a listener facing strangers (issue 10): the handshake before any request, the
// caps on connections, handshakes, frames and stored bytes, and close-on-exec sockets.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "runtime/auth/credentials.hpp"
#include "runtime/auth/handshake.hpp"
#include "runtime/comm/store.hpp"
#include "tests/runtime/comm/child_process.hpp"

using namespace troupe;
using namespace troupe::comm;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

auth::handshake_identity identity(std::string job = "0123456789abcdef", unsigned char seed = 7,
                                  int protocol = auth::protocol_version) {
  auth::handshake_identity id;
  id.job_id = std::move(job);
  id.protocol = protocol;
  for (size_t i = 0; i < id.key.size(); ++i) id.key[i] = static_cast<unsigned char>(seed * i);
  return id;
}

store_auth as(const auth::handshake_identity& id) { return store_auth{id}; }

/// Every rejection the server reported, for the test to read.
struct rejections {
  std::mutex m;
  std::vector<std::string> reasons;

  store_rejection_callback callback() {
    return [this](const std::string& peer, const std::string& why) {
      std::lock_guard lock(m);
      reasons.push_back(peer + ": " + why);
    };
  }
  bool any(const std::string& needle) {
    std::lock_guard lock(m);
    for (const auto& r : reasons) {
      if (r.find(needle) != std::string::npos) return true;
    }
    return false;
  }
};

store_server_options options(const auth::handshake_identity& id, rejections* seen = nullptr) {
  store_server_options o;
  o.auth = as(id);
  o.limits.handshake_timeout = 500ms;
  if (seen != nullptr) o.on_rejection = seen->callback();
  return o;
}

template <class Cond>
bool eventually(Cond cond, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = clock_type::now() + timeout;
  while (!cond()) {
    if (clock_type::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

/// A raw TCP connection to 127.0.0.1:port; reads time out after 200 ms each.
int raw_connect(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{0, 200000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

bool send_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool read_exact(int fd, void* p, size_t n, clock_type::time_point deadline) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = ::recv(fd, c, n, 0);
    if (k > 0) {
      c += k;
      n -= static_cast<size_t>(k);
    } else if (k < 0 && (errno == EAGAIN || errno == EINTR) && clock_type::now() < deadline) {
      continue;
    } else {
      return false;
    }
  }
  return true;
}

/// Whether the server closes `fd` before `deadline` (whatever it sends first is skipped).
bool closed_by(int fd, clock_type::time_point deadline) {
  char buf[4096];
  for (;;) {
    const ssize_t k = ::recv(fd, buf, sizeof buf, 0);
    if (k == 0) return true;
    if (k < 0 && errno != EAGAIN && errno != EINTR) return true;  // reset
    if (k < 0 && clock_type::now() >= deadline) return false;
  }
}

/// A raw connection that has passed the handshake as `id`: past it, bytes reach the decoder.
int raw_member(uint16_t port, const auth::handshake_identity& id) {
  const int fd = raw_connect(port);
  if (fd < 0) return -1;
  const auto deadline = clock_type::now() + 5s;
  auth::server_hello hello{};
  if (!read_exact(fd, hello.data(), hello.size(), deadline)) return ::close(fd), -1;
  const auto answer = auth::make_client_answer(id, hello, auth::random_nonce());
  auth::server_verdict verdict{};
  if (!send_all(fd, answer.data(), answer.size()) ||
      !read_exact(fd, verdict.data(), verdict.size(), deadline) ||
      !auth::check_server_verdict(id, hello, answer, verdict, "test").ok()) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// The store's own 'set' frame, as a stranger would send it.
std::vector<char> set_frame(const std::string& key, const std::string& value) {
  std::vector<char> body{1};
  auto u32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) body.push_back(static_cast<char>(v >> (8 * i)));
  };
  u32(static_cast<uint32_t>(key.size()));
  body.insert(body.end(), key.begin(), key.end());
  u32(static_cast<uint32_t>(value.size()));
  body.insert(body.end(), value.begin(), value.end());
  std::vector<char> frame;
  const auto n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) frame.push_back(static_cast<char>(n >> (8 * i)));
  frame.insert(frame.end(), body.begin(), body.end());
  return frame;
}

size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

void expect_refused(const std::function<void()>& f, store_errc code,
                    const std::vector<std::string>& needles) {
  const auto start = clock_type::now();
  try {
    f();
    ADD_FAILURE() << "not refused";
  } catch (const store_error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& n : needles) {
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << n << " in " << e.what();
    }
  }
  // Refusals are not retried until the connect timeout.
  EXPECT_LT(clock_type::now() - start, 3s);
}

TEST(store_auth, members_work) {
  const auto id = identity();
  tcp_store_server server("127.0.0.1", 0, options(id));
  auto a = connect_tcp_store("127.0.0.1", server.port(), 5s, as(id));
  auto b = connect_tcp_store("127.0.0.1", server.port(), 5s, as(id));
  auto got = std::async(std::launch::async, [&] { return b->get_string("k", 5s); });
  a->set_string("k", "v");
  EXPECT_EQ(got.get(), "v");
  EXPECT_EQ(a->add("n", 2), 2);
  EXPECT_EQ(b->add("n", 3), 5);
  b->wait({"k", "n"}, 1s);
  EXPECT_TRUE(a->check({"k", "n"}));
  EXPECT_EQ(server.rejected_connections(), 0u);
}

TEST(store_auth, a_raw_stranger_can_neither_set_nor_get) {
  const auto id = identity();
  rejections seen;
  auto opts = options(id, &seen);
  opts.limits.handshake_timeout = 3000ms;  // the default, as the coordinator runs it
  tcp_store_server server("127.0.0.1", 0, opts);
  auto member = connect_tcp_store("127.0.0.1", server.port(), 5s, as(id));
  member->set_string("secret", "s");

  // A stranger speaking the store's protocol without the handshake: it gets the hello (not an
  // answer) and is cut off at the handshake deadline.
  const int fd = raw_connect(server.port());
  ASSERT_GE(fd, 0);
  const auto frame = set_frame("g1/world/bootstrap", "evil");
  ASSERT_TRUE(send_all(fd, frame.data(), frame.size()));
  unsigned char first[5] = {};
  ASSERT_TRUE(read_exact(fd, first, sizeof first, clock_type::now() + 2s));
  EXPECT_NE(std::memcmp(first, "\x01\x00\x00\x00\x00", 5), 0) << "the store answered a stranger";
  const auto start = clock_type::now();
  EXPECT_TRUE(closed_by(fd, clock_type::now() + 5s));
  EXPECT_LT(clock_type::now() - start, 4s);
  ::close(fd);
  EXPECT_FALSE(member->check({"g1/world/bootstrap"}));

  // A stranger that sends a long frame: its first 92 bytes are a (bad) answer; refused at once.
  const int fd2 = raw_connect(server.port());
  const auto long_frame = set_frame(std::string(200, 's'), "");
  ASSERT_TRUE(send_all(fd2, long_frame.data(), long_frame.size()));
  EXPECT_TRUE(closed_by(fd2, clock_type::now() + 2s));
  ::close(fd2);

  // A process without credentials using the real client is told why.
  expect_refused(
      [&] {
        auto c = connect_tcp_store("127.0.0.1", server.port(), 2s, store_auth{});
        c->get("secret", 1s);
      },
      store_errc::refused, {"holds no job credentials", "--join-token"});

  ASSERT_TRUE(eventually([&] { return server.rejected_connections() >= 3; }));
  EXPECT_TRUE(seen.any("no handshake within 3000 ms"));
  EXPECT_TRUE(seen.any("127.0.0.1:"));
  EXPECT_TRUE(seen.any("not a troupe handshake"));
  EXPECT_FALSE(member->check({"g1/world/bootstrap"}));
  EXPECT_EQ(member->get_string("secret", 1s), "s");
}

TEST(store_auth, another_job_is_refused_naming_both) {
  const auto id = identity("0123456789abcdef");
  rejections seen;
  tcp_store_server server("127.0.0.1", 0, options(id, &seen));
  const std::string where = "127.0.0.1:" + std::to_string(server.port());
  expect_refused(
      [&] { connect_tcp_store("127.0.0.1", server.port(), 10s, as(identity("fedcba9876543210"))); },
      store_errc::refused,
      {where, "belongs to job 0123456789abcdef", "join token is for job fedcba9876543210"});
  ASSERT_TRUE(eventually([&] { return seen.any("a member of job fedcba9876543210"); }));
  EXPECT_GE(server.rejected_connections(), 1u);
}

TEST(store_auth, another_protocol_is_refused_naming_both) {
  const auto id = identity();
  rejections seen;
  tcp_store_server server("127.0.0.1", 0, options(id, &seen));
  expect_refused(
      [&] {
        connect_tcp_store("127.0.0.1", server.port(), 10s, as(identity("0123456789abcdef", 7, 1)));
      },
      store_errc::refused,
      {"speaks protocol version " + std::to_string(auth::protocol_version),
       "this troupe build speaks 1"});
  ASSERT_TRUE(eventually([&] { return seen.any("protocol version 1"); }));
}

TEST(store_auth, a_wrong_secret_is_refused) {
  const auto id = identity();
  rejections seen;
  tcp_store_server server("127.0.0.1", 0, options(id, &seen));
  expect_refused(
      [&] {
        connect_tcp_store("127.0.0.1", server.port(), 10s, as(identity("0123456789abcdef", 3)));
      },
      store_errc::refused, {"refused this process's proof"});
  ASSERT_TRUE(eventually([&] { return seen.any("wrong proof"); }));
}

TEST(store_auth, huge_length_prefixes_close_without_allocating) {
  const auto id = identity();
  rejections seen;
  tcp_store_server server("127.0.0.1", 0, options(id, &seen));
  auto member = connect_tcp_store("127.0.0.1", server.port(), 5s, as(id));
  const size_t before = resident_bytes();
  for (const uint32_t n : {uint32_t{1} << 30, uint32_t{0xffffffff}, (uint32_t{16} << 20) + 1}) {
    const int fd = raw_member(server.port(), id);
    ASSERT_GE(fd, 0);
    unsigned char header[4];
    for (int i = 0; i < 4; ++i) header[i] = static_cast<unsigned char>(n >> (8 * i));
    ASSERT_TRUE(send_all(fd, header, 4));
    EXPECT_TRUE(closed_by(fd, clock_type::now() + 2s)) << n;
    ::close(fd);
  }
  // A frame within the limit that promises more than it sends: memory follows what arrived.
  const int slow = raw_member(server.port(), id);
  ASSERT_GE(slow, 0);
  const uint32_t promise = (uint32_t{16} << 20) - 1;
  unsigned char header[4];
  for (int i = 0; i < 4; ++i) header[i] = static_cast<unsigned char>(promise >> (8 * i));
  ASSERT_TRUE(send_all(slow, header, 4));
  ASSERT_TRUE(send_all(slow, "\x01", 1));
  EXPECT_LT(resident_bytes(), before + (size_t{64} << 20));
  ::close(slow);
  // A key list longer than its frame.
  const int liar = raw_member(server.port(), id);
  const unsigned char wait_all[] = {5, 0, 0, 0, 3, 0xff, 0xff, 0xff, 0xff};
  ASSERT_TRUE(send_all(liar, wait_all, sizeof wait_all));
  EXPECT_TRUE(closed_by(liar, clock_type::now() + 2s));
  ::close(liar);

  EXPECT_LT(resident_bytes(), before + (size_t{64} << 20));
  EXPECT_TRUE(seen.any("a frame of 1073741824 bytes"));
  EXPECT_TRUE(seen.any("a frame of 4294967295 bytes"));
  EXPECT_TRUE(seen.any("a malformed request"));
  member->set_string("still", "here");
  EXPECT_EQ(member->get_string("still", 1s), "here");
}

TEST(store_auth, a_flood_does_not_stop_members) {
  const auto id = identity();
  tcp_store_server server("127.0.0.1", 0, options(id));
  auto member = connect_tcp_store("127.0.0.1", server.port(), 5s, as(id));
  std::atomic<bool> flooding{true};
  std::vector<int> silent;
  auto flood = std::async(std::launch::async, [&] {
    std::mt19937 rng(42);
    std::uniform_int_distribution<size_t> size(1, 64 << 10);
    std::vector<char> payload(64 << 10);
    for (int i = 0; i < 1000; ++i) {
      for (auto& c : payload) c = static_cast<char>(rng());
      const int fd = raw_connect(server.port());
      if (fd < 0) continue;
      send_all(fd, payload.data(), size(rng));
      ::close(fd);
      if (i < 500) {
        const int quiet = raw_connect(server.port());
        if (quiet >= 0) silent.push_back(quiet);
      }
    }
    flooding = false;
  });
  // Members keep working, and a new one gets in, while the flood goes on.
  int rounds = 0;
  while (flooding) {
    member->set_string("k" + std::to_string(rounds), "v");
    EXPECT_EQ(member->get_string("k" + std::to_string(rounds), 2s), "v");
    auto fresh = connect_tcp_store("127.0.0.1", server.port(), 5s, as(id));
    EXPECT_EQ(fresh->add("joined", 1), rounds + 1);
    ++rounds;
  }
  flood.get();
  EXPECT_GE(rounds, 1);
  EXPECT_TRUE(eventually([&] { return server.rejected_connections() >= 1000; }))
      << server.rejected_connections();
  auto late = connect_tcp_store("127.0.0.1", server.port(), 5s, as(id));
  EXPECT_EQ(late->get_string("k0", 1s), "v");
  for (const int fd : silent) ::close(fd);
}

TEST(store_auth, connections_over_the_cap_are_closed_at_once) {
  const auto id = identity();
  rejections seen;
  auto opts = options(id, &seen);
  opts.limits.max_connections = 4;
  opts.limits.handshake_timeout = 10s;
  tcp_store_server server("127.0.0.1", 0, opts);
  std::vector<std::unique_ptr<kv_store>> members;
  for (int i = 0; i < 4; ++i) {
    members.push_back(connect_tcp_store("127.0.0.1", server.port(), 5s, as(id)));
  }
  const int fd = raw_connect(server.port());
  ASSERT_GE(fd, 0);
  const auto start = clock_type::now();
  EXPECT_TRUE(closed_by(fd, clock_type::now() + 2s));
  EXPECT_LT(clock_type::now() - start, 1s);  // not the 10 s handshake deadline
  ::close(fd);
  expect_refused([&] { connect_tcp_store("127.0.0.1", server.port(), 300ms, as(id)); },
                 store_errc::unreachable, {"connection cap"});
  EXPECT_TRUE(seen.any("over the cap of 4 connections"));
  members.pop_back();
  ASSERT_TRUE(eventually([&] {
    try {
      members.push_back(connect_tcp_store("127.0.0.1", server.port(), 200ms, as(id)));
      return true;
    } catch (const store_error&) {
      return false;
    }
  }));
  members.back()->set_string("k", "v");
}

TEST(store_auth, stored_bytes_are_bounded) {
  store_server_options opts;
  opts.auth = store_auth{};
  opts.limits.max_stored_bytes = 1 << 20;
  tcp_store_server server("127.0.0.1", 0, opts);
  auto c = connect_tcp_store("127.0.0.1", server.port(), 5s, store_auth{});
  c->set("a", std::vector<char>(600 << 10));
  try {
    c->set("b", std::vector<char>(600 << 10));
    FAIL() << "the store took more than its bound";
  } catch (const store_error& e) {
    EXPECT_EQ(e.code(), store_errc::full) << e.what();
  }
  c->set("a", std::vector<char>(10));  // replacing frees
  c->set("b", std::vector<char>(600 << 10));
  EXPECT_EQ(c->get("a", 1s).size(), 10u);
  // The client refuses, before sending, what no store would take.
  try {
    c->set("huge", std::vector<char>(17 << 20));
    FAIL() << "a 17 MiB value was sent";
  } catch (const store_error& e) {
    EXPECT_EQ(e.code(), store_errc::invalid) << e.what();
  }
  EXPECT_TRUE(c->check({"a", "b"}));
}

bool close_on_exec(int fd) { return (::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0; }

TEST(store_auth, sockets_are_close_on_exec) {
  const auto id = identity();
  tcp_store_server server("127.0.0.1", 0, options(id));
  auto member = connect_tcp_store("127.0.0.1", server.port(), 5s, as(id));
  member->set_string("k", "v");
  // The listening socket and the accepted one (local port: the store's) and the client's (peer
  // port: the store's).
  int found = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) continue;
    if (addr.ss_family != AF_INET) continue;
    sockaddr_storage peer{};
    len = sizeof peer;
    const bool client_side =
        ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0 &&
        ntohs(reinterpret_cast<sockaddr_in*>(&peer)->sin_port) == server.port();
    if (!client_side && ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port) != server.port()) {
      continue;
    }
    EXPECT_TRUE(close_on_exec(fd)) << "fd " << fd;
    ++found;
  }
  EXPECT_GE(found, 3);
}

TEST(store_auth, the_process_credentials_are_the_default) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("troupe-store-auth-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auth::set_process_credentials(auth::create_join_token((dir / "join.token").string()));
  {
    tcp_store_server server;                                          // as the coordinator runs it
    auto member = connect_tcp_store("127.0.0.1", server.port(), 5s);  // as a rank connects
    member->set_string("k", "v");
    EXPECT_EQ(member->get_string("k", 1s), "v");
    expect_refused(
        [&] {
          auto stranger = connect_tcp_store("127.0.0.1", server.port(), 2s, store_auth{});
          stranger->get("k", 1s);
        },
        store_errc::refused, {"holds no job credentials"});
  }
  auth::set_process_credentials({});
  std::filesystem::remove_all(dir);
}

}  // namespace
