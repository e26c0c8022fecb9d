#pragma once
// The control plane's transport: CAF's BASP over TLS 1.3 with the job's certificate, on both
// ends, for every listener a troupe process publishes (the coordinator, the stage actors).
//
// Why not CAF's own OpenSSL module (caf/openssl/, 0.17.6): it never clears OpenSSL's
// per-thread error queue, so one stranger's failed handshake made the next healthy read on the
// same I/O thread look like a fatal error and dropped every member's connection (measured: a
// 2-rank job failed at once). It also cannot count or log refused peers, and a peer that
// connects and stays silent is kept forever. This transport plugs into the same extension point
// (a middleman actor whose connect() and open() make the sockets) and does all three.

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/expected.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace troupe::actors {

/// Called (from the I/O thread or the handshake watchdog) for every connection refused before
/// it reached CAF: the listener's name, the peer's address and why. Keep it cheap.
using rejection_listener = std::function<void(const std::string& listener, const std::string& peer,
                                              const std::string& why)>;

/// Replaces the process's rejection listener (the default only logs).
void set_rejection_listener(rejection_listener listener);

/// The help text of troupe_rejected_connections_total{listener}, for whoever registers it first.
inline constexpr const char* rejected_connections_help =
    "Connections refused before any byte reached a listener's decoder: no job credentials, "
    "garbage, silence past the handshake deadline, or over the connection cap";

/// Connections refused so far by this process's TLS listeners.
uint64_t tls_rejected_connections();

/// A listener's handshake deadline: a connection that has not finished its TLS handshake by
/// then is closed and counted. At most `max_pending_handshakes` handshakes run at once; more
/// are closed on accept.
inline constexpr std::chrono::milliseconds tls_handshake_deadline{3000};
inline constexpr int max_pending_handshakes = 64;

/// Publishes `whom` on host:port over TLS with this process's job credentials
/// (auth::process_credentials(), which must be valid). `listener` names it in rejections.
caf::expected<uint16_t> tls_publish(caf::actor_system& sys, const caf::actor& whom, uint16_t port,
                                    const std::string& host, bool reuse,
                                    const std::string& listener);

/// How long a control connection's TCP connect may take before it fails (a peer behind a cut
/// link drops the SYN, and the kernel alone would retry for two minutes).
inline constexpr std::chrono::milliseconds control_connect_deadline{3000};

/// The TCP_USER_TIMEOUT of every control connection of this process, open now or made later:
/// one whose sent data stays unacknowledged this long is closed (a long cut), so that after
/// the link heals the peers meet over a new connection instead of one whose retransmissions
/// have backed off for a minute or more. 0 = the kernel's default (about 15 minutes).
void set_control_socket_timeout(std::chrono::milliseconds timeout);

/// Connects to an actor published with tls_publish. A peer that shows another job's
/// certificate is refused with an error that names both jobs.
caf::expected<caf::actor> tls_remote_actor(caf::actor_system& sys, const std::string& host,
                                           uint16_t port);

}  // namespace troupe::actors
