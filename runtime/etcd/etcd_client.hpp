#pragma once
// A client for etcd's v3 key-value, lease and watch API, spoken through etcd's JSON gateway.
//
// Why the gateway and not gRPC: etcd 3.4 serves every v3 call we need (range, put, txn,
// deleterange, lease grant/keepalive/revoke/timetolive and watch as a streamed response) as
// JSON over plain HTTP/1.1 on its client port, so this needs only Boost.Beast, OpenSSL and
// nlohmann::json, which the build already has. gRPC would mean vendoring etcd's .proto files
// (and the gogoproto/googleapis files they import), running protoc and grpc++'s code generator
// in the build, and linking grpc++ and its own TLS stack: a large dependency for about a dozen
// calls. What the gateway costs: keys and values travel base64-encoded, int64 fields come back
// as JSON strings, and a bidirectional stream (keepalive, watch) becomes one request per
// keepalive and one long response per watch.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::etcd {

/// What went wrong, so a caller can decide between retrying, failing over and giving up.
enum class error_kind {
  unreachable,       ///< no endpoint accepted a connection (refused, reset, closed early)
  timeout,           ///< an endpoint accepted but did not answer within the deadline
  tls,               ///< TLS handshake or certificate problem (wrong CA, missing client cert)
  protocol,          ///< the answer was not what etcd's gateway sends (bad HTTP/JSON, too large)
  compacted,         ///< the revision asked for has been compacted away
  lease_not_found,   ///< the lease does not exist (expired or revoked)
  invalid_argument,  ///< etcd refused the request as malformed (empty key, duplicate txn keys)
  server,            ///< etcd answered with another error (no leader, too many requests, ...)
  cancelled,         ///< the operation was cancelled by its owner
};

/// "unreachable", "timeout", ...
const char* to_string(error_kind kind);

/// Every failure of the client: a kind to branch on, and a message that names the endpoint(s)
/// and says what to check.
class etcd_error : public std::runtime_error {
 public:
  etcd_error(error_kind kind, const std::string& message)
      : std::runtime_error(message), kind_(kind) {}
  error_kind kind() const { return kind_; }

 private:
  error_kind kind_;
};

/// One key as etcd stores it. Revisions are etcd's cluster-wide revision counter.
struct key_value {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t version = 0;
  std::int64_t lease = 0;
};

/// The answer to get/get_prefix: the keys found and the store's revision when read.
struct range_result {
  std::vector<key_value> kvs;
  std::int64_t revision = 0;
  std::int64_t count = 0;  ///< how many keys matched (may exceed kvs.size() with a limit)
};

/// The connection's settings. Endpoints are tried in order, starting from the last one that
/// answered.
struct client_options {
  std::vector<std::string> endpoints;  ///< "http://host:port" or "https://host:port"
  std::string ca_file;                 ///< PEM CA bundle for https (empty: the system's)
  std::string cert_file;               ///< PEM client certificate (with --client-cert-auth)
  std::string key_file;                ///< PEM key of cert_file
  /// How long one endpoint may take to answer one request before the next one is tried.
  std::chrono::milliseconds request_timeout{2000};
  /// The largest answer accepted; a larger one is a protocol error, never an allocation.
  /// etcd itself refuses requests over 1.5 MiB by default, and troupe reads single keys and
  /// small prefixes, so 4 MiB is far above any real answer.
  std::size_t max_response_bytes = 4u << 20;
};

/// A deadline for one call across all endpoints; without one the call may take
/// request_timeout on each endpoint.
struct call_options {
  std::optional<std::chrono::steady_clock::time_point> deadline;
};

/// One comparison of a transaction: "<target> of key <op> operand".
struct compare {
  enum class target { create_revision, mod_revision, version, value };
  enum class op { equal, not_equal, greater, less };
  std::string key;
  target what = target::create_revision;
  op how = op::equal;
  std::int64_t number = 0;  ///< operand for the revision/version targets
  std::string value;        ///< operand for target::value

  static compare created(std::string key, op how, std::int64_t rev);
  static compare modified(std::string key, op how, std::int64_t rev);
  static compare versioned(std::string key, op how, std::int64_t version);
  static compare valued(std::string key, op how, std::string value);
};

/// One operation of a transaction's then/else branch.
struct txn_op {
  enum class kind { put, del, get };
  kind what = kind::get;
  std::string key;
  std::string value;       ///< put only
  std::int64_t lease = 0;  ///< put only
  bool prefix = false;     ///< del/get: every key starting with `key`

  static txn_op put(std::string key, std::string value, std::int64_t lease = 0);
  static txn_op del(std::string key, bool prefix = false);
  static txn_op get(std::string key, bool prefix = false);
};

