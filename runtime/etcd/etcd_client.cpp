#include "runtime/etcd/etcd_client.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

namespace troupe::etcd {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;
using time_point = clock_type::time_point;

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

// ---- JSON shapes of the gateway ----

namespace {

// The gateway writes int64 fields as JSON strings and leaves out every field that is zero.
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

json range_body(const std::string& key, bool prefix, std::int64_t limit = 0) {
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

// Maps the gRPC status the gateway forwards ({"error", "message", "code"}) to an error kind.
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

// gRPC codes after which another member may still answer: unavailable (no leader, stopping),
// deadline exceeded (a request timed out inside the member) and internal.
bool worth_another_endpoint(int code) { return code == 4 || code == 13 || code == 14; }

struct endpoint {
  std::string url;
  std::string host;
  std::string port;
  bool tls = false;
};

endpoint parse_endpoint(const std::string& url) {
  endpoint ep;
  ep.url = url;
  std::string rest;
  if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    rest = url.substr(8);
    ep.tls = true;
  } else {
    throw etcd_error(error_kind::invalid_argument,
                     "etcd endpoint '" + url + "' must start with http:// or https://");
  }
  if (const auto slash = rest.find('/'); slash != std::string::npos) rest.resize(slash);
  std::string host = rest;
  std::string port;
  if (!rest.empty() && rest.front() == '[') {  // [v6]:port
    const auto close = rest.find(']');
    if (close == std::string::npos) {
      throw etcd_error(error_kind::invalid_argument, "etcd endpoint '" + url + "': bad IPv6");
    }
    host = rest.substr(1, close - 1);
    if (close + 1 < rest.size() && rest[close + 1] == ':') port = rest.substr(close + 2);
  } else if (const auto colon = rest.rfind(':'); colon != std::string::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty()) {
    throw etcd_error(error_kind::invalid_argument, "etcd endpoint '" + url + "' has no host");
  }
  ep.host = host;
  ep.port = port.empty() ? (ep.tls ? "443" : "80") : port;
  return ep;
}

bool is_tls_error(const beast::error_code& ec) {
  return ec.category() == net::error::get_ssl_category() || ec == ssl::error::stream_truncated;
}

std::string ms_text(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

// Runs one asynchronous operation to completion on a private io_context. The stream's own
// expiry (tcp_stream::expires_at) bounds it. To end it early from another thread, set `abort`
// and then call ioc.stop(): whichever of the two this thread sees first, it does not block.
template <class Start>
beast::error_code run_op(net::io_context& ioc, const std::atomic<bool>* abort, Start start) {
  beast::error_code result = net::error::operation_aborted;
  bool done = false;
  start([&](beast::error_code ec, auto&&...) {
    result = ec;
    done = true;
  });
  ioc.restart();
  if (abort == nullptr || !abort->load()) ioc.run();
  return done ? result : beast::error_code(net::error::operation_aborted);
}

}  // namespace

// ---- one HTTP connection to one endpoint ----

struct etcd_client::impl {
  client_options options;
  std::vector<endpoint> endpoints;
  std::unique_ptr<ssl::context> tls;
  std::atomic<std::size_t> preferred{0};  // the endpoint that answered last

  explicit impl(client_options o) : options(std::move(o)) {
    if (options.endpoints.empty()) {
      throw etcd_error(error_kind::invalid_argument, "etcd_client needs at least one endpoint");
    }
    bool any_tls = false;
    for (const auto& url : options.endpoints) {
      endpoints.push_back(parse_endpoint(url));
      any_tls = any_tls || endpoints.back().tls;
    }
    if (any_tls) make_tls_context();
  }

  void make_tls_context() {
    tls = std::make_unique<ssl::context>(ssl::context::tls_client);
    tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                     ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
    beast::error_code ec;
    if (options.ca_file.empty()) {
      tls->set_default_verify_paths(ec);
    } else {
      tls->load_verify_file(options.ca_file, ec);
    }
    if (ec) {
      throw etcd_error(error_kind::tls, "etcd_client: cannot load CA file '" + options.ca_file +
                                            "': " + ec.message());
    }
    if (!options.cert_file.empty() || !options.key_file.empty()) {
      tls->use_certificate_chain_file(options.cert_file, ec);
      if (!ec) tls->use_private_key_file(options.key_file, ssl::context::pem, ec);
      if (ec) {
        throw etcd_error(error_kind::tls, "etcd_client: cannot load client certificate '" +
                                              options.cert_file + "' / key '" + options.key_file +
                                              "': " + ec.message());
      }
    }
  }
};

namespace {

// One connection to one endpoint: plain TCP or TLS, every step bounded by its deadline.
class connection {
 public:
  connection(net::io_context& ioc, etcd_client::impl& client, const endpoint& ep,
             const std::atomic<bool>* abort = nullptr)
      : ioc_(ioc), ep_(ep), abort_(abort) {
    if (ep.tls) {
      secure_.emplace(ioc, *client.tls);
    } else {
      plain_.emplace(ioc);
    }
  }

