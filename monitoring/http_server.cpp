#include "monitoring/http_server.hpp"

#include <pthread.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "monitoring/log.hpp"

namespace troupe::monitoring {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr auto idle_timeout = std::chrono::seconds(30);
constexpr auto accept_retry_delay = std::chrono::milliseconds(100);
constexpr const char* exposition_content_type = "text/plain; version=0.0.4; charset=utf-8";

std::string describe(const std::string& host, std::uint16_t port) {
  return host + ":" + std::to_string(port);
}

// One client connection: read a request, answer it, repeat while the client keeps it alive.
// The session keeps itself alive through the shared_ptr captured by its pending handler; when
// the io_context is destroyed, that handler is destroyed and the socket closes with it.
class session : public std::enable_shared_from_this<session> {
 public:
  session(tcp::socket socket, const metrics_registry& registry)
      : stream_(std::move(socket)), registry_(registry) {}

  void start() { read_next(); }

 private:
  void read_next() {
    request_ = {};
    stream_.expires_after(idle_timeout);
    http::async_read(
        stream_, buffer_, request_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec) {
      // end_of_stream is the normal close of a keep-alive connection; a timeout or a reset
      // simply ends the session.
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      return;
    }
    build_response();
    http::async_write(stream_, response_,
                      [self = shared_from_this()](beast::error_code write_ec, std::size_t) {
                        self->on_write(write_ec);
                      });
  }

  void on_write(beast::error_code ec) {
    if (ec) return;
    if (!response_.keep_alive()) {
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      return;
    }
    read_next();
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
    } else if (target == "/metrics") {
      respond(http::status::ok, exposition_content_type, registry_.render_prometheus(), is_head);
    } else if (target == "/healthz") {
      respond(http::status::ok, "text/plain; charset=utf-8", "ok", is_head);
    } else {
      respond(http::status::not_found, "text/plain; charset=utf-8",
              "not found; this server has /metrics and /healthz\n", is_head);
    }
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

  beast::tcp_stream stream_;
  const metrics_registry& registry_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
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
                           "another port with --metrics-port, or --metrics-port 0 to let the OS "
                           "pick one"),
      port_(port) {}

struct metrics_server::impl {
  impl(const metrics_registry& reg, std::string host_name)
      : registry(reg), host(std::move(host_name)) {}

  void accept_next() {
    acceptor->async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) {
        // Out of descriptors or a transient network error: wait a little instead of spinning.
        log(level::warn, {}, "metrics server: accept failed: " + ec.message());
        retry_timer->expires_after(accept_retry_delay);
        retry_timer->async_wait([this](beast::error_code timer_ec) {
          if (!timer_ec) accept_next();
        });
        return;
      }
      std::make_shared<session>(std::move(socket), registry)->start();
      accept_next();
    });
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

  const metrics_registry& registry;
  std::string host;
  std::uint16_t port = 0;
  // Optional so that stop() can destroy the acceptor and then the io_context (which closes
  // every open connection) in that order, without waiting for the destructor.
  std::optional<asio::io_context> ioc;
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::steady_timer> retry_timer;
  std::thread thread;
  std::mutex stop_mutex;
};

metrics_server::metrics_server(const metrics_registry& registry, std::string host,
                               std::uint16_t port)
    : impl_(std::make_unique<impl>(registry, std::move(host))) {
  impl& s = *impl_;
  s.ioc.emplace(1);
  const tcp::endpoint endpoint = resolve_endpoint(*s.ioc, s.host, port);
  s.acceptor.emplace(*s.ioc);
  s.retry_timer.emplace(*s.ioc);

  beast::error_code ec;
  s.acceptor->open(endpoint.protocol(), ec);
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
