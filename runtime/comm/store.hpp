#pragma once
// The key-value store that bootstraps communicators: the interface, the TCP server the
// coordinator runs, its client, and a prefix view that keeps generations and groups apart.

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::comm {

/// Why a store operation failed.
enum class store_errc : uint8_t {
  timeout = 1,      ///< the key(s) did not appear, or the server did not answer, in time
  unreachable,      ///< nothing accepted a connection at host:port before the deadline
  connection_lost,  ///< the server closed the connection (it died or was stopped)
  protocol,         ///< a malformed message (a version mismatch or a bug)
  invalid,          ///< bad arguments (an empty key list, a negative timeout)
};

const char* to_string(store_errc code);

/// Typed error thrown by every kv_store operation; the message names the server and the key.
class store_error : public std::runtime_error {
 public:
  store_error(store_errc code, const std::string& what) : std::runtime_error(what), code_(code) {}
  store_errc code() const { return code_; }

 private:
  store_errc code_;
};

/// A shared key-value store. Values are opaque bytes; keys are set once per generation by
/// convention (a later set replaces the value). All calls are thread-safe.
class kv_store {
 public:
  virtual ~kv_store() = default;

  /// Sets `key` to `value` and wakes everyone waiting for it.
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  /// Returns the value of `key`, waiting up to `timeout` for it to be set.
  /// Throws store_error{timeout} if it is still missing then.
  virtual std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  /// Returns once every key in `keys` is set; throws store_error{timeout} naming the missing
  /// ones otherwise.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  /// Atomically adds `delta` to the decimal counter at `key` (0 when unset), returns the sum.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  /// Whether every key in `keys` is set, without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  /// set() for text values.
  void set_string(const std::string& key, std::string_view value);
  /// get() for text values.
  std::string get_string(const std::string& key, std::chrono::milliseconds timeout);
};

/// A view of another store in which every key is `prefix + "/" + key`, so that generations and
/// groups sharing one server never see each other's keys. Does not own `base`.
class prefix_store final : public kv_store {
 public:
  prefix_store(kv_store& base, std::string prefix);

  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;

  const std::string& prefix() const { return prefix_; }

 private:
  std::string full(const std::string& key) const { return prefix_ + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const;

  kv_store& base_;
  std::string prefix_;  ///< includes the trailing '/'
};

/// The store server the coordinator runs: TCP, many clients, its own I/O thread. A get or
/// wait on a missing key is answered when the key is set or when the client's deadline passes.
/// State lives in memory only; it dies with the server. A client that disconnects while
/// blocked is noticed when its answer falls due (its deadline at the latest).
class tcp_store_server {
 public:
  /// Listens on bind_host:port (port 0 picks a free one) and starts serving at once.
  explicit tcp_store_server(const std::string& bind_host = "127.0.0.1", uint16_t port = 0);
  ~tcp_store_server();
  tcp_store_server(const tcp_store_server&) = delete;
  tcp_store_server& operator=(const tcp_store_server&) = delete;

  /// The port actually bound.
  uint16_t port() const;
  /// Closes every connection and joins the I/O thread; clients then see connection_lost.
  /// Idempotent.
  void stop();
  /// Number of get/wait requests now blocked on missing keys (for tests and monitoring).
  size_t waiting() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Connects to a tcp_store_server, retrying until `timeout` passes (the server may start
/// after its clients). Throws store_error{unreachable} naming host:port if nothing answers.
/// `timeout` also bounds each set/add/check; a get/wait waits for the server's answer until
/// its own deadline plus min(timeout, 2 s), then declares the server hung (store_error{timeout}).
/// A lost connection is reopened once on the next call.
std::unique_ptr<kv_store> connect_tcp_store(const std::string& host, uint16_t port,
                                            std::chrono::milliseconds timeout);

}  // namespace troupe::comm