struct txn_request {
  std::vector<compare> compares;  ///< all must hold for `then` to run
  std::vector<txn_op> then;
  std::vector<txn_op> otherwise;
};

/// The answer to one branch operation: gets fill kvs, deletes fill deleted.
struct txn_op_result {
  txn_op::kind what = txn_op::kind::get;
  std::vector<key_value> kvs;
  std::int64_t deleted = 0;
};

struct txn_result {
  bool succeeded = false;  ///< whether the compares held (then ran) or not (otherwise ran)
  std::int64_t revision = 0;
  std::vector<txn_op_result> results;  ///< one per operation of the branch that ran
};

/// One change seen by a watch.
struct watch_event {
  enum class type { put, del };
  type what = type::put;
  key_value kv;  ///< for a delete: the key and the deleting revision (mod_revision)
};

/// What to watch: one key, or every key under a prefix, from a revision on (0: from now).
struct watch_request {
  std::string key;
  bool prefix = false;
  std::int64_t start_revision = 0;
  /// A stream that has been silent this long is reopened (from the last revision seen), so a
  /// paused or partitioned server cannot hold the watch forever.
  std::chrono::milliseconds idle_timeout{10000};
  /// Delay before reopening a broken stream; doubles up to 1 s while it keeps failing.
  std::chrono::milliseconds retry_delay{50};
};

/// A running watch. Its thread delivers events until cancel() or destruction; callbacks run
/// on that thread and must not destroy the watcher.
class watcher {
 public:
  virtual ~watcher() = default;
  /// Stops the stream and joins the thread; no callback runs after it returns (unless called
  /// from a callback, where it only asks the thread to stop). Idempotent.
  virtual void cancel() = 0;
  /// The next revision the watch will ask for when it resumes.
  virtual std::int64_t next_revision() const = 0;
};

using watch_callback = std::function<void(const std::vector<watch_event>&)>;
/// Called on the watch's thread for each broken stream (the watch then resumes by itself) and
/// for a compacted start revision (then the watch stops: re-read and watch again).
using watch_error_callback = std::function<void(const etcd_error&)>;

/// A client for one etcd cluster. Thread-safe: a call takes an idle kept-alive connection to
/// its endpoint (or opens one) for itself, so calls from several threads do not wait on each
/// other; up to 4 idle connections per endpoint are kept for the next calls. A kept-alive
/// connection that the server has closed is replaced without the caller seeing it (the rule
/// for sending a request again is in etcd_transport.cpp). Each watch has a connection of its
/// own.
class etcd_client {
 public:
  explicit etcd_client(client_options options);
  ~etcd_client();
  etcd_client(const etcd_client&) = delete;
  etcd_client& operator=(const etcd_client&) = delete;

  std::optional<key_value> get(const std::string& key, const call_options& call = {});
  /// Every key starting with `prefix`, in key order; limit 0 means all.
  range_result get_prefix(const std::string& prefix, std::int64_t limit = 0,
                          const call_options& call = {});
  /// Returns the revision of the write.
  std::int64_t put(const std::string& key, const std::string& value, std::int64_t lease = 0,
                   const call_options& call = {});
  /// Returns how many keys were deleted.
  std::int64_t del(const std::string& key, bool prefix = false, const call_options& call = {});
  txn_result txn(const txn_request& request, const call_options& call = {});

  /// Discards the history before `revision`; watches from an older revision then fail with
  /// error_kind::compacted.
  void compact(std::int64_t revision, const call_options& call = {});

  /// A new lease of `ttl` seconds; returns its id.
  std::int64_t lease_grant(std::chrono::seconds ttl, const call_options& call = {});
  /// Renews the lease once; returns its remaining TTL in seconds, 0 when it no longer exists.
  std::int64_t lease_keepalive_once(std::int64_t id, const call_options& call = {});
  /// Remaining TTL in seconds, or -1 when the lease does not exist.
  std::int64_t lease_time_to_live(std::int64_t id, const call_options& call = {});
  /// Revokes the lease and deletes its keys; a lease already gone is not an error.
  void lease_revoke(std::int64_t id, const call_options& call = {});

  /// Starts a watch in a thread of its own.
  std::unique_ptr<watcher> watch(watch_request request, watch_callback on_events,
                                 watch_error_callback on_error = {});

  const client_options& options() const;

  struct impl;

 private:
  std::shared_ptr<impl> impl_;
};

/// The end of the key range holding every key that starts with `prefix` ("\0" for "").
std::string prefix_range_end(const std::string& prefix);

std::string base64_encode(const std::string& bytes);
/// Throws etcd_error(protocol) on input that is not base64.
std::string base64_decode(const std::string& text);

}  // namespace troupe::etcd
