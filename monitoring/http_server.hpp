// Serves a metrics_registry over HTTP (GET /metrics, GET /healthz) on its own thread, for
// Prometheus to scrape, and the job's status document (GET /status) for `troupe status`.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "monitoring/metrics.hpp"
#include "monitoring/status_board.hpp"

namespace troupe::monitoring {

/// The server could not start: the host does not resolve, the port is privileged, ...
class metrics_server_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The requested port is taken by another socket. The message names the address and the fix.
class metrics_port_in_use : public metrics_server_error {
 public:
  metrics_port_in_use(const std::string& host, std::uint16_t port);
  /// The port that was asked for.
  [[nodiscard]] std::uint16_t port() const { return port_; }

 private:
  std::uint16_t port_;
};

/// What the endpoint accepts. Every bound is there so that a client, however hostile, costs
/// at most one descriptor and a few kilobytes for a few seconds.
struct metrics_server_limits {
  /// Connections served at once; more are accepted and closed at once (counted).
  std::size_t max_connections = 64;
  /// A request's start line and headers together; a request may have no body. Over it: 431.
  std::size_t max_header_bytes = 8 * 1024;
  /// A new connection must send its whole first request within this (else closed, counted).
  std::chrono::milliseconds request_deadline{5000};
  /// A kept-alive connection with no next request for this long is closed (not counted).
  std::chrono::milliseconds idle_timeout{10000};
  /// When not empty, GET /metrics and GET /status need `Authorization: Bearer <token>` (else
  /// 401, counted).
  /// /healthz stays open: it says only "ok", and load balancers probe it without secrets.
  std::string bearer_token;
  /// Called on the server's thread for each refused connection or request: the peer's
  /// address and why. Keep it cheap.
  std::function<void(const std::string& peer, const std::string& why)> on_reject;
};

/// An HTTP/1.1 endpoint on one background thread (Boost.Beast). Read-only routes:
///   GET /metrics  200, text exposition format 0.0.4 of the registry, rendered per request
///   GET /status   200, application/json: the status board's document (404 without a board)
///   GET /healthz  200, "ok"
///   other paths   404;  methods other than GET and HEAD: 405.
/// Keep-alive and up to limits.max_connections concurrent connections are served. The
/// listening socket and every connection are close-on-exec, and a connection is refused when
/// the process's descriptors run low (runtime descriptor reserve), so a flood cannot starve
/// checkpoints or the data plane. The registry and the status board must outlive the server.
class metrics_server {
 public:
  /// Binds and starts listening before returning, so a scrape right after construction
  /// succeeds. `port` 0 lets the OS pick a free port (see port()). Throws metrics_port_in_use
  /// if the port is taken and metrics_server_error for any other failure to listen.
  explicit metrics_server(const metrics_registry& registry, std::string host = "127.0.0.1",
                          std::uint16_t port = 9400, metrics_server_limits limits = {},
                          const status_board* status = nullptr);
  /// Stops the server (see stop()).
  ~metrics_server();
  metrics_server(const metrics_server&) = delete;
  metrics_server& operator=(const metrics_server&) = delete;

  /// The port actually bound (the OS's choice when 0 was asked for).
  [[nodiscard]] std::uint16_t port() const;
  /// The host the server was asked to listen on.
  [[nodiscard]] const std::string& host() const;
  /// Connections and requests refused so far (over the cap, too large, too slow, no token).
  [[nodiscard]] std::uint64_t rejected() const;
  /// Closes the listening socket and every open connection and joins the thread. Returns in
  /// milliseconds even with clients connected; idempotent and safe from any thread.
  void stop();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::monitoring
