// The calls of etcd_client: each builds its request, posts it (etcd_transport.cpp) and reads
// the answer's JSON (etcd_wire.cpp).

#include <algorithm>

#include "runtime/etcd/etcd_client.hpp"
#include "runtime/etcd/etcd_transport.hpp"
#include "runtime/etcd/etcd_wire.hpp"

namespace troupe::etcd {

using namespace detail;

etcd_client::etcd_client(client_options options)
    : impl_(std::make_shared<impl>(std::move(options))) {}
etcd_client::~etcd_client() = default;

const client_options& etcd_client::options() const { return impl_->options; }

std::optional<key_value> etcd_client::get(const std::string& key, const call_options& call) {
  const json answer = post(*impl_, "/v3/kv/range", range_body(key, false), call, replay::safe);
  auto kvs = parse_kvs(answer);
  if (kvs.empty()) return std::nullopt;
  return std::move(kvs.front());
}

range_result etcd_client::get_prefix(const std::string& prefix, std::int64_t limit,
                                     const call_options& call) {
  const json answer =
      post(*impl_, "/v3/kv/range", range_body(prefix, true, limit), call, replay::safe);
  range_result r;
  r.kvs = parse_kvs(answer);
  r.revision = header_revision(answer);
  r.count = int_field(answer, "count");
  return r;
}

std::int64_t etcd_client::put(const std::string& key, const std::string& value, std::int64_t lease,
                              const call_options& call) {
  return header_revision(
      post(*impl_, "/v3/kv/put", put_body(key, value, lease), call, replay::unsafe));
}

std::int64_t etcd_client::del(const std::string& key, bool prefix, const call_options& call) {
  return int_field(
      post(*impl_, "/v3/kv/deleterange", delete_body(key, prefix), call, replay::unsafe),
      "deleted");
}

txn_result etcd_client::txn(const txn_request& request, const call_options& call) {
  json body = {{"compare", json::array()}, {"success", json::array()}, {"failure", json::array()}};
  for (const auto& c : request.compares) body["compare"].push_back(compare_body(c));
  for (const auto& op : request.then) body["success"].push_back(op_body(op));
  for (const auto& op : request.otherwise) body["failure"].push_back(op_body(op));
  const json answer = post(*impl_, "/v3/kv/txn", body, call, replay::unsafe);
  txn_result r;
  r.succeeded = answer.value("succeeded", false);
  r.revision = header_revision(answer);
  if (const auto it = answer.find("responses"); it != answer.end() && it->is_array()) {
    for (const auto& one : *it) {
      txn_op_result op;
      if (const auto g = one.find("response_range"); g != one.end()) {
        op.what = txn_op::kind::get;
        op.kvs = parse_kvs(*g);
      } else if (const auto d = one.find("response_delete_range"); d != one.end()) {
        op.what = txn_op::kind::del;
        op.deleted = int_field(*d, "deleted");
      } else {
        op.what = txn_op::kind::put;
      }
      r.results.push_back(std::move(op));
    }
  }
  return r;
}

void etcd_client::compact(std::int64_t revision, const call_options& call) {
  post(*impl_, "/v3/kv/compaction",
       json{{"revision", std::to_string(revision)}, {"physical", true}}, call, replay::unsafe);
}

std::int64_t etcd_client::lease_grant(std::chrono::seconds ttl, const call_options& call) {
  const json answer = post(*impl_, "/v3/lease/grant", json{{"TTL", std::to_string(ttl.count())}},
                           call, replay::unsafe);
  const std::int64_t id = int_field(answer, "ID");
  if (id == 0) {
    throw etcd_error(error_kind::protocol,
                     "etcd granted a lease without an ID: " + answer.value("error", std::string()));
  }
  return id;
}

std::int64_t etcd_client::lease_keepalive_once(std::int64_t id, const call_options& call) {
  // The gateway reads one request from the body, answers one message and ends the stream; a
  // lease that is gone comes back without a TTL (zero), not as an error.
  const json answer =
      post(*impl_, "/v3/lease/keepalive", json{{"ID", std::to_string(id)}}, call, replay::safe);
  return std::max<std::int64_t>(0, int_field(answer, "TTL"));
}

std::int64_t etcd_client::lease_time_to_live(std::int64_t id, const call_options& call) {
  return int_field(
      post(*impl_, "/v3/lease/timetolive", json{{"ID", std::to_string(id)}}, call, replay::safe),
      "TTL");
}

void etcd_client::lease_revoke(std::int64_t id, const call_options& call) {
  try {
    post(*impl_, "/v3/lease/revoke", json{{"ID", std::to_string(id)}}, call, replay::safe);
  } catch (const etcd_error& e) {
    if (e.kind() != error_kind::lease_not_found) throw;
  }
}

}  // namespace troupe::etcd
