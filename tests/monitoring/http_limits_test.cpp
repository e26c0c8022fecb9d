// The metrics endpoint's bounds, each tried by a real client: the connection cap, the header
// limit, the deadline for a silent client, the bearer token, close-on-exec and the descriptor
// reserve. Each refusal must also be counted and reported with the peer's address.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "monitoring/http_server.hpp"

namespace troupe::monitoring {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

tcp::endpoint local(std::uint16_t port) { return {asio::ip::make_address("127.0.0.1"), port}; }

// GET `target` on a new connection; 0 when the server closed it without an answer.
unsigned get_status(std::uint16_t port, const std::string& target, const std::string& auth = "") {
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.connect(local(port));
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, "127.0.0.1");
  if (!auth.empty()) req.set(http::field::authorization, auth);
  stream.expires_after(10s);
  beast::error_code ec;
  http::write(stream, req, ec);
  if (ec) return 0;
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(stream, buffer, res, ec);
  return ec ? 0 : res.result_int();
}

// Whether the server ends `socket` (EOF or reset) within `deadline`.
bool closed_by_server(tcp::socket& socket, std::chrono::milliseconds deadline) {
  timeval tv{static_cast<time_t>(deadline.count() / 1000),
             static_cast<suseconds_t>((deadline.count() % 1000) * 1000)};
  ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(socket.native_handle(), buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;  // EAGAIN: the deadline passed, still open
  }
}

template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds deadline = 5s) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

struct recorded {
  std::mutex m;
  std::vector<std::string> why;
  void operator()(const std::string& peer, const std::string& reason) {
    std::lock_guard lock(m);
    EXPECT_EQ(peer.rfind("127.0.0.1:", 0), 0u) << peer;
    why.push_back(reason);
  }
  bool saw(const std::string& needle) {
    std::lock_guard lock(m);
    for (const auto& w : why)
      if (w.find(needle) != std::string::npos) return true;
    return false;
  }
};

struct fixture {
  metrics_registry registry;
  gauge& loss = registry.add_gauge("troupe_loss", "Loss.");
  recorded rejections;
  metrics_server_limits limits() {
    metrics_server_limits l;
    l.on_reject = [this](const std::string& peer, const std::string& why) {
      rejections(peer, why);
    };
    return l;
  }
};

TEST(metrics_limits, connections_over_the_cap_are_closed_at_once_and_counted) {
  fixture f;
  auto limits = f.limits();
  limits.max_connections = 4;
  limits.request_deadline = 60s;  // the held connections stay until the test lets them go
  metrics_server server(f.registry, "127.0.0.1", 0, limits);
  asio::io_context ioc;
  std::vector<tcp::socket> held;
  for (int i = 0; i < 4; ++i) {
    held.emplace_back(ioc);
    held.back().connect(local(server.port()));
  }
  tcp::socket extra(ioc);
  extra.connect(local(server.port()));
  EXPECT_TRUE(closed_by_server(extra, 2000ms));
  EXPECT_TRUE(eventually([&] { return f.rejections.saw("over the cap of 4"); }));
  EXPECT_GE(server.rejected(), 1u);
  // A held connection that goes away frees its place for a scrape.
  held.pop_back();
  EXPECT_TRUE(eventually([&] { return get_status(server.port(), "/metrics") == 200; }));
}

TEST(metrics_limits, a_huge_header_is_refused_without_being_buffered) {
  fixture f;
  metrics_server server(f.registry, "127.0.0.1", 0, f.limits());
  asio::io_context ioc;
  tcp::socket s(ioc);
  s.connect(local(server.port()));
  std::string req =
      "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Junk: " + std::string(1 << 20, 'a') + "\r\n\r\n";
  beast::error_code ec;
  asio::write(s, asio::buffer(req), ec);  // the server may hang up before it all arrives
  std::string answer(64, '\0');
  const size_t n = s.read_some(asio::buffer(answer), ec);
  if (!ec) {
    EXPECT_NE(answer.substr(0, n).find("431"), std::string::npos) << answer;
  }
  EXPECT_TRUE(eventually([&] { return f.rejections.saw("request header over 8192 bytes"); }));
  EXPECT_EQ(get_status(server.port(), "/metrics"), 200u);
}

TEST(metrics_limits, a_silent_client_is_closed_at_the_request_deadline) {
  fixture f;
  auto limits = f.limits();
  limits.request_deadline = 300ms;
  metrics_server server(f.registry, "127.0.0.1", 0, limits);
  asio::io_context ioc;
  tcp::socket silent(ioc);
  silent.connect(local(server.port()));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(closed_by_server(silent, 3000ms));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_TRUE(eventually([&] { return f.rejections.saw("no complete request in time"); }));
}

TEST(metrics_limits, the_bearer_token_guards_metrics_but_not_healthz) {
  fixture f;
  auto limits = f.limits();
  limits.bearer_token = "s3cret-token";
  metrics_server server(f.registry, "127.0.0.1", 0, limits);
  EXPECT_EQ(get_status(server.port(), "/metrics"), 401u);
  EXPECT_EQ(get_status(server.port(), "/metrics", "Bearer wrong-token!"), 401u);
  EXPECT_EQ(get_status(server.port(), "/metrics", "Basic s3cret-token"), 401u);
  EXPECT_EQ(get_status(server.port(), "/metrics", "Bearer s3cret-token"), 200u);
  EXPECT_EQ(get_status(server.port(), "/metrics", "bearer s3cret-token"), 200u);
  EXPECT_EQ(get_status(server.port(), "/healthz"), 200u);
  EXPECT_EQ(server.rejected(), 3u);
  EXPECT_TRUE(f.rejections.saw("without the bearer token"));
}

// The inode of the socket listening on `port`, from /proc/net/tcp.
std::string listening_inode(std::uint16_t port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);
  char hex[8];
  std::snprintf(hex, sizeof hex, "%04X", port);
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string slot, local_addr, remote, state, queues, timer, retr, uid, timeout, inode;
    f >> slot >> local_addr >> remote >> state >> queues >> timer >> retr >> uid >> timeout >>
        inode;
    if (state == "0A" && local_addr.substr(local_addr.find(':') + 1) == hex) return inode;
  }
  return "";
}

TEST(metrics_limits, the_listening_socket_is_close_on_exec) {
  fixture f;
  metrics_server server(f.registry, "127.0.0.1", 0, f.limits());
  const std::string inode = listening_inode(server.port());
  ASSERT_FALSE(inode.empty());
  int found = -1;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(e.path(), ec).string();
    if (target == "socket:[" + inode + "]") found = std::stoi(e.path().filename().string());
  }
  ASSERT_GE(found, 0);
  EXPECT_TRUE(::fcntl(found, F_GETFD) & FD_CLOEXEC);
}

TEST(metrics_limits, a_connection_is_refused_when_descriptors_run_low) {
  fixture f;
  metrics_server server(f.registry, "127.0.0.1", 0, f.limits());
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = 128;  // a reserve of 32: descriptors from 96 up are kept free
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> filler;
  for (int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC); fd >= 0;
       fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) {
    filler.push_back(fd);
    if (fd >= 100) break;
  }
  {
    asio::io_context ioc;
    tcp::socket s(ioc);
    s.connect(local(server.port()));
    EXPECT_TRUE(closed_by_server(s, 2000ms));
  }
  EXPECT_TRUE(eventually([&] { return f.rejections.saw("descriptor reserve"); }));
  for (int fd : filler) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  EXPECT_EQ(get_status(server.port(), "/metrics"), 200u);
}

}  // namespace
}  // namespace troupe::monitoring
