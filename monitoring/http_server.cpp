#include "monitoring/http_server.hpp"

#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "monitoring/log.hpp"
#include "runtime/sys/descriptors.hpp"

namespace troupe::monitoring {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr auto accept_retry_delay = std::chrono::milliseconds(100);
constexpr const char* exposition_content_type = "text/plain; version=0.0.4; charset=utf-8";

std::string describe(const std::string& host, std::uint16_t port) {
  return host + ":" + std::to_string(port);
}

// What every session shares with the server: the limits, the count of open sessions and of
// refusals. Touched on the server's one I/O thread, except `rejected` (read by anyone).
struct server_shared {
  const metrics_registry& registry;
  metrics_server_limits limits;
  const status_board* status = nullptr;
  std::size_t open_sessions = 0;
  std::atomic<std::uint64_t> rejected{0};

  void reject(const std::string& peer, const std::string& why) {
    rejected.fetch_add(1, std::memory_order_relaxed);
    if (limits.on_reject) limits.on_reject(peer, why);
  }
};

std::string peer_of(const tcp::socket& socket) {
  beast::error_code ec;
  const auto ep = socket.remote_endpoint(ec);
  return ec ? std::string("unknown peer")
            : ep.address().to_string() + ":" + std::to_string(ep.port());
}

// Constant-time comparison, so the time a refusal takes says nothing about the token.
bool same_secret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// One client connection: read a request, answer it, repeat while the client keeps it alive.
// The session keeps itself alive through the shared_ptr captured by its pending handler; when
// the io_context is destroyed, that handler is destroyed and the socket closes with it.
class session : public std::enable_shared_from_this<session> {
 public:
  session(tcp::socket socket, server_shared& shared)
      : peer_(peer_of(socket)), stream_(std::move(socket)), shared_(shared) {
    ++shared_.open_sessions;
  }
  ~session() { --shared_.open_sessions; }

  void start() { read_next(); }

 private:
  void read_next() {
    // A request has headers only (GET and HEAD), bounded in size; the first must arrive
    // within the request deadline, later ones within the idle timeout.
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(shared_.limits.max_header_bytes));
    parser_->body_limit(0);
    stream_.expires_after(served_ == 0 ? shared_.limits.request_deadline
                                       : shared_.limits.idle_timeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::header_limit || ec == http::error::body_limit) {
      shared_.reject(peer_, ec == http::error::header_limit
                                ? "request header over " +
                                      std::to_string(shared_.limits.max_header_bytes) + " bytes"
                                : "a request body (only GET and HEAD are served)");
      refuse(ec == http::error::header_limit ? http::status::request_header_fields_too_large
                                             : http::status::payload_too_large);
      return;
    }
    if (ec) {
      // end_of_stream is the normal close of a keep-alive connection; a reset simply ends the
      // session; a first request that never completed is a refusal.
      if (served_ == 0 && ec != http::error::end_of_stream)
        shared_.reject(peer_, ec == beast::error::timeout ? "no complete request in time"
                                                          : "malformed request: " + ec.message());
      close();
      return;
    }
    request_ = parser_->release();
    ++served_;
    build_response();
    stream_.expires_after(shared_.limits.request_deadline);  // a client that will not read
    http::async_write(stream_, response_,
                      [self = shared_from_this()](beast::error_code write_ec, std::size_t) {
                        self->on_write(write_ec);
                      });
  }

  void on_write(beast::error_code ec) {
    if (ec) return;
    if (!response_.keep_alive()) return close();
    read_next();
  }

