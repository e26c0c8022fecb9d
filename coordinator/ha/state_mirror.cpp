#include "coordinator/ha/state_mirror.hpp"

#include <algorithm>

#include "monitoring/log.hpp"
#include "runtime/config.hpp"

namespace troupe::coordinator::ha {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
namespace ev = troupe::events;

const monitoring::log_context etcd_ctx{"coordinator", -1, 0, -1};

}  // namespace

state_mirror::state_mirror(etcd::etcd_client& client, job_identity who, milliseconds timeout)
    : client_(client), who_(std::move(who)), timeout_(timeout) {}

state_mirror::~state_mirror() { stop(); }

etcd::call_options state_mirror::call_within(milliseconds most) const {
  etcd::call_options call;
  call.deadline = steady_clock::now() + std::min(timeout_, most);
  return call;
}

void state_mirror::mark_identity(nlohmann::json& doc) const {
  doc["incarnation"] = who_.incarnation;
  doc["run_dir"] = who_.run_dir;
  doc["host"] = who_.host;
}

bool state_mirror::is_ours(const nlohmann::json& doc) const {
  if (!doc.is_object() || !doc.contains("incarnation") || who_.incarnation.empty()) return true;
  if (doc.value("incarnation", std::string()) == who_.incarnation) return true;
  const std::string theirs = "incarnation " + doc.value("incarnation", std::string("?")) +
                             ", run directory " + doc.value("run_dir", std::string("?")) +
                             " on host " + doc.value("host", std::string("?"));
  if (!doc.contains("ended"))
    throw config_error("etcd: job id '" + who_.job + "' is in use by another job (" + theirs +
                       ", at step " + std::to_string(doc.value("committed_step", int64_t{0})) +
                       "); give this job another --job-id. If that job is gone, remove its "
                       "keys: etcdctl del --prefix /troupe/" +
                       who_.job + "/");
  monitoring::log(monitoring::level::info, etcd_ctx,
                  "etcd: job id '" + who_.job + "' was used by an earlier job (" + theirs +
                      ", ended with exit " + std::to_string(doc.value("ended", 0)) +
                      "); its state is not this job's and is replaced");
  return false;
}

void state_mirror::refuse_another_job() {
  try {
    // Another job under this id is refused before campaigning, not after a whole
    // --etcd-timeout-ms spent waiting for its leader to go.
    if (const auto found = client_.get(key(), call_within(milliseconds(10000))))
      (void)is_ours(nlohmann::json::parse(found->value, nullptr, false));
  } catch (const etcd::etcd_error& e) {
    // Not known now: the campaign that follows waits for etcd and says what is wrong with it,
    // and checks again once it answers.
    monitoring::log(monitoring::level::warn, etcd_ctx,
                    std::string("etcd: could not check that no other job holds this job's id "
                                "yet: ") +
                        e.what());
  }
}

std::string state_mirror::read_found() {
  const auto found = client_.get(key(), call_within(milliseconds(10000)));
  if (!found) return "";
  const auto doc = nlohmann::json::parse(found->value, nullptr, false);
  if (!is_ours(doc)) return "";
  if (doc.is_object()) {
    std::lock_guard lock(mutex_);
    // A damaged number reads as 0 (nlohmann throws on a wrong type): nothing is taken from it.
    const auto number = [&](const char* name, auto fallback) {
      try {
        return doc.value(name, fallback);
      } catch (const nlohmann::json::exception&) {
        return fallback;
      }
    };
    progress_.generation = number("generation", uint64_t{0});
    progress_.committed_step = number("committed_step", int64_t{0});
    progress_.checkpoint_step = number("checkpoint_step", int64_t{0});
    progress_.world = number("world", int64_t{0});
    if (const auto it = doc.find("skipped_steps"); it != doc.end() && it->is_array()) {
      try {
        progress_.skipped_steps = it->get<std::vector<int64_t>>();
      } catch (const nlohmann::json::exception&) {
        progress_.skipped_steps.clear();
      }
    }
  }
  return found->value;
}

bool state_mirror::fenced_put(const std::string& k, const std::string& value,
                              const fence_fn& fence) {
  etcd::txn_request txn;
  txn.compares.push_back(fence());
  txn.then.push_back(etcd::txn_op::put(k, value));
  return client_.txn(txn, call_within(milliseconds(10000))).succeeded;
}

bool state_mirror::mark(const std::string& found, int64_t epoch, const fence_fn& fence) {
  nlohmann::json marked = nlohmann::json::parse(found, nullptr, false);
  if (!marked.is_object()) marked = nlohmann::json::object();
  marked["epoch"] = epoch;
  mark_identity(marked);
  const bool written = fenced_put(key(), marked.dump(), fence);
  std::lock_guard lock(mutex_);
  epoch_ = epoch;
  return written;
}

bool state_mirror::put_config(const std::string& config_json, const fence_fn& fence) {
  return fenced_put("/troupe/" + who_.job + "/config", config_json, fence);
}

