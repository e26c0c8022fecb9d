// comm_bench: forks one process per rank, times each collective over a range of sizes on the
// CPU transports (gloo over loopback TCP, shared memory, and the hierarchical communicator
// across simulated nodes) and prints nccl-tests' columns (time, algbw, busbw), plus busbw as a
// fraction of this machine's memcpy bandwidth, the ceiling a single-host transport could reach.
// With --node, one invocation per node (network namespace or host) forks only that node's
// ranks, which meet the others' through a store at a given address.
#include "bench/comm_bench.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>
#include <utility>

#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/host_communicator.hpp"
#include "runtime/comm/shm_communicator.hpp"
#include "runtime/comm/store.hpp"
#include "strategies/exact_reducer.hpp"

namespace troupe::bench {
namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct bench_options {
  std::vector<int> ranks{2, 4};
  std::vector<std::string> ops{"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
  size_t min_bytes = size_t{4} << 10;
  size_t max_bytes = size_t{256} << 20;
  int batches = 5;
  double batch_seconds = 0.2;
  std::vector<std::string> transports{"tcp"};
  int nodes = 2;  ///< hier: the ranks are cut into this many simulated nodes, in rank order
  /// Across real nodes (network namespaces, hosts): this process runs only node `node`'s ranks
  /// (of `nodes`, cut as node_of says), they meet in the store at `store_host:store_port`
  /// (served by this process when `serve_store`) and their pairs listen on `bind_host`.
  /// -1: every rank forked here, a store on loopback.
  int node = -1;
  std::string store_host;
  uint16_t store_port = 0;
  bool serve_store = false;
  std::string bind_host = "127.0.0.1";
};

/// hier: the simulated node of rank r of `size` cut into `nodes` runs of consecutive ranks.
int node_of(int r, int size, int nodes) { return r * nodes / size; }

/// "HOST:PORT" with a port in 1..65535; throws std::invalid_argument otherwise.
std::pair<std::string, uint16_t> parse_endpoint(const std::string& v) {
  const auto colon = v.rfind(':');
  if (colon == std::string::npos || colon == 0) throw std::invalid_argument(v);
  size_t pos = 0;
  const int port = std::stoi(v.substr(colon + 1), &pos);
  if (pos != v.size() - colon - 1 || port < 1 || port > 65535) throw std::invalid_argument(v);
  return {v.substr(0, colon), static_cast<uint16_t>(port)};
}

/// One collective as nccl-tests describes it: how its size counts and the factor that turns
/// algorithm bandwidth into bus bandwidth (the bytes each rank's link must carry).
struct op_table {
  const char* name;
  double (*bus_factor)(int n);
};

double all_reduce_factor(int n) { return 2.0 * (n - 1) / n; }
double gather_factor(int n) { return static_cast<double>(n - 1) / n; }

const op_table tables[] = {
    {"all_reduce", all_reduce_factor},  // size: the buffer reduced in place
    {"all_gather", gather_factor},      // size: the gathered output (all ranks' parts)
    {"reduce_scatter", gather_factor},  // size: the input (all ranks' parts)
    {"all_to_all", gather_factor},      // size: one rank's whole send buffer
    // --reduction exact's sum (strategies/exact_reducer.hpp), one micro-batch per rank in
    // 4 MiB buckets as a job runs it: compare its busbw with all_reduce's.
    {"exact_all_reduce", all_reduce_factor},
};

const op_table* find_op(const std::string& name) {
  for (const auto& t : tables) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

std::optional<size_t> parse_bytes(const std::string& s) {
  if (s.empty()) return std::nullopt;
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &pos);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  const std::string unit = s.substr(pos);
  if (unit.empty()) return v;
  if (unit == "K" || unit == "KiB") return v << 10;
  if (unit == "M" || unit == "MiB") return v << 20;
  if (unit == "G" || unit == "GiB") return v << 30;
  return std::nullopt;
}

// A comma-separated list of at least one item, none empty: an empty value would otherwise
// benchmark nothing and exit 0.
std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty()) throw std::invalid_argument("an empty item");
    out.push_back(item);
  }
  if (out.empty() || s.back() == ',') throw std::invalid_argument("an empty list");
  return out;
}

