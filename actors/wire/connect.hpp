#pragma once
// Reaching the coordinator from another process: retried until a deadline, with an error
// that says where we looked.

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::actors {

/// Connects to the job_supervisor published at host:port, retrying until `timeout`
/// (the coordinator may still be starting). Blocks: call it outside message handlers.
/// Returns an invalid handle and sets `error` when nothing answered in time.
caf::actor connect_to_coordinator(caf::actor_system& sys, const std::string& host, uint16_t port,
                                  std::chrono::milliseconds timeout, std::string& error);

/// Publishes `whom` on host:port (0 picks a free port) for the other processes of the job:
/// over mutual TLS with the job's certificate when this process holds the job's credentials
/// (actors/wire/tls_transport.hpp), plain TCP otherwise (tests inside one process). `listener`
/// names the port in refusals and in troupe_rejected_connections_total.
caf::expected<uint16_t> publish_for_job(caf::actor_system& sys, const caf::actor& whom,
                                        uint16_t port, const std::string& host, bool reuse,
                                        const std::string& listener);

/// Undoes publish_for_job.
void unpublish_for_job(caf::actor_system& sys, const caf::actor& whom, uint16_t port);

/// Reaches an actor that another process of the job published, the same way it was published.
caf::expected<caf::actor> remote_job_actor(caf::actor_system& sys, const std::string& host,
                                           uint16_t port);

/// remote_job_actor, retried with backoff until `deadline`. On a loaded machine a peer busy
/// touching its fresh memory may let one TLS handshake run out (connection_timeout) while it
/// would answer the next. A refusal that names another job is returned at once.
caf::expected<caf::actor> remote_job_actor_until(caf::actor_system& sys, const std::string& host,
                                                 uint16_t port,
                                                 std::chrono::steady_clock::time_point deadline);

/// The address of this machine's interface that traffic to host:port leaves by (what peers
/// of a job should be told to connect to: a node's address, loopback when the coordinator is
/// on loopback). Sends nothing (a UDP socket is connected, not written to). Falls back to
/// 127.0.0.1 when the route cannot be found.
std::string local_address_toward(const std::string& host, uint16_t port);

/// Parses "HOST:PORT". Returns false (and leaves the outputs alone) on bad input.
bool parse_endpoint(const std::string& text, std::string& host, uint16_t& port);

/// One coordinator's address.
struct endpoint {
  std::string host;
  uint16_t port = 0;
};
/// Where a member process (an agent, a worker) finds its job's coordinators and what it
/// advertises, as its command line gave it: the same for both.
struct coordinator_contact {
  std::string coordinator_host = "127.0.0.1";
  uint16_t coordinator_port = 0;
  /// Every coordinator of the job (the first is coordinator_host:port). More than one: one
  /// leads and the others stand by; when the leader is lost the process asks them in turn
  /// (actors/wire/leader_search.hpp) until the new leader takes it on.
  std::vector<endpoint> coordinators;
  int connect_timeout_ms = 30000;
  /// The address this process's listeners bind and advertise (--iface / --advertise or the
  /// environment, checked: actors/wire/node_address.hpp); "" = the route toward the
  /// coordinator.
  std::string advertise;
};

/// Parses "HOST:PORT[,HOST:PORT...]" (the job's coordinators: one leads, the others stand by)
/// into `out`; false, with `out` unchanged, when any part is not HOST:PORT.
bool parse_endpoints(const std::string& text, std::vector<endpoint>& out);
/// "HOST:PORT,HOST:PORT": the form parse_endpoints reads.
std::string endpoints_text(const std::vector<endpoint>& list);
/// "host:port" of each, in order (the names a leader search knows the coordinators by).
std::vector<std::string> endpoint_names(const std::vector<endpoint>& list);

}  // namespace troupe::actors
