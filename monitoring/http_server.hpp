// Serves a metrics_registry over HTTP (GET /metrics, GET /healthz) on its own thread, for
// Prometheus to scrape.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "monitoring/metrics.hpp"

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

/// An HTTP/1.1 endpoint on one background thread (Boost.Beast). Routes:
///   GET /metrics  200, text exposition format 0.0.4 of the registry, rendered per request
///   GET /healthz  200, "ok"
///   other paths   404;  methods other than GET and HEAD: 405.
/// Keep-alive and several concurrent connections are served; idle connections are dropped
/// after 30 s. The registry must outlive the server.
class metrics_server {
 public:
  /// Binds and starts listening before returning, so a scrape right after construction
  /// succeeds. `port` 0 lets the OS pick a free port (see port()). Throws metrics_port_in_use
  /// if the port is taken and metrics_server_error for any other failure to listen.
  explicit metrics_server(const metrics_registry& registry, std::string host = "127.0.0.1",
                          std::uint16_t port = 9400);
  /// Stops the server (see stop()).
  ~metrics_server();
  metrics_server(const metrics_server&) = delete;
  metrics_server& operator=(const metrics_server&) = delete;

  /// The port actually bound (the OS's choice when 0 was asked for).
  [[nodiscard]] std::uint16_t port() const;
  /// The host the server was asked to listen on.
  [[nodiscard]] const std::string& host() const;
  /// Closes the listening socket and every open connection and joins the thread. Returns in
  /// milliseconds even with clients connected; idempotent and safe from any thread.
  void stop();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::monitoring