/// Parses `args`; on error prints why and returns nullopt.
std::optional<bench_options> parse(const std::vector<std::string>& args) {
  bench_options o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (i + 1 >= args.size()) {
      std::cerr << "comm bench: " << a << " needs a value\n";
      return std::nullopt;
    }
    const std::string& v = args[++i];
    try {
      if (a == "--ranks") {
        o.ranks.clear();
        for (const auto& r : split(v)) o.ranks.push_back(std::stoi(r));
      } else if (a == "--ops") {
        o.ops = split(v);
      } else if (a == "--min-bytes" || a == "--max-bytes") {
        const auto b = parse_bytes(v);
        if (!b || *b < 4) throw std::invalid_argument(v);
        (a == "--min-bytes" ? o.min_bytes : o.max_bytes) = *b;
      } else if (a == "--transport") {
        o.transports = split(v);
        for (const auto& t : o.transports) {
          if (t != "tcp" && t != "tcp-signed" && t != "shm" && t != "hier")
            throw std::invalid_argument(t);
        }
      } else if (a == "--nodes") {
        o.nodes = std::stoi(v);
        if (o.nodes < 2) throw std::invalid_argument(v);
      } else if (a == "--node") {
        o.node = std::stoi(v);
        if (o.node < 0) throw std::invalid_argument(v);
      } else if (a == "--store" || a == "--serve-store") {
        std::tie(o.store_host, o.store_port) = parse_endpoint(v);
        o.serve_store = a == "--serve-store";
      } else if (a == "--bind") {
        if (v.empty()) throw std::invalid_argument(v);
        o.bind_host = v;
      } else if (a == "--batches") {
        o.batches = std::stoi(v);
      } else if (a == "--batch-seconds") {
        o.batch_seconds = std::stod(v);
      } else {
        std::cerr << "comm bench: unknown option " << a << "\n";
        return std::nullopt;
      }
    } catch (const std::exception&) {
      std::cerr << "comm bench: bad value for " << a << ": '" << v
                << "'; see troupe bench --help\n";
      return std::nullopt;
    }
  }
  for (const auto& op : o.ops) {
    if (!find_op(op)) {
      std::cerr << "comm bench: unknown op " << op << "\n";
      return std::nullopt;
    }
  }
  for (int r : o.ranks) {
    if (r < 1 || r > 64) {
      std::cerr << "comm bench: rank count " << r << " out of range\n";
      return std::nullopt;
    }
  }
  if (std::find(o.transports.begin(), o.transports.end(), "hier") != o.transports.end()) {
    for (int r : o.ranks) {
      if (r <= o.nodes) {
        std::cerr << "comm bench: hier needs more ranks than --nodes (" << o.nodes << "), not " << r
                  << "\n";
        return std::nullopt;
      }
    }
  }
  if ((o.node >= 0) != !o.store_host.empty()) {
    std::cerr << "comm bench: --node needs --store or --serve-store (and they need --node)\n";
    return std::nullopt;
  }
  if (o.node >= o.nodes) {
    std::cerr << "comm bench: --node " << o.node << " is not one of --nodes " << o.nodes << "\n";
    return std::nullopt;
  }
  if (o.batches < 1 || o.batch_seconds <= 0 || o.min_bytes > o.max_bytes) {
    std::cerr << "comm bench: need --batches >= 1, --batch-seconds > 0, min <= max bytes\n";
    return std::nullopt;
  }
  return o;
}

/// Copy bandwidth of one thread on 64 MiB (bytes copied per second; median of 7 copies).
double memcpy_bandwidth() {
  const size_t bytes = size_t{64} << 20;
  std::vector<char> a(bytes, 1);
  std::vector<char> b(bytes, 2);
  std::vector<double> secs;
  for (int i = 0; i < 7; ++i) {
    const auto start = clock_type::now();
    std::memcpy(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), bytes);
    secs.push_back(std::chrono::duration<double>(clock_type::now() - start).count());
  }
  std::sort(secs.begin(), secs.end());
  return static_cast<double>(bytes) / secs[secs.size() / 2];
}

