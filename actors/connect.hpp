#pragma once
// Reaching the coordinator from another process: retried until a deadline, with an error
// that says where we looked.

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <chrono>
#include <cstdint>
#include <string>

namespace troupe::actors {

/// Connects to the job_supervisor published at host:port, retrying until `timeout`
/// (the coordinator may still be starting). Blocks: call it outside message handlers.
/// Returns an invalid handle and sets `error` when nothing answered in time.
caf::actor connect_to_coordinator(caf::actor_system& sys, const std::string& host, uint16_t port,
                                  std::chrono::milliseconds timeout, std::string& error);

/// The address of this machine's interface that traffic to host:port leaves by (what peers
/// of a job should be told to connect to: a node's address, loopback when the coordinator is
/// on loopback). Sends nothing (a UDP socket is connected, not written to). Falls back to
/// 127.0.0.1 when the route cannot be found.
std::string local_address_toward(const std::string& host, uint16_t port);

/// Parses "HOST:PORT". Returns false (and leaves the outputs alone) on bad input.
bool parse_endpoint(const std::string& text, std::string& host, uint16_t& port);

}  // namespace troupe::actors
