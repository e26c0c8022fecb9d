// The client's plain parts: error names, base64, key ranges and the builders of compares and
// transaction operations. The calls are in etcd_calls.cpp, their JSON in etcd_wire.cpp, the
// connections in etcd_transport.cpp and the watches in etcd_watch.cpp.

#include "runtime/etcd/etcd_client.hpp"

#include <cstdint>

namespace troupe::etcd {

const char* to_string(error_kind kind) {
  switch (kind) {
    case error_kind::unreachable:
      return "unreachable";
    case error_kind::timeout:
      return "timeout";
    case error_kind::tls:
      return "tls";
    case error_kind::protocol:
      return "protocol";
    case error_kind::compacted:
      return "compacted";
    case error_kind::lease_not_found:
      return "lease_not_found";
    case error_kind::invalid_argument:
      return "invalid_argument";
    case error_kind::server:
      return "server";
    case error_kind::cancelled:
      return "cancelled";
  }
  return "unknown";
}

// ---- base64 and key ranges ----

namespace {
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int sextet(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}
}  // namespace

std::string base64_encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const std::uint32_t v = static_cast<unsigned char>(bytes[i]) << 16 |
                            static_cast<unsigned char>(bytes[i + 1]) << 8 |
                            static_cast<unsigned char>(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(v >> s) & 63];
  }
  const std::size_t rest = bytes.size() - i;
  if (rest > 0) {
    std::uint32_t v = static_cast<unsigned char>(bytes[i]) << 16;
    if (rest == 2) v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string base64_decode(const std::string& text) {
  std::string out;
  out.reserve(text.size() / 4 * 3);
  std::uint32_t acc = 0;
  int bits = 0;
  std::size_t pad = 0;
  for (const char ch : text) {
    if (ch == '=') {
      ++pad;
      continue;
    }
    const int s = sextet(static_cast<unsigned char>(ch));
    if (s < 0 || pad > 0) throw etcd_error(error_kind::protocol, "etcd sent invalid base64");
    acc = (acc << 6) | static_cast<std::uint32_t>(s);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  if (pad > 2) throw etcd_error(error_kind::protocol, "etcd sent invalid base64");
  return out;
}

std::string prefix_range_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  // No key above every key with this prefix: etcd reads "\0" as "to the end of the keyspace".
  return std::string(1, '\0');
}

// ---- builders ----

compare compare::created(std::string key, op how, std::int64_t rev) {
  return {std::move(key), target::create_revision, how, rev, {}};
}
compare compare::modified(std::string key, op how, std::int64_t rev) {
  return {std::move(key), target::mod_revision, how, rev, {}};
}
compare compare::versioned(std::string key, op how, std::int64_t version) {
  return {std::move(key), target::version, how, version, {}};
}
compare compare::valued(std::string key, op how, std::string value) {
  return {std::move(key), target::value, how, 0, std::move(value)};
}
txn_op txn_op::put(std::string key, std::string value, std::int64_t lease) {
  return {kind::put, std::move(key), std::move(value), lease, false};
}
txn_op txn_op::del(std::string key, bool prefix) {
  return {kind::del, std::move(key), {}, 0, prefix};
}
txn_op txn_op::get(std::string key, bool prefix) {
  return {kind::get, std::move(key), {}, 0, prefix};
}

}  // namespace troupe::etcd
