#pragma once
// The key-value store that bootstraps communicators: the interface, the TCP server the
// coordinator runs, its client, and a prefix view that keeps generations and groups apart.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/auth/handshake.hpp"
#include "runtime/comm/communicator.hpp"

namespace troupe::comm {

/// Why a store operation failed.
enum class store_errc : uint8_t {
  timeout = 1,      ///< the key(s) did not appear, or the server did not answer, in time
  unreachable,      ///< nothing accepted a connection at host:port before the deadline
  connection_lost,  ///< the server closed the connection (it died or was stopped)
  protocol,         ///< a malformed message (a version mismatch or a bug)
  invalid,          ///< bad arguments (an empty key list, a negative timeout, a huge value)
  refused,          ///< the handshake failed: another job, another protocol, a wrong secret
  full,             ///< the server holds its limit of bytes already
  cancelled,        ///< the caller gave up waiting (interruptible_store)
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

/// The communicator error that a store call failing during a connect stands for: timeout,
/// aborted (cancelled by a newer generation) or internal; the message starts with `where`.
comm_error as_connect_error(const store_error& e, const std::string& where);

/// Whether a caller still wants what it waits for.
using cancel_check = std::function<bool()>;

/// A view of `base` whose get() and wait() give up with store_errc::cancelled once
/// `cancelled` returns true: they wait in slices of `poll`, asking between them. A generation's
/// communicators connect through one, so that a newer generation's abort is not held up by
/// peers that will never arrive. Does not own `base`.
class interruptible_store final : public kv_store {
 public:
  interruptible_store(kv_store& base, cancel_check cancelled,
                      std::chrono::milliseconds poll = std::chrono::milliseconds(50));

  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;

 private:
  template <class Wait>
  auto in_slices(const std::string& what, std::chrono::milliseconds timeout, Wait wait_for);

  kv_store& base_;
  cancel_check cancelled_;
  std::chrono::milliseconds poll_;
};

/// Who may talk to a store: members proving they hold a key derived from the job's secret, or
/// (no identity) anyone, for a store inside one process or a test.
struct store_auth {
  std::optional<auth::handshake_identity> identity;

  /// This process's credentials for the store (derive_key(creds, "store")) when it holds
  /// any (auth::process_credentials()), else none.
  static store_auth from_process();
};

/// What one tcp_store_server accepts. A value is a bootstrap address or an id (bytes to KiB),
/// so the frame limit leaves room for more than that without letting one client make the
/// server allocate much.
struct store_limits {
  /// Largest request; a bigger length prefix closes the connection before anything is
  /// allocated, and a body is allocated only as its bytes arrive.
  uint32_t max_frame_bytes = 16u << 20;
  /// Keys plus values (plus 64 bytes per key) the server holds; a set past it is refused with
  /// store_errc::full.
  size_t max_stored_bytes = size_t{256} << 20;
  /// Open connections; one more is closed as soon as it is accepted.
  size_t max_connections = 1024;
  /// Connections still in the handshake; one more evicts the oldest of them, so a flood of
  /// silent connections cannot lock members out.
  size_t max_pending_handshakes = 64;
  /// A connection that has not finished the handshake by then is closed (no effect without
  /// an identity).
  std::chrono::milliseconds handshake_timeout{3000};
};

/// Called on the server's I/O thread for every refused connection: the peer's address and
/// why. Keep it cheap.
using store_rejection_callback =
    std::function<void(const std::string& peer, const std::string& why)>;

struct store_server_options {
  store_auth auth = store_auth::from_process();
  store_limits limits;
  store_rejection_callback on_rejection;
};

/// The store server the coordinator runs: TCP, many clients, its own I/O thread. A get or
/// wait on a missing key is answered when the key is set or when the client's deadline passes.
/// State lives in memory only; it dies with the server. A client that disconnects while
/// blocked is noticed when its answer falls due (its deadline at the latest).
class tcp_store_server {
 public:
  /// Listens on bind_host:port (port 0 picks a free one) and starts serving at once. With an
  /// identity, a connection is served only after it proved it holds the key
  /// (runtime/auth/handshake.hpp); nothing it sends before reaches the request decoder.
  explicit tcp_store_server(const std::string& bind_host = "127.0.0.1", uint16_t port = 0,
                            store_server_options options = {});
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
  /// Connections refused or closed for misbehaving so far: failed or late handshakes, over a
  /// cap, oversized or malformed frames. Thread-safe.
  uint64_t rejected_connections() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Connects to a tcp_store_server, retrying until `timeout` passes (the server may start
/// after its clients). Throws store_error{unreachable} naming host:port if nothing answers.
/// `timeout` also bounds each set/add/check; a get/wait waits for the server's answer until
/// its own deadline plus min(timeout, 2 s), then declares the server hung (store_error{timeout}).
/// A lost connection is reopened once on the next call.
/// With an identity (by default this process's credentials, when it has any) every connection
/// starts with the handshake; a server of another job, another protocol version or that
/// refuses this process's proof fails at once with store_error{refused} naming which.
std::unique_ptr<kv_store> connect_tcp_store(const std::string& host, uint16_t port,
                                            std::chrono::milliseconds timeout,
                                            store_auth auth = store_auth::from_process());

}  // namespace troupe::comm
