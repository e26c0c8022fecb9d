// The hierarchical communicator across real processes, nodes simulated on this host
// (TROUPE_NODE): exact against a flat group and against the documented order from 1 float to
// 64 MiB on 2 × 2, 3 × 2 and uneven nodes; each node's share crosses TCP once (bytes counted by
// the kernel); a node SIGKILLed in the middle of all-reduces fails every survivor within 1 s,
// as does a peer killed in the middle of one gloo message; abort and deadlines as on every
// backend. Issue 25, test 7.
#include <gtest/gtest.h>

#include <cstdlib>
#include <future>
#include <sstream>
#include <thread>

#include "runtime/comm/hierarchical_communicator.hpp"
#include "runtime/comm/host_communicator.hpp"
#include "tests/runtime/comm/hierarchical_scenarios.hpp"
#include "tests/runtime/comm/peer_group.hpp"

using namespace troupe;
using namespace troupe::comm;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

class hier : public test::peer_group {
 protected:
  /// Publishes the layout every rank reads, e.g. "0,0,1,1".
  void publish_layout(const std::string& layout) {
    store_ = client();
    store_->set_string("layout", layout);
    layout_ = node_layout::parse(layout);
    ASSERT_FALSE(layout_.node_of.empty()) << layout;
  }

  /// Ranks `from`.. of the layout as comm_peer processes with their stdout captured.
  void spawn_ranks(const std::string& scenario, int from = 0) {
    const int size = static_cast<int>(layout_.node_of.size());
    for (int r = from; r < size; ++r) {
      peers_.push_back(
          test::child_process::spawn({COMM_PEER_PATH, "127.0.0.1:" + std::to_string(server_.port()),
                                      std::to_string(r), std::to_string(size), scenario},
                                     true));
    }
  }

  /// Waits for "warm/<rank>" of ranks `from`..size-1.
  void wait_warm(int from = 0) {
    std::vector<std::string> keys;
    for (int r = from; r < static_cast<int>(layout_.node_of.size()); ++r)
      keys.push_back("warm/" + std::to_string(r));
    store_->wait(keys, 60s);
  }

  std::unique_ptr<kv_store> store_;
  node_layout layout_;
};

struct shape {
  const char* name;
  const char* layout;
};

class exact : public hier, public ::testing::WithParamInterface<shape> {};

TEST_P(exact, all_reduce_matches_the_flat_group_and_the_node_order_bit_for_bit) {
  publish_layout(GetParam().layout);
  spawn_ranks("hier_exact");
  expect_peers_succeed(240s);
}

INSTANTIATE_TEST_SUITE_P(
    nodes, exact,
    ::testing::Values(shape{"two_nodes_of_two", "0,0,1,1"},
                      shape{"three_nodes_of_two", "0,0,1,1,2,2"},
                      // Nodes of 2 and 3 ranks, interleaved: the leaders' path.
                      shape{"uneven_interleaved_nodes", "0,1,0,1,1"}),
    [](const auto& p) { return std::string(p.param.name); });

TEST_F(hier, each_node_sends_its_share_across_tcp_once) {
  publish_layout("0,0,1,1");
  spawn_ranks("hier_bytes");
  expect_peers_succeed(120s);
  const double share = 16 << 20;  // the all-reduce's buffer, bytes
  std::vector<double> hier_by_node(2, 0.0);
  double hier_total = 0;
  double flat_total = 0;
  for (int r = 0; r < 4; ++r) {
    const double h = std::stod(store_->get_string("bytes/hier/" + std::to_string(r), 1s));
    const double f = std::stod(store_->get_string("bytes/flat/" + std::to_string(r), 1s));
    hier_by_node[static_cast<size_t>(layout_.node_of[static_cast<size_t>(r)])] += h;
    hier_total += h;
    flat_total += f;
  }
  std::printf(
      "16 MiB all-reduce, 2 nodes x 2 ranks: bytes sent over TCP: hierarchical %.0f "
      "(node 0 %.0f, node 1 %.0f), flat 4-rank ring %.0f; share %.0f\n",
      hier_total, hier_by_node[0], hier_by_node[1], flat_total, share);
  EXPECT_LT(hier_total, flat_total);
  for (int k = 0; k < 2; ++k) {
    // Half the share out in the reduce-scatter, half in the all-gather: the share, once, plus
    // gloo's message headers.
    EXPECT_GE(hier_by_node[k], share) << "node " << k;
    EXPECT_LE(hier_by_node[k], share * 1.01 + 65536) << "node " << k;
  }
  // The flat ring sends 2 (P-1)/P of the buffer from every rank, over TCP inside nodes too.
  EXPECT_GE(flat_total, 6 * share);
}

