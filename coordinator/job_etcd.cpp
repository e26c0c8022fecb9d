// The coordinator's leadership through etcd (--etcd): the job's own etcd member for
// --etcd local, the election before supervising, and the job's config and state mirrored under
// /troupe/<job id>/, every write fenced by the leadership that makes it.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "coordinator/job_steps.hpp"
#include "monitoring/log.hpp"
#include "runtime/etcd/etcd_client.hpp"
#include "runtime/etcd/leader_election.hpp"
#include "runtime/sys/child_process.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::coordinator {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
namespace ev = troupe::events;

const monitoring::log_context etcd_ctx{"coordinator", -1, 0, -1};
constexpr const char* etcd_binary = "/usr/bin/etcd";

// A dead coordinator keeps the leader key for up to this long. Shorter than the 10 s that
// workers and agents wait for a silent coordinator by default (5 x the heartbeat timeout), so a
// standby could lead before the members give up; long enough that the election's keepalive
// (every ttl / 4) survives a second or two of etcd being slow without stepping down.
constexpr std::chrono::seconds leader_ttl{5};
// How long an ended job's state and config stay in etcd (troupe status and a late standby read
// them); then etcd removes them.
constexpr std::chrono::seconds ended_keys_ttl{600};

void require_readable(const std::string& path, const char* option) {
  if (path.empty()) return;
  std::ifstream in(path);
  if (!in || in.peek() == std::ifstream::traits_type::eof())
    throw config_error(std::string(option) + " '" + path +
                       "' cannot be read (or is empty); give a readable PEM file");
}

// A port the kernel hands out now; etcd binds it a moment later. Another process could take it
// in between, which shows as etcd failing to start, named with its log.
uint16_t free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("etcd: cannot open a socket to find a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    throw std::runtime_error("etcd: cannot find a free loopback port");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::vector<std::string> split_endpoints(const std::string& text) {
  std::vector<std::string> out;
  size_t from = 0;
  while (true) {
    const auto comma = text.find(',', from);
    out.push_back(text.substr(from, comma == std::string::npos ? comma : comma - from));
    if (comma == std::string::npos) return out;
    from = comma + 1;
  }
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == 0) return "localhost";
  return buf;
}

}  // namespace

void check_etcd_options(const train_config& cfg) {
  if (cfg.etcd.endpoints == "local" && access(etcd_binary, X_OK) != 0)
    throw config_error(std::string("--etcd local needs etcd at ") + etcd_binary +
                       ", which is not there; install etcd-server (apt-get install etcd-server) "
                       "or give --etcd the endpoints of a running etcd");
  require_readable(cfg.etcd.cacert, "--etcd-cacert");
  require_readable(cfg.etcd.cert, "--etcd-cert");
  require_readable(cfg.etcd.key, "--etcd-key");
}

struct job_etcd::state {
  const train_config& cfg;
  monitoring::event_log& events;
  std::string job;
  std::string endpoints_words;  // for messages
  monitoring::gauge* leader_gauge = nullptr;
  monitoring::gauge* epoch_gauge = nullptr;

  pid_t local_pid = 0;  // --etcd local: the job's etcd member
  std::string local_log;
  std::optional<etcd::etcd_client> client;
  std::unique_ptr<etcd::leader_election> election;

