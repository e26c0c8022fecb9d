#pragma once
// The JSON shapes of etcd's v3 gateway as the client writes and reads them. Internal to
// troupe_etcd (etcd_calls.cpp, etcd_watch.cpp); users include etcd_client.hpp.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/etcd/etcd_client.hpp"

namespace troupe::etcd::detail {

using json = nlohmann::json;

/// An int64 field: the gateway writes them as JSON strings and leaves out every field that is
/// zero, so an absent field is 0. Throws etcd_error(protocol) on anything else.
std::int64_t int_field(const json& j, const char* name);
/// A bytes field (base64 on the wire); absent is "".
std::string bytes_field(const json& j, const char* name);
key_value parse_kv(const json& j);
/// The "kvs" array of a range answer; absent is empty.
std::vector<key_value> parse_kvs(const json& j);
/// header.revision of an answer.
std::int64_t header_revision(const json& j);

json range_body(const std::string& key, bool prefix, std::int64_t limit = 0);
json delete_body(const std::string& key, bool prefix);
json put_body(const std::string& key, const std::string& value, std::int64_t lease);
json compare_body(const compare& c);
json op_body(const txn_op& op);

/// Maps the gRPC status the gateway forwards ({"error", "message", "code"}) to an error kind.
error_kind kind_of_status(int code, const std::string& message);
/// gRPC codes after which another member may still answer: unavailable (no leader, stopping),
/// deadline exceeded (a request timed out inside the member) and internal.
bool worth_another_endpoint(int code);

}  // namespace troupe::etcd::detail
