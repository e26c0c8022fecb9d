// A test fixture for the data plane across real processes: a key-value store served by this
// process, `comm_peer` processes started against it as ranks on this binary's backend
// (backend.hpp; cleaned up by pid), and rank 0 joining in this process.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/store.hpp"
#include "tests/runtime/comm/backend.hpp"
#include "tests/runtime/comm/child_process.hpp"
#include "tests/runtime/comm/patterns.hpp"

namespace troupe::test {

class peer_group : public ::testing::Test {
 protected:
  void spawn(int rank, int size, const std::string& scenario) {
    peers_.push_back(
        child_process::spawn({COMM_PEER_PATH, "127.0.0.1:" + std::to_string(server_.port()),
                              std::to_string(rank), std::to_string(size), scenario, backend()}));
  }

  void spawn_all(int size, const std::string& scenario) {
    for (int r = 0; r < size; ++r) spawn(r, size, scenario);
  }

  /// Every peer exits 0 within `timeout` (one deadline for all of them).
  void expect_peers_succeed(std::chrono::milliseconds timeout = std::chrono::seconds(200)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (size_t i = 0; i < peers_.size(); ++i) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      const auto status = peers_[i].wait_exit(std::max(left, std::chrono::milliseconds(0)));
      ASSERT_TRUE(status.has_value()) << "peer " << i << " still running";
      EXPECT_EQ(*status, 0) << "peer " << i << " " << describe_status(*status);
    }
  }

  std::unique_ptr<comm::kv_store> client() {
    return comm::connect_tcp_store("127.0.0.1", server_.port(), std::chrono::seconds(5));
  }

  child_process& peer(size_t i) { return peers_.at(i); }

  comm::tcp_store_server server_;
  std::vector<child_process> peers_;
};

/// Rank 0, in this process, joins generation 1 and does the warm-up all-reduce the peers do;
/// returns once every peer has published "warm/<rank>", so none is still in flight when a
/// test then kills or stops one.
inline std::unique_ptr<comm::communicator> join_and_warm_up(comm::kv_store& store, int size) {
  using namespace std::chrono_literals;
  auto c = connect(store, {1, "world", 0, size});
  auto v = contributions(0, 1000);
  c->all_reduce(v.data(), v.size(), comm::reduce_op::sum, {30s});
  EXPECT_EQ(check_reduced(v, size, comm::reduce_op::sum), "");
  std::vector<std::string> warm;
  for (int r = 1; r < size; ++r) warm.push_back("warm/" + std::to_string(r));
  store.wait(warm, 30s);
  return c;
}

}  // namespace troupe::test