  beast::tcp_stream& tcp() { return secure_ ? beast::get_lowest_layer(*secure_) : *plain_; }

  void open(time_point deadline) {
    beast::error_code ec;
    const net::ip::address numeric = net::ip::make_address(ep_.host, ec);
    const bool is_numeric = !ec;
    std::vector<net::ip::tcp::endpoint> targets;
    if (is_numeric) {
      targets.emplace_back(numeric, static_cast<unsigned short>(std::stoi(ep_.port)));
    } else {
      targets = resolve(deadline);
    }
    tcp().expires_at(deadline);
    ec = run_op(ioc_, abort_, [&](auto h) { tcp().async_connect(targets, h); });
    if (ec) fail(ec, "connect");
    if (secure_) {
      if (!is_numeric) {
        // Server name indication for names; IP addresses are checked against the IP SANs.
        SSL_set_tlsext_host_name(secure_->native_handle(), ep_.host.c_str());
      }
      secure_->set_verify_mode(ssl::verify_peer);
      secure_->set_verify_callback(ssl::host_name_verification(ep_.host));
      ec = run_op(ioc_, abort_,
                  [&](auto h) { secure_->async_handshake(ssl::stream_base::client, h); });
      if (ec) fail(ec, "TLS handshake");
    }
  }

  // getaddrinfo cannot be interrupted, so it runs on a thread of its own that may outlive this
  // call; the caller waits for it only until its deadline.
  std::vector<net::ip::tcp::endpoint> resolve(time_point deadline) {
    struct result {
      std::mutex mutex;
      std::condition_variable done_cv;
      bool done = false;
      beast::error_code ec;
      std::vector<net::ip::tcp::endpoint> found;
    };
    auto r = std::make_shared<result>();
    std::thread([r, host = ep_.host, port = ep_.port] {
      net::io_context ioc;
      net::ip::tcp::resolver resolver(ioc);
      beast::error_code ec;
      const auto answers = resolver.resolve(host, port, ec);
      std::lock_guard lock(r->mutex);
      r->ec = ec;
      if (!ec) {
        for (const auto& a : answers) r->found.push_back(a.endpoint());
      }
      r->done = true;
      r->done_cv.notify_all();
    }).detach();
    std::unique_lock lock(r->mutex);
    if (!r->done_cv.wait_until(lock, deadline, [&] { return r->done; })) {
      fail(beast::error::timeout, "resolve");
    }
    if (r->ec || r->found.empty()) fail(r->ec ? r->ec : net::error::host_not_found, "resolve");
    return r->found;
  }

  void send(const std::string& target, const std::string& body, time_point deadline) {
    http::request<http::string_body> req{http::verb::post, target, 11};
    req.set(http::field::host, ep_.host + ":" + ep_.port);
    req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    tcp().expires_at(deadline);
    const auto ec = secure_
                        ? run_op(ioc_, abort_, [&](auto h) { http::async_write(*secure_, req, h); })
                        : run_op(ioc_, abort_, [&](auto h) { http::async_write(*plain_, req, h); });
    if (ec) fail(ec, "send");
  }

  template <class Parser>
  void read_header(Parser& parser, time_point deadline) {
    tcp().expires_at(deadline);
    const auto ec =
        secure_ ? run_op(ioc_, abort_,
                         [&](auto h) { http::async_read_header(*secure_, buffer_, parser, h); })
                : run_op(ioc_, abort_,
                         [&](auto h) { http::async_read_header(*plain_, buffer_, parser, h); });
    if (ec) fail(ec, "read the answer");
  }

