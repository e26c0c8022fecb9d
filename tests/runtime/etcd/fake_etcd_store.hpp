#pragma once
// The state behind fake_etcd: an in-memory key-value store with etcd's revisions, leases and
// event history, and the unary calls of etcd's v3 JSON gateway applied to it. Not thread-safe:
// fake_etcd holds its lock around every use.
//
// What it keeps of etcd because callers depend on it: one cluster-wide revision that starts at
// 1 and grows by one per write request (a txn or a lease expiry that deletes several keys is
// one revision; a delete that finds nothing is none); create_revision, mod_revision and
// version per key; a put attaches its key to its lease and detaches it from the previous one
// (a put without a lease too); an expired or revoked lease deletes its keys; compares against
// a missing key see zeros, except a value compare, which fails; a txn that writes a key twice
// is refused; a range read inside a txn sees the txn's earlier writes; the gateway's JSON
// (int64 as strings, zero fields left out, errors as {"error", "code", "message"}).

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/etcd/etcd_client.hpp"

namespace troupe::etcd::testing {

/// A refusal as etcd words it: the gRPC code and message its gateway forwards.
class store_error : public std::runtime_error {
 public:
  store_error(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

/// One change, as a watch reports it: a delete carries the key and the deleting revision.
struct fake_event {
  watch_event::type what = watch_event::type::put;
  key_value kv;
};

/// One answer of the gateway: its HTTP status and JSON body (null for the mux's plain 404).
struct gateway_answer {
  unsigned status = 200;
  nlohmann::json body;
};

class fake_store {
 public:
  using clock_type = std::chrono::steady_clock;

  explicit fake_store(std::chrono::seconds min_lease_ttl = std::chrono::seconds(1));

  /// Applies one unary call (/v3/kv/range, /v3/kv/put, /v3/kv/txn, /v3/kv/deleterange,
  /// /v3/kv/compaction, /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke,
  /// /v3/lease/timetolive) and returns the gateway's answer, errors included.
  gateway_answer call(const std::string& path, const nlohmann::json& request);
  /// The answer of the gateway to a refused request.
  static gateway_answer error_answer(int code, const std::string& message);
  /// The header every answer carries, at the current revision.
  nlohmann::json header() const;
  /// A key as the gateway writes it (base64 bytes, int64 as strings, zero fields left out).
  static nlohmann::json to_json(const key_value& kv);

  std::int64_t revision() const { return revision_; }
  std::int64_t compact_revision() const { return compacted_; }
  std::optional<key_value> get(const std::string& key) const;
  /// Keys in [key, range_end) in key order; range_end "" is `key` alone, "\0" is every key from
  /// `key` on.
  std::vector<key_value> range(const std::string& key, const std::string& range_end) const;

  /// One write request each, like a client's; throw store_error as etcd would refuse them.
  std::int64_t put(const std::string& key, const std::string& value, std::int64_t lease = 0);
  std::int64_t del(const std::string& key, const std::string& range_end = {});
  /// A lease of `ttl` (raised to the minimum); id 0 picks the next free id.
  std::int64_t grant(std::chrono::seconds ttl, std::int64_t id = 0);
  /// Ends the lease now as its expiry or a revoke would: its keys are deleted in one revision.
  /// False when there is no such lease.
  bool end_lease(std::int64_t id);
  std::vector<std::int64_t> leases() const;
  /// Time left before the lease expires; nullopt when it does not exist.
  std::optional<clock_type::duration> lease_remaining(std::int64_t id) const;
  /// Ends every lease whose time is up at `now`; returns how many.
  std::size_t expire_due(clock_type::time_point now);
  void compact(std::int64_t revision);
  /// Replaces every key with `kvs` as an earlier incarnation left them: their revisions and
  /// versions are kept (missing ones filled in after the largest given), and the store's
  /// revision becomes `revision` (at least the largest one given). The history becomes one put
  /// per key at its mod_revision, the last write of each, since earlier ones are not known:
  /// a watch from an older revision sees those, not every version (call compact() to have it
  /// refused instead). Leases that keys name must have been granted; other leases stay.
  void seed(std::vector<key_value> kvs, std::int64_t revision = 0);

  /// Events from revision `from` on for keys in [key, range_end); nullopt when `from` is
  /// compacted away.
  std::optional<std::vector<fake_event>> events(std::int64_t from, const std::string& key,
                                                const std::string& range_end) const;

 private:
  struct lease {
    std::int64_t ttl = 0;  // seconds
    clock_type::time_point expires_at;
    std::set<std::string> keys;
  };

  nlohmann::json range_call(const nlohmann::json& request) const;
  nlohmann::json put_call(const nlohmann::json& request);
  nlohmann::json delete_call(const nlohmann::json& request);
  nlohmann::json txn_call(const nlohmann::json& request);
  nlohmann::json compaction_call(const nlohmann::json& request);
  nlohmann::json grant_call(const nlohmann::json& request);
  nlohmann::json keepalive_call(const nlohmann::json& request);
  nlohmann::json revoke_call(const nlohmann::json& request);
  nlohmann::json time_to_live_call(const nlohmann::json& request) const;

  bool compare_holds(const nlohmann::json& c) const;
  void check_txn_branch(const nlohmann::json& ops) const;
  nlohmann::json apply_op(const nlohmann::json& op, std::int64_t rev, bool& wrote);
  void apply_put(const std::string& key, const std::string& value, std::int64_t lease_id,
                 std::int64_t rev);
  std::int64_t apply_delete(const std::string& key, const std::string& range_end, std::int64_t rev);
  void check_put(const std::string& key, std::int64_t lease_id) const;

  std::chrono::seconds min_ttl_;
  std::int64_t revision_ = 1;  // etcd's first revision: a new cluster reports 1
  std::int64_t compacted_ = 0;
  std::int64_t next_lease_ = 0x694d71ac00000001;  // etcd's ids are large; callers must cope
  std::map<std::string, key_value> kvs_;
  std::map<std::int64_t, lease> leases_;
  std::vector<fake_event> history_;  // by revision; compaction drops the older part
};

}  // namespace troupe::etcd::testing
