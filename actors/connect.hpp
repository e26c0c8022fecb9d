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

/// Parses "HOST:PORT". Returns false (and leaves the outputs alone) on bad input.
bool parse_endpoint(const std::string& text, std::string& host, uint16_t& port);

}  // namespace troupe::actors
