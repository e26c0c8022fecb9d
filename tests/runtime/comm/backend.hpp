#pragma once
// Test support: which data-plane backend a multi-process test runs on. The same scenarios and
// tests run on every backend; the test binary is built once per backend (TROUPE_TEST_BACKEND)
// and tells each comm_peer which one to use on its command line. "hier" is the hierarchical
// backend as a job picks it: make_host_communicator with each rank on the simulated node
// test_node_of(rank) (TROUPE_NODE), so groups of 3 or more ranks span two nodes unevenly (3)
// or with their nodes' ranks interleaved (4: nodes 0,1,0,1).

#include <chrono>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/host_communicator.hpp"
#include "runtime/comm/shm_communicator.hpp"
#include "runtime/comm/store.hpp"

#ifndef TROUPE_TEST_BACKEND
#define TROUPE_TEST_BACKEND "gloo"
#endif

namespace troupe::test {

/// The backend of this process: the test binary's, or the one comm_peer was started with.
inline std::string& backend() {
  static std::string name = TROUPE_TEST_BACKEND;
  return name;
}

/// The simulated node of `rank` on the hier backend.
inline int test_node_of(int rank) { return rank % 2; }

/// Connects on backend() with its default options (and `connect_timeout`).
inline std::unique_ptr<comm::communicator> connect(
    comm::kv_store& store, const comm::comm_identity& id,
    std::chrono::milliseconds connect_timeout = std::chrono::seconds(30)) {
  if (backend() == "shm") {
    comm::shm_options o;
    o.connect_timeout = connect_timeout;
    return comm::make_shm_communicator(store, id, o);
  }
  if (backend() == "hier") {
    ::setenv("TROUPE_NODE", std::to_string(test_node_of(id.rank)).c_str(), 1);
    comm::gloo_options o;
    o.connect_timeout = connect_timeout;
    return comm::make_host_communicator(store, id, o);
  }
  if (backend() != "gloo") throw std::invalid_argument("unknown backend " + backend());
  comm::gloo_options o;
  o.connect_timeout = connect_timeout;
  return comm::make_gloo_communicator(store, id, o);
}

}  // namespace troupe::test