  // Answers a request that broke a limit, then closes: nothing more is read from it.
  void refuse(http::status status) {
    response_ = {};
    response_.version(11);
    response_.keep_alive(false);
    response_.result(status);
    response_.set(http::field::connection, "close");
    response_.prepare_payload();
    stream_.expires_after(shared_.limits.request_deadline);
    http::async_write(
        stream_, response_,
        [self = shared_from_this()](beast::error_code, std::size_t) { self->close(); });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  void build_response() {
    response_ = {};
    response_.version(request_.version());
    response_.keep_alive(request_.keep_alive());
    response_.set(http::field::server, "troupe");

    std::string_view target(request_.target().data(), request_.target().size());
    if (const auto q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
    const bool is_head = request_.method() == http::verb::head;

    if (request_.method() != http::verb::get && !is_head) {
      respond(http::status::method_not_allowed, "text/plain; charset=utf-8",
              "only GET and HEAD are served\n", is_head);
      response_.set(http::field::allow, "GET, HEAD");
    } else if ((target == "/metrics" || (target == "/status" && shared_.status)) && !authorized()) {
      shared_.reject(peer_, "GET " + std::string(target) + " without the bearer token");
      respond(http::status::unauthorized, "text/plain; charset=utf-8",
              "this endpoint needs Authorization: Bearer <token> (--metrics-token)\n", is_head);
      response_.set(http::field::www_authenticate, "Bearer");
    } else if (target == "/metrics") {
      respond(http::status::ok, exposition_content_type, shared_.registry.render_prometheus(),
              is_head);
    } else if (target == "/status" && shared_.status) {
      respond(http::status::ok, "application/json", shared_.status->document(), is_head);
    } else if (target == "/healthz") {
      respond(http::status::ok, "text/plain; charset=utf-8", "ok", is_head);
    } else {
      respond(http::status::not_found, "text/plain; charset=utf-8",
              shared_.status ? "not found; this server has /metrics, /status and /healthz\n"
                             : "not found; this server has /metrics and /healthz\n",
              is_head);
    }
  }

  bool authorized() const {
    const std::string& token = shared_.limits.bearer_token;
    if (token.empty()) return true;
    const auto it = request_.find(http::field::authorization);
    if (it == request_.end()) return false;
    const std::string_view value(it->value().data(), it->value().size());
    constexpr std::string_view scheme = "Bearer ";
    if (value.size() < scheme.size()) return false;
    for (std::size_t i = 0; i < scheme.size(); ++i)  // the scheme's name is case-insensitive
      if (std::tolower(static_cast<unsigned char>(value[i])) !=
          std::tolower(static_cast<unsigned char>(scheme[i])))
        return false;
    return same_secret(value.substr(scheme.size()), token);
  }

  void respond(http::status status, const char* content_type, std::string body, bool is_head) {
    response_.result(status);
    response_.set(http::field::content_type, content_type);
    if (is_head) {
      // A HEAD answer announces the length of the body it does not send.
      response_.content_length(body.size());
    } else {
      response_.body() = std::move(body);
      response_.prepare_payload();
    }
  }

  std::string peer_;
  beast::tcp_stream stream_;
  server_shared& shared_;
  std::size_t served_ = 0;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::empty_body>> parser_;
  http::request<http::empty_body> request_;
  http::response<http::string_body> response_;
};

tcp::endpoint resolve_endpoint(asio::io_context& ioc, const std::string& host, std::uint16_t port) {
  beast::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (!ec) return {address, port};
  tcp::resolver resolver(ioc);
  const auto results = resolver.resolve(host, std::to_string(port), ec);
  if (ec || results.empty()) {
    throw metrics_server_error("metrics server: cannot resolve host '" + host +
                               "': " + (ec ? ec.message() : std::string("no addresses")));
  }
  return results.begin()->endpoint();
}

}  // namespace

metrics_port_in_use::metrics_port_in_use(const std::string& host, std::uint16_t port)
    : metrics_server_error("metrics server: " + describe(host, port) +
                           " is already in use (another troupe process or exporter?); choose "
                           "another port with --metrics-port, or --metrics-port 0 to serve no "
                           "metrics"),
      port_(port) {}

struct metrics_server::impl {
  impl(const metrics_registry& reg, std::string host_name, metrics_server_limits limits,
       const status_board* status)
      : shared{reg, std::move(limits), status}, host(std::move(host_name)) {}

  // Asio (1.74) opens and accepts sockets without close-on-exec, and a process the
  // coordinator spawns between accept() and fcntl() would inherit the connection: connections
  // are taken here with accept4(SOCK_CLOEXEC), when the listening socket is readable.
  void accept_next() {
    acceptor->async_wait(tcp::acceptor::wait_read, [this](beast::error_code ec) {
      if (ec == asio::error::operation_aborted || !acceptor->is_open()) return;
      if (ec) return pause_accepting(ec.message());
      if (accept_ready()) accept_next();
    });
  }

  // Out of descriptors or memory: the connection waits in the backlog; try again a little
  // later instead of spinning on a listening socket that stays readable.
  void pause_accepting(const std::string& why) {
    log(level::warn, {}, "metrics server: accept failed: " + why);
    retry_timer->expires_after(accept_retry_delay);
    retry_timer->async_wait([this](beast::error_code timer_ec) {
      if (!timer_ec) accept_next();
    });
  }

