#include "actors/worker/worker_environment.hpp"

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "actors/wire/connect.hpp"
#include "actors/wire/node_address.hpp"
#include "runtime/auth/credentials.hpp"

namespace troupe::actors {
namespace {

std::string env_or(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v ? std::string(v) : fallback;
}

int env_int(const char* name, int fallback) {
  const std::string v = env_or(name);
  if (v.empty()) return fallback;
  try {
    size_t used = 0;
    const int x = std::stoi(v, &used);
    if (used == v.size() && x >= 0) return x;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(std::string(name) + " must be a non-negative integer, got '" + v +
                              "'");
}

}  // namespace

bool started_by_agent() { return !env_or("TROUPE_COORDINATOR").empty(); }

worker_args worker_args_from_environment() {
  worker_args a;
  const std::string list = env_or("TROUPE_COORDINATOR");
  if (!parse_endpoints(list, a.coordinators))
    throw std::invalid_argument("TROUPE_COORDINATOR must be HOST:PORT[,HOST:PORT...], got '" +
                                list + "'");
  a.coordinator_host = a.coordinators.front().host;
  a.coordinator_port = a.coordinators.front().port;
  a.standby = env_or("TROUPE_STANDBY") == "1";
  a.member = a.standby ? -1 : env_int("TROUPE_MEMBER", -1);
  if (!a.standby && a.member < 0)
    throw std::invalid_argument("TROUPE_MEMBER (or TROUPE_STANDBY=1) must be set");
  a.node = env_int("TROUPE_NODE", 0);
  const std::string token = env_or("TROUPE_JOIN_TOKEN");
  if (token.empty()) throw std::invalid_argument("TROUPE_JOIN_TOKEN must name the job's token");
  auth::set_process_credentials(auth::load_join_token(token));
  a.advertise = resolve_node_address(choose_node_address("", ""));
  return a;
}

}  // namespace troupe::actors
