#include "tests/runtime/etcd/fake_etcd_store.hpp"

#include <algorithm>

namespace troupe::etcd::testing {

using json = nlohmann::json;

namespace {

// gRPC codes and etcd's messages for them (etcd's api/v3rpc/rpctypes).
constexpr int kInvalidArgument = 3;
constexpr int kNotFound = 5;
constexpr int kOutOfRange = 11;
const char* const kLeaseNotFound = "etcdserver: requested lease not found";
const char* const kEmptyKey = "etcdserver: key is not provided";
const char* const kDuplicateKey = "etcdserver: duplicate key given in txn request";
const char* const kCompacted = "etcdserver: mvcc: required revision has been compacted";
const char* const kFutureRevision = "etcdserver: mvcc: required revision is a future revision";

// The gateway reads an int64 from a JSON string or number; absent is 0.
std::int64_t number(const json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_string()) {
    try {
      return std::stoll(it->get<std::string>());
    } catch (const std::exception&) {
    }
  }
  throw store_error(kInvalidArgument, std::string("bad integer in field ") + name);
}

std::string bytes(const json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end() || !it->is_string()) return {};
  try {
    return base64_decode(it->get<std::string>());
  } catch (const etcd_error&) {
    throw store_error(kInvalidArgument, std::string("bad base64 in field ") + name);
  }
}

// int64 fields go out as strings, and zero ones not at all: what the gateway writes.
void set_int(json& j, const char* name, std::int64_t v) {
  if (v != 0) j[name] = std::to_string(v);
}

}  // namespace

json fake_store::to_json(const key_value& kv) {
  json j = {{"key", base64_encode(kv.key)}};
  set_int(j, "create_revision", kv.create_revision);
  set_int(j, "mod_revision", kv.mod_revision);
  set_int(j, "version", kv.version);
  if (!kv.value.empty()) j["value"] = base64_encode(kv.value);
  set_int(j, "lease", kv.lease);
  return j;
}

namespace {

bool in_range(const std::string& k, const std::string& key, const std::string& range_end) {
  if (range_end.empty()) return k == key;
  if (range_end == std::string(1, '\0')) return k >= key;
  return k >= key && k < range_end;
}

// Enums arrive as names or numbers (the gateway takes both).
std::string enum_name(const json& c, const char* field, const std::vector<std::string>& names) {
  const auto it = c.find(field);
  if (it == c.end() || it->is_null()) return names.front();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number_integer()) {
    const auto i = it->get<std::size_t>();
    if (i < names.size()) return names[i];
  }
  throw store_error(kInvalidArgument, std::string("bad value in field ") + field);
}

unsigned http_status_of(int code) {
  switch (code) {
    case 1:
      return 408;
    case 3:
    case 11:
      return 400;
    case 4:
      return 504;
    case 5:
      return 404;
    case 9:
      return 412;
    case 14:
      return 503;
    default:
      return 500;
  }
}

}  // namespace

fake_store::fake_store(std::chrono::seconds min_lease_ttl) : min_ttl_(min_lease_ttl) {}

gateway_answer fake_store::error_answer(int code, const std::string& message) {
  return {http_status_of(code), json{{"error", message}, {"code", code}, {"message", message}}};
}

json fake_store::header() const {
  // The ids of a one-member cluster; only revision matters to clients.
  return {{"cluster_id", "14841639068965178418"},
          {"member_id", "10276657743932975437"},
          {"revision", std::to_string(revision_)},
          {"raft_term", "2"}};
}

gateway_answer fake_store::call(const std::string& path, const json& request) {
  try {
    if (path == "/v3/kv/range") return {200, range_call(request)};
    if (path == "/v3/kv/put") return {200, put_call(request)};
    if (path == "/v3/kv/deleterange") return {200, delete_call(request)};
    if (path == "/v3/kv/txn") return {200, txn_call(request)};
    if (path == "/v3/kv/compaction") return {200, compaction_call(request)};
    if (path == "/v3/lease/grant") return {200, grant_call(request)};
    // The gateway streams keepalive answers: each message comes wrapped in "result".
    if (path == "/v3/lease/keepalive") return {200, json{{"result", keepalive_call(request)}}};
    if (path == "/v3/lease/revoke") return {200, revoke_call(request)};
    if (path == "/v3/lease/timetolive") return {200, time_to_live_call(request)};
  } catch (const store_error& e) {
    return error_answer(e.code(), e.what());
  }
  return {404, nullptr};
}

