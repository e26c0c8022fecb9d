#pragma once
// comm_peer's scenarios for reduce-scatter, all-gather, all-to-all(v) and send/recv: each rank
// runs them against the answers computed locally in patterns.hpp and reports by exit status.

#include <chrono>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "runtime/comm/store.hpp"
#include "tests/runtime/comm/backend.hpp"
#include "tests/runtime/comm/patterns.hpp"

namespace troupe::test {

using namespace std::chrono_literals;

/// Checks every op of the set once with elements of `count` floats (or the matching byte
/// sizes) over `c`; returns the first failure described, or "".
inline std::string check_collective_set(comm::communicator& c, size_t count) {
  const comm::op_options op{60s};
  const int p = c.size();
  const int r = c.rank();
  const auto up = static_cast<size_t>(p);
  for (const auto rop : {comm::reduce_op::sum, comm::reduce_op::average}) {
    // Rank r's input is the all-reduce pattern over p * count elements; block r of the
    // reduced pattern must come back.
    const auto in = contributions(r, count * up);
    std::vector<float> out(count, -1.0f);
    c.reduce_scatter(in.data(), out.data(), count, rop, op);
    for (size_t i = 0; i < count; ++i) {
      const float want = reduced(p, static_cast<size_t>(r) * count + i, rop);
      if (out[i] != want) {
        return "reduce_scatter count " + std::to_string(count) + ": index " + std::to_string(i) +
               " got " + std::to_string(out[i]) + ", want " + std::to_string(want);
      }
    }
  }
  const size_t bytes = count * sizeof(float) + count % 2;  // odd byte counts too
  {
    std::vector<char> in(bytes);
    for (size_t i = 0; i < bytes; ++i) in[i] = exchange_byte(r, -1, i);
    std::vector<char> out(bytes * up, 0x5a);
    c.all_gather(in.data(), out.data(), bytes, op);
    for (int j = 0; j < p; ++j) {
      if (auto e = check_exchange(out.data() + j * bytes, bytes, j, -1); !e.empty()) {
        return "all_gather " + std::to_string(bytes) + " bytes: " + e;
      }
    }
  }
  {
    std::vector<char> in(bytes * up);
    for (int j = 0; j < p; ++j) {
      for (size_t i = 0; i < bytes; ++i) in[j * bytes + i] = exchange_byte(r, j, i);
    }
    std::vector<char> out(bytes * up, 0x5a);
    c.all_to_all(in.data(), out.data(), bytes, op);
    for (int j = 0; j < p; ++j) {
      if (auto e = check_exchange(out.data() + j * bytes, bytes, j, r); !e.empty()) {
        return "all_to_all " + std::to_string(bytes) + " bytes per rank: " + e;
      }
    }
  }
  {
    std::vector<size_t> send_bytes(up);
    std::vector<size_t> recv_bytes(up);
    size_t in_total = 0;
    size_t out_total = 0;
    for (int j = 0; j < p; ++j) {
      send_bytes[j] = uneven_bytes(r, j, bytes);
      recv_bytes[j] = uneven_bytes(j, r, bytes);
      in_total += send_bytes[j];
      out_total += recv_bytes[j];
    }
    std::vector<char> in(in_total);
    size_t at = 0;
    for (int j = 0; j < p; ++j) {
      for (size_t i = 0; i < send_bytes[j]; ++i) in[at++] = exchange_byte(r, j, i);
    }
    std::vector<char> out(out_total, 0x5a);
    c.all_to_allv(in.data(), send_bytes, out.data(), recv_bytes, op);
    at = 0;
    for (int j = 0; j < p; ++j) {
      if (auto e = check_exchange(out.data() + at, recv_bytes[j], j, r); !e.empty()) {
        return "all_to_allv around " + std::to_string(bytes) + " bytes: " + e;
      }
      at += recv_bytes[j];
    }
  }
  return {};
}

/// Send/recv around the ring, two tags per hop with different sizes. Sends complete only when
/// received, so rank 0 sends first and everyone else receives first (no cycle of waits).
inline std::string check_ring_send_recv(comm::communicator& c, size_t bytes) {
  const comm::op_options op{60s};
  const int p = c.size();
  const int r = c.rank();
  const int next = (r + 1) % p;
  const int prev = (r + p - 1) % p;
  constexpr uint32_t tag_a = 7;
  constexpr uint32_t tag_b = 0xfffffff0u;  // high tags must work too
  auto payload = [](int from, uint32_t tag, size_t n) {
    std::vector<char> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = exchange_byte(from, static_cast<int>(tag & 0xff), i);
    return v;
  };
  const auto a = payload(r, tag_a, bytes);
  const auto b = payload(r, tag_b, bytes / 2 + 1);
  std::vector<char> got_a(bytes, 0x5a);
  std::vector<char> got_b(bytes / 2 + 1, 0x5a);
  auto sends = [&] {
    c.send(a.data(), a.size(), next, tag_a, op);
    c.send(b.data(), b.size(), next, tag_b, op);
  };
  auto recvs = [&] {
    c.recv(got_a.data(), got_a.size(), prev, tag_a, op);
    c.recv(got_b.data(), got_b.size(), prev, tag_b, op);
  };
  if (r == 0) {
    sends();
    recvs();
  } else {
    recvs();
    sends();
  }
  if (got_a != payload(prev, tag_a, bytes)) return "send/recv tag a, " + std::to_string(bytes);
  if (got_b != payload(prev, tag_b, bytes / 2 + 1)) return "send/recv tag b";
  // Everyone sends to next and receives from prev at once: only send_recv can do that.
  std::vector<char> got_c(bytes, 0x5a);
  c.send_recv(a.data(), a.size(), next, got_c.data(), got_c.size(), prev, tag_a, op);
  if (got_c != payload(prev, tag_a, bytes))
    return "send_recv around the ring, " + std::to_string(bytes);
  return {};
}

inline int report(int rank, const std::string& err) {
  if (err.empty()) return 0;
  std::cerr << "comm_peer rank " << rank << ": " << err << std::endl;
  return 1;
}

/// Every op of the set at the sizes every collective test covers, plus an odd size between.
inline int more_collectives(comm::kv_store& store, int rank, int size) {
  auto c = connect(store, {1, "world", rank, size});
  auto counts = test_counts();
  counts.push_back(100003);
  for (const size_t count : counts) {
    if (int rc = report(rank, check_collective_set(*c, count)); rc != 0) return rc;
    if (int rc = report(rank, check_ring_send_recv(*c, count * sizeof(float) + 1)); rc != 0) {
      return rc;
    }
    c->barrier({30s});
  }
  return 0;
}

/// 64 MiB buffers (the whole input or output of each op) through every bandwidth path.
inline int big_collectives(comm::kv_store& store, int rank, int size) {
  auto c = connect(store, {1, "world", rank, size});
  const size_t total = (size_t{64} << 20) / sizeof(float);
  auto v = contributions(rank, total);
  c->all_reduce(v.data(), total, comm::reduce_op::sum, {120s});
  if (int rc = report(rank, check_reduced(v, size, comm::reduce_op::sum)); rc != 0) return rc;
  return report(rank, check_collective_set(*c, total / static_cast<size_t>(size)));
}

/// Four ranks: "world" plus two 2-rank groups (ranks 0,1 and 2,3) alive at once, with ops on
/// them interleaved, so keys, slots and connections of the groups must not mix.
inline int subgroups(comm::kv_store& store, int rank, int size) {
  if (size != 4) return report(rank, "subgroups needs 4 ranks");
  auto world = connect(store, {1, "world", rank, 4});
  auto pair = connect(store, {1, "pair" + std::to_string(rank / 2), rank % 2, 2});
  for (const size_t count : {size_t{1000}, size_t{100003}}) {
    if (int rc = report(rank, check_collective_set(*pair, count)); rc != 0) return rc;
    if (int rc = report(rank, check_collective_set(*world, count)); rc != 0) return rc;
    if (int rc = report(rank, check_ring_send_recv(*pair, count)); rc != 0) return rc;
    auto v = contributions(rank % 2, count);
    pair->all_reduce(v.data(), count, comm::reduce_op::sum, {30s});
    if (int rc = report(rank, check_reduced(v, 2, comm::reduce_op::sum)); rc != 0) return rc;
    if (int rc = report(rank, check_ring_send_recv(*world, count)); rc != 0) return rc;
  }
  world->barrier({30s});
  return 0;
}

/// Two ranks: rank 1 receives with a tag rank 0 never sends, while rank 0 sends with another;
/// both must time out at their deadlines rather than deliver across tags.
inline int crossed_tags(comm::kv_store& store, int rank, int size) {
  if (size != 2) return report(rank, "crossed_tags needs 2 ranks");
  auto c = connect(store, {1, "world", rank, 2});
  std::vector<char> buf(4096, 1);
  const auto start = std::chrono::steady_clock::now();
  try {
    if (rank == 0) {
      c->send(buf.data(), buf.size(), 1, 5, {1500ms});
    } else {
      c->recv(buf.data(), buf.size(), 0, 6, {1500ms});
    }
    return report(rank, "a message crossed from tag 5 to tag 6");
  } catch (const comm::comm_error& e) {
    const auto took = std::chrono::steady_clock::now() - start;
    // The first rank to time out closes its connections, so the other may see peer_lost.
    if (e.code() != comm::comm_errc::timeout && e.code() != comm::comm_errc::peer_lost) {
      return report(rank, std::string("unexpected error: ") + e.what());
    }
    const auto earliest = e.code() == comm::comm_errc::timeout ? 1450ms : 1000ms;
    if (took < earliest || took > 4s) return report(rank, "did not fail at the deadline");
    if (std::string(e.what()).find(rank == 0 ? "send" : "recv") == std::string::npos) {
      return report(rank, std::string("error does not name the op: ") + e.what());
    }
  }
  return buf[0] == 1 ? 0 : report(rank, "receive buffer was written");
}

/// Warms up, then expects its next all_to_all to fail with peer_lost well before the deadline.
inline int expect_lost_all_to_all(comm::kv_store& store, int rank, int size) {
  auto c = connect(store, {1, "world", rank, size});
  auto v = contributions(rank, 1000);
  c->all_reduce(v.data(), v.size(), comm::reduce_op::sum, {30s});
  store.set_string("warm/" + std::to_string(rank), "1");
  const size_t block = size_t{1} << 20;
  std::vector<char> in(block * static_cast<size_t>(size), 1);
  std::vector<char> out(in.size());
  const auto start = std::chrono::steady_clock::now();
  try {
    c->all_to_all(in.data(), out.data(), block, {20s});
  } catch (const comm::comm_error& e) {
    if (e.code() != comm::comm_errc::peer_lost) return report(rank, std::string("got ") + e.what());
    if (std::chrono::steady_clock::now() - start > 10s) return report(rank, "peer_lost too late");
    return 0;
  }
  return report(rank, "all_to_all succeeded although a peer was gone");
}

/// All-reduces of values whose float sums depend on the order of addition: every rank must
/// get the same bits (each publishes a hash of its result and compares the others'), and on
/// shm, which promises rank order 0..size-1, exactly the sum a reference takes in that order
/// (on hier, the order hierarchical_communicator.hpp promises: nodes' sums in node order).
inline int bitwise_all_reduce(comm::kv_store& store, int rank, int size) {
  auto c = connect(store, {1, "world", rank, size});
  auto input = [](int r, size_t n) {
    std::mt19937 gen(static_cast<uint32_t>(1234 + r));
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(gen) * (1 + static_cast<float>(gen() % 1000));
    return v;
  };
  int round = 0;
  for (const size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{100003},
                             (size_t{4} << 20) / sizeof(float) + 5}) {
    for (const auto op : {comm::reduce_op::sum, comm::reduce_op::average}) {
      auto v = input(rank, count);
      c->all_reduce(v.data(), count, op, {60s});
      if (backend() == "shm") {
        auto want = input(0, count);
        for (int r = 1; r < size; ++r) {
          const auto other = input(r, count);
          for (size_t i = 0; i < count; ++i) want[i] += other[i];
        }
        if (op == comm::reduce_op::average) {
          for (auto& x : want) x /= static_cast<float>(size);
        }
        if (std::memcmp(want.data(), v.data(), count * sizeof(float)) != 0) {
          return report(rank, "all_reduce of " + std::to_string(count) +
                                  " is not the rank-order sum bit for bit");
        }
      }
      if (backend() == "hier" && size > 2) {
        // Each node's sum in rank order, then those in node order (test_node_of: node 0 holds
        // the even ranks, node 1 the odd ones).
        std::vector<float> want(count, 0.0f);
        for (int node = 0; node < 2; ++node) {
          auto part = input(node, count);
          for (int r = node + 2; r < size; r += 2) {
            const auto other = input(r, count);
            for (size_t i = 0; i < count; ++i) part[i] += other[i];
          }
          for (size_t i = 0; i < count; ++i) want[i] = node == 0 ? part[i] : want[i] + part[i];
        }
        if (op == comm::reduce_op::average) {
          for (auto& x : want) x /= static_cast<float>(size);
        }
        if (std::memcmp(want.data(), v.data(), count * sizeof(float)) != 0) {
          return report(rank, "all_reduce of " + std::to_string(count) +
                                  " is not the node-order sum bit for bit");
        }
      }
      uint64_t hash = 1469598103934665603ull;  // FNV-1a over the result's bytes
      const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
      for (size_t i = 0; i < count * sizeof(float); ++i)
        hash = (hash ^ bytes[i]) * 1099511628211ull;
      const std::string key = "bits/" + std::to_string(round++) + "/";
      store.set_string(key + std::to_string(rank), std::to_string(hash));
      for (int r = 0; r < size; ++r) {
        if (store.get_string(key + std::to_string(r), 60s) != std::to_string(hash)) {
          return report(rank, "all_reduce of " + std::to_string(count) + ": rank " +
                                  std::to_string(r) + " got other bits");
        }
      }
    }
  }
  c->barrier({30s});
  return 0;
}

}  // namespace troupe::test
