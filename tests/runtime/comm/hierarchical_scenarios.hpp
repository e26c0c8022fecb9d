#pragma once
// comm_peer's scenarios for the hierarchical communicator (hierarchical_multiproc_test.cpp):
// each rank reads the group's node layout from the store ("layout", e.g. "0,0,1,1"), becomes
// a process of that simulated node (TROUPE_NODE) and connects as a job does, through
// make_host_communicator.

#include <dirent.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/hierarchical_communicator.hpp"
#include "runtime/comm/host_communicator.hpp"
#include "runtime/comm/store.hpp"
#include "tests/runtime/comm/patterns.hpp"

namespace troupe::test {

using namespace std::chrono_literals;

/// Bytes this process's TCP sockets have sent so far, each byte once (TCP_INFO's data octets
/// out less those retransmitted): what the network layer carried, whoever asked.
inline uint64_t tcp_bytes_sent() {
  uint64_t total = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  while (const dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (e->d_name[0] == '.' || fd == ::dirfd(d)) continue;
    tcp_info info{};
    socklen_t len = sizeof(info);
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) continue;
    // Retransmissions are counted in tcpi_bytes_sent; they happen on a loaded loopback and say
    // nothing about what the algorithm sends, so only first transmissions count.
    if (len >= offsetof(tcp_info, tcpi_bytes_retrans) + sizeof(info.tcpi_bytes_retrans))
      total += info.tcpi_bytes_sent - info.tcpi_bytes_retrans;
  }
  ::closedir(d);
  return total;
}

/// This process's TCP sockets.
inline std::vector<int> tcp_fds() {
  std::vector<int> fds;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return fds;
  while (const dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (e->d_name[0] == '.' || fd == ::dirfd(d)) continue;
    tcp_info info{};
    socklen_t len = sizeof(info);
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0) fds.push_back(fd);
  }
  ::closedir(d);
  return fds;
}

/// Bytes received so far by this process's TCP sockets but those in `skip`
/// (TCP_INFO's tcpi_bytes_received).
inline uint64_t tcp_bytes_received(const std::vector<int>& skip) {
  uint64_t total = 0;
  for (const int fd : tcp_fds()) {
    if (std::find(skip.begin(), skip.end(), fd) != skip.end()) continue;
    tcp_info info{};
    socklen_t len = sizeof(info);
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) continue;
    if (len >= offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received))
      total += info.tcpi_bytes_received;
  }
  return total;
}

/// Nanoseconds on the steady clock (CLOCK_MONOTONIC: the same clock in every process here).
inline int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// Becomes a rank of the layout the test published and connects like a job. Throws if the
/// group did not come out hierarchical.
inline std::unique_ptr<comm::communicator> connect_on_layout(comm::kv_store& store, int rank,
                                                             int size, comm::node_layout& layout) {
  layout = comm::node_layout::parse(store.get_string("layout", 30s));
  if (layout.node_of.size() != static_cast<size_t>(size))
    throw std::runtime_error("the layout does not fit the group");
  ::setenv("TROUPE_NODE", std::to_string(layout.node_of[static_cast<size_t>(rank)]).c_str(), 1);
  auto c = comm::make_host_communicator(store, {1, "world", rank, size});
  if (std::string(typeid(*c).name()).find("hierarchical") == std::string::npos)
    throw std::runtime_error(std::string("make_host_communicator chose ") + typeid(*c).name());
  return c;
}