std::optional<key_value> fake_store::get(const std::string& key) const {
  const auto it = kvs_.find(key);
  if (it == kvs_.end()) return std::nullopt;
  return it->second;
}

std::vector<key_value> fake_store::range(const std::string& key,
                                         const std::string& range_end) const {
  std::vector<key_value> out;
  for (auto it = kvs_.lower_bound(key); it != kvs_.end(); ++it) {
    if (!in_range(it->first, key, range_end)) break;
    out.push_back(it->second);
  }
  return out;
}

// ---- writes ----

void fake_store::check_put(const std::string& key, std::int64_t lease_id) const {
  if (key.empty()) throw store_error(kInvalidArgument, kEmptyKey);
  if (lease_id != 0 && !leases_.count(lease_id)) throw store_error(kNotFound, kLeaseNotFound);
}

void fake_store::apply_put(const std::string& key, const std::string& value, std::int64_t lease_id,
                           std::int64_t rev) {
  auto [it, fresh] = kvs_.try_emplace(key);
  key_value& kv = it->second;
  if (fresh) {
    kv.key = key;
    kv.create_revision = rev;
  }
  if (kv.lease != lease_id) {
    // etcd moves the key to the lease of its latest put; no lease detaches it.
    if (const auto old = leases_.find(kv.lease); old != leases_.end()) old->second.keys.erase(key);
    if (lease_id != 0) leases_.at(lease_id).keys.insert(key);
  }
  kv.value = value;
  kv.mod_revision = rev;
  kv.lease = lease_id;
  ++kv.version;
  history_.push_back({watch_event::type::put, kv});
}

std::int64_t fake_store::apply_delete(const std::string& key, const std::string& range_end,
                                      std::int64_t rev) {
  std::int64_t deleted = 0;
  for (const auto& kv : range(key, range_end)) {
    if (const auto l = leases_.find(kv.lease); l != leases_.end()) l->second.keys.erase(kv.key);
    key_value gone;
    gone.key = kv.key;
    gone.mod_revision = rev;
    history_.push_back({watch_event::type::del, gone});
    kvs_.erase(kv.key);
    ++deleted;
  }
  return deleted;
}

std::int64_t fake_store::put(const std::string& key, const std::string& value,
                             std::int64_t lease_id) {
  check_put(key, lease_id);
  apply_put(key, value, lease_id, ++revision_);
  return revision_;
}

std::int64_t fake_store::del(const std::string& key, const std::string& range_end) {
  const std::int64_t deleted = apply_delete(key, range_end, revision_ + 1);
  if (deleted > 0) ++revision_;
  return deleted;
}

std::int64_t fake_store::grant(std::chrono::seconds ttl, std::int64_t id) {
  if (id == 0) {
    while (leases_.count(next_lease_)) ++next_lease_;
    id = next_lease_++;
  }
  if (leases_.count(id)) throw store_error(9, "etcdserver: lease already exists");
  lease& l = leases_[id];
  l.ttl = std::max(ttl, min_ttl_).count();
  l.expires_at = clock_type::now() + std::chrono::seconds(l.ttl);
  return id;
}

bool fake_store::end_lease(std::int64_t id) {
  const auto it = leases_.find(id);
  if (it == leases_.end()) return false;
  const std::set<std::string> keys = it->second.keys;
  std::int64_t deleted = 0;
  for (const auto& key : keys) deleted += apply_delete(key, {}, revision_ + 1);
  if (deleted > 0) ++revision_;
  leases_.erase(id);
  return true;
}

std::vector<std::int64_t> fake_store::leases() const {
  std::vector<std::int64_t> out;
  for (const auto& [id, l] : leases_) out.push_back(id);
  return out;
}

std::optional<fake_store::clock_type::duration> fake_store::lease_remaining(std::int64_t id) const {
  const auto it = leases_.find(id);
  if (it == leases_.end()) return std::nullopt;
  return std::max(clock_type::duration::zero(), it->second.expires_at - clock_type::now());
}

std::size_t fake_store::expire_due(clock_type::time_point now) {
  std::vector<std::int64_t> due;
  for (const auto& [id, l] : leases_) {
    if (l.expires_at <= now) due.push_back(id);
  }
  for (const auto id : due) end_lease(id);
  return due.size();
}

void fake_store::compact(std::int64_t revision) {
  if (revision <= compacted_) throw store_error(kOutOfRange, kCompacted);
  if (revision > revision_) throw store_error(kOutOfRange, kFutureRevision);
  compacted_ = revision;
  std::erase_if(history_, [&](const fake_event& e) { return e.kv.mod_revision < revision; });
}