  std::mutex mutex;
  std::condition_variable wake;
  bool elected = false;
  bool stopping = false;
  bool campaign_stopped = false;  // stop_campaign(): a standby gives up waiting
  std::string found_state;        // /troupe/<job>/state when elected
  // RUN_DIR/incarnation: the job's state in etcd carries it, with the run directory and host,
  // so that a job under an id another job used never reads that job's numbers.
  std::string incarnation;
  // /troupe/<job>/state written by another job under the same id: refused while that job
  // runs (config_error naming --job-id), passed over once it ended. Returns whether `doc`
  // is this job's own state (or one from before incarnations were kept).
  bool is_ours(const nlohmann::json& doc) const;
  void mark_identity(nlohmann::json& doc) const {
    doc["incarnation"] = incarnation;
    doc["run_dir"] = cfg.run_dir;
    doc["host"] = host_name();
  }
  // The job ended: its keys go with a lease of ended_keys_ttl, not at once (a standby elected
  // as the leader resigns must still read that the job ended).
  void lease_keys_of_ended_job();
  std::string client_urls;  // the job is over: a step-down now is ours, not a loss
  std::string lost;
  // Held while on_lost runs, so that forget_on_lost() returns only once it cannot run again.
  std::mutex callback_mutex;
  std::function<void()> on_lost;
  // While its lease has lapsed the leader pauses (see pause_watch): these reach the supervisor.
  std::function<void()> on_pause;
  std::function<void(int64_t)> on_resume;
  std::function<void(const std::string&)> on_give_up;
  bool paused = false;
  steady_clock::time_point paused_since{};
  std::string pause_reason;
  int64_t reelected_epoch = 0;  // the election won again while paused
  int64_t led_epoch = 0;        // the epoch this coordinator last led under
  // Whether the job's state in etcd was last written under `epoch` and the job still runs: a
  // coordinator elected again after a pause resumes only then (no other leader came between).
  bool state_is_ours(int64_t epoch);
  std::string id, address;
  std::thread pause_watcher;
  void pause_watch();

  // The mirror: the newest state to write, handed from the supervisor's thread to the writer.
  nlohmann::json pending;  // null: nothing to write
  bool writer_stop = false;
  int64_t committed_step = 0, checkpoint_step = 0, world = 0;
  uint64_t generation = 0;
  // The batches rollbacks skipped: a coordinator that takes over trains on the same data
  // positions (skipped_batches.json on disk may miss the newest, on a full disk).
  std::vector<int64_t> skipped_steps;
  std::optional<int> ended;  // the job's exit code once it ended: a standby elected later stops
  std::thread writer;

  bool mirroring = false;  // the writer runs: set under `mutex` once leading

  state(const train_config& c, monitoring::event_log& e) : cfg(c), events(e) {}
  // A constructor or lead() that throws leaves no etcd of the job's behind.
  ~state() {
    {
      std::lock_guard lock(mutex);
      writer_stop = true;
    }
    wake.notify_all();
    if (writer.joinable()) writer.join();
    if (pause_watcher.joinable()) pause_watcher.join();
    election.reset();
    client.reset();
    stop_local();
  }

  void start_local();
  void stop_local();
  void wait_until_answering(steady_clock::time_point deadline, bool local);
  bool fenced_put(const std::string& key, const std::string& value);
  void write_loop();
};

void job_etcd::state::start_local() {
  const uint16_t client_port = free_loopback_port();
  uint16_t peer_port = free_loopback_port();
  while (peer_port == client_port) peer_port = free_loopback_port();
  const std::string client_url = "http://127.0.0.1:" + std::to_string(client_port);
  const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer_port);
  const std::string data_dir = cfg.run_dir + "/etcd";
  local_log = cfg.run_dir + "/etcd.log";
  // Through a shell only to send its output to the log; exec keeps etcd's pid the child's. Its
  // own process group keeps a Ctrl-C at the terminal from stopping it before the job ends.
  const std::string command =
      "exec " + std::string(etcd_binary) + " --name troupe-" + shell_quoted(job) + " --data-dir " +
      shell_quoted(data_dir) + " --listen-client-urls " + client_url + " --advertise-client-urls " +
      client_url + " --listen-peer-urls " + peer_url + " --initial-advertise-peer-urls " +
      peer_url + " --initial-cluster troupe-" + shell_quoted(job) + "=" + peer_url + " >>" +
      shell_quoted(local_log) + " 2>&1";
  local_pid = sys::spawn_child({"/bin/sh", "-c", command}, true, SIGKILL);
  endpoints_words = client_url + " (the job's own etcd, log " + local_log + ")";
  client_urls = client_url;
  etcd::client_options options;
  options.endpoints = {client_url};
  client.emplace(options);
}

void job_etcd::state::stop_local() {
  if (local_pid <= 0) return;
  kill(local_pid, SIGTERM);
  if (!sys::wait_for_exit(local_pid, std::chrono::seconds(10))) {
    monitoring::log(monitoring::level::warn, etcd_ctx,
                    "the job's etcd did not stop within 10 s of SIGTERM; killing it");
    kill(local_pid, SIGKILL);
    sys::wait_for_exit(local_pid, std::chrono::seconds(10));
  }
  local_pid = 0;
}

