#include "runtime/etcd/etcd_transport.hpp"

#include <poll.h>

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

namespace troupe::etcd {
namespace detail {

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

namespace {

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

connection::connection(net::io_context& ioc, ssl::context* tls, const endpoint& ep,
                       const std::atomic<bool>* abort)
    : ioc_(ioc), ep_(ep), abort_(abort) {
  if (ep.tls) {
    secure_.emplace(ioc, *tls);
  } else {
    plain_.emplace(ioc);
  }
}

beast::tcp_stream& connection::tcp() {
  return secure_ ? beast::get_lowest_layer(*secure_) : *plain_;
}

void connection::open(time_point deadline) {
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
std::vector<net::ip::tcp::endpoint> connection::resolve(time_point deadline) {
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

void connection::send(const std::string& target, const std::string& body, time_point deadline) {
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

void connection::read_header(response_parser& parser, time_point deadline) {
  tcp().expires_at(deadline);
  const auto ec =
      secure_ ? run_op(ioc_, abort_,
                       [&](auto h) { http::async_read_header(*secure_, buffer_, parser, h); })
              : run_op(ioc_, abort_,
                       [&](auto h) { http::async_read_header(*plain_, buffer_, parser, h); });
  if (ec) fail(ec, "read the answer");
}

void connection::read_all(response_parser& parser, time_point deadline) {
  tcp().expires_at(deadline);
  const auto ec =
      secure_
          ? run_op(ioc_, abort_, [&](auto h) { http::async_read(*secure_, buffer_, parser, h); })
          : run_op(ioc_, abort_, [&](auto h) { http::async_read(*plain_, buffer_, parser, h); });
  if (ec) fail(ec, "read the answer");
}

bool connection::read_some(response_parser& parser, time_point deadline) {
  if (parser.is_done()) return false;
  tcp().expires_at(deadline);
  const auto ec = secure_
                      ? run_op(ioc_, abort_,
                               [&](auto h) { http::async_read_some(*secure_, buffer_, parser, h); })
                      : run_op(ioc_, abort_,
                               [&](auto h) { http::async_read_some(*plain_, buffer_, parser, h); });
  if (ec == http::error::end_of_stream) return false;
  if (ec) fail(ec, "read the stream");
  return true;
}

bool connection::fit_for_reuse() {
  if (buffer_.size() != 0 || !tcp().socket().is_open()) return false;
  // Between two answers an HTTP/1.1 server has nothing to say: anything readable is its FIN,
  // a reset, or a TLS alert that precedes one.
  pollfd p{tcp().socket().native_handle(), POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 0;
}

bool connection::nothing_received(const response_parser& parser) const {
  return !parser.got_some() && buffer_.size() == 0;
}

void connection::fail(const beast::error_code& ec, const char* stage) {
  last_error_ = ec;
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
  if (ec == http::error::end_of_stream || ec == http::error::partial_message) {
    // Beast's words for a connection that ended before or inside the answer: the server went
    // away (or dropped the connection), which says nothing about what it speaks.
    throw etcd_error(error_kind::unreachable,
                     ep_.url + ": " + stage + " failed: the connection was closed " +
                         (ec == http::error::end_of_stream ? "before" : "in the middle of") +
                         " the answer");
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

// ---- answers ----

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

// ---- kept-alive connections ----

// At most this many idle connections are kept per endpoint: enough for the few threads of one
// process that call at once (a coordinator's supervisor, state writer and election), few
// enough that idle connections never add up on etcd. More concurrent calls open more
// connections, which are closed after their call.
constexpr std::size_t kMaxIdlePerEndpoint = 4;
// A connection idle this long is closed rather than reused: a firewall or NAT table may have
// forgotten it without telling either side, and a request sent into such a connection costs
// the whole request_timeout before anything can be said about it.
constexpr auto kMaxIdleTime = std::chrono::seconds(30);

// A connection with the io_context its steps run on, so that it outlives the call that
// opened it and serves whichever thread takes it next.
struct kept_connection {
  kept_connection(ssl::context* tls, const endpoint& ep) : conn(ioc, tls, ep) {}
  net::io_context ioc;
  connection conn;
  time_point idle_since{};
};

struct endpoint_pool {
  std::mutex mutex;
  std::vector<std::unique_ptr<kept_connection>> idle;  // the most recently used last
};

}  // namespace detail

// ---- the client's state ----

etcd_client::impl::impl(client_options o) : options(std::move(o)) {
  if (options.endpoints.empty()) {
    throw etcd_error(error_kind::invalid_argument, "etcd_client needs at least one endpoint");
  }
  bool any_tls = false;
  for (const auto& url : options.endpoints) {
    endpoints.push_back(detail::parse_endpoint(url));
    any_tls = any_tls || endpoints.back().tls;
  }
  if (any_tls) make_tls_context();
  for (std::size_t i = 0; i < endpoints.size(); ++i) {
    pools.push_back(std::make_unique<detail::endpoint_pool>());
  }
}

etcd_client::impl::~impl() = default;

void etcd_client::impl::make_tls_context() {
  using detail::ssl::context;
  tls = std::make_unique<context>(context::tls_client);
  tls->set_options(context::default_workarounds | context::no_sslv2 | context::no_sslv3 |
                   context::no_tlsv1 | context::no_tlsv1_1);
  boost::system::error_code ec;
  if (options.ca_file.empty()) {
    tls->set_default_verify_paths(ec);
  } else {
    tls->load_verify_file(options.ca_file, ec);
  }
  if (ec) {
    throw etcd_error(error_kind::tls,
                     "etcd_client: cannot load CA file '" + options.ca_file + "': " + ec.message());
  }
  if (!options.cert_file.empty() || !options.key_file.empty()) {
    tls->use_certificate_chain_file(options.cert_file, ec);
    if (!ec) tls->use_private_key_file(options.key_file, context::pem, ec);
    if (ec) {
      throw etcd_error(error_kind::tls, "etcd_client: cannot load client certificate '" +
                                            options.cert_file + "' / key '" + options.key_file +
                                            "': " + ec.message());
    }
  }
}

namespace detail {
namespace {

// The most recently used idle connection that is still fit to carry a request, or null.
// Connections found closed by the server, or idle too long, are closed here.
std::unique_ptr<kept_connection> take_idle(endpoint_pool& pool) {
  for (;;) {
    std::unique_ptr<kept_connection> c;
    {
      std::lock_guard lock(pool.mutex);
      if (pool.idle.empty()) return nullptr;
      c = std::move(pool.idle.back());
      pool.idle.pop_back();
    }
    if (clock_type::now() - c->idle_since < kMaxIdleTime && c->conn.fit_for_reuse()) return c;
  }
}

void give_back(endpoint_pool& pool, std::unique_ptr<kept_connection> c) {
  c->idle_since = clock_type::now();
  std::lock_guard lock(pool.mutex);
  if (pool.idle.size() < kMaxIdlePerEndpoint) pool.idle.push_back(std::move(c));
}

// When a kept-alive connection breaks during a call, may the call be sent again on a fresh
// connection to the same endpoint? Only when the request certainly did nothing, since a
// second txn or put would otherwise be applied twice:
//  - Before a connection is reused, fit_for_reuse() checks that the server has not closed it.
//    A closed one is dropped before a byte is written: no question arises.
//  - The send failed: the server never had the whole request (etcd's gateway decodes a body
//    only once its last byte is in), so it cannot have acted on it. Sent again, any call.
//  - The send went through and the connection ended (FIN, reset, TLS truncation) before one
//    byte of the answer. This is what a server closing an idle connection looks like when its
//    close crosses our request on the wire, but it is also what a member looks like that
//    applied the request and died before answering: the two cannot be told apart from here.
//    Reads, lease keepalives and revokes (replay::safe) are sent again, since a repeat changes
//    nothing; writes (replay::unsafe) are not, and fail this endpoint as they always did.
//  - A timeout, or a failure after the first byte of the answer: never sent again here.
// Only a connection that carried an earlier request is retried, and only once: a fresh
// connection that breaks is a failing member, which the failover in post() deals with. That
// failover sends the call to the next member after any such failure, as before connections
// were kept: callers whose writes must not run twice check what is there afterwards.
enum class broke { no, unsent, unanswered, other };

bool may_resend(broke how, replay what) {
  return how == broke::unsent || (how == broke::unanswered && what == replay::safe);
}

bool closed_by_peer(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == net::error::eof ||
         ec == net::error::connection_reset || ec == net::error::broken_pipe ||
         ec == net::error::connection_aborted || ec == ssl::error::stream_truncated;
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

struct answer {
  unsigned status = 0;
  std::string body;
  bool reusable = false;  // read to its end, and the server keeps the connection open
};

// One request and its whole answer on an open connection. On failure, `how` says how far it
// got (see may_resend).
//
// An answer is read within max_response_bytes: one that announces more is refused from its
// header, before a byte of its body is read; one that sends more without saying so is cut off
// at the limit. Either is a protocol error that says the size, so that a stand-in or a
// misconfigured proxy is reported for what it is.
answer request_on(etcd_client::impl& client, connection& conn, const endpoint& ep,
                  const std::string& target, const std::string& body, time_point deadline,
                  broke& how) {
  response_parser parser;
  const std::size_t limit = client.options.max_response_bytes;
  parser.header_limit(64u << 10);
  parser.body_limit(limit);
  const auto too_large = [&](const std::string& size) {
    return attempt_failure{
        etcd_error(error_kind::protocol, "etcd at " + ep.url + " answered " + target + " with " +
                                             size + "; the limit is " + size_text(limit) +
                                             " (is this etcd's client URL?)"),
        true};
  };
  try {
    how = broke::unsent;
    conn.send(target, body, deadline);
    how = broke::other;
    conn.read_header(parser, deadline);
    if (const auto length = parser.content_length(); length && *length > limit)
      throw too_large("a body of " + size_text(*length));
    conn.read_all(parser, deadline);
  } catch (const etcd_error& e) {
    if (e.kind() == error_kind::timeout || e.kind() == error_kind::cancelled) {
      how = broke::other;  // the call's time is up: nothing is sent again
    } else if (how == broke::other && conn.nothing_received(parser) &&
               closed_by_peer(conn.last_error())) {
      how = broke::unanswered;
    }
    if (e.kind() == error_kind::protocol && parser.is_header_done() && !parser.is_done()) {
      // Beast refuses a Content-Length over the limit as it reads the header.
      const auto length = parser.content_length();
      throw too_large(length && *length > limit ? "a body of " + size_text(*length)
                                                : "more than " + size_text(limit));
    }
    throw attempt_failure{e, true};
  }
  how = broke::no;
  auto& response = parser.get();
  return {response.result_int(), std::move(response.body()), response.keep_alive()};
}

// One call on one endpoint, over a kept-alive connection when one is fit, else a new one.
json post_once(etcd_client::impl& client, std::size_t index, const std::string& target,
               const std::string& body, time_point deadline, replay what) {
  const endpoint& ep = client.endpoints[index];
  endpoint_pool& pool = *client.pools[index];
  std::unique_ptr<kept_connection> c = take_idle(pool);
  for (;;) {
    const bool reused = c != nullptr;
    if (!reused) {
      c = std::make_unique<kept_connection>(client.tls.get(), ep);
      try {
        c->conn.open(deadline);
      } catch (const etcd_error& e) {
        throw attempt_failure{e, true};
      }
    }
    broke how = broke::no;
    try {
      answer a = request_on(client, c->conn, ep, target, body, deadline, how);
      // An error answer read to its end leaves the connection as good as a success does.
      if (a.reusable && c->conn.fit_for_reuse()) give_back(pool, std::move(c));
      return parse_answer(ep, target, a.status, a.body);
    } catch (attempt_failure&) {
      if (how == broke::no || !reused || !may_resend(how, what)) throw;
      c.reset();  // once more, on a new connection
    }
  }
}

}  // namespace

// A write that timed out may still have been applied before the next endpoint repeats it;
// callers whose writes are not idempotent (campaigns) check what is there afterwards.
json post(etcd_client::impl& client, const std::string& target, const json& body,
          const call_options& call, replay what) {
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
      json answer = post_once(client, index, target, text, deadline, what);
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

}  // namespace detail
}  // namespace troupe::etcd