/// Rank `rank` of `size`: runs every op and size on `transport`; rank 0 prints the rows.
int run_rank(comm::kv_store& store, int rank, int size, const std::string& transport,
             const bench_options& o, double memcpy_bw) {
  // One group name per transport and size: across nodes the groups share one store.
  const comm::comm_identity id{1, "bench-" + transport + "-" + std::to_string(size), rank, size};
  const bool across = o.node >= 0;
  // For tuning: TROUPE_BENCH_SHM_CHUNK_KIB, _SINGLE_COPY_KIB (or off), _SPIN_US and _YIELD_US
  // override shm's defaults.
  comm::shm_options shm;
  if (const char* v = std::getenv("TROUPE_BENCH_SHM_CHUNK_KIB"))
    shm.chunk_bytes = std::stoul(v) << 10;
  if (const char* v = std::getenv("TROUPE_BENCH_SHM_SINGLE_COPY_KIB")) {
    shm.single_copy_bytes = std::string(v) == "off" ? SIZE_MAX : std::stoul(v) << 10;
  }
  if (const char* v = std::getenv("TROUPE_BENCH_SHM_SPIN_US")) {
    shm.spin_time = std::chrono::microseconds(std::stol(v));
  }
  if (const char* v = std::getenv("TROUPE_BENCH_SHM_YIELD_US")) {
    shm.yield_time = std::chrono::microseconds(std::stol(v));
  }
  // tcp-signed: the pairs connect with TCP signatures, as troupe's jobs do between nodes
  // (--data-plane-auth tcp-md5); the keys are gone before the first collective, but the
  // kernel keeps segmentation offload off for a socket that ever had one.
  comm::gloo_options gloo;
  gloo.bind_host = o.bind_host;
  if (transport == "tcp-signed") gloo.pair_key = std::string(32, 'b');
  // hier: each rank a process of its simulated node (TROUPE_NODE, as agents set it), connected
  // the way a job connects, so the transport is the one a job would get.
  std::unique_ptr<comm::communicator> c;
  if (transport == "hier") {
    ::setenv("TROUPE_NODE", std::to_string(node_of(rank, size, o.nodes)).c_str(), 1);
    c = comm::make_host_communicator(store, id, gloo);
  } else if (transport == "shm") {
    c = comm::make_shm_communicator(store, id, shm);
  } else {
    c = comm::make_gloo_communicator(store, id, gloo);
  }
  const std::string nodes = std::to_string(o.nodes) + (across ? " nodes" : " simulated nodes");
  const std::string tcp = across ? "TCP across " + nodes : "loopback TCP";
  std::string label = "gloo, " + tcp;
  if (transport == "shm") {
    label = "shm, shared memory";
  } else if (transport == "hier") {
    label = "hier, " + nodes + ": shm inside, TCP across";
  } else if (transport == "tcp-signed") {
    label += ", pairs signed while connecting";
  }
  const comm::op_options op{120s};
  const auto n = static_cast<size_t>(size);
  const size_t top = (o.max_bytes + 3) / 4 * 4 + 4 * n;  // room for rounding up to n parts
  // Touched before timing: first touch of fresh memory is slow here.
  std::vector<float> in(top / 4, 0.0f);
  std::vector<float> out(top / 4, 0.0f);
  // At each size the ops run one after the other, so that each is measured beside the others
  // (the machine's state drifts over a sweep: an op measured minutes later is not comparable);
  // the table is printed per op at the end, with a line per size on stderr as it goes.
  std::vector<std::string> rows(o.ops.size());
  for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
    for (size_t k = 0; k < o.ops.size(); ++k) {
      const std::string& name = o.ops[k];
      const op_table& t = *find_op(name);
      // Sizes are rounded down to whole floats per rank, as nccl-tests does.
      const size_t per_rank = std::max<size_t>(1, bytes / 4 / n);
      const size_t count = t.bus_factor == all_reduce_factor ? bytes / 4 : per_rank * n;
      std::function<void()> once;
      std::optional<strategies::exact_reducer> exact;
      std::vector<float> leaf;
      if (name == "exact_all_reduce") {
        exact.emplace(std::vector<int>(n, 1), rank, count, size_t{4} << 18);
        leaf.assign(count, 0.0f);
        once = [&] {
          exact->begin_step();
          exact->add_micro_batch(rank, leaf, 0.0);  // a spare buffer comes back in `leaf`
          exact->all_reduce(*c, out.data(), op);
        };
      } else if (name == "all_reduce") {
        once = [&] { c->all_reduce(in.data(), count, comm::reduce_op::sum, op); };
      } else if (name == "all_gather") {
        once = [&] { c->all_gather(in.data(), out.data(), per_rank * 4, op); };
      } else if (name == "reduce_scatter") {
        once = [&] {
          c->reduce_scatter(in.data(), out.data(), per_rank, comm::reduce_op::sum, op);
        };
      } else {
        once = [&] { c->all_to_all(in.data(), out.data(), per_rank * 4, op); };
      }
      once();  // warm-up: scratch buffers, connections' windows
      // Every rank must run the same number of ops, so rank 0 decides from one timed call.
      const auto probe = clock_type::now();
      once();
      const double probe_s = std::chrono::duration<double>(clock_type::now() - probe).count();
      int iters = static_cast<int>(std::clamp(o.batch_seconds / std::max(probe_s, 1e-7), 1.0, 1e5));
      c->broadcast(&iters, sizeof(iters), 0, op);
      std::vector<float> batch_secs;
      for (int b = 0; b < o.batches; ++b) {
        c->barrier(op);
        const auto start = clock_type::now();
        for (int i = 0; i < iters; ++i) once();
        float s = static_cast<float>(
            std::chrono::duration<double>(clock_type::now() - start).count() / iters);
        c->all_reduce(&s, 1, comm::reduce_op::average, op);  // nccl-tests averages over ranks
        batch_secs.push_back(s);
      }
      std::sort(batch_secs.begin(), batch_secs.end());
      const double secs = batch_secs[batch_secs.size() / 2];
      const double size_b = static_cast<double>(count * 4);
      const double algbw = size_b / secs / 1e9;
      const double busbw = algbw * t.bus_factor(size);
      if (rank == 0) {
        char line[160];
        std::snprintf(line, sizeof line, "  %12zu %12zu %10.1f %8.3f %8.3f %9.3f %7d\n", count * 4,
                      count, secs * 1e6, algbw, busbw, busbw * 1e9 / memcpy_bw,
                      2 + iters * o.batches);
        rows[k] += line;
        std::fprintf(stderr, "# %s, %d ranks (%s), %zu B: %.3f GB/s busbw\n", t.name, size,
                     label.c_str(), count * 4, busbw);
      }
    }
  }
  if (rank == 0) {
    for (size_t k = 0; k < o.ops.size(); ++k) {
      std::printf("\n# %s, %d ranks (%s)\n", find_op(o.ops[k])->name, size, label.c_str());
      // calls: how many times the op ran at this size (warm-up, probe, timed batches), so a
      // harness that counts a link's bytes can divide them by op.
      std::printf("# %12s %12s %10s %8s %8s %9s %7s\n", "size(B)", "count(elts)", "time(us)",
                  "algbw", "busbw", "busbw/cpy", "calls");
      std::fputs(rows[k].c_str(), stdout);
    }
    std::fflush(stdout);
  }
  c->barrier(op);
  return 0;
}