// Until etcd answers a read. A TLS failure will not mend by waiting: it is the options.
void job_etcd::state::wait_until_answering(steady_clock::time_point deadline, bool local) {
  std::string last;
  int bad_answers = 0;  // it answered, but not as etcd does (too large, not JSON, ...)
  std::string last_bad;
  while (true) {
    if (local && sys::try_reap(local_pid)) {
      local_pid = 0;
      throw std::runtime_error("etcd: the job's etcd (" + std::string(etcd_binary) +
                               ") exited before it answered; see its log " + local_log);
    }
    try {
      etcd::call_options call;
      call.deadline = std::min(deadline, steady_clock::now() + milliseconds(2000));
      client->get("/troupe/" + job + "/leader", call);
      return;
    } catch (const etcd::etcd_error& e) {
      if (e.kind() == etcd::error_kind::tls)
        throw config_error(
            "etcd: TLS with " + endpoints_words +
            " failed: the CA given with --etcd-cacert does not verify etcd's certificate, or "
            "etcd refused the client certificate (--etcd-cert, --etcd-key); check that they "
            "belong to this etcd (" +
            e.what() + ")");
      last = e.what();
      if (e.kind() == etcd::error_kind::protocol) {
        ++bad_answers;
        last_bad = e.what();
      }
    }
    if (steady_clock::now() >= deadline && bad_answers > 0)
      throw std::runtime_error("etcd: " + endpoints_words + " answered " +
                               std::to_string(bad_answers) + " times within --etcd-timeout-ms (" +
                               std::to_string(cfg.etcd.timeout_ms) +
                               " ms), but never as etcd does: " + last_bad);
    if (steady_clock::now() >= deadline)
      throw std::runtime_error(
          "etcd: " + endpoints_words + " did not answer within --etcd-timeout-ms (" +
          std::to_string(cfg.etcd.timeout_ms) + " ms): " + last +
          (local ? "" : "; check that etcd runs there and this machine reaches it"));
    std::this_thread::sleep_for(milliseconds(100));
  }
}

bool job_etcd::state::fenced_put(const std::string& key, const std::string& value) {
  etcd::txn_request txn;
  txn.compares.push_back(election->fence());
  txn.then.push_back(etcd::txn_op::put(key, value));
  etcd::call_options call;
  call.deadline = steady_clock::now() + milliseconds(std::min(cfg.etcd.timeout_ms, 10000));
  return client->txn(txn, call).succeeded;
}

void job_etcd::state::lease_keys_of_ended_job() {
  nlohmann::json last;
  {
    std::lock_guard lock(mutex);
    if (!ended || !mirroring || !election) return;
    last = {{"generation", generation},
            {"committed_step", committed_step},
            {"checkpoint_step", checkpoint_step},
            {"world", world},
            {"ended", *ended},
            {"epoch", led_epoch}};
    if (!skipped_steps.empty()) last["skipped_steps"] = skipped_steps;
  }
  mark_identity(last);
  try {
    etcd::call_options call;
    call.deadline = steady_clock::now() + milliseconds(std::min(cfg.etcd.timeout_ms, 5000));
    const int64_t lease = client->lease_grant(ended_keys_ttl, call);
    etcd::txn_request txn;
    txn.compares.push_back(election->fence());
    txn.then.push_back(etcd::txn_op::put("/troupe/" + job + "/state", last.dump(), lease));
    txn.then.push_back(etcd::txn_op::put("/troupe/" + job + "/config", to_json(cfg).dump(), lease));
    client->txn(txn, call);
  } catch (const std::exception& e) {
    monitoring::log(
        monitoring::level::warn, etcd_ctx,
        std::string("etcd: the ended job's keys stay (they could not be leased): ") + e.what());
  }
}