  template <class Parser>
  void read_all(Parser& parser, time_point deadline) {
    tcp().expires_at(deadline);
    const auto ec =
        secure_
            ? run_op(ioc_, abort_, [&](auto h) { http::async_read(*secure_, buffer_, parser, h); })
            : run_op(ioc_, abort_, [&](auto h) { http::async_read(*plain_, buffer_, parser, h); });
    if (ec) fail(ec, "read the answer");
  }

  /// One read of whatever arrives next; returns false at the end of the message.
  template <class Parser>
  bool read_some(Parser& parser, time_point deadline) {
    if (parser.is_done()) return false;
    tcp().expires_at(deadline);
    const auto ec =
        secure_ ? run_op(ioc_, abort_,
                         [&](auto h) { http::async_read_some(*secure_, buffer_, parser, h); })
                : run_op(ioc_, abort_,
                         [&](auto h) { http::async_read_some(*plain_, buffer_, parser, h); });
    if (ec == http::error::end_of_stream) return false;
    if (ec) fail(ec, "read the stream");
    return true;
  }

  [[noreturn]] void fail(const beast::error_code& ec, const char* stage) {
    if (ec == beast::error::timeout) {
      throw etcd_error(error_kind::timeout,
                       ep_.url + ": no answer in time (" + stage + " timed out)");
    }
    if (ec == net::error::operation_aborted) {
      throw etcd_error(error_kind::cancelled, ep_.url + ": " + stage + " cancelled");
    }
    if (is_tls_error(ec)) {
      throw etcd_error(error_kind::tls,
                       ep_.url + ": " + stage + " failed: " + ec.message() +
                           " (check that ca_file signs the server's certificate, that the "
                           "certificate names this host, and cert_file/key_file when etcd "
                           "runs with --client-cert-auth)");
    }
    if (ec == http::error::body_limit || ec == http::error::header_limit ||
        ec.category() == http::make_error_code(http::error::bad_version).category()) {
      throw etcd_error(error_kind::protocol,
                       ep_.url + ": " + stage + ": " + ec.message() +
                           " (is this etcd's client port, and is the answer within "
                           "max_response_bytes?)");
    }
    throw etcd_error(error_kind::unreachable, ep_.url + ": " + stage + " failed: " + ec.message());
  }

