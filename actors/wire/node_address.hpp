#pragma once
// This node's address on the data plane, which every listener of its workers binds and
// advertises (gloo's pairs, stage links, checkpoint replicas, state transfer): the interface
// or address the user named (--iface NAME, --advertise ADDR, or the environment), checked
// against this host, or else the address of the route toward the coordinator.

#include <stdexcept>
#include <string>

namespace troupe::actors {

/// The environment variables read when neither --iface nor --advertise is given, in this
/// order; an empty value counts as unset. GLOO_SOCKET_IFNAME is the one torchrun and gloo
/// read (one interface name here, not a list).
inline constexpr const char* advertise_env = "TROUPE_ADVERTISE";
inline constexpr const char* iface_env = "TROUPE_IFACE";
inline constexpr const char* gloo_iface_env = "GLOO_SOCKET_IFNAME";

/// A named interface or address that cannot be used: it does not exist, is down, has no
/// IPv4 address, is not an address of this host, or two choices were given at once. The
/// message names what was given, where it came from and this host's addresses. Commands turn
/// it into exit code 2.
class node_address_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What the user named for this node's address: an interface or an address (one of them at
/// most), and where it came from ("--iface", "--advertise" or an environment variable).
struct address_choice {
  std::string iface;
  std::string advertise;
  std::string from;
  bool named() const { return !iface.empty() || !advertise.empty(); }
};

/// The choice from the command line (`iface_flag` / `advertise_flag`, empty when not given),
/// else from the environment (advertise_env, iface_env, gloo_iface_env, the first one set).
/// Throws node_address_error when both flags are given, or both TROUPE_ variables.
address_choice choose_node_address(const std::string& iface_flag,
                                   const std::string& advertise_flag);

/// The IPv4 address the choice names, checked: an interface that exists, is up and has an
/// IPv4 address (its first), or an address (or a name that resolves to one) held by one of
/// this host's interfaces; never a wildcard. Throws node_address_error otherwise. "" when
/// nothing is named.
std::string resolve_node_address(const address_choice& choice);

/// This host's interfaces with their IPv4 addresses, for messages: "lo 127.0.0.1, eth0 10.0.0.2".
std::string describe_host_addresses();

}  // namespace troupe::actors
