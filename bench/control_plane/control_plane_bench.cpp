#include "bench/control_plane/control_plane_bench.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "actors/coordinator/job/membership.hpp"
#include "actors/wire/connect.hpp"
#include "bench/control_plane/checkpoint_figures.hpp"
#include "bench/control_plane/coordinator_process.hpp"
#include "bench/control_plane/etcd_writes.hpp"
#include "bench/control_plane/measure.hpp"
#include "bench/control_plane/sim_node.hpp"
#include "bench/control_plane/sim_process.hpp"
#include "monitoring/http_client.hpp"
#include "runtime/auth/credentials.hpp"
#include "runtime/sys/child_process.hpp"

namespace troupe::bench::control_plane {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

double seconds_since(int64_t from_ns, int64_t to_ns) {
  return static_cast<double>(to_ns - from_ns) / 1e9;
}

// Progress on stderr, so that --json's stdout stays one object.
void say(const std::string& what) {
  std::fprintf(stderr, "[control-plane] %s\n", what.c_str());
  std::fflush(stderr);
}

// Waits, polling the ledger, until `done()` or the deadline; false at the deadline, or at once
// when the coordinator this process started has exited.
coordinator_process* watched = nullptr;
template <class Pred>
bool wait_until(Pred done, std::chrono::milliseconds limit) {
  const auto deadline = clock_type::now() + limit;
  auto next_look = clock_type::now();
  while (!done()) {
    if (clock_type::now() >= deadline) return false;
    if (watched && clock_type::now() >= next_look) {
      if (!watched->running()) return false;
      next_look = clock_type::now() + std::chrono::milliseconds(100);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  return true;
}

// Every live member holds a rank and has applied step `k` (or later).
bool all_committed(sim_ledger& ledger, int64_t k) {
  for (size_t m = 0; m < ledger.member_count(); ++m) {
    auto& r = ledger.member_at(m);
    if (!r.alive.load(std::memory_order_relaxed)) continue;
    if (r.rank.load(std::memory_order_relaxed) < 0) continue;
    if (r.commit_step.load(std::memory_order_relaxed) < k) return false;
  }
  return true;
}

size_t welcomed_count(sim_ledger& ledger) {
  size_t n = 0;
  for (size_t m = 0; m < ledger.member_count(); ++m)
    n += ledger.member_at(m).welcomed.load() ? 1 : 0;
  return n;
}

size_t placed_count(sim_ledger& ledger) {
  size_t n = 0;
  for (size_t m = 0; m < ledger.member_count(); ++m)
    n += ledger.member_at(m).rank.load() >= 0 ? 1 : 0;
  return n;
}

std::vector<int32_t> live_members(sim_ledger& ledger) {
  std::vector<int32_t> out;
  for (size_t m = 0; m < ledger.member_count(); ++m)
    if (ledger.member_at(m).alive.load())
      out.push_back(ledger.first_member() + static_cast<int32_t>(m));
  return out;
}

// A snapshot of the counters that give rates over a window.
struct window_mark {
  int64_t at_ns = 0;
  std::optional<process_sample> coordinator;
  double sim_cpu_s = 0;
  int64_t lo_bytes = 0;
  uint64_t beats_sent = 0, beats_received = 0, votes = 0, commits = 0;
  uint64_t messages_in = 0, messages_out = 0;  // the coordinator's
  int64_t events_bytes = 0;
  int64_t step = 0;
};

window_mark mark(sim_ledger& ledger, pid_t coordinator, const std::vector<pid_t>& sims,
                 const std::string& events, int64_t step) {
  window_mark w;
  w.at_ns = now_ns();
  if (coordinator > 0) w.coordinator = sample_process(coordinator);
  w.sim_cpu_s = own_cpu_seconds();
  for (pid_t p : sims)
    if (auto sample = sample_process(p)) w.sim_cpu_s += sample->cpu_s;
  w.lo_bytes = loopback_bytes();
  w.beats_sent = ledger.beats_sent.load();
  w.beats_received = ledger.beats_received.load();
  w.messages_in = ledger.messages_to_coordinator.load();
  w.messages_out = ledger.messages_from_coordinator.load();
  w.votes = ledger.votes_sent.load();
  w.commits = ledger.commits_received.load();
  w.events_bytes = file_bytes(events);
  w.step = step;
  return w;
}

struct metrics_scrape {
  int64_t bytes = 0;
  int64_t series = 0;  ///< sample lines
  double ms = 0;       ///< the scrape's round trip
};

// One Prometheus scrape of the coordinator, as a server scraping it would see it.
metrics_scrape scrape_metrics(uint16_t port) {
  metrics_scrape out;
  if (port == 0) return out;
  try {
    const int64_t t0 = now_ns();
    const auto answer = monitoring::http_get("127.0.0.1", port, "/metrics", {},
                                             std::chrono::seconds(10), 64u << 20);
    out.ms = static_cast<double>(now_ns() - t0) / 1e6;
    if (answer.status != 200) return out;
    out.bytes = static_cast<int64_t>(answer.body.size());
    for (size_t at = 0; at < answer.body.size();) {
      const size_t end = answer.body.find('\n', at);
      if (answer.body[at] != '#' && end != at) ++out.series;
      if (end == std::string::npos) break;
      at = end + 1;
    }
  } catch (const std::exception& e) {
    say(std::string("could not scrape the coordinator's metrics: ") + e.what());
  }
  return out;
}

// A port free now on loopback (the kernel's pick), for the coordinator's metrics.
uint16_t free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

struct fault_result {
  int lost = 0;
  double to_commit_s = -1;  ///< the loss -> the last survivor's first commit of a newer generation
};

// Kills `count` live members spread over the nodes, then waits until every survivor applied a
// commit of a newer generation.
fault_result lose_members(sim_ledger& ledger, int count, std::chrono::milliseconds limit) {
  fault_result out;
  auto live = live_members(ledger);
  count = std::min<int>(count, static_cast<int>(live.size()) - 1);
  if (count <= 0) return out;
  uint64_t before = 0;
  for (int32_t m : live) before = std::max(before, ledger.member(m).generation.load());
  std::vector<int32_t> victims;
  victims.reserve(static_cast<size_t>(count));
  const double stride = static_cast<double>(live.size()) / count;
  for (int i = 0; i < count; ++i)
    victims.push_back(live[static_cast<size_t>(std::floor(i * stride))]);
  const int64_t t0 = now_ns();
  for (int32_t v : victims) ledger.member(v).kill.store(true);
  ledger.control().kill_round.fetch_add(1);
  out.lost = count;
  const bool ok = wait_until(
      [&] {
        for (size_t m = 0; m < ledger.member_count(); ++m) {
          auto& r = ledger.member_at(m);
          if (r.alive.load(std::memory_order_relaxed) &&
              r.commit_generation.load(std::memory_order_relaxed) <= before)
            return false;
        }
        return true;
      },
      limit);
  if (!ok) return out;
  int64_t last = t0;
  for (size_t m = 0; m < ledger.member_count(); ++m) {
    auto& r = ledger.member_at(m);
    if (r.alive.load()) last = std::max(last, r.commit_ns.load());
  }
  out.to_commit_s = seconds_since(t0, last);
  return out;
}

void check(const bench_options& o) {
  auto bad = [](const std::string& w) { throw std::invalid_argument(w); };
  if (o.members < 1) bad("--members N is required (1 or more)");
  if (o.etcd && !o.coordinator.empty())
    bad("--etcd starts the coordinator with its own etcd: it does not go with --coordinator");
  if (o.steps < 4) bad("--steps must be at least 4 (two warm-up steps, then measured ones)");
  if (o.members_per_node < 1) bad("--members-per-node must be at least 1");
  if (o.d_model != 8 && !o.coordinator.empty())
    bad("--d-model sizes the coordinator started here; another's has its own model");
  if (o.lose < 0 || o.lose >= o.members) bad("--lose K must be in 0..members-1");
  if (o.lose_percent < 0 || o.lose_percent >= 100) bad("--lose-percent must be in 0..<100");
  if (o.lose_at < 0 || o.lose_at >= o.steps || o.lose_percent_at < 0 ||
      o.lose_percent_at >= o.steps)
    bad("--lose-at and --lose-percent-at must name a step before the last");
  if (o.coordinator.empty() != o.join_token.empty())
    bad("--coordinator HOST:PORT and --join-token FILE go together");
  if (o.first_member < 0 || o.first_member > (1 << 20) - o.members)
    bad("--first-member K must be in 0.." + std::to_string((1 << 20) - o.members));
  // The coordinator started here expects members 0..N-1; later ids would never form its job.
  if (o.first_member > 0 && o.coordinator.empty())
    bad("--first-member K needs --coordinator: a job whose members below K are real workers");
}

}  // namespace

int run_control_plane_bench(const bench_options& opt) {
  check(opt);
  bench_options o = opt;
  if (o.lose > 0 && o.lose_at == 0) o.lose_at = o.steps / 2;
  if (o.lose_percent > 0 && o.lose_percent_at == 0) o.lose_percent_at = o.steps * 3 / 4;
  if (o.lose > 0 && o.lose_percent > 0 && o.lose_at == o.lose_percent_at)
    throw std::invalid_argument("--lose-at and --lose-percent-at must differ");
  const int nodes_count = (o.members + o.members_per_node - 1) / o.members_per_node;
  // The simulation needs one connection per node, here and in the coordinator (told so by
  // TROUPE_SIMULATED_CONNECTIONS: its start-up check would otherwise ask for two per rank).
  if (auto why = raise_descriptor_limit(4L * nodes_count + 1024); !why.empty()) {
    std::cerr << "troupe bench control-plane: " << why << "\n";
    return 2;
  }
  const bool own_dir = o.run_dir.empty() && o.coordinator.empty();
  if (own_dir) {
    char tmpl[] = "/tmp/troupe-control-plane-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("cannot make a run directory under /tmp");
    o.run_dir = tmpl;
  }
  std::unique_ptr<coordinator_process> coordinator;
  std::string host;
  uint16_t port = 0;
  std::string token = o.join_token;
  if (o.coordinator.empty()) {
    say("starting the coordinator for " + std::to_string(o.members) + " members in " + o.run_dir);
    coordinator_request req;
    req.run_dir = o.run_dir + "/run";
    req.members = o.members;
    req.connections = nodes_count;
    req.steps = o.steps;
    req.checkpoint_every = o.checkpoint_every;
    req.d_model = o.d_model;
    req.heartbeat_timeout_ms = o.heartbeat_timeout_ms;
    req.metrics_port = free_local_port();
    if (o.etcd) req.extra = {"--etcd", "local"};
    coordinator = std::make_unique<coordinator_process>(req, 120);
    host = coordinator->host();
    port = coordinator->port();
    token = coordinator->join_token();
  } else if (!actors::parse_endpoint(o.coordinator, host, port)) {
    throw std::invalid_argument("--coordinator must be HOST:PORT, got '" + o.coordinator + "'");
  }
  auth::set_process_credentials(auth::load_join_token(token));
  watched = coordinator.get();
  struct unwatch {
    ~unwatch() { watched = nullptr; }
  } unwatch_on_return;
  const pid_t cpid = coordinator ? coordinator->pid() : -1;
  // Another's coordinator writes its events where its --run-dir says, if the bench was told.
  const std::string events = o.coordinator.empty() ? o.run_dir + "/run/events.jsonl"
                             : o.run_dir.empty()   ? std::string()
                                                   : o.run_dir + "/events.jsonl";
  const auto at_publish = cpid > 0 ? sample_process(cpid) : std::nullopt;

  auto shared = sim_ledger::create_shared(o.members, o.steps, o.first_member);
  sim_ledger& ledger = *shared;
  const auto interval =
      actors::heartbeat_interval(std::chrono::milliseconds(o.heartbeat_timeout_ms));
  const int64_t t_start = now_ns();
  const int64_t unix_ms_at_start = std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::system_clock::now().time_since_epoch())
                                       .count();
  std::vector<pid_t> sims;
  struct reap_sims {
    std::vector<pid_t>& pids;
    sim_ledger& ledger;
    ~reap_sims() {
      ledger.control().quit.store(1);
      for (pid_t p : pids)
        if (!sys::wait_for_exit(p, std::chrono::seconds(30))) {
          ::kill(p, SIGKILL);
          sys::wait_for_exit(p, std::chrono::seconds(5));
        }
    }
  } reap{sims, ledger};
  for (int first = 0; first < nodes_count; first += nodes_per_process) {
    const int last = std::min(nodes_count, first + nodes_per_process);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("cannot fork a simulator process");
    if (pid == 0) {
      sim_process_setup p{first, last, host, port, interval};
      std::_Exit(run_sim_process(o, p, ledger));
    }
    sims.push_back(pid);
  }
  if (!wait_until(
          [&] {
            auto& c = ledger.control();
            return c.nodes_connected.load() + c.nodes_failed.load() >= nodes_count;
          },
          std::chrono::seconds(o.hello_timeout_s)) ||
      ledger.control().nodes_failed.load() > 0) {
    std::cerr << "troupe bench control-plane: " << ledger.control().nodes_failed.load()
              << " simulated nodes could not reach the coordinator (above); see "
              << (coordinator ? coordinator->log_path() : std::string("the coordinator's log"))
              << "\n";
    return 1;
  }
  const int64_t t_connected = now_ns();
  say("connected " + std::to_string(nodes_count) + " nodes in " +
      std::to_string(seconds_since(t_start, t_connected)) + " s");
  const auto form_limit = std::chrono::seconds(o.hello_timeout_s);
  const bool formed = wait_until(
      [&] {
        for (size_t m = 0; m < ledger.member_count(); ++m)
          if (ledger.member_at(m).rank.load(std::memory_order_relaxed) < 0) return false;
        return ledger.refusals.load() == 0;
      },
      form_limit);
  if (!formed) {
    std::cerr << "troupe bench control-plane: the job did not form within " << o.hello_timeout_s
              << " s (" << ledger.refusals.load() << " hellos refused or unanswered, "
              << welcomed_count(ledger) << " welcomed, " << ledger.reconfigures.load()
              << " places received, " << placed_count(ledger) << " with a rank); see "
              << (coordinator ? coordinator->log_path() : std::string("the coordinator's log"))
              << "\n";
    return 1;
  }
  int64_t t_formed = 0;
  for (size_t m = 0; m < ledger.member_count(); ++m)
    t_formed = std::max(t_formed, ledger.member_at(m).placed_ns.load());
  say("formed in " + std::to_string(seconds_since(t_start, t_formed)) + " s");

  const auto step_limit = std::chrono::milliseconds(o.step_ms * 20 + 120000);
  const int64_t warm = 2;
  const int64_t first_fault =
      std::min(o.lose > 0 ? o.lose_at : o.steps, o.lose_percent > 0 ? o.lose_percent_at : o.steps);
  window_mark begin, end;
  fault_result loss, mass_loss;
  // --etcd: etcd's own count of the coordinator's writes, at the window's ends and around the
  // single loss (its generation and the commit after it).
  const uint16_t etcd_port = o.etcd ? local_etcd_port(o.run_dir + "/run").value_or(0) : 0;
  if (o.etcd && !etcd_port) say("the job's etcd was not found: no etcd figures");
  auto etcd_now = [&] { return etcd_port ? scrape_etcd(etcd_port) : std::nullopt; };
  std::optional<etcd_counts> etcd_begin, etcd_end, etcd_before_loss, etcd_after_loss;
  metrics_scrape metrics;
  int64_t t_first_commit = 0;
  for (int64_t k = 1; k <= o.steps; ++k) {
    if (!wait_until([&] { return all_committed(ledger, k); }, step_limit)) {
      std::cerr << "troupe bench control-plane: step " << k << " was not committed within "
                << step_limit.count() / 1000 << " s; see "
                << (coordinator ? coordinator->log_path() : std::string("the coordinator's log"))
                << "\n";
      return 1;
    }
    if (k == 1)
      if (auto* s = ledger.step(1)) t_first_commit = s->last_commit_ns.load();
    if (k == warm) {
      begin = mark(ledger, cpid, sims, events, k);
      etcd_begin = etcd_now();
    }
    if (k == first_fault) {
      end = mark(ledger, cpid, sims, events, k);
      etcd_end = etcd_now();
      if (coordinator) metrics = scrape_metrics(coordinator->metrics_port());
    }
    if (o.lose > 0 && k == o.lose_at) {
      say("losing " + std::to_string(o.lose) + " member(s) after step " + std::to_string(k));
      etcd_before_loss = etcd_now();
      loss = lose_members(ledger, o.lose, step_limit);
      etcd_after_loss = etcd_now();
    }
    if (o.lose_percent > 0 && k == o.lose_percent_at) {
      const int count = std::max(
          1, static_cast<int>(std::lround(o.lose_percent / 100.0 * live_members(ledger).size())));
      say("losing " + std::to_string(count) + " members (" + std::to_string(o.lose_percent) +
          " %) after step " + std::to_string(k));
      mass_loss = lose_members(ledger, count, step_limit);
    }
    if (k % 10 == 0 && !o.json) say("step " + std::to_string(k) + " committed");
  }
  const auto final_sample = cpid > 0 ? sample_process(cpid) : std::nullopt;
  const int64_t final_sample_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count();
  std::optional<int> exit_code;
  bool stopped = true;
  if (coordinator) {
    exit_code = coordinator->wait(120);
  } else {
    // Nobody here waits for another's coordinator to end the job: the members wait for their
    // stop, or the coordinator would see them vanish before the job's end (a loss).
    stopped = wait_until([&] { return live_members(ledger).empty(); }, step_limit);
    if (!stopped)
      std::cerr << "troupe bench control-plane: " << live_members(ledger).size()
                << " simulated members were not stopped within " << step_limit.count() / 1000
                << " s of the last step\n";
  }
  ledger.control().quit.store(1);  // every member has stopped, or is killed now

  // The control plane's share of each measured step: the last vote out -> the last commit in.
  std::vector<double> control_ms;
  auto near_fault = [&](int64_t k) {
    return (o.lose > 0 && k > o.lose_at && k <= o.lose_at + 2) ||
           (o.lose_percent > 0 && k > o.lose_percent_at && k <= o.lose_percent_at + 2);
  };
  for (int64_t k = warm + 1; k <= o.steps; ++k) {
    if (near_fault(k)) continue;
    const auto* s = ledger.step(k);
    control_ms.push_back(static_cast<double>(s->last_commit_ns.load() - s->last_vote_ns.load()) /
                         1e6);
  }
  json r;
  r["members"] = o.members;
  r["first_member"] = o.first_member;
  r["nodes"] = nodes_count;
  r["connections"] = nodes_count;
  r["members_per_node"] = o.members_per_node;
  r["aggregate"] = o.aggregate;
  r["steps"] = o.steps;
  r["step_ms"] = o.step_ms;
  r["d_model"] = o.d_model;
  r["connect_s"] = seconds_since(t_start, t_connected);
  r["forming_s"] = seconds_since(t_start, t_formed);
  r["first_commit_s"] = seconds_since(t_start, t_first_commit);
  r["step_control_ms_p50"] = percentile(control_ms, 0.5);
  r["step_control_ms_p99"] = percentile(control_ms, 0.99);
  r["step_control_ms_max"] = percentile(control_ms, 1.0);
  r["steps_measured"] = control_ms.size();
  const double step_s = o.step_ms / 1000.0;
  if (o.lose > 0) {
    r["lost"] = loss.lost;
    r["loss_to_commit_s"] = loss.to_commit_s;
    r["loss_to_commit_less_step_s"] = loss.to_commit_s - step_s;
  }
  if (o.lose_percent > 0) {
    r["mass_lost"] = mass_loss.lost;
    r["mass_loss_to_commit_s"] = mass_loss.to_commit_s;
    r["mass_loss_to_commit_less_step_s"] = mass_loss.to_commit_s - step_s;
  }
  const double window_s = seconds_since(begin.at_ns, end.at_ns);
  const auto window_steps = static_cast<double>(std::max<int64_t>(1, end.step - begin.step));
  r["window_steps"] = end.step - begin.step;
  if (begin.coordinator && end.coordinator) {
    const double cpu = end.coordinator->cpu_s - begin.coordinator->cpu_s;
    r["coordinator_cpu_s_per_step"] = cpu / window_steps;
    r["coordinator_cpu_cores"] = cpu / std::max(1e-9, window_s);
    // The busiest thread: CAF's I/O thread (decoding, TLS) or the scheduler (the supervisor).
    std::string top_name;
    double top = 0;
    for (const auto& [tid, t] : end.coordinator->threads) {
      const auto before = begin.coordinator->threads.find(tid);
      const double used =
          t.second - (before == begin.coordinator->threads.end() ? 0 : before->second.second);
      if (used > top) top = used, top_name = t.first;
    }
    r["coordinator_busiest_thread"] = top_name;
    r["coordinator_busiest_thread_share"] = cpu > 0 ? top / cpu : 0;
    r["coordinator_threads"] = end.coordinator->threads_count;
    r["coordinator_rss_bytes"] = end.coordinator->rss_bytes;
    if (at_publish)
      r["rss_per_member_bytes"] =
          static_cast<double>(end.coordinator->rss_bytes - at_publish->rss_bytes) / o.members;
  }
  if (final_sample) r["coordinator_hwm_bytes"] = final_sample->hwm_bytes;
  const double sim_cpu = end.sim_cpu_s - begin.sim_cpu_s;
  r["sim_cpu_s_per_step"] = sim_cpu / window_steps;
  if (begin.coordinator && end.coordinator) {
    const double busy =
        (end.coordinator->cpu_s - begin.coordinator->cpu_s + sim_cpu) / std::max(1e-9, window_s);
    r["machine_cores_busy"] = busy;
    r["machine_saturated"] = busy > 0.9 * std::thread::hardware_concurrency();
  }
  r["heartbeats_in_per_s"] =
      static_cast<double>(end.beats_sent - begin.beats_sent) / std::max(1e-9, window_s);
  r["heartbeats_out_per_s"] =
      static_cast<double>(end.beats_received - begin.beats_received) / std::max(1e-9, window_s);
  r["coordinator_messages_in_per_step"] =
      static_cast<double>(end.messages_in - begin.messages_in) / window_steps;
  r["coordinator_messages_out_per_step"] =
      static_cast<double>(end.messages_out - begin.messages_out) / window_steps;
  if (etcd_begin && etcd_end) {
    const double per_step = (etcd_end->writes() - etcd_begin->writes()) / window_steps;
    r["etcd_writes_per_step"] = per_step;
    r["etcd_txns_per_step"] = (etcd_end->txns - etcd_begin->txns) / window_steps;
    if (etcd_before_loss && etcd_after_loss)  // the loss's generation, less its one commit
      r["etcd_writes_per_loss"] = etcd_after_loss->writes() - etcd_before_loss->writes() - per_step;
  }
  r["loopback_bytes_per_s"] =
      static_cast<double>(end.lo_bytes - begin.lo_bytes) / std::max(1e-9, window_s);
  if (!events.empty()) {
    r["events_bytes_per_step"] =
        static_cast<double>(end.events_bytes - begin.events_bytes) / window_steps;
    r["events_lines"] = file_lines(events);
    r["events_bytes"] = file_bytes(events);
    if (metrics.bytes > 0) {
      r["metrics_bytes"] = metrics.bytes;  // one scrape of /metrics
      r["metrics_series"] = metrics.series;
      r["metrics_scrape_ms"] = metrics.ms;
    }
    const checkpoint_figures ck =
        checkpoints_of(events, o.run_dir, ledger, t_start, unix_ms_at_start, final_sample_unix_ms);
    r["checkpoints_committed"] = ck.committed;
    r["checkpoints_failed"] = ck.failed;
    r["checkpoint_shares_written"] = ledger.shares_written.load();
    if (!ck.commit_s.empty()) {
      r["checkpoint_shares_s_p50"] = percentile(ck.shares_s, 0.5);
      r["checkpoint_commit_s_p50"] = percentile(ck.commit_s, 0.5);
      r["checkpoint_commit_s_max"] = percentile(ck.commit_s, 1.0);
      r["checkpoint_coordinator_s_p50"] = percentile(ck.coordinator_s, 0.5);
      r["checkpoint_coordinator_s_max"] = percentile(ck.coordinator_s, 1.0);
      r["manifest_bytes"] = ck.manifest_bytes;
      r["manifest_pieces"] = ck.manifest_pieces;
      // The committer thread's CPU (it validates and writes each manifest; it runs at nice 10
      // on cores training leaves idle, so its wall time above includes waiting for one) over
      // the checkpoints it had committed when the coordinator was last sampled.
      if (final_sample && ck.committed_before > 0)
        for (const auto& [tid, t] : final_sample->threads)
          if (t.first == "troupe-ckpt-c")
            r["checkpoint_committer_cpu_s"] = t.second / ck.committed_before;
    }
  }
  uint64_t newest_generation = 0;
  for (size_t m = 0; m < ledger.member_count(); ++m)
    newest_generation = std::max(newest_generation, ledger.member_at(m).generation.load());
  r["generations"] = newest_generation;
  r["coordinator_exit"] = exit_code ? json(*exit_code) : json(nullptr);
  const bool ok = coordinator ? exit_code == 0 : stopped;
  if (o.json) {
    std::printf("%s\n", r.dump().c_str());
  } else {
    for (const auto& [k, v] : r.items()) std::printf("%-36s %s\n", k.c_str(), v.dump().c_str());
  }
  if (!ok && coordinator)
    std::cerr << "troupe bench control-plane: the coordinator exited with "
              << (exit_code ? std::to_string(*exit_code) : std::string("no exit (killed)"))
              << "; see " << coordinator->log_path() << "\n";
  coordinator.reset();
  if (own_dir && ok) fs::remove_all(o.run_dir);
  return ok ? 0 : 1;
}

}  // namespace troupe::bench::control_plane