bool job_etcd::state::is_ours(const nlohmann::json& doc) const {
  if (!doc.is_object() || !doc.contains("incarnation") || incarnation.empty()) return true;
  if (doc.value("incarnation", std::string()) == incarnation) return true;
  const std::string theirs = "incarnation " + doc.value("incarnation", std::string("?")) +
                             ", run directory " + doc.value("run_dir", std::string("?")) +
                             " on host " + doc.value("host", std::string("?"));
  if (!doc.contains("ended"))
    throw config_error("etcd: job id '" + job + "' is in use by another job (" + theirs +
                       ", at step " + std::to_string(doc.value("committed_step", int64_t{0})) +
                       "); give this job another --job-id. If that job is gone, remove its "
                       "keys: etcdctl del --prefix /troupe/" +
                       job + "/");
  monitoring::log(monitoring::level::info, etcd_ctx,
                  "etcd: job id '" + job + "' was used by an earlier job (" + theirs +
                      ", ended with exit " + std::to_string(doc.value("ended", 0)) +
                      "); its state is not this job's and is replaced");
  return false;
}

// Off the supervisor's thread: a slow etcd delays the mirror, never the job. Only the newest
// state matters, so one that arrives while a write is in flight replaces any older one waiting.
void job_etcd::state::write_loop() {
  std::unique_lock lock(mutex);
  while (true) {
    wake.wait(lock, [&] { return writer_stop || !pending.is_null(); });
    if (pending.is_null()) return;
    const std::string value = pending.dump();
    pending = nullptr;
    lock.unlock();
    try {
      if (!fenced_put("/troupe/" + job + "/state", value))
        monitoring::log(monitoring::level::warn, etcd_ctx,
                        "etcd: the job's state was not written: this coordinator no longer "
                        "leads (the fence failed)");
    } catch (const etcd::etcd_error& e) {
      monitoring::log(monitoring::level::warn, etcd_ctx,
                      std::string("etcd: writing the job's state failed: ") + e.what());
    }
    lock.lock();
  }
}

job_etcd::job_etcd(const train_config& cfg, monitoring::metrics_registry& registry,
                   monitoring::event_log& events) {
  if (cfg.etcd.endpoints.empty()) return;
  auto s = std::make_unique<state>(cfg, events);
  s->job = etcd_job_id(cfg);
  {
    std::ifstream in(run_paths::incarnation(cfg.run_dir));
    std::getline(in, s->incarnation);
  }
  s->leader_gauge = &registry.add_gauge(
      "troupe_coordinator_leader", "1 while this coordinator leads the job through etcd, else 0");
  s->epoch_gauge =
      &registry.add_gauge("troupe_coordinator_epoch",
                          "Fencing epoch of this coordinator's leadership (etcd revision); 0 "
                          "before it is elected");
  const auto deadline = steady_clock::now() + milliseconds(cfg.etcd.timeout_ms);
  if (cfg.etcd.endpoints == "local") {
    s->start_local();
    state_ = std::move(s);
    state_->wait_until_answering(deadline, true);  // state_ set: a throw here stops etcd
    return;
  }
  etcd::client_options options;
  options.endpoints = split_endpoints(cfg.etcd.endpoints);
  options.ca_file = cfg.etcd.cacert;
  options.cert_file = cfg.etcd.cert;
  options.key_file = cfg.etcd.key;
  s->endpoints_words = cfg.etcd.endpoints;
  s->client_urls = cfg.etcd.endpoints;
  s->client.emplace(options);
  state_ = std::move(s);
}

job_etcd::~job_etcd() {
  if (!state_) return;
  auto& s = *state_;
  {
    std::lock_guard lock(s.mutex);
    s.writer_stop = true;
    s.stopping = true;
  }
  s.wake.notify_all();
  if (s.writer.joinable()) s.writer.join();  // the last state goes out before stepping down
  if (s.pause_watcher.joinable()) s.pause_watcher.join();
  s.lease_keys_of_ended_job();
  if (s.election) {
    try {
      s.election->resign();
    } catch (const std::exception& e) {
      monitoring::log(monitoring::level::warn, etcd_ctx,
                      std::string("etcd: stepping down failed: ") + e.what());
    }
    s.election.reset();
  }
  if (s.leader_gauge) s.leader_gauge->set(0);
  s.client.reset();
  s.stop_local();
}