  // Takes what the backlog holds, but not forever: sessions' timers must run too. False when
  // accepting paused (pause_accepting() resumes it).
  bool accept_ready() {
    for (int i = 0; i < 64; ++i) {
      const int fd =
          ::accept4(acceptor->native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
          return true;
        pause_accepting(std::strerror(errno));
        return false;
      }
      tcp::socket socket(*ioc);
      beast::error_code assigned;
      socket.assign(protocol, fd, assigned);
      if (assigned) {
        ::close(fd);
        continue;
      }
      admit(std::move(socket));
    }
    return true;
  }

  void admit(tcp::socket socket) {
    if (shared.open_sessions >= shared.limits.max_connections) {
      shared.reject(
          peer_of(socket),
          "over the cap of " + std::to_string(shared.limits.max_connections) + " connections");
    } else if (sys::in_descriptor_reserve(socket.native_handle())) {
      shared.reject(peer_of(socket), "the process's descriptor reserve is reached");
    } else {
      std::make_shared<session>(std::move(socket), shared)->start();
    }
    // A refused socket closes as it goes out of scope here.
  }

  void run() {
    pthread_setname_np(pthread_self(), "troupe-metrics");
    for (;;) {
      try {
        ioc->run();
        return;
      } catch (const std::exception& e) {
        // A failure while answering one request must not take the endpoint down.
        log(level::error, {}, std::string("metrics server: request failed: ") + e.what());
      }
    }
  }

  server_shared shared;
  std::string host;
  std::uint16_t port = 0;
  tcp::endpoint::protocol_type protocol = tcp::v4();
  // Optional so that stop() can destroy the acceptor and then the io_context (which closes
  // every open connection) in that order, without waiting for the destructor.
  std::optional<asio::io_context> ioc;
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::steady_timer> retry_timer;
  std::thread thread;
  std::mutex stop_mutex;
};

metrics_server::metrics_server(const metrics_registry& registry, std::string host,
                               std::uint16_t port, metrics_server_limits limits,
                               const status_board* status)
    : impl_(std::make_unique<impl>(registry, std::move(host), std::move(limits), status)) {
  impl& s = *impl_;
  s.ioc.emplace(1);
  const tcp::endpoint endpoint = resolve_endpoint(*s.ioc, s.host, port);
  s.acceptor.emplace(*s.ioc);
  s.retry_timer.emplace(*s.ioc);

  beast::error_code ec;
  s.protocol = endpoint.protocol();
  // Close-on-exec from the start (not set later), so no child can inherit the listener.
  const int listen_fd =
      ::socket(endpoint.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd < 0) {
    ec.assign(errno, boost::system::system_category());
  } else {
    s.acceptor->assign(endpoint.protocol(), listen_fd, ec);
    if (ec) ::close(listen_fd);
  }
  // SO_REUSEADDR lets a restarted process bind while old connections sit in TIME_WAIT; on
  // Linux it does not let two sockets listen on the same port, so "in use" is still detected.
  if (!ec) s.acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor->bind(endpoint, ec);
  if (ec == asio::error::address_in_use) throw metrics_port_in_use(s.host, port);
  if (ec == asio::error::access_denied) {
    throw metrics_server_error("metrics server: no permission to listen on " +
                               describe(s.host, port) +
                               " (ports below 1024 need privileges); choose another port with "
                               "--metrics-port");
  }
  if (!ec) s.acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec == asio::error::address_in_use) throw metrics_port_in_use(s.host, port);
  if (ec) {
    throw metrics_server_error("metrics server: cannot listen on " + describe(s.host, port) + ": " +
                               ec.message());
  }
  s.port = s.acceptor->local_endpoint().port();
  s.accept_next();
  s.thread = std::thread([&s] { s.run(); });
}

metrics_server::~metrics_server() { stop(); }

std::uint16_t metrics_server::port() const { return impl_->port; }

const std::string& metrics_server::host() const { return impl_->host; }

std::uint64_t metrics_server::rejected() const {
  return impl_->shared.rejected.load(std::memory_order_relaxed);
}

void metrics_server::stop() {
  impl& s = *impl_;
  std::lock_guard lock(s.stop_mutex);
  if (!s.ioc) return;
  s.ioc->stop();
  if (s.thread.joinable()) s.thread.join();
  s.retry_timer.reset();
  s.acceptor.reset();
  // Destroying the io_context destroys the pending handlers, and with them every session and
  // its socket, so clients see the connection close at once.
  s.ioc.reset();
}

}  // namespace troupe::monitoring
