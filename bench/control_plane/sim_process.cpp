#include "bench/control_plane/sim_process.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "bench/control_plane/sim_node.hpp"

namespace troupe::bench::control_plane {

using clock_type = std::chrono::steady_clock;

int run_sim_process(const bench_options& o, const sim_process_setup& p, sim_ledger& ledger) {
  std::vector<std::unique_ptr<sim_node>> nodes(static_cast<size_t>(p.last_node - p.first_node));
  const auto connect_deadline = clock_type::now() + std::chrono::seconds(o.hello_timeout_s);
  std::atomic<int> next{p.first_node};
  std::vector<std::thread> pool;
  for (int t = 0; t < std::max(1, o.connect_threads); ++t)
    pool.emplace_back([&] {
      for (int k; (k = next.fetch_add(1)) < p.last_node;) {
        node_setup s;
        // Numbered from the first simulated member's id: real agents, each with at least one
        // of the members below it, hold at most that many nodes, so none shares a number.
        s.node = o.first_member + k;
        for (int m = k * o.members_per_node; m < std::min(o.members, (k + 1) * o.members_per_node);
             ++m)
          s.members.push_back(o.first_member + m);
        s.coordinator_host = p.host;
        s.coordinator_port = p.port;
        s.connect_deadline = connect_deadline;
        s.heartbeat_interval = p.heartbeat_interval;
        s.aggregate = o.aggregate;
        s.vote_window = std::chrono::milliseconds(o.vote_window_ms);
        s.member.ledger = &ledger;
        s.member.step_ms = o.step_ms;
        s.member.jitter_ms = o.jitter_ms;
        s.member.hello_timeout_s = o.hello_timeout_s;
        if (o.straggler > 1 && k == 0) {
          s.slow_members = {o.first_member};
          s.slowdown = o.straggler;
        }
        auto n = std::make_unique<sim_node>(std::move(s));
        if (auto error = n->start(); !error.empty()) {
          std::fprintf(stderr, "troupe bench control-plane: node %d: %s\n", k, error.c_str());
          ledger.control().nodes_failed.fetch_add(1);
        } else {
          ledger.control().nodes_connected.fetch_add(1);
        }
        nodes[static_cast<size_t>(k - p.first_node)] = std::move(n);
      }
    });
  for (auto& t : pool) t.join();
  int32_t round = 0;
  while (!ledger.control().quit.load()) {
    if (const int32_t now = ledger.control().kill_round.load(); now != round) {
      round = now;
      for (auto& n : nodes)
        for (int32_t m : n->members())
          if (ledger.member(m).kill.exchange(false)) n->kill_member(m);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  nodes.clear();
  return 0;
}

}  // namespace troupe::bench::control_plane
