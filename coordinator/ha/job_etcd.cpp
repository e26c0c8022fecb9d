#include "coordinator/ha/job_etcd.hpp"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "coordinator/ha/state_mirror.hpp"
#include "monitoring/log.hpp"
#include "runtime/etcd/etcd_client.hpp"
#include "runtime/etcd/leader_election.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::coordinator::ha {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
namespace ev = troupe::events;

const monitoring::log_context etcd_ctx{"coordinator", -1, 0, -1};

// A dead coordinator keeps the leader key for up to this long. Shorter than the 10 s that
// workers and agents wait for a silent coordinator by default (5 x the heartbeat timeout), so a
// standby could lead before the members give up; long enough that the election's keepalive
// (every ttl / 4) survives a second or two of etcd being slow without stepping down.
constexpr std::chrono::seconds leader_ttl{5};
// How long an ended job's state and config stay in etcd (troupe status and a late standby read
// them); then etcd removes them.
constexpr std::chrono::seconds ended_keys_ttl{600};

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == 0) return "localhost";
  return buf;
}

}  // namespace

struct job_etcd::state {
  const train_config& cfg;
  monitoring::event_log& events;
  std::string job;
  monitoring::gauge* leader_gauge = nullptr;
  monitoring::gauge* epoch_gauge = nullptr;

  std::unique_ptr<ha::etcd_link> link;
  std::unique_ptr<ha::state_mirror> mirror;
  std::unique_ptr<etcd::leader_election> election;

  std::mutex mutex;
  std::condition_variable wake;
  bool elected = false;
  bool stopping = false;
  bool campaign_stopped = false;  // stop_campaign(): a standby gives up waiting
  std::string found_state;        // /troupe/<job>/state when elected
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
  std::string id, address;
  std::thread pause_watcher;
  void pause_watch();
  ha::fence_fn fence() {
    return [this] { return election->fence(); };
  }

  state(const train_config& c, monitoring::event_log& e) : cfg(c), events(e) {}
  // A constructor or lead() that throws leaves no etcd of the job's behind.
  ~state() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    if (mirror) mirror->stop();
    if (pause_watcher.joinable()) pause_watcher.join();
    election.reset();
    mirror.reset();
    link.reset();
  }
};

job_etcd::job_etcd(const train_config& cfg, monitoring::metrics_registry& registry,
                   monitoring::event_log& events) {
  if (cfg.etcd.endpoints.empty()) return;
  auto s = std::make_unique<state>(cfg, events);
  s->job = etcd_job_id(cfg);
  ha::job_identity who{s->job, "", cfg.run_dir, host_name()};
  {
    std::ifstream in(run_paths::incarnation(cfg.run_dir));
    std::getline(in, who.incarnation);
  }
  s->leader_gauge = &registry.add_gauge(
      "troupe_coordinator_leader", "1 while this coordinator leads the job through etcd, else 0");
  s->epoch_gauge =
      &registry.add_gauge("troupe_coordinator_epoch",
                          "Fencing epoch of this coordinator's leadership (etcd revision); 0 "
                          "before it is elected");
  const auto deadline = steady_clock::now() + milliseconds(cfg.etcd.timeout_ms);
  s->link = std::make_unique<ha::etcd_link>(cfg, s->job);
  s->mirror = std::make_unique<ha::state_mirror>(s->link->client(), std::move(who),
                                                 milliseconds(cfg.etcd.timeout_ms));
  state_ = std::move(s);
  // state_ set: a throw here stops the job's own etcd.
  if (state_->link->local()) state_->link->wait_until_answering(deadline);
}

job_etcd::~job_etcd() {
  if (!state_) return;
  auto& s = *state_;
  {
    std::lock_guard lock(s.mutex);
    s.stopping = true;
  }
  s.wake.notify_all();
  s.mirror->stop();  // the last state goes out before stepping down
  if (s.pause_watcher.joinable()) s.pause_watcher.join();
  s.mirror->lease_keys_of_ended_job(to_json(s.cfg).dump(), ended_keys_ttl);
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
  s.link->stop();
}

bool job_etcd::enabled() const { return state_ != nullptr; }

void job_etcd::refuse_another_job() {
  if (state_) state_->mirror->refuse_another_job();
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
    return state_->link->client().txn(txn, call).succeeded;
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

std::string job_etcd::client_urls() const { return state_ ? state_->link->client_urls() : ""; }

void job_etcd::release_dead_leader(int pid) {
  if (!state_) return;
  auto& s = *state_;
  try {
    etcd::call_options call;
    call.deadline = steady_clock::now() + milliseconds(3000);
    const auto kv = s.link->client().get("/troupe/" + s.job + "/leader", call);
    if (!kv || kv->lease == 0) return;
    const auto doc = nlohmann::json::parse(kv->value, nullptr, false);
    const std::string id = doc.is_object() ? doc.value("id", std::string()) : std::string();
    const std::string suffix = ":" + std::to_string(pid);
    if (id.size() <= suffix.size() || id.compare(id.size() - suffix.size(), suffix.size(), suffix))
      return;
    s.link->client().lease_revoke(kv->lease, call);
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
  s.link->wait_until_answering(deadline);
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
  s.election = std::make_unique<etcd::leader_election>(s.link->client(), std::move(options));
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
                               " through " + s.link->words() + " within --etcd-timeout-ms (" +
                               std::to_string(s.cfg.etcd.timeout_ms) + " ms)" + holder);
    }
  }
  const int64_t epoch = s.election->epoch();
  try {
    // Where the job stands, as the last leader left it: a takeover starts from there.
    std::string found = s.mirror->read_found();
    std::lock_guard lock(s.mutex);
    s.found_state = std::move(found);
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
    // and wins again can tell whether another led in between (state_mirror::still_ours).
    try {
      s.mirror->mark(s.found_state, epoch, s.fence());
    } catch (const etcd::etcd_error& e) {
      throw std::runtime_error(std::string("etcd: writing the job's state failed: ") + e.what());
    }
    std::lock_guard lock(s.mutex);
    s.led_epoch = epoch;
  }
  s.leader_gauge->set(1);
  s.epoch_gauge->set(static_cast<double>(epoch));
  s.events.write(ev::to_json(ev::leader{.epoch = epoch, .id = id, .address = address}));
  monitoring::log(monitoring::level::info, etcd_ctx,
                  "leading job " + s.job + " through etcd " + s.link->words() + " (epoch " +
                      std::to_string(epoch) + ")");
  try {
    if (!s.mirror->put_config(to_json(s.cfg).dump(), s.fence()))
      throw std::runtime_error("etcd: this coordinator lost leadership of job " + s.job +
                               " before it wrote the job's config");
  } catch (const etcd::etcd_error& e) {
    throw std::runtime_error(std::string("etcd: writing the job's config failed: ") + e.what());
  }
  s.mirror->start(s.fence(), epoch);
  s.id = id;
  s.address = address;
  s.pause_watcher = std::thread([&s] { s.pause_watch(); });
  return true;
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
      const bool ours = mirror->still_ours(before, epoch, fence());
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
      lost = "etcd " + link->words() + " gave this coordinator no leadership for " +
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
  if (state_) state_->mirror->observe(event);
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

}  // namespace troupe::coordinator::ha
