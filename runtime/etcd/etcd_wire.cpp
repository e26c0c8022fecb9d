#include "runtime/etcd/etcd_wire.hpp"

namespace troupe::etcd::detail {

std::int64_t int_field(const json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == s.size() && !s.empty()) return v;
  }
  throw etcd_error(error_kind::protocol,
                   std::string("etcd sent a field '") + name + "' that is not an integer");
}

std::string bytes_field(const json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_string()) {
    throw etcd_error(error_kind::protocol,
                     std::string("etcd sent a field '") + name + "' that is not a string");
  }
  return base64_decode(it->get_ref<const std::string&>());
}

key_value parse_kv(const json& j) {
  key_value kv;
  kv.key = bytes_field(j, "key");
  kv.value = bytes_field(j, "value");
  kv.create_revision = int_field(j, "create_revision");
  kv.mod_revision = int_field(j, "mod_revision");
  kv.version = int_field(j, "version");
  kv.lease = int_field(j, "lease");
  return kv;
}

std::vector<key_value> parse_kvs(const json& j) {
  std::vector<key_value> out;
  if (const auto it = j.find("kvs"); it != j.end() && it->is_array()) {
    for (const auto& kv : *it) out.push_back(parse_kv(kv));
  }
  return out;
}

std::int64_t header_revision(const json& j) {
  if (const auto it = j.find("header"); it != j.end() && it->is_object()) {
    return int_field(*it, "revision");
  }
  return 0;
}

json range_body(const std::string& key, bool prefix, std::int64_t limit) {
  json body = {{"key", base64_encode(key)}};
  if (prefix) body["range_end"] = base64_encode(prefix_range_end(key));
  if (limit > 0) body["limit"] = std::to_string(limit);
  return body;
}

json delete_body(const std::string& key, bool prefix) { return range_body(key, prefix); }

json put_body(const std::string& key, const std::string& value, std::int64_t lease) {
  json body = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  return body;
}

json compare_body(const compare& c) {
  json body = {{"key", base64_encode(c.key)}};
  switch (c.how) {
    case compare::op::equal:
      body["result"] = "EQUAL";
      break;
    case compare::op::not_equal:
      body["result"] = "NOT_EQUAL";
      break;
    case compare::op::greater:
      body["result"] = "GREATER";
      break;
    case compare::op::less:
      body["result"] = "LESS";
      break;
  }
  switch (c.what) {
    case compare::target::create_revision:
      body["target"] = "CREATE";
      body["create_revision"] = std::to_string(c.number);
      break;
    case compare::target::mod_revision:
      body["target"] = "MOD";
      body["mod_revision"] = std::to_string(c.number);
      break;
    case compare::target::version:
      body["target"] = "VERSION";
      body["version"] = std::to_string(c.number);
      break;
    case compare::target::value:
      body["target"] = "VALUE";
      body["value"] = base64_encode(c.value);
      break;
  }
  return body;
}

json op_body(const txn_op& op) {
  switch (op.what) {
    case txn_op::kind::put:
      return {{"request_put", put_body(op.key, op.value, op.lease)}};
    case txn_op::kind::del:
      return {{"request_delete_range", delete_body(op.key, op.prefix)}};
    case txn_op::kind::get:
      return {{"request_range", range_body(op.key, op.prefix)}};
  }
  return {};
}

error_kind kind_of_status(int code, const std::string& message) {
  if (message.find("compacted") != std::string::npos) return error_kind::compacted;
  if (message.find("lease not found") != std::string::npos) return error_kind::lease_not_found;
  switch (code) {
    case 1:
      return error_kind::cancelled;
    case 3:
      return error_kind::invalid_argument;
    case 4:
      return error_kind::timeout;
    default:
      return error_kind::server;
  }
}

bool worth_another_endpoint(int code) { return code == 4 || code == 13 || code == 14; }

}  // namespace troupe::etcd::detail