bool job_etcd::enabled() const { return state_ != nullptr; }

void job_etcd::refuse_another_job() {
  if (!state_) return;
  auto& s = *state_;
  try {
    // Another job under this id is refused before campaigning, not after a whole
    // --etcd-timeout-ms spent waiting for its leader to go.
    etcd::call_options call;
    call.deadline = steady_clock::now() + milliseconds(std::min(s.cfg.etcd.timeout_ms, 10000));
    if (const auto found = s.client->get("/troupe/" + s.job + "/state", call))
      (void)s.is_ours(nlohmann::json::parse(found->value, nullptr, false));
  } catch (const etcd::etcd_error& e) {
    // Not known now: the campaign that follows waits for etcd and says what is wrong with it,
    // and checks again once it answers.
    monitoring::log(monitoring::level::warn, etcd_ctx,
                    std::string("etcd: could not check that no other job holds this job's id "
                                "yet: ") +
                        e.what());
  }
}

void job_etcd::lead(const std::string& address, std::function<void()> on_lost) {
  campaign(address, std::move(on_lost), false);
}

bool job_etcd::stand_by(const std::string& address, std::function<void()> on_lost) {
  return campaign(address, std::move(on_lost), true);
}

void job_etcd::stop_campaign() {
  if (!state_) return;
  {
    std::lock_guard lock(state_->mutex);
    state_->campaign_stopped = true;
  }
  state_->wake.notify_all();
}

bool job_etcd::leading() const {
  return !state_ || !state_->election || state_->election->is_leader();
}

bool job_etcd::confirm_leading() {
  if (!state_ || !state_->election) return true;
  try {
    etcd::txn_request txn;
    txn.compares.push_back(state_->election->fence());
    etcd::call_options call;
    call.deadline = steady_clock::now() + milliseconds(2000);
    return state_->client->txn(txn, call).succeeded;
  } catch (const std::exception&) {
    return false;
  }
}

bool job_etcd::job_ended() const {
  const auto doc = nlohmann::json::parse(found_state(), nullptr, false);
  return doc.is_object() && doc.contains("ended");
}

int64_t job_etcd::epoch() const {
  return state_ && state_->election ? state_->election->epoch() : 0;
}

std::string job_etcd::found_state() const {
  if (!state_) return "";
  std::lock_guard lock(state_->mutex);
  return state_->found_state;
}

std::string job_etcd::client_urls() const { return state_ ? state_->client_urls : ""; }

void job_etcd::release_dead_leader(int pid) {
  if (!state_) return;
  auto& s = *state_;
  try {
    etcd::call_options call;
    call.deadline = steady_clock::now() + milliseconds(3000);
    const auto kv = s.client->get("/troupe/" + s.job + "/leader", call);
    if (!kv || kv->lease == 0) return;
    const auto doc = nlohmann::json::parse(kv->value, nullptr, false);
    const std::string id = doc.is_object() ? doc.value("id", std::string()) : std::string();
    const std::string suffix = ":" + std::to_string(pid);
    if (id.size() <= suffix.size() || id.compare(id.size() - suffix.size(), suffix.size(), suffix))
      return;
    s.client->lease_revoke(kv->lease, call);
    monitoring::log(monitoring::level::warn, etcd_ctx,
                    "etcd: the leading coordinator (" + id +
                        ") died; revoked its lease so that a standby leads at once");
  } catch (const std::exception& e) {
    monitoring::log(monitoring::level::warn, etcd_ctx,
                    std::string("etcd: could not release a dead coordinator's leadership (a "
                                "standby leads once its lease expires): ") +
                        e.what());
  }
}