/// Forks `size` ranks, serves their store, and waits for all of them (each bounded by a
/// generous deadline, then killed). Returns 0 if every rank succeeded.
int run_group(int size, const std::string& transport, const bench_options& o, double memcpy_bw) {
  // Across nodes only this node's ranks are forked here; the others run in their own.
  std::vector<int> mine;
  for (int r = 0; r < size; ++r) {
    if (o.node < 0 || node_of(r, size, o.nodes) == o.node) mine.push_back(r);
  }
  std::vector<pid_t> pids;
  std::vector<int> port_pipes;
  auto cleanup = [&] {
    for (pid_t p : pids) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
    for (int fd : port_pipes) ::close(fd);
  };
  for (int r : mine) {
    int fds[2];
    if (::pipe(fds) != 0) {
      cleanup();
      return 1;
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::close(fds[1]);
      int rc = 1;
      try {
        // The store is started after the fork (its threads must not be in the children), so
        // the port comes through the pipe.
        pollfd pfd{fds[0], POLLIN, 0};
        uint16_t port = 0;
        if (::poll(&pfd, 1, 30000) == 1 && ::read(fds[0], &port, sizeof(port)) == sizeof(port)) {
          const std::string host = o.node >= 0 ? o.store_host : "127.0.0.1";
          auto store = comm::connect_tcp_store(host, port, 60s);
          rc = run_rank(*store, r, size, transport, o, memcpy_bw);
        }
      } catch (const std::exception& e) {
        std::cerr << "comm bench rank " << r << ": " << e.what() << std::endl;
      }
      std::fflush(stdout);
      ::_exit(rc);
    }
    ::close(fds[0]);
    if (pid < 0) {
      ::close(fds[1]);
      cleanup();
      return 1;
    }
    pids.push_back(pid);
    port_pipes.push_back(fds[1]);
  }
  // Across nodes the ranks meet in the store at --store (serve_store_process serves it).
  std::optional<comm::tcp_store_server> server;
  if (o.node < 0) server.emplace("127.0.0.1", 0);
  const uint16_t port = o.node < 0 ? server->port() : o.store_port;
  for (int fd : port_pipes) {
    if (::write(fd, &port, sizeof(port)) != sizeof(port)) {
      cleanup();
      return 1;
    }
  }
  // Bounded: the largest run here takes minutes, not hours.
  const auto deadline = clock_type::now() + 1h;
  int rc = 0;
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    pid_t done = 0;
    while ((done = ::waitpid(pids[i], &status, WNOHANG)) == 0 && clock_type::now() < deadline) {
      std::this_thread::sleep_for(20ms);
    }
    if (done != pids[i] || !WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
    if (done == pids[i]) pids[i] = -1;
  }
  pids.erase(std::remove(pids.begin(), pids.end(), -1), pids.end());
  cleanup();
  return rc;
}