class lost : public hier, public ::testing::WithParamInterface<shape> {};

TEST_P(lost, a_node_killed_mid_all_reduce_fails_every_survivor_within_a_second) {
  publish_layout(GetParam().layout);
  spawn_ranks("hier_until_lost");
  wait_warm();
  std::this_thread::sleep_for(150ms);  // well into the all-reduces that follow
  const int victim = 1;
  const int64_t killed_at = test::steady_ns();
  for (size_t r = 0; r < layout_.node_of.size(); ++r)
    if (layout_.node_of[r] == victim) peer(r).signal(SIGKILL);
  for (size_t r = 0; r < layout_.node_of.size(); ++r) {
    if (layout_.node_of[r] == victim) continue;
    const auto line = peer(r).read_line(10s);
    ASSERT_TRUE(line.has_value()) << "rank " << r << " reported nothing";
    std::istringstream in(*line);
    std::string word, code;
    long long at = 0;
    in >> word >> at >> code;
    ASSERT_EQ(word, "failed") << *line;
    const double after_ms = static_cast<double>(at - killed_at) / 1e6;
    std::printf("rank %zu (node %d) failed %.1f ms after the kill: %s\n", r, layout_.node_of[r],
                after_ms, line->c_str());
    EXPECT_LT(after_ms, 1000.0) << "rank " << r << ": " << *line;
    EXPECT_EQ(code, "peer_lost") << *line;
    EXPECT_NE(line->find("all_reduce"), std::string::npos) << *line;
    const auto status = peer(r).wait_exit(10s);
    ASSERT_TRUE(status.has_value()) << "rank " << r;
    EXPECT_EQ(*status, 0) << "rank " << r << " " << test::describe_status(*status);
  }
}

INSTANTIATE_TEST_SUITE_P(nodes, lost,
                         ::testing::Values(shape{"two_nodes_of_two", "0,0,1,1"},
                                           shape{"three_nodes_of_two", "0,0,1,1,2,2"}),
                         [](const auto& p) { return std::string(p.param.name); });

// What made the 2-node case above flaky: gloo fails a broken pair's pending operations, but
// not the receive whose message it is in the middle of reading. The peer dies at that point
// here every time (hierarchical_scenarios.hpp, gloo_torn_message); the receive must fail
// within a second, not wait for its 60 s deadline.
TEST_F(hier, a_peer_killed_in_the_middle_of_a_message_fails_the_receive_within_a_second) {
  publish_layout("0,1");  // two ranks; the scenario uses a plain gloo group
  spawn_ranks("gloo_torn_message");
  store_->wait({"notified"}, 60s);
  peer(0).signal(SIGSTOP);
  store_->set_string("stopped", "1");
  store_->wait({"flowing"}, 30s);
  peer(1).signal(SIGKILL);
  ASSERT_TRUE(peer(1).wait_exit(10s).has_value());
  const int64_t resumed_at = test::steady_ns();
  peer(0).signal(SIGCONT);
  const auto line = peer(0).read_line(10s);
  ASSERT_TRUE(line.has_value()) << "rank 0 reported nothing";
  std::istringstream in(*line);
  std::string word, code;
  long long at = 0;
  in >> word >> at >> code;
  ASSERT_EQ(word, "failed") << *line;
  const double after_ms = static_cast<double>(at - resumed_at) / 1e6;
  std::printf("rank 0 failed %.1f ms after it resumed: %s\n", after_ms, line->c_str());
  EXPECT_LT(after_ms, 1000.0) << *line;
  EXPECT_EQ(code, "peer_lost") << *line;
  const auto status = peer(0).wait_exit(10s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0) << test::describe_status(*status);
}