 private:
  net::io_context& ioc_;
  const endpoint& ep_;
  const std::atomic<bool>* abort_;
  std::optional<beast::tcp_stream> plain_;
  std::optional<beast::ssl_stream<beast::tcp_stream>> secure_;
  // Bytes read ahead of the parser: it takes them as they come, so a large body never sits
  // here whole.
  beast::flat_buffer buffer_{256u << 10};
};

// The JSON answer of one endpoint, or an error that says whether another endpoint may do.
struct attempt_failure {
  etcd_error error;
  bool try_next;
};

json parse_answer(const endpoint& ep, const std::string& target, unsigned status,
                  const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    throw attempt_failure{
        etcd_error(error_kind::protocol,
                   ep.url + target + ": HTTP " + std::to_string(status) +
                       " with an answer that is not JSON (is this etcd's client URL, and "
                       "is etcd 3.4 or newer serving the v3 gateway?)"),
        true};
  }
  // Streamed calls (keepalive) wrap their message in "result"; their errors in "error".
  if (const auto r = j.find("result"); r != j.end() && r->is_object()) return *r;
  const auto err = j.find("error");
  if (status != 200 || err != j.end()) {
    int code = 0;
    std::string message;
    if (const auto c = j.find("code"); c != j.end() && c->is_number_integer()) {
      code = c->get<int>();
    }
    if (const auto m = j.find("message"); m != j.end() && m->is_string()) {
      message = m->get<std::string>();
    } else if (err != j.end() && err->is_object()) {
      message = err->value("message", std::string());
      if (const auto c = err->find("grpc_code"); c != err->end() && c->is_number_integer()) {
        code = c->get<int>();
      }
    } else if (err != j.end() && err->is_string()) {
      message = err->get<std::string>();
    }
    if (message.empty()) message = "HTTP " + std::to_string(status);
    throw attempt_failure{etcd_error(kind_of_status(code, message),
                                     ep.url + target + ": etcd refused the request: " + message),
                          worth_another_endpoint(code)};
  }
  return j;
}

// "16 MiB", "50000000 bytes (47.7 MiB)": sizes as an error message says them.
std::string size_text(std::uint64_t bytes) {
  char buf[64];
  if (bytes % (1u << 20) == 0) {
    std::snprintf(buf, sizeof buf, "%llu MiB", static_cast<unsigned long long>(bytes >> 20));
  } else {
    std::snprintf(buf, sizeof buf, "%llu bytes (%.1f MiB)", static_cast<unsigned long long>(bytes),
                  static_cast<double>(bytes) / (1 << 20));
  }
  return buf;
}

// An answer is read within max_response_bytes: one that announces more is refused from its
// header, before a byte of its body is read; one that sends more without saying so is cut off
// at the limit. Either is a protocol error that says the size, so that a stand-in or a
// misconfigured proxy is reported for what it is.
json post_once(etcd_client::impl& client, const endpoint& ep, const std::string& target,
               const std::string& body, time_point deadline) {
  net::io_context ioc;
  connection conn(ioc, client, ep);
  http::response_parser<http::string_body> parser;
  const std::size_t limit = client.options.max_response_bytes;
  parser.header_limit(64u << 10);
  parser.body_limit(limit);
  const auto too_large = [&](const std::string& how) {
    return attempt_failure{
        etcd_error(error_kind::protocol, "etcd at " + ep.url + " answered " + target + " with " +
                                             how + "; the limit is " + size_text(limit) +
                                             " (is this etcd's client URL?)"),
        true};
  };
  try {
    conn.open(deadline);
    conn.send(target, body, deadline);
    conn.read_header(parser, deadline);
    if (const auto length = parser.content_length(); length && *length > limit)
      throw too_large("a body of " + size_text(*length));
    conn.read_all(parser, deadline);
  } catch (const etcd_error& e) {
    if (e.kind() == error_kind::protocol && parser.is_header_done() && !parser.is_done()) {
      // Beast refuses a Content-Length over the limit as it reads the header.
      const auto length = parser.content_length();
      throw too_large(length && *length > limit ? "a body of " + size_text(*length)
                                                : "more than " + size_text(limit));
    }
    throw attempt_failure{e, true};
  }
  return parse_answer(ep, target, parser.get().result_int(), parser.get().body());
}

// Posts to each endpoint in turn, starting from the one that answered last, until one answers.
// A write that timed out may still have been applied before the next endpoint repeats it;
// callers whose writes are not idempotent (campaigns) check what is there afterwards.
json post(etcd_client::impl& client, const std::string& target, const json& body,
          const call_options& call) {
  const std::string text = body.dump();
  const std::size_t n = client.endpoints.size();
  const std::size_t first = client.preferred.load();
  std::string tried;
  bool any_tls = false;
  bool any_timeout = false;
  error_kind last_kind = error_kind::unreachable;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t index = (first + i) % n;
    const auto now = clock_type::now();
    auto deadline = now + client.options.request_timeout;
    if (call.deadline) {
      if (*call.deadline <= now) {
        any_timeout = true;
        tried += tried.empty() ? "" : "; ";
        tried += "call deadline passed before " + client.endpoints[index].url + " was tried";
        break;
      }
      deadline = std::min(deadline, *call.deadline);
    }
    try {
      json answer = post_once(client, client.endpoints[index], target, text, deadline);
      client.preferred.store(index);
      return answer;
    } catch (attempt_failure& f) {
      if (!f.try_next) throw f.error;
      any_tls = any_tls || f.error.kind() == error_kind::tls;
      any_timeout = any_timeout || f.error.kind() == error_kind::timeout;
      last_kind = f.error.kind();
      tried += tried.empty() ? "" : "; ";
      tried += f.error.what();
    }
  }
  const error_kind kind = any_tls ? error_kind::tls : any_timeout ? error_kind::timeout : last_kind;
  throw etcd_error(kind, "etcd " + target + " failed on every endpoint (" + tried +
                             "); check that etcd is running at client_options.endpoints "
                             "(per-endpoint timeout " +
                             ms_text(client.options.request_timeout) + ")");
}

}  // namespace

// ---- the calls ----

etcd_client::etcd_client(client_options options)
    : impl_(std::make_shared<impl>(std::move(options))) {}
etcd_client::~etcd_client() = default;

const client_options& etcd_client::options() const { return impl_->options; }