void fake_store::seed(std::vector<key_value> kvs, std::int64_t revision) {
  for (const auto& kv : kvs) check_put(kv.key, kv.lease);
  for (auto& [id, l] : leases_) l.keys.clear();
  kvs_.clear();
  history_.clear();
  std::int64_t top = std::max<std::int64_t>(revision, 1);
  for (const auto& kv : kvs) top = std::max({top, kv.create_revision, kv.mod_revision});
  for (auto& kv : kvs) {
    // Keys given without revisions were written after those given with them, one each.
    if (kv.mod_revision == 0) kv.mod_revision = kv.create_revision ? kv.create_revision : ++top;
    if (kv.create_revision == 0) kv.create_revision = kv.mod_revision;
    if (kv.version == 0) kv.version = 1;
    if (kv.lease != 0) leases_.at(kv.lease).keys.insert(kv.key);
    kvs_[kv.key] = kv;
    history_.push_back({watch_event::type::put, kv});
  }
  std::sort(history_.begin(), history_.end(), [](const fake_event& x, const fake_event& y) {
    return x.kv.mod_revision < y.kv.mod_revision;
  });
  revision_ = top;
  compacted_ = 0;
}

std::optional<std::vector<fake_event>> fake_store::events(std::int64_t from, const std::string& key,
                                                          const std::string& range_end) const {
  if (from > 0 && from < compacted_) return std::nullopt;
  std::vector<fake_event> out;
  for (const auto& e : history_) {
    if (e.kv.mod_revision >= from && in_range(e.kv.key, key, range_end)) out.push_back(e);
  }
  return out;
}

// ---- the calls ----

json fake_store::range_call(const json& request) const {
  const auto found = range(bytes(request, "key"), bytes(request, "range_end"));
  const std::int64_t limit = number(request, "limit");
  json answer = {{"header", header()}};
  json kvs = json::array();
  for (const auto& kv : found) {
    if (limit > 0 && static_cast<std::int64_t>(kvs.size()) == limit) break;
    kvs.push_back(to_json(kv));
  }
  if (!kvs.empty()) answer["kvs"] = kvs;
  if (kvs.size() < found.size()) answer["more"] = true;
  set_int(answer, "count", static_cast<std::int64_t>(found.size()));
  return answer;
}

json fake_store::put_call(const json& request) {
  put(bytes(request, "key"), bytes(request, "value"), number(request, "lease"));
  return {{"header", header()}};
}

json fake_store::delete_call(const json& request) {
  const std::int64_t deleted = del(bytes(request, "key"), bytes(request, "range_end"));
  json answer = {{"header", header()}};
  set_int(answer, "deleted", deleted);
  return answer;
}

json fake_store::compaction_call(const json& request) {
  compact(number(request, "revision"));
  return {{"header", header()}};
}

json fake_store::grant_call(const json& request) {
  const std::int64_t id =
      grant(std::chrono::seconds(number(request, "TTL")), number(request, "ID"));
  json answer = {{"header", header()}, {"ID", std::to_string(id)}};
  set_int(answer, "TTL", leases_.at(id).ttl);
  return answer;
}

json fake_store::keepalive_call(const json& request) {
  const std::int64_t id = number(request, "ID");
  json answer = {{"header", header()}, {"ID", std::to_string(id)}};
  // A lease that is gone is renewed to nothing: TTL 0 (left out), not an error.
  if (const auto it = leases_.find(id); it != leases_.end()) {
    it->second.expires_at = clock_type::now() + std::chrono::seconds(it->second.ttl);
    set_int(answer, "TTL", it->second.ttl);
  }
  return answer;
}

json fake_store::revoke_call(const json& request) {
  if (!end_lease(number(request, "ID"))) throw store_error(kNotFound, kLeaseNotFound);
  return {{"header", header()}};
}

json fake_store::time_to_live_call(const json& request) const {
  const std::int64_t id = number(request, "ID");
  json answer = {{"header", header()}, {"ID", std::to_string(id)}};
  const auto it = leases_.find(id);
  if (it == leases_.end()) {
    answer["TTL"] = "-1";
    return answer;
  }
  // etcd truncates the time left to whole seconds.
  const auto left = std::chrono::duration_cast<std::chrono::seconds>(*lease_remaining(id));
  set_int(answer, "TTL", left.count());
  set_int(answer, "grantedTTL", it->second.ttl);
  return answer;
}

