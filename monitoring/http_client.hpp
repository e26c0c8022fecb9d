// A small, bounded HTTP/1.1 GET for troupe's own tools (`troupe status`, `troupe top`): one
// request, one answer, with a deadline for the whole exchange and a cap on what is read.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace troupe::monitoring {

/// Nothing usable came back: no connection, the deadline passed, the answer was too large or
/// not HTTP. The message says which, with the address.
class http_get_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct http_answer {
  int status = 0;
  std::string content_type;
  std::string body;
};

/// GET http://host:port/target, with `Authorization: Bearer <bearer>` when bearer is not
/// empty. Everything (resolving, connecting, writing, reading) must finish within `deadline`;
/// an answer whose headers or body exceed `max_bytes` is refused. Any HTTP status is returned;
/// only a failed exchange throws http_get_error.
http_answer http_get(const std::string& host, uint16_t port, const std::string& target,
                     const std::string& bearer = {},
                     std::chrono::milliseconds deadline = std::chrono::milliseconds(5000),
                     std::size_t max_bytes = 4 * 1024 * 1024);

}  // namespace troupe::monitoring
