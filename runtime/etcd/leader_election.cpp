#include "runtime/etcd/leader_election.hpp"

#include <nlohmann/json.hpp>

namespace troupe::etcd {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {
// How soon a failed keepalive or campaign is tried again: well inside any step-down window.
constexpr auto kRetryDelay = 200ms;

std::chrono::milliseconds or_default(std::chrono::milliseconds given,
                                     std::chrono::milliseconds fallback) {
  return given.count() > 0 ? given : fallback;
}
}  // namespace

leader_election::leader_election(etcd_client& client, election_options options)
    : client_(client), options_(std::move(options)), key_("/troupe/" + options_.job + "/leader") {
  const auto ttl = std::chrono::duration_cast<std::chrono::milliseconds>(options_.ttl);
  margin_ = or_default(options_.safety_margin, std::max<std::chrono::milliseconds>(ttl / 4, 500ms));
  interval_ = or_default(options_.keepalive_interval, ttl / 4);
  recheck_ = or_default(options_.recheck_interval, ttl);
  if (options_.job.empty() || options_.id.empty()) {
    throw etcd_error(error_kind::invalid_argument, "leader_election needs a job and an id");
  }
  if (margin_ >= ttl || interval_ >= ttl - margin_) {
    throw etcd_error(error_kind::invalid_argument,
                     "leader_election for job '" + options_.job + "': ttl (" +
                         std::to_string(ttl.count()) + " ms) must exceed safety_margin (" +
                         std::to_string(margin_.count()) + " ms) plus keepalive_interval (" +
                         std::to_string(interval_.count()) + " ms)");
  }
}

leader_election::~leader_election() { resign(); }

void leader_election::start() {
  std::lock_guard lock(mutex_);
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { run(); });
}

void leader_election::resign() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (watch_) watch_->cancel();
  watch_.reset();
  const std::int64_t lease = lease_.exchange(0);
  if (leading_.load()) step_down("resigned");
  if (lease != 0) {
    try {
      client_.lease_revoke(lease);
    } catch (const etcd_error&) {
      // etcd is away: the lease runs out by its TTL, after which a standby takes over.
    }
  }
}

bool leader_election::is_leader() const {
  if (!leading_.load()) return false;
  return clock_type::now().time_since_epoch().count() < step_down_at_.load();
}

std::int64_t leader_election::epoch() const { return epoch_.load(); }

compare leader_election::fence() const {
  return compare::created(key_, compare::op::equal, epoch_.load());
}

std::string leader_election::my_value() const {
  return nlohmann::json{{"id", options_.id}, {"address", options_.address}}.dump();
}

std::optional<leader_info> leader_election::leader(const call_options& call) {
  const auto kv = client_.get(key_, call);
  if (!kv) return std::nullopt;
  leader_info info;
  info.epoch = kv->create_revision;
  const auto j = nlohmann::json::parse(kv->value, nullptr, false);
  if (j.is_object()) {
    info.id = j.value("id", std::string());
    info.address = j.value("address", std::string());
  } else {
    info.id = kv->value;  // written by something else than this class
  }
  return info;
}

void leader_election::step_down(const std::string& reason) {
  if (!leading_.exchange(false)) return;
  if (options_.on_lost) options_.on_lost(reason);
}

void leader_election::let_go(const std::string& reason) {
  step_down(reason);
  // Revoking frees the key for a standby now rather than when the lease runs out; when etcd
  // cannot be reached this fails and the TTL does the same, later.
  if (const std::int64_t lease = lease_.exchange(0); lease != 0) {
    try {
      client_.lease_revoke(lease,
                           call_options{clock_type::now() + client_.options().request_timeout});
    } catch (const etcd_error&) {
    }
  }
}

void leader_election::wait_until(clock_type::time_point until) {
  std::unique_lock lock(mutex_);
  wake_.wait_until(lock, until, [this] { return stop_ || key_changed_; });
}

void leader_election::watch_from(std::int64_t revision) {
  if (watch_) watch_->cancel();
  {
    std::lock_guard lock(mutex_);
    key_changed_ = false;
  }
  watch_request request;
  request.key = key_;
  request.start_revision = revision;
  request.idle_timeout = std::max<std::chrono::milliseconds>(recheck_, 1000ms);
  auto changed = [this] {
    {
      std::lock_guard lock(mutex_);
      key_changed_ = true;
    }
    wake_.notify_all();
  };
  // Any change, and a compacted watch too, sends the loop back to read the key.
  watch_ = client_.watch(
      request, [changed](const std::vector<watch_event>&) { changed(); },
      [changed](const etcd_error& e) {
        if (e.kind() == error_kind::compacted) changed();
      });
}