std::optional<key_value> etcd_client::get(const std::string& key, const call_options& call) {
  const json answer = post(*impl_, "/v3/kv/range", range_body(key, false), call);
  auto kvs = parse_kvs(answer);
  if (kvs.empty()) return std::nullopt;
  return std::move(kvs.front());
}

range_result etcd_client::get_prefix(const std::string& prefix, std::int64_t limit,
                                     const call_options& call) {
  const json answer = post(*impl_, "/v3/kv/range", range_body(prefix, true, limit), call);
  range_result r;
  r.kvs = parse_kvs(answer);
  r.revision = header_revision(answer);
  r.count = int_field(answer, "count");
  return r;
}

std::int64_t etcd_client::put(const std::string& key, const std::string& value, std::int64_t lease,
                              const call_options& call) {
  return header_revision(post(*impl_, "/v3/kv/put", put_body(key, value, lease), call));
}

std::int64_t etcd_client::del(const std::string& key, bool prefix, const call_options& call) {
  return int_field(post(*impl_, "/v3/kv/deleterange", delete_body(key, prefix), call), "deleted");
}

txn_result etcd_client::txn(const txn_request& request, const call_options& call) {
  json body = {{"compare", json::array()}, {"success", json::array()}, {"failure", json::array()}};
  for (const auto& c : request.compares) body["compare"].push_back(compare_body(c));
  for (const auto& op : request.then) body["success"].push_back(op_body(op));
  for (const auto& op : request.otherwise) body["failure"].push_back(op_body(op));
  const json answer = post(*impl_, "/v3/kv/txn", body, call);
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
       json{{"revision", std::to_string(revision)}, {"physical", true}}, call);
}

std::int64_t etcd_client::lease_grant(std::chrono::seconds ttl, const call_options& call) {
  const json answer =
      post(*impl_, "/v3/lease/grant", json{{"TTL", std::to_string(ttl.count())}}, call);
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
  const json answer = post(*impl_, "/v3/lease/keepalive", json{{"ID", std::to_string(id)}}, call);
  return std::max<std::int64_t>(0, int_field(answer, "TTL"));
}

std::int64_t etcd_client::lease_time_to_live(std::int64_t id, const call_options& call) {
  return int_field(post(*impl_, "/v3/lease/timetolive", json{{"ID", std::to_string(id)}}, call),
                   "TTL");
}

void etcd_client::lease_revoke(std::int64_t id, const call_options& call) {
  try {
    post(*impl_, "/v3/lease/revoke", json{{"ID", std::to_string(id)}}, call);
  } catch (const etcd_error& e) {
    if (e.kind() != error_kind::lease_not_found) throw;
  }
}

// ---- watch ----

namespace {

class stream_watcher final : public watcher {
 public:
  stream_watcher(std::shared_ptr<etcd_client::impl> client, watch_request request,
                 watch_callback on_events, watch_error_callback on_error)
      : client_(std::move(client)),
        request_(std::move(request)),
        on_events_(std::move(on_events)),
        on_error_(std::move(on_error)),
        next_revision_(request_.start_revision) {
    thread_ = std::thread([this] { run(); });
  }

  ~stream_watcher() override { cancel(); }

  void cancel() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    abort_ = true;
    ioc_.stop();
    wake_.notify_all();
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }

  std::int64_t next_revision() const override { return next_revision_.load(); }

 private:
  bool stopping() {
    std::lock_guard lock(mutex_);
    return stop_;
  }

  void report(const etcd_error& e) {
    if (on_error_ && !stopping()) on_error_(e);
  }

