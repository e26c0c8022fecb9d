#include "actors/wire/node_address.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

namespace troupe::actors {
namespace {

struct interface_entry {
  std::string name;
  bool up = false;
  std::vector<in_addr> v4;
};

/// This host's interfaces, in the kernel's order, with their IPv4 addresses.
std::vector<interface_entry> host_interfaces() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::unique_ptr<ifaddrs, decltype(&::freeifaddrs)> owned(list, &::freeifaddrs);
  std::vector<interface_entry> out;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_name == nullptr) continue;
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const interface_entry& e) { return e.name == i->ifa_name; });
    if (it == out.end()) {
      out.push_back({i->ifa_name, false, {}});
      it = out.end() - 1;
    }
    it->up = it->up || (i->ifa_flags & IFF_UP) != 0;
    if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET)
      it->v4.push_back(reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr);
  }
  return out;
}

std::string text_of(const in_addr& a) {
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a, text, sizeof text);
  return text;
}

std::string env_value(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

[[noreturn]] void refuse(const address_choice& c, const std::string& why) {
  const std::string given = c.from.rfind("--", 0) == 0
                                ? c.from + " " + (c.iface.empty() ? c.advertise : c.iface)
                                : c.from + "=" + (c.iface.empty() ? c.advertise : c.iface);
  throw node_address_error(given + ": " + why + " (this host: " + describe_host_addresses() + ")");
}

std::string resolve_interface(const address_choice& c) {
  for (const auto& e : host_interfaces()) {
    if (e.name != c.iface) continue;
    if (!e.up) refuse(c, "interface " + c.iface + " is down");
    if (e.v4.empty()) refuse(c, "interface " + c.iface + " has no IPv4 address");
    return text_of(e.v4.front());
  }
  refuse(c, "no interface of that name on this host");
}

std::string resolve_address(const address_choice& c) {
  std::vector<in_addr> candidates;
  in_addr literal{};
  in6_addr literal6{};
  if (::inet_pton(AF_INET, c.advertise.c_str(), &literal) == 1) {
    candidates.push_back(literal);
  } else if (::inet_pton(AF_INET6, c.advertise.c_str(), &literal6) == 1) {
    refuse(c, "an IPv6 address; the data plane takes this node's IPv4 address");
  } else {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(c.advertise.c_str(), nullptr, &hints, &found);
    if (rc != 0 || found == nullptr)
      refuse(c, std::string("not an IPv4 address, and it does not resolve to one (") +
                    ::gai_strerror(rc) + ")");
    for (const addrinfo* a = found; a != nullptr; a = a->ai_next)
      candidates.push_back(reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr);
    ::freeaddrinfo(found);
  }
  const auto interfaces = host_interfaces();
  std::string resolved;
  for (const auto& want : candidates) {
    if (want.s_addr == htonl(INADDR_ANY))
      refuse(c,
             "the wildcard address, which peers cannot connect to; name this node's own "
             "address or interface");
    if (!resolved.empty()) resolved += ", ";
    resolved += text_of(want);
    for (const auto& e : interfaces) {
      for (const auto& held : e.v4) {
        if (held.s_addr != want.s_addr) continue;
        if (!e.up) refuse(c, text_of(want) + " is on interface " + e.name + ", which is down");
        return text_of(want);
      }
    }
  }
  refuse(c, "not an address of this host" +
                (resolved == c.advertise ? std::string() : " (it resolves to " + resolved + ")"));
}

}  // namespace

address_choice choose_node_address(const std::string& iface_flag,
                                   const std::string& advertise_flag) {
  if (!iface_flag.empty() && !advertise_flag.empty())
    throw node_address_error("--iface " + iface_flag + " and --advertise " + advertise_flag +
                             ": give one of them, not both");
  if (!iface_flag.empty()) return {iface_flag, "", "--iface"};
  if (!advertise_flag.empty()) return {"", advertise_flag, "--advertise"};
  const std::string address = env_value(advertise_env), iface = env_value(iface_env);
  if (!address.empty() && !iface.empty())
    throw node_address_error(std::string(advertise_env) + "=" + address + " and " + iface_env +
                             "=" + iface + ": set one of them, not both");
  if (!address.empty()) return {"", address, advertise_env};
  if (!iface.empty()) return {iface, "", iface_env};
  const std::string gloo = env_value(gloo_iface_env);
  if (gloo.find(',') != std::string::npos)
    throw node_address_error(std::string(gloo_iface_env) + "=" + gloo +
                             ": names several interfaces; troupe binds one: set " + iface_env +
                             " (or pass --iface) to one of them");
  if (!gloo.empty()) return {gloo, "", gloo_iface_env};
  return {};
}

std::string resolve_node_address(const address_choice& choice) {
  if (!choice.iface.empty()) return resolve_interface(choice);
  if (!choice.advertise.empty()) return resolve_address(choice);
  return "";
}

std::string describe_host_addresses() {
  std::string out;
  for (const auto& e : host_interfaces()) {
    if (!out.empty()) out += ", ";
    out += e.name;
    if (e.v4.empty()) out += " (no IPv4)";
    for (const auto& a : e.v4) out += " " + text_of(a);
    if (!e.up) out += " (down)";
  }
  return out.empty() ? "no interfaces found" : out;
}

}  // namespace troupe::actors
