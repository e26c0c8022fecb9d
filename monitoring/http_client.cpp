#include "monitoring/http_client.hpp"

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <optional>

namespace troupe::monitoring {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

http_answer http_get(const std::string& host, uint16_t port, const std::string& target,
                     const std::string& bearer, std::chrono::milliseconds deadline,
                     std::size_t max_bytes) {
  const std::string where = host + ":" + std::to_string(port);
  asio::io_context ioc(1);
  tcp::resolver resolver(ioc);
  beast::tcp_stream stream(ioc);
  beast::flat_buffer buffer;
  http::request<http::empty_body> request{http::verb::get, target, 11};
  request.set(http::field::host, host);
  request.set(http::field::user_agent, "troupe");
  request.set(http::field::connection, "close");
  if (!bearer.empty()) request.set(http::field::authorization, "Bearer " + bearer);
  http::response_parser<http::string_body> parser;
  parser.header_limit(static_cast<std::uint32_t>(std::min<std::size_t>(max_bytes, 64 * 1024)));
  parser.body_limit(max_bytes);

  std::optional<beast::error_code> outcome;
  const auto finish = [&outcome](beast::error_code ec) {
    if (!outcome) outcome = ec;
  };
  stream.expires_after(deadline);
  resolver.async_resolve(
      host, std::to_string(port),
      [&](beast::error_code ec, const tcp::resolver::results_type& results) {
        if (ec) return finish(ec);
        stream.async_connect(results, [&](beast::error_code cec, const tcp::endpoint&) {
          if (cec) return finish(cec);
          http::async_write(stream, request, [&](beast::error_code wec, std::size_t) {
            if (wec) return finish(wec);
            // The announced length is checked here too: Beast 1.74's parser lets a body
            // with a Content-Length over its body_limit through.
            http::async_read_header(
                stream, buffer, parser, [&](beast::error_code hec, std::size_t) {
                  if (hec) return finish(hec);
                  if (const auto length = parser.content_length(); length && *length > max_bytes)
                    return finish(http::error::body_limit);
                  http::async_read(stream, buffer, parser,
                                   [&](beast::error_code rec, std::size_t) { finish(rec); });
                });
          });
        });
      });
  ioc.run_for(deadline + std::chrono::milliseconds(100));
  if (!outcome) {
    stream.close();
    throw http_get_error("no answer from " + where + " within " + std::to_string(deadline.count()) +
                         " ms");
  }
  const beast::error_code ec = *outcome;
  if (ec == beast::error::timeout)
    throw http_get_error("no answer from " + where + " within " + std::to_string(deadline.count()) +
                         " ms");
  if (ec == http::error::body_limit || ec == http::error::header_limit)
    throw http_get_error("the answer from " + where + " is larger than " +
                         std::to_string(max_bytes) + " bytes");
  if (ec) throw http_get_error("cannot reach " + where + ": " + ec.message());
  const auto& response = parser.get();
  if (response.body().size() > max_bytes)
    throw http_get_error("the answer from " + where + " is larger than " +
                         std::to_string(max_bytes) + " bytes");
  http_answer answer;
  answer.status = static_cast<int>(response.result_int());
  if (const auto it = response.find(http::field::content_type); it != response.end())
    answer.content_type = std::string(it->value());
  answer.body = response.body();
  return answer;
}

}  // namespace troupe::monitoring