bool job_etcd::campaign(const std::string& address, std::function<void()> on_lost, bool standby) {
  if (!state_) return true;
  auto& s = *state_;
  const auto deadline = steady_clock::now() + milliseconds(s.cfg.etcd.timeout_ms);
  s.wait_until_answering(deadline, s.local_pid > 0);
  {
    std::lock_guard lock(s.callback_mutex);
    s.on_lost = std::move(on_lost);
  }
  etcd::election_options options;
  options.job = s.job;
  options.id = host_name() + ":" + std::to_string(getpid());
  options.address = address;
  options.ttl = leader_ttl;
  options.on_elected = [&s](std::int64_t epoch) {
    {
      std::lock_guard lock(s.mutex);
      if (s.elected) s.reelected_epoch = epoch;  // won back while paused
      s.elected = true;
    }
    s.wake.notify_all();
  };
  options.on_lost = [&s](const std::string& reason) {
    {
      std::lock_guard lock(s.mutex);
      if (s.stopping || !s.elected || s.paused) return;
      s.paused = true;
      s.paused_since = steady_clock::now();
      s.pause_reason = reason;
      s.reelected_epoch = 0;
    }
    s.leader_gauge->set(0);
    monitoring::log(monitoring::level::error, etcd_ctx,
                    "etcd: this coordinator's leadership of job " + s.job + " lapsed: " + reason +
                        "; training pauses (nothing is committed without a leader) until it leads "
                        "again, another coordinator leads (then this one exits), or etcd stays "
                        "out of reach for --etcd-timeout-ms (" +
                        std::to_string(s.cfg.etcd.timeout_ms) + " ms; then the job ends, exit 1)");
    {
      std::lock_guard lock(s.callback_mutex);
      if (s.on_pause) s.on_pause();
    }
    s.wake.notify_all();
  };
  const std::string id = options.id;
  refuse_another_job();
  s.election = std::make_unique<etcd::leader_election>(*s.client, std::move(options));
  s.election->start();
  {
    std::unique_lock lock(s.mutex);
    if (standby) {
      s.wake.wait(lock, [&] { return s.elected || s.campaign_stopped; });
      if (!s.elected) {
        lock.unlock();
        s.election.reset();  // stops campaigning
        return false;
      }
    } else if (!s.wake.wait_until(lock, deadline, [&] { return s.elected; })) {
      lock.unlock();
      std::string holder;
      try {
        etcd::call_options call;
        call.deadline = steady_clock::now() + milliseconds(2000);
        if (auto l = s.election->leader(call))
          holder = "; " + l->id + " (at " + l->address + ") leads it under epoch " +
                   std::to_string(l->epoch);
      } catch (const std::exception&) {
      }
      s.election.reset();
      throw std::runtime_error("etcd: this coordinator was not elected leader of job " + s.job +
                               " through " + s.endpoints_words + " within --etcd-timeout-ms (" +
                               std::to_string(s.cfg.etcd.timeout_ms) + " ms)" + holder);
    }
  }
  const int64_t epoch = s.election->epoch();
  try {
    // Where the job stands, as the last leader left it: a takeover starts from there.
    etcd::call_options call;
    call.deadline = steady_clock::now() + milliseconds(std::min(s.cfg.etcd.timeout_ms, 10000));
    const auto found = s.client->get("/troupe/" + s.job + "/state", call);
    std::lock_guard lock(s.mutex);
    const auto doc = found ? nlohmann::json::parse(found->value, nullptr, false) : nlohmann::json();
    if (found && s.is_ours(doc)) {
      s.found_state = found->value;
      if (doc.is_object()) {
        s.generation = doc.value("generation", uint64_t{0});
        s.committed_step = doc.value("committed_step", int64_t{0});
        s.checkpoint_step = doc.value("checkpoint_step", int64_t{0});
        s.world = doc.value("world", int64_t{0});
        if (const auto it = doc.find("skipped_steps"); it != doc.end() && it->is_array())
          s.skipped_steps = it->get<std::vector<int64_t>>();
      }
    }
  } catch (const etcd::etcd_error& e) {
    throw std::runtime_error(std::string("etcd: reading the job's state failed: ") + e.what());
  }
  if (standby && job_ended()) {
    // Elected as the last leader resigned at the job's end: nothing to lead.
    {
      std::lock_guard lock(s.mutex);
      s.stopping = true;
    }
    s.election->resign();
    s.election.reset();
    return false;
  }
  {
    // Every leadership marks the state with its epoch at once, so that a leader that paused
    // and wins again can tell whether another led in between (state_is_ours).
    nlohmann::json marked = nlohmann::json::parse(s.found_state, nullptr, false);
    if (!marked.is_object()) marked = nlohmann::json::object();
    marked["epoch"] = epoch;
    s.mark_identity(marked);
    try {
      s.fenced_put("/troupe/" + s.job + "/state", marked.dump());
    } catch (const etcd::etcd_error& e) {
      throw std::runtime_error(std::string("etcd: writing the job's state failed: ") + e.what());
    }
    std::lock_guard lock(s.mutex);
    s.led_epoch = epoch;
  }
  s.leader_gauge->set(1);
  s.epoch_gauge->set(static_cast<double>(epoch));
  s.events.write(ev::to_json(ev::leader{.epoch = epoch, .id = id, .address = address}));
  say("leading job %s through etcd %s (epoch %lld)", s.job.c_str(), s.endpoints_words.c_str(),
      static_cast<long long>(epoch));
  try {
    if (!s.fenced_put("/troupe/" + s.job + "/config", to_json(s.cfg).dump()))
      throw std::runtime_error("etcd: this coordinator lost leadership of job " + s.job +
                               " before it wrote the job's config");
  } catch (const etcd::etcd_error& e) {
    throw std::runtime_error(std::string("etcd: writing the job's config failed: ") + e.what());
  }
  s.writer = std::thread([&s] { s.write_loop(); });
  s.id = id;
  s.address = address;
  s.pause_watcher = std::thread([&s] { s.pause_watch(); });
  std::lock_guard lock(s.mutex);
  s.mirroring = true;
  return true;
}