void leader_election::run() {
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (stop_) return;
    }
    if (leading_.load()) {
      keep_alive();
    } else {
      campaign();
    }
  }
}

// One try at becoming leader; when it does not win, waits for the key to change (or for the
// recheck interval) before returning.
void leader_election::campaign() {
  try {
    const call_options call;
    // Read with the store's revision: a watch starts just past it. Past the key's own
    // mod_revision would be wrong once a compaction passed that revision (the leader key is
    // written once per leadership, so on an etcd with auto-compaction it soon is): every
    // watch would fail as compacted at once, and the campaign would spin reading the key.
    txn_request look;
    look.then.push_back(txn_op::get(key_));
    const txn_result seen = client_.txn(look, call);
    const key_value* current = seen.results.empty() || seen.results.front().kvs.empty()
                                   ? nullptr
                                   : &seen.results.front().kvs.front();
    std::int64_t watch_revision = 0;
    if (current) {
      watch_revision = seen.revision + 1;
    } else {
      // The lease counts from before the grant was sent: etcd cannot have started it earlier.
      const auto granted_at = clock_type::now();
      const std::int64_t lease = client_.lease_grant(options_.ttl, call);
      txn_request txn;
      txn.compares.push_back(compare::created(key_, compare::op::equal, 0));
      txn.then.push_back(txn_op::put(key_, my_value(), lease));
      txn.then.push_back(txn_op::get(key_));
      txn.otherwise.push_back(txn_op::get(key_));
      const txn_result result = client_.txn(txn, call);
      const key_value* holder = nullptr;
      const auto& read = result.results.back();
      if (!read.kvs.empty()) holder = &read.kvs.front();
      // A campaign retried on another member after a timeout finds its own key: still a win.
      if (holder != nullptr && holder->lease == lease) {
        epoch_ = holder->create_revision;
        lease_ = lease;
        step_down_at_ = (granted_at + options_.ttl - margin_).time_since_epoch().count();
        next_keepalive_ = granted_at + interval_;
        leading_ = true;
        watch_from(holder->create_revision + 1);
        if (options_.on_elected) options_.on_elected(epoch_.load());
        return;
      }
      try {
        client_.lease_revoke(lease, call);
      } catch (const etcd_error&) {
        // Unused, it runs out by itself.
      }
      watch_revision = result.revision + 1;
    }
    watch_from(watch_revision);
    wait_until(clock_type::now() + recheck_);
  } catch (const etcd_error&) {
    wait_until(clock_type::now() + kRetryDelay);
  }
}

// One round of the leader's loop: renew the lease when due, step down when it cannot have been
// renewed in time, and notice a leader key that someone else deleted.
void leader_election::keep_alive() {
  const auto deadline = clock_type::time_point(clock_type::duration(step_down_at_.load()));
  auto now = clock_type::now();
  if (now >= deadline) {
    let_go("no lease keepalive succeeded for " + std::to_string((options_.ttl - margin_).count()) +
           " ms (etcd unreachable or too slow); stepping down before the lease can expire");
    return;
  }
  bool changed = false;
  {
    std::lock_guard lock(mutex_);
    changed = std::exchange(key_changed_, false);
  }
  if (changed) {
    try {
      const auto kv = client_.get(key_, call_options{deadline});
      if (!kv || kv->create_revision != epoch_.load()) {
        let_go("the leader key was deleted or replaced");
        return;
      }
    } catch (const etcd_error&) {
      // Unknown: the keepalive decides.
    }
  }
  if (now >= next_keepalive_) {
    try {
      const std::int64_t ttl = client_.lease_keepalive_once(lease_.load(), call_options{deadline});
      if (ttl <= 0) {
        let_go("the lease expired or was revoked");
        return;
      }
      step_down_at_ = (now + options_.ttl - margin_).time_since_epoch().count();
      next_keepalive_ = now + interval_;
    } catch (const etcd_error&) {
      next_keepalive_ = clock_type::now() + kRetryDelay;
    }
  }
  wait_until(std::min(next_keepalive_,
                      clock_type::time_point(clock_type::duration(step_down_at_.load()))));
}

}  // namespace troupe::etcd
