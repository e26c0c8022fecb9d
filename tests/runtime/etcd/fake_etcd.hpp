#pragma once
// An etcd stand-in for unit tests: an HTTP/1.1 server on 127.0.0.1 (a free port) that speaks
// the part of etcd's v3 JSON gateway that troupe::etcd::etcd_client uses (range, put, txn,
// deleterange, compaction, lease grant/keepalive/revoke/timetolive, watch), over an in-memory
// store with etcd's revisions and leases (fake_etcd_store.hpp). On top, what a real etcd
// cannot be made to do on cue: fail the next requests in a chosen way, expire a lease now,
// serve a store left by "another incarnation", and count connections and requests.
//
// It runs one thread of its own; every method may be called from any thread.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/etcd/etcd_client.hpp"

namespace troupe::etcd::testing {

/// How a request chosen by fake_etcd::fail_next fails.
struct failure {
  enum class kind {
    close,             ///< read whole, not applied, connection closed without an answer
    apply_then_close,  ///< applied, then closed without an answer: a member that died between
                       ///< its commit and its reply (the client cannot tell it from `close`)
    hang,              ///< read and never answered; the connection stays open until the
                       ///< client closes it or the fake is stopped
    error,             ///< answered with the gRPC error below, not applied
  };
  kind what = kind::close;
  int code = 14;                                  ///< gRPC code of kind::error
  std::string message = "etcdserver: no leader";  ///< its message

  static failure closed() { return {kind::close}; }
  static failure applied_then_closed() { return {kind::apply_then_close}; }
  static failure hung() { return {kind::hang}; }
  /// etcd without a raft leader: gRPC Unavailable, after which a client tries another member.
  static failure unavailable() { return {kind::error, 14, "etcdserver: no leader"}; }
  static failure error(int code, std::string message) {
    return {kind::error, code, std::move(message)};
  }
};

struct fake_options {
  /// Leases run out by their TTL (checked every 10 ms; etcd checks every 500 ms). Off: only
  /// expire_lease() and revokes end them.
  bool expire_leases = true;
  /// Grants below this are raised to it, as etcd raises them to its minimum (1.5 election
  /// timeouts, rounded up to whole seconds).
  std::chrono::seconds min_lease_ttl{1};
  /// Off: every answer says "Connection: close" and the connection is closed after it.
  bool keep_alive = true;
};

class fake_etcd {
 public:
  explicit fake_etcd(fake_options options = {});
  /// Closes every connection and stops the thread.
  ~fake_etcd();
  fake_etcd(const fake_etcd&) = delete;
  fake_etcd& operator=(const fake_etcd&) = delete;

  /// "http://127.0.0.1:<port>", for client_options::endpoints.
  std::string url() const;
  std::uint16_t port() const;

  // ---- the store: each write is one request, as from a client, and watches see it ----

  std::int64_t revision() const;
  std::optional<key_value> get(const std::string& key) const;
  std::vector<key_value> get_prefix(const std::string& prefix) const;
  /// Throw store_error (fake_etcd_store.hpp) where etcd would refuse (no key, no such lease).
  std::int64_t put(const std::string& key, const std::string& value, std::int64_t lease = 0);
  std::int64_t del(const std::string& key, bool prefix = false);
  void compact(std::int64_t revision);
  /// Replaces the keys with `kvs`, revisions and versions as given (as another incarnation of
  /// a program left them); see fake_store::seed. Grant the leases they name first.
  void seed(std::vector<key_value> kvs, std::int64_t revision = 0);

  /// A lease as a grant makes it; `id` 0 picks one.
  std::int64_t grant_lease(std::chrono::seconds ttl, std::int64_t id = 0);
  /// Ends the lease now, as its TTL running out would (a revoke does the same): its keys are
  /// deleted in one revision and a keepalive then answers TTL 0. False if it does not exist.
  bool expire_lease(std::int64_t id);
  std::vector<std::int64_t> leases() const;
  /// Time left before the lease expires; nullopt when it does not exist.
  std::optional<std::chrono::milliseconds> lease_remaining(std::int64_t id) const;

  // ---- faults ----

  /// The next `n` requests for `path` ("/v3/kv/txn"; empty: any) fail as `how` says. Several
  /// calls queue up; a request takes the first that matches it.
  void fail_next(std::size_t n, failure how, const std::string& path = {});
  /// Forgets failures not yet used; requests already hung stay so.
  void clear_failures();
  /// Closes every connection that waits for its next request, as a server's idle timeout
  /// does; returns once they are closed.
  void close_idle_connections();
  /// Closes every connection: idle ones, ones with a hung request, and watch streams.
  void close_all_connections();
  /// Stops listening and closes every connection: connecting is refused until
  /// resume_serving() listens again on the same port.
  void stop_serving();
  void resume_serving();

  // ---- counts ----

  std::size_t connections_accepted() const;
  std::size_t open_connections() const;
  /// Requests received for `path` (empty: all), failed ones included.
  std::size_t requests(const std::string& path = {}) const;
  /// Watch streams now open.
  std::size_t open_watches() const;

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::etcd::testing