bool job_etcd::state::state_is_ours(int64_t epoch) {
  try {
    etcd::call_options call;
    call.deadline = steady_clock::now() + milliseconds(std::min(cfg.etcd.timeout_ms, 5000));
    const auto kv = client->get("/troupe/" + job + "/state", call);
    if (!kv) return false;
    const auto doc = nlohmann::json::parse(kv->value, nullptr, false);
    if (!doc.is_object() || doc.contains("ended")) return false;
    if (doc.value("epoch", int64_t{0}) != epoch) return false;
    // Marked with the new epoch, as every leadership does.
    nlohmann::json marked = doc;
    marked["epoch"] = election->epoch();
    return fenced_put("/troupe/" + job + "/state", marked.dump());
  } catch (const std::exception&) {
    return false;  // not known: stepping aside is the safe answer
  }
}

void job_etcd::on_pause(std::function<void()> pause, std::function<void(int64_t)> resume,
                        std::function<void(const std::string&)> give_up) {
  if (!state_) return;
  std::lock_guard lock(state_->callback_mutex);
  state_->on_pause = std::move(pause);
  state_->on_resume = std::move(resume);
  state_->on_give_up = std::move(give_up);
}

// While paused: leading again resumes the job under the new epoch; another coordinator leading
// deposes this one (on_lost: its process ends, the members go to the new leader); etcd out of
// reach for longer than --etcd-timeout-ms ends the job.
void job_etcd::state::pause_watch() {
  auto last_look = steady_clock::time_point{};
  std::unique_lock lock(mutex);
  while (!stopping) {
    wake.wait_for(lock, milliseconds(200));
    if (stopping || !paused) continue;
    if (reelected_epoch > 0) {
      const int64_t epoch = std::exchange(reelected_epoch, 0);
      const int64_t before = led_epoch;
      lock.unlock();
      const bool ours = state_is_ours(before);
      lock.lock();
      if (!ours) {
        lost = "another coordinator led the job while this one was paused";
        const std::string why = lost;
        lock.unlock();
        monitoring::log(monitoring::level::warn, etcd_ctx,
                        "etcd: " + why + "; this one steps aside");
        try {
          election->resign();
        } catch (const std::exception&) {
        }
        std::lock_guard cb(callback_mutex);
        if (on_lost) on_lost();
        return;
      }
      led_epoch = epoch;
      const auto paused_ms =
          std::chrono::duration_cast<milliseconds>(steady_clock::now() - paused_since).count();
      paused = false;
      lock.unlock();
      leader_gauge->set(1);
      epoch_gauge->set(static_cast<double>(epoch));
      events.write(ev::to_json(ev::leader{.epoch = epoch, .id = id, .address = address}));
      monitoring::log(monitoring::level::warn, etcd_ctx,
                      "etcd: leading job " + job + " again (epoch " + std::to_string(epoch) +
                          ") after " + std::to_string(paused_ms) + " ms; training goes on");
      {
        std::lock_guard cb(callback_mutex);
        if (on_resume) on_resume(epoch);
      }
      lock.lock();
      continue;
    }
    const auto now = steady_clock::now();
    if (now - paused_since > milliseconds(cfg.etcd.timeout_ms)) {
      lost = "etcd " + endpoints_words + " gave this coordinator no leadership for " +
             std::to_string(cfg.etcd.timeout_ms) + " ms (--etcd-timeout-ms; " + pause_reason +
             "); check that a quorum of etcd's members runs and is reachable, then --resume";
      const std::string why = lost;
      lock.unlock();
      monitoring::log(monitoring::level::error, etcd_ctx, why);
      {
        std::lock_guard cb(callback_mutex);
        if (on_give_up) on_give_up(why);
      }
      return;
    }
    if (now - last_look < std::chrono::seconds(1)) continue;
    last_look = now;
    lock.unlock();
    std::optional<etcd::leader_info> other;
    try {
      etcd::call_options call;
      call.deadline = steady_clock::now() + milliseconds(1000);
      other = election->leader(call);
    } catch (const std::exception&) {  // etcd still out of reach
    }
    if (other && other->id != id) {
      {
        std::lock_guard relock(mutex);
        lost = "coordinator " + other->id + " (at " + other->address +
               ") leads the job under epoch " + std::to_string(other->epoch);
      }
      monitoring::log(monitoring::level::warn, etcd_ctx,
                      "etcd: " + lost + "; this one steps aside");
      std::lock_guard cb(callback_mutex);
      if (on_lost) on_lost();
      return;
    }
    lock.lock();
  }
}