/// --serve-store: a child process that serves the store of every group at the given address
/// until killed (or until this process dies). A process, not a thread here: the ranks are
/// forked from this one, which must stay without threads. Returns its pid, or -1.
pid_t serve_store_process(const bench_options& o) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::close(fds[0]);
    char ok = 0;
    try {
      comm::tcp_store_server server(o.store_host, o.store_port);
      ok = 1;
      (void)!::write(fds[1], &ok, 1);
      for (;;) ::pause();
    } catch (const std::exception& e) {
      std::cerr << "comm bench: cannot serve the store at " << o.store_host << ":" << o.store_port
                << ": " << e.what() << std::endl;
    }
    (void)!::write(fds[1], &ok, 1);
    ::_exit(1);
  }
  ::close(fds[1]);
  char ok = 0;
  pollfd pfd{fds[0], POLLIN, 0};
  const bool up = pid > 0 && ::poll(&pfd, 1, 30000) == 1 && ::read(fds[0], &ok, 1) == 1 && ok;
  ::close(fds[0]);
  if (!up && pid > 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  return up ? pid : -1;
}

}  // namespace

int run_comm_bench(const std::vector<std::string>& args) {
  const auto o = parse(args);
  if (!o) return 2;
  const double memcpy_bw = memcpy_bandwidth();
  if (o->node >= 0) {
    std::printf(
        "# troupe comm bench: node %d of %d (this process forks its ranks; pairs on %s, "
        "store at %s:%u); transports:",
        o->node, o->nodes, o->bind_host.c_str(), o->store_host.c_str(), o->store_port);
  } else {
    std::printf("# troupe comm bench: ranks forked on this host; transports:");
  }
  for (const auto& t : o->transports)
    std::printf(" %s", t == "shm"    ? "shm"
                       : t == "hier" ? ("hier (" + std::to_string(o->nodes) + " nodes)").c_str()
                                     : (t + " (gloo)").c_str());
  std::printf("\n");
  std::printf("# memcpy bandwidth (1 thread, 64 MiB): %.2f GB/s\n", memcpy_bw / 1e9);
  std::printf(
      "# time: median of %d batches (mean over ranks); algbw = size/time; busbw as "
      "nccl-tests\n",
      o->batches);
  std::fflush(stdout);
  pid_t store_pid = -1;
  if (o->serve_store && (store_pid = serve_store_process(*o)) < 0) return 1;
  int rc = 0;
  for (const auto& transport : o->transports) {
    for (int size : o->ranks) {
      if (run_group(size, transport, *o, memcpy_bw) != 0) {
        std::cerr << "comm bench: a rank of the " << size << "-rank " << transport
                  << " group failed\n";
        rc = 1;
      }
    }
  }
  if (store_pid > 0) {
    ::kill(store_pid, SIGKILL);
    ::waitpid(store_pid, nullptr, 0);
  }
  return rc;
}

}  // namespace troupe::bench

#ifdef TROUPE_COMM_BENCH_MAIN
// The standalone `comm_bench` executable (bench/comm_bench.sh runs it); `troupe bench comm`
// calls run_comm_bench() directly.
int main(int argc, char** argv) {
  return troupe::bench::run_comm_bench(std::vector<std::string>(argv + 1, argv + argc));
}
#endif
