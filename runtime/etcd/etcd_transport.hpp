#pragma once
// How the client reaches etcd: HTTP/1.1 connections to its members (plain TCP or TLS), unary
// calls over connections kept alive in a small pool per member, and the failover of one call
// across members. Internal to troupe_etcd (etcd_calls.cpp, etcd_watch.cpp); users include
// etcd_client.hpp.

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/etcd/etcd_client.hpp"
#include "runtime/etcd/etcd_wire.hpp"

namespace troupe::etcd {
namespace detail {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using clock_type = std::chrono::steady_clock;
using time_point = clock_type::time_point;
using response_parser = http::response_parser<http::string_body>;

struct endpoint {
  std::string url;
  std::string host;
  std::string port;
  bool tls = false;
};

/// "http://host:port" or "https://[v6]:port"; throws etcd_error(invalid_argument).
endpoint parse_endpoint(const std::string& url);

/// One connection to one endpoint: plain TCP or TLS, every step bounded by its deadline and
/// run on `ioc` by the calling thread. Each failing step throws etcd_error.
class connection {
 public:
  /// `tls` is needed for an https endpoint. To end a step early from another thread, set
  /// *abort and then stop `ioc`.
  connection(net::io_context& ioc, ssl::context* tls, const endpoint& ep,
             const std::atomic<bool>* abort = nullptr);

  void open(time_point deadline);
  void send(const std::string& target, const std::string& body, time_point deadline);
  void read_header(response_parser& parser, time_point deadline);
  void read_all(response_parser& parser, time_point deadline);
  /// One read of whatever arrives next; returns false at the end of the message.
  bool read_some(response_parser& parser, time_point deadline);

  /// Whether this connection, between two requests, is still fit to carry the next one: the
  /// server has neither closed it nor sent anything unasked, and no byte is left over from
  /// the last answer. It does not wait.
  bool fit_for_reuse();
  /// Nothing of an answer has arrived: no byte read and none waiting in the read buffer.
  bool nothing_received(const response_parser& parser) const;
  /// The error of the last step that failed.
  const beast::error_code& last_error() const { return last_error_; }

 private:
  beast::tcp_stream& tcp();
  std::vector<net::ip::tcp::endpoint> resolve(time_point deadline);
  [[noreturn]] void fail(const beast::error_code& ec, const char* stage);

  net::io_context& ioc_;
  const endpoint& ep_;
  const std::atomic<bool>* abort_;
  std::optional<beast::tcp_stream> plain_;
  std::optional<beast::ssl_stream<beast::tcp_stream>> secure_;
  // Bytes read ahead of the parser: it takes them as they come, so a large body never sits
  // here whole.
  beast::flat_buffer buffer_{256u << 10};
  beast::error_code last_error_;
};

/// A failed attempt on one endpoint, and whether another endpoint may do better.
struct attempt_failure {
  etcd_error error;
  bool try_next;
};

/// The JSON answer of one endpoint; throws attempt_failure for an error answer or one that is
/// not JSON.
json parse_answer(const endpoint& ep, const std::string& target, unsigned status,
                  const std::string& body);

/// Whether a request may be sent a second time when a kept-alive connection broke after it was
/// sent and before any byte of the answer came (see may_resend in etcd_transport.cpp).
enum class replay {
  safe,    ///< reads, and calls whose repeat changes nothing (lease keepalive, revoke)
  unsafe,  ///< writes: a repeat would apply them twice
};

/// The idle connections kept for one endpoint (defined in etcd_transport.cpp).
struct endpoint_pool;

}  // namespace detail

struct etcd_client::impl {
  client_options options;
  std::vector<detail::endpoint> endpoints;
  std::unique_ptr<detail::ssl::context> tls;
  std::atomic<std::size_t> preferred{0};                      // the endpoint that answered last
  std::vector<std::unique_ptr<detail::endpoint_pool>> pools;  // one per endpoint, same order

  explicit impl(client_options o);
  ~impl();
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;

 private:
  void make_tls_context();
};

namespace detail {

/// Posts one unary call to each endpoint in turn, starting from the one that answered last,
/// until one answers; returns its JSON answer or throws etcd_error.
json post(etcd_client::impl& client, const std::string& target, const json& body,
          const call_options& call, replay how);

}  // namespace detail
}  // namespace troupe::etcd
