#pragma once
// A TCP relay for tests: listens on 127.0.0.1 (a free port) and joins each connection it
// accepts to a new one to the upstream address, so that a test can count the connections a
// client opens to a real server, and cut them all as a server or a middlebox dropping idle
// connections would. It runs one thread of its own; every method may be called from any thread.

#include <cstdint>
#include <memory>
#include <string>

namespace troupe::etcd::testing {

class tcp_proxy {
 public:
  /// Relays to `upstream`, "host:port" or a URL such as "http://127.0.0.1:2379".
  explicit tcp_proxy(const std::string& upstream);
  ~tcp_proxy();
  tcp_proxy(const tcp_proxy&) = delete;
  tcp_proxy& operator=(const tcp_proxy&) = delete;

  std::uint16_t port() const;
  /// "<scheme>://127.0.0.1:<port>".
  std::string url(const std::string& scheme = "http") const;

  std::size_t connections_accepted() const;
  std::size_t open_connections() const;
  /// Closes both sides of every relayed connection (a FIN to each); returns once done.
  void cut_all();

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::etcd::testing