// ---- transactions ----

bool fake_store::compare_holds(const json& c) const {
  const std::string target = enum_name(c, "target", {"VERSION", "CREATE", "MOD", "VALUE", "LEASE"});
  const std::string result = enum_name(c, "result", {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"});
  auto found = range(bytes(c, "key"), bytes(c, "range_end"));
  if (found.empty()) {
    // etcd: a missing key has zero revisions and version, but no value to compare.
    if (target == "VALUE") return false;
    found.push_back(key_value{});
  }
  for (const auto& kv : found) {
    int order = 0;
    if (target == "VALUE") {
      const std::string operand = bytes(c, "value");
      order = kv.value < operand ? -1 : kv.value > operand ? 1 : 0;
    } else {
      std::int64_t mine = kv.version;
      std::int64_t operand = number(c, "version");
      if (target == "CREATE") {
        mine = kv.create_revision;
        operand = number(c, "create_revision");
      } else if (target == "MOD") {
        mine = kv.mod_revision;
        operand = number(c, "mod_revision");
      } else if (target == "LEASE") {
        mine = kv.lease;
        operand = number(c, "lease");
      }
      order = mine < operand ? -1 : mine > operand ? 1 : 0;
    }
    const bool holds = result == "EQUAL"       ? order == 0
                       : result == "NOT_EQUAL" ? order != 0
                       : result == "GREATER"   ? order > 0
                                               : order < 0;
    if (!holds) return false;
  }
  return true;
}

// What etcd refuses before it runs a branch: empty keys, missing leases, and a key written
// twice (two puts, or a put inside a deleted range).
void fake_store::check_txn_branch(const json& ops) const {
  std::set<std::string> puts;
  std::vector<std::pair<std::string, std::string>> deletes;
  for (const auto& op : ops) {
    if (const auto p = op.find("request_put"); p != op.end()) {
      const std::string key = bytes(*p, "key");
      check_put(key, number(*p, "lease"));
      if (!puts.insert(key).second) throw store_error(kInvalidArgument, kDuplicateKey);
    } else if (const auto d = op.find("request_delete_range"); d != op.end()) {
      deletes.emplace_back(bytes(*d, "key"), bytes(*d, "range_end"));
    }
  }
  for (const auto& [key, end] : deletes) {
    for (const auto& put_key : puts) {
      if (in_range(put_key, key, end)) throw store_error(kInvalidArgument, kDuplicateKey);
    }
  }
}

json fake_store::apply_op(const json& op, std::int64_t rev, bool& wrote) {
  if (const auto p = op.find("request_put"); p != op.end()) {
    apply_put(bytes(*p, "key"), bytes(*p, "value"), number(*p, "lease"), rev);
    wrote = true;
    return {{"response_put", {{"header", {{"revision", std::to_string(rev)}}}}}};
  }
  if (const auto d = op.find("request_delete_range"); d != op.end()) {
    const std::int64_t n = apply_delete(bytes(*d, "key"), bytes(*d, "range_end"), rev);
    wrote = wrote || n > 0;
    json r = {{"header", {{"revision", std::to_string(rev)}}}};
    set_int(r, "deleted", n);
    return {{"response_delete_range", r}};
  }
  if (const auto g = op.find("request_range"); g != op.end()) {
    return {{"response_range", range_call(*g)}};
  }
  throw store_error(kInvalidArgument, "txn operation of an unknown kind");
}

json fake_store::txn_call(const json& request) {
  const auto list = [&](const char* name) {
    const auto it = request.find(name);
    return it != request.end() && it->is_array() ? *it : json::array();
  };
  const json compares = list("compare");
  const json success = list("success");
  const json failure = list("failure");
  check_txn_branch(success);
  check_txn_branch(failure);
  bool holds = true;
  for (const auto& c : compares) holds = holds && compare_holds(c);
  // Every write of the txn carries the same revision; the txn takes one only if it wrote.
  const std::int64_t rev = revision_ + 1;
  bool wrote = false;
  json responses = json::array();
  for (const auto& op : holds ? success : failure) responses.push_back(apply_op(op, rev, wrote));
  if (wrote) revision_ = rev;
  json answer = {{"header", header()}};
  if (holds) answer["succeeded"] = true;
  if (!responses.empty()) answer["responses"] = responses;
  return answer;
}

}  // namespace troupe::etcd::testing
