#include "actors/wire/connect.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/io/middleman.hpp>
#include <charconv>
#include <cstring>
#include <thread>

#include "actors/wire/tls_transport.hpp"
#include "runtime/auth/credentials.hpp"

namespace troupe::actors {

caf::expected<uint16_t> publish_for_job(caf::actor_system& sys, const caf::actor& whom,
                                        uint16_t port, const std::string& host, bool reuse,
                                        const std::string& listener) {
  if (auth::process_credentials().valid())
    return tls_publish(sys, whom, port, host, reuse, listener);
  return sys.middleman().publish(whom, port, host.c_str(), reuse);
}

void unpublish_for_job(caf::actor_system& sys, const caf::actor& whom, uint16_t port) {
  // Every middleman actor hands unpublishing to the same BASP broker, so the plain call
  // closes a TLS doorman too.
  sys.middleman().unpublish(whom, port);
}

caf::expected<caf::actor> remote_job_actor(caf::actor_system& sys, const std::string& host,
                                           uint16_t port) {
  if (auth::process_credentials().valid()) return tls_remote_actor(sys, host, port);
  return sys.middleman().remote_actor(host, port);
}

caf::expected<caf::actor> remote_job_actor_until(caf::actor_system& sys, const std::string& host,
                                                 uint16_t port,
                                                 std::chrono::steady_clock::time_point deadline) {
  auto backoff = std::chrono::milliseconds(20);
  for (;;) {
    auto h = remote_job_actor(sys, host, port);
    if (h && *h) return h;
    // A refusal that names the reason (another job's actor) will not change by waiting.
    if (!h && sys.render(h.error()).find("belongs to job") != std::string::npos) return h;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return h;
    // Retry pacing, not a wait for a condition; the last try comes at the deadline.
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

caf::actor connect_to_coordinator(caf::actor_system& sys, const std::string& host, uint16_t port,
                                  std::chrono::milliseconds timeout, std::string& error) {
  auto h = remote_job_actor_until(sys, host, port, std::chrono::steady_clock::now() + timeout);
  if (h && *h) return *h;
  const std::string last = h ? "nothing is published there" : sys.render(h.error());
  if (last.find("belongs to job") != std::string::npos) {
    error = "cannot join the coordinator at " + host + ":" + std::to_string(port) + ": " + last;
    return {};
  }
  error = "cannot reach the coordinator at " + host + ":" + std::to_string(port) + " within " +
          std::to_string(timeout.count() / 1000) + " s (" + last +
          "); is `troupe coordinator` running there, and is the address right?";
  return {};
}

std::string local_address_toward(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found)
    return "127.0.0.1";
  std::string out = "127.0.0.1";
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    char text[INET_ADDRSTRLEN] = {};
    if (::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text) != nullptr)
      out = text;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return out;
}

bool parse_endpoint(const std::string& text, std::string& host, uint16_t& port) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) return false;
  unsigned value = 0;
  const char* first = text.data() + colon + 1;
  const char* last = text.data() + text.size();
  auto [end, ec] = std::from_chars(first, last, value);
  if (ec != std::errc() || end != last || value == 0 || value > 65535) return false;
  host = text.substr(0, colon);
  port = static_cast<uint16_t>(value);
  return true;
}

bool parse_endpoints(const std::string& text, std::vector<endpoint>& out) {
  std::vector<endpoint> list;
  size_t from = 0;
  for (;;) {
    const auto comma = text.find(',', from);
    const std::string part =
        text.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
    endpoint e;
    if (!parse_endpoint(part, e.host, e.port)) return false;
    list.push_back(std::move(e));
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  out = std::move(list);
  return true;
}

std::vector<std::string> endpoint_names(const std::vector<endpoint>& list) {
  std::vector<std::string> out;
  out.reserve(list.size());
  for (const auto& e : list) out.push_back(e.host + ":" + std::to_string(e.port));
  return out;
}

std::string endpoints_text(const std::vector<endpoint>& list) {
  std::string text;
  for (const auto& e : list)
    text += (text.empty() ? "" : ",") + e.host + ":" + std::to_string(e.port);
  return text;
}

}  // namespace troupe::actors