/// Rank r's value at index i: any float, computable alone (a hash), so a reference of any
/// size needs no rank's whole buffer; magnitudes vary so that the order of addition shows.
inline float hier_value(int r, size_t i) {
  uint64_t z = (static_cast<uint64_t>(r) << 40) + i + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float unit = static_cast<float>(z >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
  return unit * static_cast<float>(1 + (z & 1023));
}

/// The all-reduce at index i over the nodes `members` (per node, its ranks ascending) as
/// hierarchical_communicator.hpp promises it: each node's sum in rank order, then those in
/// node order. `abs_sum` gets the sum of magnitudes.
inline float hier_reference(const std::vector<std::vector<int>>& members, int size, size_t i,
                            comm::reduce_op op, float& abs_sum) {
  float total = 0;
  abs_sum = 0;
  for (size_t k = 0; k < members.size(); ++k) {
    float node = 0;
    for (size_t j = 0; j < members[k].size(); ++j) {
      const float x = hier_value(members[k][j], i);
      node = j == 0 ? x : node + x;
      abs_sum += std::fabs(x);
    }
    total = k == 0 ? node : total + node;
  }
  return op == comm::reduce_op::average ? total / static_cast<float>(size) : total;
}

inline int hier_report(int rank, const std::string& err) {
  if (err.empty()) return 0;
  std::cerr << "comm_peer rank " << rank << ": " << err << std::endl;
  return 1;
}

/// Test 7 of issue 25: hierarchical all-reduces from 1 float to 64 MiB, even and uneven
/// sizes, sum and average, against (a) the documented order, bit for bit, (b) a flat gloo
/// group over the same ranks, within float reassociation, and (c) bit for bit on integer
/// values, whose sums are exact in any order.
inline int hier_exact(comm::kv_store& store, int rank, int size) {
  comm::node_layout layout;
  auto c = connect_on_layout(store, rank, size, layout);
  auto flat = comm::make_gloo_communicator(store, {1, "flat", rank, size});
  const comm::op_options op{120s};
  const std::vector<size_t> counts{1,
                                   2,
                                   3,
                                   5,
                                   7,
                                   1000,
                                   16383,
                                   16384,
                                   16385,
                                   100003,
                                   262144,
                                   (size_t{1} << 20) + 3,
                                   (size_t{16} << 20)};
  const float eps = std::numeric_limits<float>::epsilon();
  std::vector<std::vector<int>> members;
  for (int k = 0; k < layout.nodes(); ++k) members.push_back(layout.members(k));
  for (const size_t count : counts) {
    for (const auto rop : {comm::reduce_op::sum, comm::reduce_op::average}) {
      if (count == (size_t{16} << 20) && rop == comm::reduce_op::average) continue;
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = hier_value(rank, i);
      std::vector<float> w = v;
      c->all_reduce(v.data(), count, rop, op);
      flat->all_reduce(w.data(), count, rop, op);
      const std::string what = "all_reduce of " + std::to_string(count) + " floats (" +
                               (rop == comm::reduce_op::sum ? "sum" : "average") + ")";
      for (size_t i = 0; i < count; ++i) {
        float abs_sum = 0;
        const float want = hier_reference(members, size, i, rop, abs_sum);
        if (std::memcmp(&want, &v[i], sizeof(float)) != 0)
          return hier_report(rank, what + ": index " + std::to_string(i) + " is " +
                                       std::to_string(v[i]) + ", the node-order sum " +
                                       std::to_string(want));
        // Reassociating P terms moves a sum by at most (P-1) eps times the sum of magnitudes.
        const float bound = static_cast<float>(size) * eps * abs_sum;
        if (std::fabs(v[i] - w[i]) > bound)
          return hier_report(rank, what + ": index " + std::to_string(i) + " is " +
                                       std::to_string(v[i]) + ", the flat group's " +
                                       std::to_string(w[i]));
      }
      if (count <= (size_t{1} << 20) + 3) {
        auto a = contributions(rank, count);
        auto b = a;
        c->all_reduce(a.data(), count, rop, op);
        flat->all_reduce(b.data(), count, rop, op);
        if (std::memcmp(a.data(), b.data(), count * sizeof(float)) != 0)
          return hier_report(rank, what + " of integers differs from the flat group's");
        if (auto e = check_reduced(a, size, rop); !e.empty())
          return hier_report(rank, what + ": " + e);
      }
    }
  }
  c->barrier(op);
  return 0;
}

/// Bytes over TCP: one all-reduce of 16 MiB on the hierarchical group, then one on a flat gloo
/// group of the same ranks; each rank publishes what its sockets sent during each
/// ("bytes/hier/<rank>", "bytes/flat/<rank>"). Nothing else uses a socket of this process in
/// those windows (the store is used only between them).
inline int hier_bytes(comm::kv_store& store, int rank, int size) {
  comm::node_layout layout;
  auto c = connect_on_layout(store, rank, size, layout);
  auto flat = comm::make_gloo_communicator(store, {1, "flat", rank, size});
  const comm::op_options op{60s};
  const size_t count = (size_t{16} << 20) / sizeof(float);
  std::vector<float> v(count, 1.0f);
  c->all_reduce(v.data(), count, comm::reduce_op::sum, op);  // warm-up: scratch, windows
  flat->all_reduce(v.data(), count, comm::reduce_op::sum, op);
  auto everyone = [&](const std::string& key) {
    store.set_string(key + "/" + std::to_string(rank), "1");
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(key + "/" + std::to_string(r));
    store.wait(keys, 30s);
  };
  auto measure = [&](comm::communicator& g, const char* name) {
    everyone(std::string("before_") + name);
    const uint64_t before = tcp_bytes_sent();
    g.all_reduce(v.data(), count, comm::reduce_op::sum, op);
    std::this_thread::sleep_for(300ms);  // what the op wrote to its sockets has gone out
    const uint64_t sent = tcp_bytes_sent() - before;
    store.set_string(std::string("bytes/") + name + "/" + std::to_string(rank),
                     std::to_string(sent));
  };
  measure(*c, "hier");
  measure(*flat, "flat");
  everyone("done");
  return 0;
}

/// All-reduces of 16 MiB back to back until one fails; then prints
/// "failed <steady ns> <code> <message>" and checks that the communicator is dead.
inline int hier_until_lost(comm::kv_store& store, int rank, int size) {
  comm::node_layout layout;
  auto c = connect_on_layout(store, rank, size, layout);
  const size_t count = (size_t{16} << 20) / sizeof(float);
  std::vector<float> v(count, 1.0f);
  c->all_reduce(v.data(), count, comm::reduce_op::sum, {60s});
  store.set_string("warm/" + std::to_string(rank), "1");
  for (int i = 0; i < 100000; ++i) {
    try {
      c->all_reduce(v.data(), count, comm::reduce_op::sum, {60s});
    } catch (const comm::comm_error& e) {
      const int64_t at = steady_ns();
      std::string msg = e.what();
      for (auto& ch : msg)
        if (ch == '\n') ch = ' ';
      std::printf("failed %lld %s %s\n", static_cast<long long>(at), comm::to_string(e.code()),
                  msg.c_str());
      std::fflush(stdout);
      try {
        c->barrier({1s});
        return hier_report(rank, "a failed communicator took a barrier");
      } catch (const comm::comm_error&) {
      }
      return 0;
    }
  }
  return hier_report(rank, "no all_reduce failed");
}

/// A 2-rank gloo group whose rank 1 dies in the middle of a 64 MiB message to rank 0, steered
/// by the test through the store so that rank 0 has taken the message's first bytes when the
/// connection breaks (the case gloo does not report to the waiting buffer):
///   rank 0 posts its receive; rank 1 sees the receive's notice arrive ("notified"); the test
///   SIGSTOPs rank 0 ("stopped"); rank 1 sends, and once the first KiBs are out ("flowing")
///   the test SIGKILLs rank 1 and SIGCONTs rank 0, which reads what was sent and meets the end
///   of the connection. Rank 0 prints "failed <steady ns> <code> <message>".
inline int gloo_torn_message(comm::kv_store& store, int rank, int size) {
  const std::vector<int> store_fds = tcp_fds();  // what is not gloo's
  auto c = comm::make_gloo_communicator(store, {1, "torn", rank, size});
  c->barrier({30s});  // whatever the connect sent each way has arrived
  std::vector<char> buf(size_t{64} << 20, 1);
  if (rank == 0) {
    store.wait({"go"}, 30s);
    try {
      c->recv(buf.data(), buf.size(), 1, 7, {60s});
    } catch (const comm::comm_error& e) {
      const int64_t at = steady_ns();
      std::string msg = e.what();
      for (auto& ch : msg)
        if (ch == '\n') ch = ' ';
      std::printf("failed %lld %s %s\n", static_cast<long long>(at), comm::to_string(e.code()),
                  msg.c_str());
      std::fflush(stdout);
      return 0;
    }
    return hier_report(rank, "the receive completed");
  }
  // Rank 0 posts its receive only after "go": its notice is then the next thing gloo's
  // sockets here receive.
  const uint64_t received = tcp_bytes_received(store_fds);
  store.set_string("go", "1");
  while (tcp_bytes_received(store_fds) == received) std::this_thread::sleep_for(1ms);
  store.set_string("notified", "1");
  store.wait({"stopped"}, 30s);
  const uint64_t sent = tcp_bytes_sent();
  std::thread watch([&store, sent] {
    while (tcp_bytes_sent() < sent + 4096) std::this_thread::sleep_for(1ms);
    store.set_string("flowing", "1");
  });
  watch.detach();  // the test kills this process while send() waits
  c->send(buf.data(), buf.size(), 0, 7, {60s});
  return hier_report(rank, "the send completed while rank 0 was stopped");
}

/// Connects, takes part in one all-reduce, publishes "warm/<rank>", then never joins another.
inline int hier_park(comm::kv_store& store, int rank, int size) {
  comm::node_layout layout;
  auto c = connect_on_layout(store, rank, size, layout);
  std::vector<float> v(1000, 1.0f);
  c->all_reduce(v.data(), v.size(), comm::reduce_op::sum, {60s});
  store.set_string("warm/" + std::to_string(rank), "1");
  for (;;) ::pause();
}

}  // namespace troupe::test