bool state_mirror::still_ours(int64_t before, int64_t epoch, const fence_fn& fence) {
  try {
    const auto kv = client_.get(key(), call_within(milliseconds(5000)));
    if (!kv) return false;
    const auto doc = nlohmann::json::parse(kv->value, nullptr, false);
    if (!doc.is_object() || doc.contains("ended")) return false;
    if (!doc.contains("epoch") || !doc["epoch"].is_number_integer() ||
        doc["epoch"].get<int64_t>() != before)
      return false;
    if (doc.contains("incarnation") && !who_.incarnation.empty() &&
        doc.value("incarnation", std::string()) != who_.incarnation)
      return false;
    // Marked with the new epoch, as every leadership does.
    nlohmann::json marked = doc;
    marked["epoch"] = epoch;
    if (!fenced_put(key(), marked.dump(), fence)) return false;
    set_epoch(epoch);
    return true;
  } catch (const std::exception&) {
    return false;  // not known: stepping aside is the safe answer
  }
}

void state_mirror::start(fence_fn fence, int64_t epoch) {
  std::lock_guard lock(mutex_);
  fence_ = std::move(fence);
  epoch_ = epoch;
  mirroring_ = true;
  stopping_ = false;
  writer_ = std::thread([this] { write_loop(); });
}

void state_mirror::set_epoch(int64_t epoch) {
  std::lock_guard lock(mutex_);
  epoch_ = epoch;
}

job_progress state_mirror::progress() const {
  std::lock_guard lock(mutex_);
  return progress_;
}

nlohmann::json state_mirror::document_locked() const {
  nlohmann::json doc = {{"generation", progress_.generation},
                        {"committed_step", progress_.committed_step},
                        {"checkpoint_step", progress_.checkpoint_step},
                        {"world", progress_.world}};
  if (!progress_.skipped_steps.empty()) doc["skipped_steps"] = progress_.skipped_steps;
  if (progress_.ended) doc["ended"] = *progress_.ended;
  doc["epoch"] = epoch_;
  mark_identity(doc);
  return doc;
}

void state_mirror::observe(const ev::job_event& event) {
  std::unique_lock lock(mutex_);
  auto& p = progress_;
  bool changed = false;
  std::visit(ev::overloaded{
                 [&](const ev::step& e) { p.committed_step = std::max(p.committed_step, e.step); },
                 [&](const ev::generation& e) {
                   p.generation = e.number;
                   p.world = e.world;
                   p.committed_step = std::max(p.committed_step, e.start_step);
                   changed = true;
                 },
                 [&](const ev::checkpoint& e) {
                   p.checkpoint_step = e.step;
                   p.committed_step = std::max(p.committed_step, e.step);
                   changed = true;
                 },
                 [&](const ev::job_ended& e) {
                   p.ended = e.exit_code;
                   changed = true;
                 },
                 [&](const ev::checkpoint_fallback& e) {
                   if (e.resumed_step < 0) return;  // the job ends
                   p.checkpoint_step = e.resumed_step;
                   changed = true;
                 },
                 [&](const ev::diverged& e) {
                   if (e.action != "rollback") return;
                   p.skipped_steps = e.skipped_steps;
                   changed = true;
                 },
                 [](const auto&) {},
             },
             event);
  if (!changed || !mirroring_) return;
  pending_ = document_locked();
  lock.unlock();
  wake_.notify_all();
}

// Off the supervisor's thread: a slow etcd delays the mirror, never the job. Only the newest
// state matters, so one that arrives while a write is in flight replaces any older one waiting.
void state_mirror::write_loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || !pending_.is_null(); });
    if (pending_.is_null()) return;
    const std::string value = pending_.dump();
    pending_ = nullptr;
    const fence_fn fence = fence_;
    lock.unlock();
    try {
      if (!fenced_put(key(), value, fence))
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

void state_mirror::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
}

void state_mirror::lease_keys_of_ended_job(const std::string& config_json,
                                           std::chrono::seconds ttl) {
  nlohmann::json last;
  fence_fn fence;
  {
    std::lock_guard lock(mutex_);
    if (!progress_.ended || !mirroring_ || !fence_) return;
    last = document_locked();
    fence = fence_;
  }
  try {
    const auto call = call_within(milliseconds(5000));
    const int64_t lease = client_.lease_grant(ttl, call);
    etcd::txn_request txn;
    txn.compares.push_back(fence());
    txn.then.push_back(etcd::txn_op::put(key(), last.dump(), lease));
    txn.then.push_back(etcd::txn_op::put("/troupe/" + who_.job + "/config", config_json, lease));
    client_.txn(txn, call);
  } catch (const std::exception& e) {
    monitoring::log(
        monitoring::level::warn, etcd_ctx,
        std::string("etcd: the ended job's keys stay (they could not be leased): ") + e.what());
  }
}

}  // namespace troupe::coordinator::ha
