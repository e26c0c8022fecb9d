// A rank in its own process, for the multi-process data-plane tests: connects to the test's
// store, plays one scenario, and reports through its exit status (0 = as expected).
//
//   comm_peer HOST:PORT RANK SIZE SCENARIO [BACKEND]   one rank of a scenario below, on
//                                                     BACKEND (gloo, the default, or shm)
//   comm_peer serve                          a store server; prints "port N", serves until killed
//   comm_peer launch SIZE SCENARIO           a store plus SIZE ranks of SCENARIO (e.g. bench)
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <thread>

#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/store.hpp"
#include "tests/runtime/comm/backend.hpp"
#include "tests/runtime/comm/child_process.hpp"
#include "tests/runtime/comm/collective_scenarios.hpp"
#include "tests/runtime/comm/hierarchical_scenarios.hpp"
#include "tests/runtime/comm/patterns.hpp"
#include "tests/runtime/comm/tree_sum_scenarios.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using comm::reduce_op;
using clock_type = std::chrono::steady_clock;

namespace {

struct peer_args {
  comm::kv_store& store;
  int rank;
  int size;
};

const comm::op_options default_op{30s};

[[noreturn]] void park_forever() {
  for (;;) pause();
}

/// Logs a failure with this rank's name and returns the exit code to use.
int failed(const peer_args& a, const std::string& what, int code = 1) {
  std::cerr << "comm_peer rank " << a.rank << "/" << a.size << ": " << what << std::endl;
  return code;
}

/// One all-reduce of the standard pattern over `comm`, checked; "" when right.
std::string reduce_and_check(comm::communicator& c, size_t count, reduce_op op, int contributor,
                             int size) {
  auto v = test::contributions(contributor, count);
  c.all_reduce(v.data(), count, op, default_op);
  return test::check_reduced(v, size, op);
}

/// One checked all-reduce, then "warm/<rank>" in the store: the test waits for every peer's key
/// before it kills or stops one, so no warm-up is still in flight when that happens.
std::string warm_up(comm::communicator& c, const peer_args& a) {
  auto err = reduce_and_check(c, 1000, reduce_op::sum, a.rank, a.size);
  if (err.empty()) a.store.set_string("warm/" + std::to_string(a.rank), "1");
  return err;
}

int collectives(const peer_args& a) {
  auto c = test::connect(a.store, {1, "world", a.rank, a.size});
  int failures = 0;
  auto counts = test::test_counts();
  counts.push_back(16385);  // just above the small-message threshold: ring with one segment
  for (const size_t count : counts) {
    for (const auto op : {reduce_op::sum, reduce_op::average}) {
      if (auto err = reduce_and_check(*c, count, op, a.rank, a.size); !err.empty()) {
        failures += failed(a, "all_reduce count " + std::to_string(count) + ": " + err);
      }
    }
    const size_t bytes = count * sizeof(float) + count % 2;  // odd byte counts too
    for (int root = 0; root < a.size; ++root) {
      std::vector<char> b(bytes, 0x5a);
      if (a.rank == root) {
        for (size_t i = 0; i < bytes; ++i) b[i] = test::broadcast_byte(root, i);
      }
      c->broadcast(b.data(), bytes, root, default_op);
      for (size_t i = 0; i < bytes; ++i) {
        if (b[i] != test::broadcast_byte(root, i)) {
          failures += failed(a, "broadcast " + std::to_string(bytes) + " bytes from " +
                                    std::to_string(root) + ": wrong byte at " + std::to_string(i));
          break;
        }
      }
    }
    c->barrier(default_op);
  }
  return failures == 0 ? 0 : 1;
}

/// Joins generation 1, takes part in one all-reduce, then goes silent (never joins another op).
int hang(const peer_args& a) {
  auto c = test::connect(a.store, {1, "world", a.rank, a.size});
  if (auto err = warm_up(*c, a); !err.empty()) return failed(a, "warm-up: " + err);
  park_forever();
}

/// Joins, warms up, then expects its next all-reduce to fail with peer_lost well before its
/// own 20 s deadline (because another rank died or aborted).
int expect_lost(const peer_args& a) {
  auto c = test::connect(a.store, {1, "world", a.rank, a.size});
  if (auto err = warm_up(*c, a); !err.empty()) return failed(a, "warm-up: " + err);
  std::vector<float> v(1000, 1.0f);
  const auto start = clock_type::now();
  try {
    c->all_reduce(v.data(), v.size(), reduce_op::sum, {20s});
  } catch (const comm::comm_error& e) {
    const auto took = clock_type::now() - start;
    if (e.code() != comm::comm_errc::peer_lost) return failed(a, std::string("got ") + e.what(), 3);
    if (took > 10s) return failed(a, "peer_lost came too late", 4);
    std::cerr << "comm_peer rank " << a.rank << " saw, as expected: " << e.what() << std::endl;
    return 0;
  }
  return failed(a, "all_reduce succeeded although a peer was gone", 2);
}

/// Generation 1 of SIZE ranks loses rank SIZE-1; the survivors see the failure, form
/// generation 2 of SIZE-1 ranks on the same store, and reduce correctly there.
int survivor(const peer_args& a) {
  auto c1 = test::connect(a.store, {1, "world", a.rank, a.size});
  if (auto err = warm_up(*c1, a); !err.empty()) return failed(a, "warm-up: " + err);
  std::vector<float> v(1000, 1.0f);
  try {
    c1->all_reduce(v.data(), v.size(), reduce_op::sum, {10s});
    return failed(a, "generation 1 all_reduce succeeded without its last rank", 2);
  } catch (const comm::comm_error& e) {
    if (e.code() != comm::comm_errc::peer_lost && e.code() != comm::comm_errc::timeout) {
      return failed(a, std::string("unexpected error: ") + e.what(), 3);
    }
  }
  c1.reset();
  const int size2 = a.size - 1;
  auto c2 = test::connect(a.store, {2, "world", a.rank, size2});
  for (const size_t count : {size_t{1000}, (size_t{1} << 20) + 3}) {
    if (auto err = reduce_and_check(*c2, count, reduce_op::average, a.rank, size2); !err.empty()) {
      return failed(a, "generation 2: " + err);
    }
  }
  c2->barrier(default_op);
  return 0;
}

/// Generations 1 and 2 of "world" alive at once, plus a two-rank group "pair" in generation 2.
int generations(const peer_args& a) {
  auto g1 = test::connect(a.store, {1, "world", a.rank, a.size});
  if (auto err = reduce_and_check(*g1, 1000, reduce_op::sum, a.rank, a.size); !err.empty()) {
    return failed(a, "generation 1: " + err);
  }
  auto g2 = test::connect(a.store, {2, "world", a.rank, a.size});
  for (auto* c : {g2.get(), g1.get(), g2.get()}) {
    if (auto err = reduce_and_check(*c, 100003, reduce_op::sum, a.rank, a.size); !err.empty()) {
      return failed(a, "generation " + std::to_string(c->generation()) + ": " + err);
    }
  }
  if (a.rank < 2) {
    auto pair = test::connect(a.store, {2, "pair", a.rank, 2});
    if (auto err = reduce_and_check(*pair, 777, reduce_op::average, a.rank, 2); !err.empty()) {
      return failed(a, "group pair: " + err);
    }
  }
  g1.reset();
  g2->barrier(default_op);
  if (auto err = reduce_and_check(*g2, 7, reduce_op::sum, a.rank, a.size); !err.empty()) {
    return failed(a, "generation 2 after generation 1 ended: " + err);
  }
  return 0;
}

/// The store seen from another process; see store_multiproc_test.cpp for the other side.
int store_ops(const peer_args& a) {
  auto& s = a.store;
  const auto start = clock_type::now();
  try {
    s.get("never", 200ms);
    return failed(a, "get of a key nobody sets returned");
  } catch (const comm::store_error& e) {
    const auto took = clock_type::now() - start;
    if (e.code() != comm::store_errc::timeout) return failed(a, std::string("got ") + e.what());
    if (took < 200ms || took > 2200ms) return failed(a, "timeout not at its deadline");
  }
  if (s.get_string("from_test", 20s) != "hello") return failed(a, "wrong from_test");
  if (s.add("counter", 5) != 5) return failed(a, "counter did not start at 0");
  s.set_string("from_peer/a", "alpha");
  s.wait({"from_test2", "from_test3"}, 20s);
  s.set_string("done", std::to_string(getpid()));
  return 0;
}

/// All-reduce bandwidth on 4-64 MiB; rank 0 prints one line per size.
/// TROUPE_BENCH_SEGMENT_KIB and TROUPE_BENCH_DEPTH override the defaults, for tuning.
int bench(const peer_args& a) {
  comm::gloo_options opts;
  if (const char* s = std::getenv("TROUPE_BENCH_SEGMENT_KIB")) {
    opts.segment_bytes = std::stoul(s) << 10;
  }
  if (const char* d = std::getenv("TROUPE_BENCH_DEPTH")) opts.pipeline_depth = std::stoi(d);
  auto c = comm::make_gloo_communicator(a.store, {1, "world", a.rank, a.size}, opts);
  for (const size_t mib : {4, 8, 16, 32, 64}) {
    const size_t count = (mib << 20) / sizeof(float);
    std::vector<float> v(count, 1.0f);  // touched before timing: first touch is slow here
    for (int i = 0; i < 2; ++i) c->all_reduce(v.data(), count, reduce_op::sum, default_op);
    // Every rank must run the same number of ops, so rank 0 picks it (about 2 s worth).
    const auto probe = clock_type::now();
    c->all_reduce(v.data(), count, reduce_op::sum, default_op);
    int iters = static_cast<int>(std::clamp(2s / (clock_type::now() - probe), 3L, 500L));
    c->broadcast(&iters, sizeof(iters), 0, default_op);
    const auto start = clock_type::now();
    for (int i = 0; i < iters; ++i) c->all_reduce(v.data(), count, reduce_op::sum, default_op);
    const double secs = std::chrono::duration<double>(clock_type::now() - start).count() / iters;
    const double algbw = static_cast<double>(count * sizeof(float)) / secs / 1e9;
    const double busbw = algbw * 2.0 * (a.size - 1) / a.size;
    if (a.rank == 0) {
      std::printf("all_reduce %2zu MiB, %d ranks: %7.2f ms  algbw %5.2f GB/s  busbw %5.2f GB/s\n",
                  mib, a.size, secs * 1e3, algbw, busbw);
      std::fflush(stdout);
    }
  }
  return 0;
}

/// Many all-reduces of mixed sizes, each checked: for soak runs (`launch N stress`).
int stress(const peer_args& a) {
  auto c = test::connect(a.store, {1, "world", a.rank, a.size});
  const size_t counts[] = {(size_t{4} << 20) / 4 + 3, 1000, (size_t{16} << 20) / 4, 7, 100003};
  for (int i = 0; i < 400; ++i) {
    const size_t count = counts[i % 5];
    if (auto err = reduce_and_check(*c, count, reduce_op::sum, a.rank, a.size); !err.empty()) {
      return failed(a, "iteration " + std::to_string(i) + ": " + err);
    }
  }
  return 0;
}

const std::map<std::string, std::function<int(const peer_args&)>> scenarios{
    {"stress", stress},       {"collectives", collectives},
    {"hang", hang},           {"expect_lost", expect_lost},
    {"survivor", survivor},   {"generations", generations},
    {"store_ops", store_ops}, {"bench", bench},
};

/// The scenarios of collective_scenarios.hpp, which take the store, rank and size directly.
const std::map<std::string, int (*)(comm::kv_store&, int, int)> set_scenarios{
    {"more_collectives", test::more_collectives},
    {"big_collectives", test::big_collectives},
    {"subgroups", test::subgroups},
    {"crossed_tags", test::crossed_tags},
    {"expect_lost_all_to_all", test::expect_lost_all_to_all},
    {"bitwise", test::bitwise_all_reduce},
    {"hier_exact", test::hier_exact},
    {"hier_bytes", test::hier_bytes},
    {"hier_until_lost", test::hier_until_lost},
    {"hier_park", test::hier_park},
    {"gloo_torn_message", test::gloo_torn_message},
    {"tree_sums", test::tree_sums},
};

int serve() {
  comm::tcp_store_server server("127.0.0.1", 0);
  std::printf("port %u\n", static_cast<unsigned>(server.port()));
  std::fflush(stdout);
  park_forever();
}

int launch(int size, const std::string& scenario) {
  comm::tcp_store_server server("127.0.0.1", 0);
  const std::string where = "127.0.0.1:" + std::to_string(server.port());
  std::vector<test::child_process> ranks;
  for (int r = 0; r < size; ++r) {
    ranks.push_back(test::child_process::spawn(
        {"/proc/self/exe", where, std::to_string(r), std::to_string(size), scenario}));
  }
  int rc = 0;
  for (auto& p : ranks) {
    const auto status = p.wait_exit(600s);
    if (!status || *status != 0) rc = 1;
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  // Die with the test that started us, even if it is killed before it can clean up.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) return 9;
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (args.size() == 1 && args[0] == "serve") return serve();
    if (args.size() == 3 && args[0] == "launch") return launch(std::stoi(args[1]), args[2]);
    if (args.size() < 4 || args.size() > 5 ||
        (!scenarios.contains(args[3]) && !set_scenarios.contains(args[3]))) {
      std::cerr << "usage: comm_peer HOST:PORT RANK SIZE SCENARIO [BACKEND] | serve | "
                   "launch SIZE SCENARIO"
                << std::endl;
      return 64;
    }
    if (args.size() == 5) test::backend() = args[4];
    const auto colon = args[0].rfind(':');
    auto store = comm::connect_tcp_store(
        args[0].substr(0, colon), static_cast<uint16_t>(std::stoi(args[0].substr(colon + 1))), 30s);
    const peer_args a{*store, std::stoi(args[1]), std::stoi(args[2])};
    if (set_scenarios.contains(args[3])) return set_scenarios.at(args[3])(a.store, a.rank, a.size);
    return scenarios.at(args[3])(a);
  } catch (const std::exception& e) {
    std::cerr << "comm_peer: " << e.what() << std::endl;
    return 70;
  }
}