/// Rank 0 in this process, on node 0 of 2 × 2; the others park after one all-reduce.
class hier_rank0 : public hier {
 protected:
  std::unique_ptr<communicator> join() {
    publish_layout("0,0,1,1");
    spawn_ranks("hier_park", 1);
    ::setenv("TROUPE_NODE", "0", 1);
    auto c = make_host_communicator(*store_, {1, "world", 0, 4});
    std::vector<float> v(1000, 1.0f);
    c->all_reduce(v.data(), v.size(), reduce_op::sum, {60s});
    EXPECT_EQ(v[0], 4.0f);
    wait_warm(1);
    return c;
  }
};

TEST_F(hier_rank0, abort_from_another_thread_unblocks_an_all_reduce_in_flight) {
  auto c = join();
  const auto abort_after = 300ms;
  auto aborter = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(abort_after);
    c->abort();
  });
  std::vector<float> v((size_t{4} << 20) + 3, 1.0f);
  const auto start = clock_type::now();
  try {
    c->all_reduce(v.data(), v.size(), reduce_op::sum, {30s});
    FAIL() << "all_reduce finished without its peers";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::aborted) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0 of 4"), std::string::npos) << e.what();
  }
  EXPECT_LT(clock_type::now() - start, abort_after + 2s);
  aborter.get();
  EXPECT_TRUE(c->aborted());
  try {
    c->barrier({1s});
    FAIL() << "an aborted communicator took a barrier";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::aborted) << e.what();
  }
  c->abort();  // idempotent
}

TEST_F(hier_rank0, silent_peers_time_out_at_the_deadline_naming_the_stage) {
  auto c = join();
  const auto timeout = 1500ms;
  std::vector<float> v(100003, 1.0f);
  const auto start = clock_type::now();
  try {
    c->all_reduce(v.data(), v.size(), reduce_op::sum, {timeout});
    FAIL() << "all_reduce finished without its peers";
  } catch (const comm_error& e) {
    EXPECT_EQ(e.code(), comm_errc::timeout) << e.what();
    // The first stage is inside node 0, whose other rank (1) never comes.
    EXPECT_NE(std::string(e.what()).find("node 0's shm group (group ranks [0,1])"),
              std::string::npos)
        << e.what();
  }
  const auto took = clock_type::now() - start;
  EXPECT_GE(took, timeout - 50ms);
  EXPECT_LT(took, timeout + 2s);
}

TEST(node_layout, numbers_nodes_by_first_appearance_and_says_when_a_hierarchy_pays) {
  const auto l = node_layout::of_hosts({"b", "a", "b", "c", "a"});
  EXPECT_EQ(l.to_string(), "0,1,0,2,1");
  EXPECT_EQ(l.nodes(), 3);
  EXPECT_EQ(l.members(1), (std::vector<int>{1, 4}));
  EXPECT_TRUE(l.worth_a_hierarchy());
  EXPECT_FALSE(l.uniform());
  EXPECT_EQ(node_layout::parse("0,1,0,2,1").node_of, l.node_of);
  EXPECT_TRUE(node_layout::parse("0,0,1,1").uniform());
  EXPECT_FALSE(node_layout::parse("0,1,2").worth_a_hierarchy());  // a rank per node
  EXPECT_FALSE(node_layout::parse("0,0,0").worth_a_hierarchy());  // one node
  for (const char* bad : {"", "1,0", "0,2", "0,,1", "0,x", "-1", "0,1,"})
    EXPECT_TRUE(node_layout::parse(bad).node_of.empty()) << bad;
}

TEST(node_layout, transport_choice_goes_hierarchical_only_when_it_pays) {
  const std::vector<std::string> auto3{"auto", "auto", "auto"};
  EXPECT_EQ(choose_transport(auto3, {"a", "a", "b"}), transport_kind::hierarchical);
  EXPECT_EQ(choose_transport(auto3, {"a", "b", "c"}), transport_kind::tcp);
  EXPECT_EQ(choose_transport(auto3, {"a", "a", "a"}), transport_kind::shm);
  EXPECT_EQ(choose_transport({"auto", "tcp", "auto"}, {"a", "a", "b"}), transport_kind::tcp);
}

}  // namespace