void job_etcd::observe(const ev::job_event& event) {
  if (!state_) return;
  auto& s = *state_;
  bool changed = false;
  std::visit(ev::overloaded{
                 [&](const ev::step& e) { s.committed_step = std::max(s.committed_step, e.step); },
                 [&](const ev::generation& e) {
                   s.generation = e.number;
                   s.world = e.world;
                   s.committed_step = std::max(s.committed_step, e.start_step);
                   changed = true;
                 },
                 [&](const ev::checkpoint& e) {
                   s.checkpoint_step = e.step;
                   s.committed_step = std::max(s.committed_step, e.step);
                   changed = true;
                 },
                 [&](const ev::job_ended& e) {
                   s.ended = e.exit_code;
                   changed = true;
                 },
                 [&](const ev::checkpoint_fallback& e) {
                   if (e.resumed_step < 0) return;  // the job ends
                   s.checkpoint_step = e.resumed_step;
                   changed = true;
                 },
                 [&](const ev::diverged& e) {
                   if (e.action != "rollback") return;
                   s.skipped_steps = e.skipped_steps;
                   changed = true;
                 },
                 [](const auto&) {},
             },
             event);
  if (!changed) return;
  {
    std::lock_guard lock(s.mutex);
    if (!s.mirroring) return;
    s.pending = {{"generation", s.generation},
                 {"committed_step", s.committed_step},
                 {"checkpoint_step", s.checkpoint_step},
                 {"world", s.world}};
    if (!s.skipped_steps.empty()) s.pending["skipped_steps"] = s.skipped_steps;
    if (s.ended) s.pending["ended"] = *s.ended;
    s.pending["epoch"] = s.led_epoch;
    s.mark_identity(s.pending);
  }
  s.wake.notify_all();
}

void job_etcd::forget_on_lost() {
  if (!state_) return;
  std::lock_guard lock(state_->callback_mutex);
  state_->on_lost = nullptr;
  state_->on_pause = nullptr;
  state_->on_resume = nullptr;
  state_->on_give_up = nullptr;
}

std::string job_etcd::lost_reason() const {
  if (!state_) return "";
  std::lock_guard lock(state_->mutex);
  return state_->lost;
}

}  // namespace troupe::coordinator