  void run() {
    auto delay = request_.retry_delay;
    std::size_t index = client_->preferred.load();
    while (!stopping()) {
      const endpoint& ep = client_->endpoints[index % client_->endpoints.size()];
      bool delivered = false;
      bool idle = false;
      try {
        if (stream(ep, delivered, idle)) return;  // compacted: the owner must re-read
      } catch (const etcd_error& e) {
        if (stopping()) return;
        report(e);
      }
      ++index;  // the next attempt goes to the next member
      if (idle) continue;
      if (delivered) delay = request_.retry_delay;
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, delay, [this] { return stop_; });
      delay = std::min<std::chrono::milliseconds>(delay * 2, std::chrono::milliseconds(1000));
    }
  }

  // One stream from open to break. Returns true when the watch must end (compacted).
  bool stream(const endpoint& ep, bool& delivered, bool& idle) {
    json create = range_body(request_.key, request_.prefix);
    if (next_revision_ > 0) create["start_revision"] = std::to_string(next_revision_.load());
    const std::string body = json{{"create_request", create}}.dump();

    connection conn(ioc_, *client_, ep, &abort_);
    const auto open_deadline = clock_type::now() + client_->options.request_timeout;
    conn.open(open_deadline);
    conn.send("/v3/watch", body, open_deadline);
    http::response_parser<http::string_body> parser;
    parser.body_limit(boost::none);  // a watch never ends; each message is bounded instead
    conn.read_header(parser, open_deadline);
    if (parser.get().result_int() != 200) {
      conn.read_all(parser, clock_type::now() + client_->options.request_timeout);
      parse_answer(ep, "/v3/watch", parser.get().result_int(), parser.get().body());
      throw etcd_error(error_kind::protocol,
                       ep.url + "/v3/watch: HTTP " + std::to_string(parser.get().result_int()));
    }
    std::string& pending = parser.get().body();
    while (!stopping()) {
      bool more = false;
      try {
        more = conn.read_some(parser, clock_type::now() + request_.idle_timeout);
      } catch (const etcd_error& e) {
        if (e.kind() != error_kind::timeout) throw;
        // Silence is not an error: a quiet key sends nothing. Reopening (on the next member)
        // only guards against a member that is paused or cut off from the others.
        idle = true;
        return false;
      }
      if (!more) throw etcd_error(error_kind::unreachable, ep.url + "/v3/watch: the stream ended");
      std::size_t start = 0;
      for (std::size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
        if (nl > start && handle(ep, pending.substr(start, nl - start), delivered)) return true;
      }
      pending.erase(0, start);
      if (pending.size() > client_->options.max_response_bytes) {
        throw etcd_error(error_kind::protocol,
                         ep.url + "/v3/watch: a message larger than max_response_bytes");
      }
    }
    return false;
  }

  // One message of the stream. Returns true when the watch must end.
  bool handle(const endpoint& ep, const std::string& line, bool& delivered) {
    json answer;
    try {
      answer = parse_answer(ep, "/v3/watch", 200, line);
    } catch (attempt_failure& f) {
      throw f.error;
    }
    if (answer.value("canceled", false)) {
      const std::int64_t compact = int_field(answer, "compact_revision");
      if (compact > 0) {
        if (on_error_ && !stopping()) {
          on_error_(etcd_error(error_kind::compacted,
                               ep.url + "/v3/watch: revision " +
                                   std::to_string(next_revision_.load()) +
                                   " is compacted (oldest kept: " + std::to_string(compact) +
                                   "); read the current state and watch again from its revision"));
        }
        return true;
      }
      throw etcd_error(error_kind::server,
                       ep.url + "/v3/watch: etcd cancelled the watch: " +
                           answer.value("cancel_reason", std::string("no reason given")));
    }
    if (answer.value("created", false) && next_revision_ == 0) {
      // Resuming "from now" after a break would skip what happened in between: pin it.
      next_revision_ = header_revision(answer) + 1;
    }
    std::vector<watch_event> events;
    if (const auto it = answer.find("events"); it != answer.end() && it->is_array()) {
      for (const auto& e : *it) {
        watch_event ev;
        ev.what = e.value("type", std::string()) == "DELETE" ? watch_event::type::del
                                                             : watch_event::type::put;
        if (const auto kv = e.find("kv"); kv != e.end()) ev.kv = parse_kv(*kv);
        events.push_back(std::move(ev));
      }
    }
    if (!events.empty()) {
      next_revision_ = events.back().kv.mod_revision + 1;
      delivered = true;
      if (on_events_ && !stopping()) on_events_(events);
    }
    return false;
  }

  std::shared_ptr<etcd_client::impl> client_;
  watch_request request_;
  watch_callback on_events_;
  watch_error_callback on_error_;
  std::atomic<std::int64_t> next_revision_;
  net::io_context ioc_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::atomic<bool> abort_{false};  // stop_ for run_op, which cannot take the mutex
  std::thread thread_;
};

}  // namespace

std::unique_ptr<watcher> etcd_client::watch(watch_request request, watch_callback on_events,
                                            watch_error_callback on_error) {
  return std::make_unique<stream_watcher>(impl_, std::move(request), std::move(on_events),
                                          std::move(on_error));
}

}  // namespace troupe::etcd
