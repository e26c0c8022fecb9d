#include "actors/coordinator/job_supervisor.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <caf/all.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "actors/coordinator/checkpoint_committer.hpp"
#include "actors/coordinator/expert_group.hpp"
#include "actors/coordinator/job_metrics.hpp"
#include "actors/coordinator/job_status.hpp"
#include "actors/coordinator/relayed_commits.hpp"
#include "actors/wire/state_table.hpp"
#include "chaos/hooks.hpp"
#include "chaos/schedule.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/durable_io.hpp"
#include "monitoring/events/events.hpp"
#include "monitoring/log.hpp"
#include "runtime/settings.hpp"
#include "runtime/sys/process_clock.hpp"
#include "runtime/sys/run_paths.hpp"
#include "strategies/mesh.hpp"
#include "strategies/workload_description.hpp"

namespace troupe::actors {

namespace {

using nlohmann::json;

// A worker process as the actor reaches it: its step loop and its control path.
struct member_handles {
  caf::actor rank;     // commits, reconfigurations, stop
  caf::actor control;  // aborts (reach a collective in flight)
  caf::actor relay;    // its node's relay (hello::relay): commits and beats go there; may be null
};

struct supervisor_state {
  job_setup setup;
  std::optional<job_logic> logic;
  std::optional<job_metrics> metrics;
  std::map<int32_t, member_handles> members;  // changed only by set_handles, drop_handles
  // Which member each handle of `members` belongs to: a down_msg names only its source.
  std::unordered_map<caf::actor_addr, int32_t> member_by_addr;
  std::vector<caf::actor> agents;  // by node
  chaos::fault_schedule faults;    // setup.faults, each fired once as its step begins
  bool result_sent = false;
  logic_time started{};
  logic_time training_started{};
  int64_t training_start_step = 0;
  caf::actor experts;
  std::unique_ptr<checkpoint_committer> committer;  // manifests and retention, off this thread
  // By step, until the committer answers. A step can be in flight twice: a commit handed over
  // just before a generation ended, and the same step again after the replay. The committer
  // answers in order, so the oldest entry of a step is the one answered.
  std::multimap<int64_t, commit_checkpoint> committing;
  std::map<int32_t, uint64_t> stage_rejections;  // by member, as its last heartbeat said
  // The model's tensors as every manifest lists them. Listing them builds the whole model
  // (~10 ms of page faults here), so it is done once, before training.
  std::vector<ckpt::tensor_entry> manifest_tensors;
  size_t global_numel = 0;
  std::optional<job_logic::takeover> takeover;  // set by a standby's lead_atom, taken by leading()
  // An injected kill of this coordinator in the middle of a commit (kill:coordinator:commits=N):
  // the commits of its step sent so far, and whether it is dying (then it says nothing more).
  int mid_commit_sent = 0;
  bool dying = false;
  bool takeover_faults_passed = false;
  // Paused (see pause()): since when, and the lost connections to decide on when it leads again.
  bool paused = false;
  logic_time paused_at{};
  std::vector<caf::down_msg> paused_downs;
  bool giving_up = false;  // the job ends for etcd's loss: its last actions go out regardless
  std::map<int32_t, logic_time> heard_while_paused;  // members' beats while paused
  // Decided but not carried out, because the leadership lapsed (or etcd could not confirm it
  // for a failed end): carried out when this coordinator leads again, dropped when another
  // does. A held failed end is also carried out at the give-up, when members still follow.
  actions held;
  bool confirmed_end = false;
  status_publisher status_tick;  // the tick's rank table for GET /status, at most once a second
  std::optional<logic_time> last_beats;  // when this coordinator last beat (send_beats)
  static inline const char* name = "job_supervisor";
};

using self_ptr = caf::stateful_actor<supervisor_state>*;

// The actor system's clock: steady_clock in a job, virtual under CAF's test coordinator, so a
// test drives every deadline of the logic without sleeping.
logic_time now(self_ptr self) { return self->clock().now(); }

monitoring::log_context ctx(self_ptr self) {
  const auto& l = *self->state.logic;
  return {"coordinator", -1, l.generation(), l.committed()};
}

// What the console says of an event, beyond the progress line.
void say(self_ptr self, const events::job_event& event) {
  using namespace events;
  std::visit(
      overloaded{
          [self](const checkpoint_failed& e) {
            const int64_t kept = self->state.logic->last_checkpoint_step();
            monitoring::log(monitoring::level::error, ctx(self),
                            "checkpoint of step " + std::to_string(e.step) + " failed: " + e.error +
                                "; training goes on, " +
                                (kept >= 0 ? "the last committed checkpoint stays (step " +
                                                 std::to_string(kept) + ")"
                                           : std::string("no checkpoint is committed yet")));
          },
          [self](const checkpoint_abandoned& e) {
            monitoring::log(monitoring::level::warn, ctx(self),
                            "checkpoint of step " + std::to_string(e.step) +
                                " abandoned: " + e.reason + "; " + e.then);
          },
          [self](const checkpoint_gc_failed& e) {
            monitoring::log(monitoring::level::warn, ctx(self),
                            "checkpoint garbage collection: " + e.error);
          },
          [self](const diverged& e) {
            monitoring::log(
                monitoring::level::error, ctx(self),
                "step " + std::to_string(e.step) + " diverged: " + e.what + "; " +
                    (e.action == "rollback" ? "rolling back to the last committed checkpoint"
                                            : "stopping (--on-divergence " + e.policy + ")"));
          },
          [](const auto&) {},
      },
      event);
}

void emit(self_ptr self, const events::job_event& event) {
  auto& st = self->state;
  st.metrics->observe(event);
  // Never silent: what the job could not save, and a step it refused, also go to the
  // console (events.jsonl may be on the very disk that is full).
  say(self, event);
  if (st.setup.on_event) st.setup.on_event(event);
  if (st.setup.events) {
    try {
      st.setup.events->write(events::to_json(event));
    } catch (const std::exception& e) {
      monitoring::log(monitoring::level::error, ctx(self),
                      std::string("events.jsonl: ") + e.what());
    }
  }
}

void run(self_ptr self, actions todo);
void inject_faults(self_ptr self);

// Whether the job formed before this coordinator came to lead it: a committed checkpoint, or a
// generation in events.jsonl (read from its start, where the first one comes early; at most
// 64 MiB of it).
bool job_formed_before(const std::string& run_dir) {
  std::error_code ec;
  if (std::filesystem::exists(run_paths::latest(run_dir), ec)) return true;
  std::ifstream in(run_paths::events(run_dir));
  std::string line;
  size_t read = 0;
  while (read < (size_t{64} << 20) && std::getline(in, line)) {
    read += line.size() + 1;
    if (line.find("\"event\":\"generation\"") != std::string::npos) return true;
  }
  return false;
}

void send_result(self_ptr self, const finish_job& f) {
  auto& st = self->state;
  if (st.result_sent) return;
  st.result_sent = true;
  // Every commit was confirmed before the job could end; the last retention runs here.
  if (st.committer && !st.logic->checkpoints_in_flight() && st.logic->last_checkpoint_step() >= 0)
    st.committer->collect_garbage(st.committer->requests());
  st.committer.reset();
  const auto& l = *st.logic;
  // A job that failed before it trained has no step for a worker to finish, and a worker
  // that never took its place (a program that never called troupe.init(), or never made its
  // Trainer) does not hear the coordinator's stop: its agent stops it at once instead of
  // after the stop's grace.
  const bool never_formed =
      st.training_started == logic_time{} && !l.taking_over() && f.exit_code != exit_code::done;
  for (auto& a : st.agents) {
    if (!a) continue;
    if (never_formed)
      self->send(a, shutdown_atom::value,
                 std::string("the job failed before it trained (the coordinator says why); this "
                             "node's workers are stopped at once"));
    else
      self->send(a, stop_atom::value);
  }
  job_result res;
  res.exit_code = f.exit_code;
  res.message = f.message;
  res.steps_done = l.committed();
  res.final_loss = l.last_loss();
  res.val_loss = l.last_val_loss();
  const double train_s = std::chrono::duration<double>(now(self) - st.training_started).count();
  res.tokens_per_s = l.committed() > st.training_start_step && train_s > 0
                         ? static_cast<double>(l.tokens_trained()) / train_s
                         : 0;
  res.wall_s = std::chrono::duration<double>(now(self) - st.started).count();
  res.last_checkpoint = l.last_checkpoint_path();
  res.world = l.world();
  res.goodput_json = events::to_json(l.goodput_event(now(self))).dump();
  // A stop someone asked for (a scheduler's SIGTERM, a Ctrl-C) is no failure: log-based
  // alerting must not page on every preemption.
  const bool requested = f.exit_code == exit_code::requeue || f.exit_code == exit_code::interrupted;
  if (f.exit_code == exit_code::done)
    monitoring::log(monitoring::level::info, ctx(self), "job done: " + f.message);
  else if (requested)
    monitoring::log(
        monitoring::level::info, ctx(self),
        "job stopped as asked (exit " + std::to_string(f.exit_code) + "): " + f.message);
  else
    monitoring::log(monitoring::level::error, ctx(self),
                    "job failed (exit " + std::to_string(f.exit_code) + "): " + f.message);
  self->send(st.setup.listener, result_atom::value, res);
}

void on_committed(self_ptr self, int64_t step, const std::string& path, const std::string& error);

// Hands the manifest of a checkpoint whose every share is durable to the committer thread;
// on_checkpoint_committed follows when it answers.
void commit_manifest(self_ptr self, const commit_checkpoint& c) {
  auto& st = self->state;
  const auto& cfg = st.setup.cfg;
  ckpt::manifest m;
  m.format_version = ckpt::format_version;
  m.step = c.step;
  m.world = c.world;
  m.seed = cfg.seed;
  m.config_json = to_json(cfg).dump();
  m.tensors = st.manifest_tensors;
  m.global_numel = st.global_numel;
  m.adam_t = c.adam_t;
  m.chunk_floats = static_cast<uint64_t>(cfg.checkpoint_chunk_kib) * 1024 / sizeof(float);
  m.layout = strategies::describe(st.logic->plan().shape) + (cfg.parallel.zero ? " zero1" : "");
  m.pieces = c.pieces;
  if (cfg.external_workload()) {
    // A program's state is known only from its ranks' table: every tensor of it, any dtype, in
    // one flat layout of 4-byte words, and the rest of its state as extras (format 3).
    try {
      const state_table table = decode_state_table(c.state_table_json);
      if (table.tensors.empty()) throw std::runtime_error("the ranks reported no state table");
      m.format_version = ckpt::workload_format_version;
      m.arrays.assign(ckpt::workload_array_names.begin(), ckpt::workload_array_names.end());
      m.tensors.clear();
      size_t offset = 0;
      for (const tensor_decl& t : table.tensors) {
        m.tensors.push_back({t.name, t.shape, offset, t.array, t.type});
        offset += m.tensors.back().words();
      }
      m.global_numel = offset;
      m.extras_json = table.extras_json;
      m.adam_t = 0;
    } catch (const std::exception& e) {
      st.committing.emplace(c.step, c);
      on_committed(self, c.step, "", std::string("the program's state table: ") + e.what());
      return;
    }
  }
  if (!st.committer) {  // the job's result is out: nothing is committed behind it
    monitoring::log(
        monitoring::level::warn, ctx(self),
        "checkpoint of step " + std::to_string(c.step) + " not committed: the job has ended");
    return;
  }
  st.committing.emplace(c.step, c);
  st.committer->commit(std::move(m));
}

void on_committed(self_ptr self, int64_t step, const std::string& path, const std::string& error) {
  auto& st = self->state;
  const auto it = st.committing.lower_bound(step);  // the oldest commit of this step
  if (it == st.committing.end() || it->first != step) return;
  const commit_checkpoint c = std::move(it->second);
  st.committing.erase(it);
  if (!error.empty())
    monitoring::log(monitoring::level::error, ctx(self), "checkpoint commit failed: " + error);
  run(self, st.logic->on_checkpoint_committed(c, path, error, now(self)));
  // Retention between checkpoints: only while no rank may be writing chunks of one.
  if (error.empty() && st.committer && !st.logic->checkpoints_in_flight())
    st.committer->collect_garbage(st.committer->requests());
}

events::fault fault_event(const chaos::fault& f, const std::vector<int32_t>& pids);

// This coordinator dies as a machine would: from now on it says and decides nothing, and a
// moment later (what it sent before has left by then) its process is killed.
void die(self_ptr self, const chaos::fault& f, const std::string& when) {
  auto& st = self->state;
  st.dying = true;
  emit(self, fault_event(f, {getpid()}));
  monitoring::log(monitoring::level::warn, ctx(self), "fault: this coordinator dies " + when);
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::kill(getpid(), SIGKILL);
  }).detach();
}

// kill:coordinator:step=S:commits=N: once step S's commit went to N ranks, this coordinator
// dies (see die). Returns whether it is dying.
bool dies_mid_commit(self_ptr self, int64_t step) {
  auto& st = self->state;
  if (st.dying) return true;
  for (const auto& f : st.setup.faults) {
    if (f.target != chaos::fault_target::coordinator || f.commits < 0 || f.step != step) continue;
    if (st.mid_commit_sent < f.commits) {
      ++st.mid_commit_sent;
      return false;
    }
    die(self, f,
        "in the middle of committing step " + std::to_string(step) +
            ", after sending its commit to " + std::to_string(f.commits) + " ranks");
    return true;
  }
  return false;
}

// Carries out the logic's actions, in order.
void pause(self_ptr self);

// Whether the actions end the job with a failure.
bool ends_badly(const actions& todo) {
  for (const auto& a : todo)
    if (const auto* f = std::get_if<finish_job>(&a); f && f->exit_code != 0) return true;
  return false;
}

// Without a committer (the job's result is out) no earlier checkpoint is looked for.
checkpoint_fallback_found nothing_intact(const fall_back_checkpoint& f) {
  checkpoint_fallback_found none;
  none.damaged = f.step;
  none.error = f.error;
  return none;
}

void run(self_ptr self, actions todo) {
  auto& st = self->state;
  if (st.dying) return;
  if (!st.giving_up && !st.confirmed_end && st.setup.confirm_leading && ends_badly(todo) &&
      !st.setup.confirm_leading()) {
    // A failed end decided by a coordinator that may have been cut off (its members look
    // silent to it while another coordinator leads them): it stands only once etcd confirms
    // this leadership; until then it waits, paused, like a leader whose lease lapsed.
    monitoring::log(monitoring::level::warn, ctx(self),
                    "the job would end with a failure, but etcd does not confirm this "
                    "coordinator's leadership now; waiting for it");
    st.held.insert(st.held.end(), todo.begin(), todo.end());
    pause(self);
    return;
  }
  if (!st.giving_up && st.setup.still_leading && !st.setup.still_leading()) {
    // Decided before the lapse was seen (the logic has moved on): sent only if this
    // coordinator leads again, with its new epoch.
    st.held.insert(st.held.end(), todo.begin(), todo.end());
    pause(self);
    return;
  }
  std::vector<checkpoint_fallback_found> followups;  // answered at once, after these actions
  relayed_commits relayed;  // one node_commit per relay, sent once every action is carried out
  const auto send_relayed = [&] {
    relayed.flush([&](const caf::actor& relay, node_commit c) { self->send(relay, std::move(c)); });
  };
  for (auto& a : todo) {
    if (st.dying) return;
    std::visit(
        [&](auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, emit_event>) {
            emit(self, x.event);
          } else if constexpr (std::is_same_v<T, send_commit>) {
            x.msg.epoch = st.setup.epoch;
            if (dies_mid_commit(self, x.msg.step)) return send_relayed();  // what went so far
            if (x.msg.checkpoint && st.committer) st.committer->checkpoint_requested();
            if (auto it = st.members.find(x.member); it != st.members.end()) {
              if (it->second.relay)
                relayed.add(it->second.relay, x.member, x.msg);
              else
                self->send(it->second.rank, x.msg);
            }
          } else if constexpr (std::is_same_v<T, send_reconfigure>) {
            x.msg.epoch = st.setup.epoch;
            if (auto it = st.members.find(x.member); it != st.members.end())
              self->send(it->second.rank, x.msg);
          } else if constexpr (std::is_same_v<T, send_abort>) {
            x.msg.epoch = st.setup.epoch;
            for (auto& then : x.msg.then) then.epoch = st.setup.epoch;
            if (auto it = st.members.find(x.member); it != st.members.end())
              self->send(it->second.control, x.msg);
          } else if constexpr (std::is_same_v<T, send_stop>) {
            if (auto it = st.members.find(x.member); it != st.members.end())
              self->send(it->second.rank, stop_atom::value);
          } else if constexpr (std::is_same_v<T, commit_checkpoint>) {
            commit_manifest(self, x);
          } else if constexpr (std::is_same_v<T, finish_job>) {
            send_result(self, x);
          } else if constexpr (std::is_same_v<T, fall_back_checkpoint>) {
            if (st.committer)
              st.committer->fall_back(x.step, x.error);
            else
              followups.push_back(nothing_intact(x));
          } else if constexpr (std::is_same_v<T, schedule_regroup>) {
            self->delayed_send(self, x.after, regroup_atom::value);
          } else if constexpr (std::is_same_v<T, record_skipped>) {
            try {
              save_skipped_batches(st.setup.cfg.run_dir, x.steps);
            } catch (const std::exception& e) {
              // The diverged event holds the list too; a resume without it meets the bad
              // batch again and rolls back again.
              monitoring::log(monitoring::level::error, ctx(self),
                              std::string("could not record the skipped batches: ") + e.what());
            }
          }
        },
        a);
  }
  send_relayed();
  for (const auto& f : followups) run(self, st.logic->on_checkpoint_fallback(f, now(self)));
  inject_faults(self);
  if (st.logic->state() == job_state::training && st.training_started == logic_time{}) {
    st.training_started = now(self);
    st.training_start_step = st.logic->committed();
  }
}

// An injected fault as events.jsonl shows it: the spec's fields and the processes it hit.
// chaos spells the fault's fields (chaos::to_json); reading them into the typed event keeps
// that one spelling, and a field chaos renamed throws here rather than logging a 0.
events::fault fault_event(const chaos::fault& f, const std::vector<int32_t>& pids) {
  json spec = chaos::to_json(f);
  spec["pids"] = pids;
  return events::read_fields<events::fault>(spec);
}

// Fires the injected faults whose step is about to begin: real signals to real processes.
void inject_faults(self_ptr self) {
  auto& st = self->state;
  const auto& l = *st.logic;
  if (l.state() != job_state::training) return;
  // chaos/ says what each due fault does; this carries it out.
  if (st.dying) return;
  if (st.takeover && !st.takeover_faults_passed) {
    // Faults up to the step this leader took the job over at fired under the earlier leader
    // (a kill of the coordinator at step 10 must not kill its successor there too).
    st.takeover_faults_passed = true;
    st.faults.take_due(l.committed() + 1);
    std::erase_if(st.setup.faults,
                  [&](const chaos::fault& f) { return f.step <= l.committed() + 1; });
    return;
  }
  for (const chaos::fault_firing& x : st.faults.take_due(l.committed() + 1)) {
    using action = chaos::fault_firing::action;
    if (x.fault.commits >= 0) continue;  // fires in the middle of its step's commit instead
    if (x.what == action::announce) {    // the rank carries it out itself
      emit(self, fault_event(x.fault, {}));
    } else if (x.what == action::kill_coordinator) {
      // The coordinator dies here, as if its machine did: every member must notice.
      die(self, x.fault, "as step " + std::to_string(x.fault.step) + " begins");
      return;
    } else {
      const std::vector<int32_t> pids = l.fault_victims(x.fault);
      for (int32_t pid : pids)
        if (pid > 0) ::kill(pid, x.signal);
      emit(self, fault_event(x.fault, pids));
      if (x.continue_after.count() > 0)
        for (int32_t pid : pids)
          self->delayed_send(self, x.continue_after, resume_atom::value, pid);
    }
  }
}

void update_gauges(self_ptr self) {
  auto& st = self->state;
  std::vector<int> node_of_rank(static_cast<size_t>(std::max(0, st.logic->world())), 0);
  for (const auto& m : st.logic->members())
    if (m.live && m.rank >= 0 && static_cast<size_t>(m.rank) < node_of_rank.size())
      node_of_rank[static_cast<size_t>(m.rank)] = m.node;
  st.metrics->set_rank_gauges(st.logic->heartbeat_ages(now(self)), st.logic->straggler_scores(),
                              node_of_rank, st.setup.cfg.metrics_rank_labels);
  if (st.setup.status) st.status_tick.tick(*st.setup.status, *st.logic, now(self), st.setup.epoch);
}

// A handle of an earlier process of the member stops naming it: its down is not this one's.
void drop_handles(supervisor_state& st, int32_t member) {
  const auto it = st.members.find(member);
  if (it == st.members.end()) return;
  for (const auto* a : {&it->second.rank, &it->second.control})
    if (*a)
      if (auto x = st.member_by_addr.find(a->address());
          x != st.member_by_addr.end() && x->second == member)
        st.member_by_addr.erase(x);
  st.members.erase(it);
}

void set_handles(supervisor_state& st, int32_t member, member_handles handles) {
  drop_handles(st, member);
  for (const auto* a : {&handles.rank, &handles.control})
    if (*a) st.member_by_addr[a->address()] = member;
  st.members[member] = std::move(handles);
}

int32_t member_of(self_ptr self, const caf::actor_addr& addr) {
  const auto it = self->state.member_by_addr.find(addr);
  return it == self->state.member_by_addr.end() ? -1 : it->second;
}

caf::behavior leading(self_ptr self);
caf::behavior leading_behavior(self_ptr self);
void on_down(self_ptr self, const caf::down_msg& dm);
void resume(self_ptr self, int64_t epoch, const std::string& give_up);

// A standby's answer to whoever asks to join: not here.
std::string standing_by() {
  return std::string(not_leading_prefix) +
         "this coordinator stands by; another leads the job (ask the next coordinator)";
}

// The job's state as the previous leader left it in etcd, for a takeover.
job_logic::takeover read_takeover(const std::string& state_json, int64_t epoch,
                                  std::chrono::milliseconds wait) {
  const json doc = json::parse(state_json);
  job_logic::takeover t;
  t.generation = doc.value("generation", uint64_t{0});
  t.committed_step = doc.value("committed_step", int64_t{0});
  t.checkpoint_step = doc.value("checkpoint_step", int64_t{-1});
  if (const auto it = doc.find("skipped_steps"); it != doc.end() && it->is_array())
    t.skipped_steps = it->get<std::vector<int64_t>>();
  t.epoch = epoch;
  t.wait = wait;
  return t;
}

caf::behavior job_supervisor(self_ptr self, job_setup setup) {
  self->state.setup = std::move(setup);
  if (!self->state.setup.standby) return leading(self);
  return {
      [=](const agent_hello&) -> launch_plan {
        launch_plan refused;
        refused.error = standing_by();
        return refused;
      },
      [=](const hello&) -> welcome {
        welcome refused;
        refused.error = standing_by();
        return refused;
      },
      // What a standby's process is told by its signals concerns the job's leader.
      [=](shutdown_atom) {},
      [=](preempt_atom) {},
      [=](pause_atom) {},
      [=](pause_atom, const std::string&) {},
      // A member's beat to a coordinator it took for the leader.
      [=](const heartbeat&) {},
      [=](const node_beats&) {},
      [=](lead_atom, int64_t epoch, const std::string& state_json) {
        auto& st = self->state;
        st.setup.epoch = epoch;
        st.setup.standby = false;
        std::optional<job_logic::takeover> t;
        std::optional<events::etcd_state_lost> lost_event;  // emitted once leading
        // Members that lost the old leader look for the new one for up to their coordinator
        // timeout; they are waited for as long.
        const std::chrono::milliseconds wait = liveness_of(st.setup.cfg.elastic).coordinator;
        std::string lost =
            "etcd holds no state of this run for the job (its keys were deleted, "
            "lost with etcd's data, or written by another run)";
        if (!state_json.empty()) {
          try {
            t = read_takeover(state_json, epoch, wait);
          } catch (const std::exception& e) {
            lost = std::string("the job's state in etcd does not read back (") + e.what() + ")";
          }
        }
        if (!t && job_formed_before(st.setup.cfg.run_dir)) {
          // What etcd lacks, the run directory and the members still prove: a job that ran is
          // taken over from there, never started again from step 0.
          t = job_logic::takeover{};
          t->epoch = epoch;
          t->wait = wait;
          monitoring::log(monitoring::level::error, ctx(self),
                          lost +
                              "; taking the job over from the run directory and what the "
                              "members hold, and writing the state again");
          events::etcd_state_lost e{.reason = lost, .epoch = epoch};
          try {
            e.checkpoint_step = ckpt::read_latest_step(st.setup.cfg.run_dir).value_or(-1);
          } catch (const std::exception&) {  // said below, where LATEST is read again
          }
          // The members say how far they got; the checkpoint is the floor.
          t->committed_step = std::max<int64_t>(e.checkpoint_step, 0);
          lost_event = e;
        } else if (!t && !state_json.empty()) {
          monitoring::log(monitoring::level::error, ctx(self),
                          lost + "; the job never formed, so it is formed afresh");
        }
        if (t) {
          // LATEST is the commit point of checkpoints; etcd's copy may lag behind it.
          try {
            t->checkpoint_step = ckpt::read_latest_step(st.setup.cfg.run_dir).value_or(-1);
          } catch (const std::exception& e) {
            monitoring::log(monitoring::level::error, {"coordinator", -1, 0, -1},
                            std::string("taking over: LATEST does not read back (") + e.what() +
                                "); planning as if no checkpoint were committed");
            t->checkpoint_step = -1;
          }
          st.setup.start_step = t->committed_step;
        }
        st.takeover = t;
        self->become(leading(self));
        if (lost_event) emit(self, *lost_event);
        if (t) {
          monitoring::log(monitoring::level::warn, ctx(self),
                          "taking the job over (epoch " + std::to_string(epoch) + "): generation " +
                              std::to_string(t->generation) + ", committed step " +
                              std::to_string(t->committed_step) +
                              "; waiting for the members to rejoin");
          run(self, st.logic->take_over(*t, now(self)));
        }
      },
  };
}

// The batches the job skipped so far, for a coordinator that takes it over: a rollback since
// this process started skipped more than it read then. What the previous leader left in etcd
// and what the run directory holds, together (a skip is never taken back).
std::vector<int64_t> skipped_at_takeover(const supervisor_state& st) {
  std::set<int64_t> all(st.setup.skipped_steps.begin(), st.setup.skipped_steps.end());
  all.insert(st.takeover->skipped_steps.begin(), st.takeover->skipped_steps.end());
  try {
    for (int64_t s : load_skipped_batches(st.setup.cfg.run_dir)) all.insert(s);
  } catch (const std::exception& e) {
    monitoring::log(monitoring::level::warn, {"coordinator", -1, 0, -1},
                    std::string("taking over with the skipped batches etcd holds: ") + e.what());
  }
  return {all.begin(), all.end()};
}

caf::behavior leading(self_ptr self) {
  auto& st = self->state;
  st.faults = chaos::fault_schedule(st.setup.faults);
  chaos::install_hooks_from_environment();
  st.started = now(self);
  st.metrics.emplace(*st.setup.metrics);
  job_params p = make_job_params(st.setup.cfg, st.setup.plan, st.setup.start_step,
                                 st.takeover ? skipped_at_takeover(st) : st.setup.skipped_steps);
  p.form_timeout = std::chrono::milliseconds(st.setup.form_timeout_ms);
  if (st.takeover) p.checkpoint_step = st.takeover->checkpoint_step;
  if (p.peak_flops <= 0) p.peak_flops = st.setup.peak_flops;
  // The job's time counts from when this process began it; a coordinator that took the job
  // over counts from its takeover.
  if (!st.takeover) p.accounted_from = sys::job_started();
  st.logic.emplace(std::move(p), now(self));
  st.metrics->world->set(st.setup.plan.shape.world());
  st.metrics->step->set(static_cast<double>(st.setup.start_step));
  st.metrics->state->set(0);
  std::error_code ec;
  const auto run_dir = std::filesystem::absolute(st.setup.cfg.run_dir, ec).lexically_normal();
  st.metrics->set_job_info(etcd_job_id(st.setup.cfg), ec ? st.setup.cfg.run_dir : run_dir.string(),
                           model_words(st.setup.cfg.model),
                           strategies::describe(st.setup.plan.shape));
  if (st.setup.cfg.model.experts > 0) {
    expert_group_setup eg;
    eg.blocks = st.setup.cfg.model.n_layer;
    eg.experts = st.setup.cfg.model.experts;
    eg.top_k = st.setup.cfg.model.top_k;
    eg.reports_per_step = std::max(1, st.setup.plan.shape.dp / std::max(1, st.setup.plan.shape.ep));
    eg.events = st.setup.events;
    eg.metrics = st.setup.metrics;
    st.experts = spawn_expert_group(self, eg);
  }
  st.committer = std::make_unique<checkpoint_committer>(
      st.setup.cfg.run_dir,
      ckpt::retention_policy{static_cast<size_t>(st.setup.cfg.keep_last),
                             static_cast<int64_t>(st.setup.cfg.keep_every)},
      caf::actor_cast<caf::actor>(self),
      // A resumed job starts from a checkpoint it read back whole.
      st.setup.cfg.resume ? std::optional<int64_t>(st.setup.start_step) : std::nullopt);
  if (st.setup.still_leading) st.committer->set_fence(st.setup.still_leading);
  const auto workload = strategies::describe_workload(st.setup.cfg);
  for (const auto& t : workload.tensors) st.manifest_tensors.push_back({t.name, t.shape, t.offset});
  st.global_numel = workload.global_numel;
  self->send(self, tick_atom::value);

  self->set_down_handler([=](caf::down_msg& dm) { on_down(self, dm); });

  return leading_behavior(self);
}

void on_down(self_ptr self, const caf::down_msg& dm) {
  auto& s = self->state;
  if (s.paused) {  // decided on once this coordinator leads again
    s.paused_downs.push_back(dm);
    return;
  }
  {
    for (size_t node = 0; node < s.agents.size(); ++node) {
      auto& a = s.agents[node];
      if (a && dm.source == a.address()) {
        a = nullptr;
        run(self, s.logic->on_agent_lost(static_cast<int>(node), self->system().render(dm.reason),
                                         now(self)));
        return;
      }
    }
    const int32_t member = member_of(self, dm.source);
    if (member < 0) return;
    run(self, s.logic->on_member_lost(
                  member, loss_cause::connection,
                  "its connection closed (" + self->system().render(dm.reason) + ")", now(self)));
  }
}

// The members and agents watch for the coordinator's heartbeat as it watches theirs: one per
// heartbeat interval, as members beat (welcome::heartbeat_interval_ms), on the first tick that
// far from the last. Beating on every tick instead sent 100,000 messages a second to 10,000
// members. The longest gap, an interval and a tick (500 ms by default), is a quarter of the
// shortest silence a member or agent acts on (a heartbeat timeout, with standbys; without,
// a member waits twice that and an agent the coordinator timeout).
void send_beats(self_ptr self) {
  auto& s = self->state;
  const auto interval = heartbeat_interval(liveness_of(s.setup.cfg.elastic).heartbeat);
  if (s.last_beats && now(self) - *s.last_beats < interval) return;
  s.last_beats = now(self);
  heartbeat beat{-1, s.logic->generation(), s.logic->committed()};
  beat.epoch = s.setup.epoch;
  std::unordered_set<caf::actor_addr> relays_beaten;  // a relay hands the beat to its members
  for (const auto& m : s.logic->members())
    if (m.live)
      if (auto it = s.members.find(m.id); it != s.members.end()) {
        const auto& relay = it->second.relay;
        if (!relay)
          self->send(it->second.control, beat);
        else if (relays_beaten.insert(relay.address()).second)
          self->send(relay, beat);
      }
  for (auto& a : s.agents)
    if (a) self->send(a, beat);
}

// Paused: the leadership's lease lapsed (etcd unreachable, or this process stalled past it). It
// decides nothing, so every message waits in the mailbox, and it keeps beating so that members
// wait for it; it goes on when it leads again and gives up, ending the job, when told so.
void pause(self_ptr self) {
  auto& s = self->state;
  if (s.paused) return;
  s.paused = true;
  s.paused_at = now(self);
  monitoring::log(monitoring::level::warn, ctx(self),
                  "no longer leads (its lease in etcd lapsed): deciding nothing until elected "
                  "again; the members wait");
  self->set_default_handler(caf::skip);
  self->become(
      caf::keep_behavior,
      [=](tick_atom) {
        send_beats(self);
        self->delayed_send(self, self->state.setup.tick, tick_atom::value);
      },
      [=](lead_atom, int64_t epoch, const std::string&) { resume(self, epoch, ""); },
      [=](pause_atom) {}, [=](pause_atom, const std::string& why) { resume(self, 0, why); },
      // Who still follows this coordinator (for giving up, see resume); the logic hears the
      // beats that waited once it goes on.
      [=](const heartbeat& h) { self->state.heard_while_paused[h.member] = now(self); },
      [=](const node_beats& b) {
        for (const auto& h : b.beats) self->state.heard_while_paused[h.member] = now(self);
      });
}

// Whether some member still follows this coordinator: it beat within the coordinator timeout.
bool followed(self_ptr self) {
  auto& s = self->state;
  const auto limit = liveness_of(s.setup.cfg.elastic).coordinator;
  for (const auto& [member, at] : s.heard_while_paused)
    if (now(self) - at < limit) return true;
  return false;
}

// Leads again under `epoch`, or (a reason given) ends the job with it, paused or not.
void resume(self_ptr self, int64_t epoch, const std::string& give_up) {
  auto& s = self->state;
  const bool was_paused = std::exchange(s.paused, false);
  if (was_paused) {
    self->set_default_handler(caf::print_and_drop);
    self->unbecome();
  }
  if (!give_up.empty()) {
    if (was_paused && !followed(self)) {
      // No member follows this coordinator any more: another leads them (this one was cut
      // off), or they are gone. Nothing it would say about the job is true; it just ends.
      monitoring::log(monitoring::level::error, ctx(self),
                      give_up +
                          "; no member follows this coordinator any more (another "
                          "coordinator leads them, or they are gone): it ends without "
                          "ending the job");
      self->quit(caf::exit_reason::kill);
      return;
    }
    s.giving_up = true;
    actions held = std::exchange(s.held, {});
    if (ends_badly(held))
      run(self, std::move(held));  // the end decided before the pause
    else
      run(self, s.logic->on_abandon(give_up, now(self)));
    for (const auto& dm : std::exchange(s.paused_downs, {})) on_down(self, dm);
    return;
  }
  if (!was_paused) return;
  const auto paused_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now(self) - s.paused_at).count();
  s.setup.epoch = epoch;
  monitoring::log(monitoring::level::warn, ctx(self),
                  "leads again under epoch " + std::to_string(epoch) + " after a pause of " +
                      std::to_string(paused_ms) + " ms");
  actions held = std::exchange(s.held, {});
  s.confirmed_end = ends_badly(held);  // still the leader: the end it decided stands
  run(self, std::move(held));
  for (const auto& dm : std::exchange(s.paused_downs, {})) on_down(self, dm);
}

// What every member taken on is told beside its place: the job's config, the store where
// the data plane meets, and how often to beat.
void fill_welcome(self_ptr self, welcome& w) {
  const auto& s = self->state;
  w.config_json = worker_config_json(s.setup.cfg).dump();
  w.store_host = s.setup.store_host;
  w.store_port = s.setup.store_port;
  w.heartbeat_interval_ms =
      static_cast<int32_t>(heartbeat_interval(liveness_of(s.setup.cfg.elastic).heartbeat).count());
}

// A member's heartbeat, alone or from its relay's bundle. An evicted member is answered
// directly: at `sender`, or at its control actor when the beat came without one.
void on_beat(self_ptr self, const heartbeat& h, caf::actor sender) {
  auto& seen = self->state.stage_rejections[h.member];
  if (h.rejected_connections > seen) {
    self->state.metrics->stage_rejections->inc(static_cast<double>(h.rejected_connections - seen));
    seen = h.rejected_connections;
  }
  auto todo = self->state.logic->on_heartbeat(h, now(self));
  for (auto& a : todo)
    if (auto* abort = std::get_if<send_abort>(&a)) {
      abort->msg.epoch = self->state.setup.epoch;
      auto to = sender;
      if (auto it = self->state.members.find(h.member); !to && it != self->state.members.end())
        to = it->second.control;
      if (to) self->send(to, abort->msg);
    }
  std::erase_if(todo, [](const action& a) { return std::holds_alternative<send_abort>(a); });
  run(self, std::move(todo));
}

// A relay's bundle longer than any node: refused whole, with the reason in the log.
bool refused_bundle(self_ptr self, const char* what, size_t entries) {
  if (entries <= max_bundle) return false;
  monitoring::log(monitoring::level::warn, ctx(self),
                  std::string("refused a ") + what + " of " + std::to_string(entries) +
                      " entries from " + caf::to_string(self->current_sender()) + " (at most " +
                      std::to_string(max_bundle) + " per node)");
  return true;
}

caf::behavior leading_behavior(self_ptr self) {
  return {
      [=](const agent_hello& h) -> launch_plan {
        auto& s = self->state;
        launch_plan plan;
        plan.epoch = s.setup.epoch;
        auto todo = s.logic->on_agent_joined(h, plan);
        if (!plan.error.empty()) return plan;
        // The logic numbers nodes in the order agents are admitted (a rejoining agent keeps
        // its number), as `agents` holds them.
        auto agent = caf::actor_cast<caf::actor>(self->current_sender());
        const auto node = static_cast<size_t>(plan.node);
        if (s.agents.size() <= node) s.agents.resize(node + 1);
        s.agents[node] = agent;
        self->monitor(agent);
        run(self, std::move(todo));
        return plan;
      },
      [=](const hello& h) -> welcome {
        auto& s = self->state;
        welcome w;
        w.epoch = s.setup.epoch;
        auto sender = caf::actor_cast<caf::actor>(self->current_sender());
        if (h.rejoin && !s.logic->taking_over()) {
          // A member of ours that took this coordinator for lost (it was silent past the
          // member's timeout) and found no other leader: it comes back with its state, and
          // the generation it dropped is formed again.
          if (const member_info* m = s.logic->member(h.member); m && m->live && m->pid == h.pid) {
            set_handles(s, h.member,
                        member_handles{sender, h.control ? h.control : sender, h.relay});
            self->monitor(sender);
            w.generation = s.logic->generation();
            fill_welcome(self, w);
            run(self, s.logic->on_member_rejoined(h.member, now(self)));
            return w;
          }
          // Declared lost meanwhile: this process does not come back in place; its agent
          // starts the member again, and the new process joins like any other.
          if (auto refusal = s.logic->rejoin_refusal(h.member); !refusal.empty()) {
            w.error = std::move(refusal);
            return w;
          }
        }
        // Handles first: the logic's first actions may already address this member.
        auto previous = s.members.find(h.member);
        std::optional<member_handles> old;
        if (previous != s.members.end()) old = previous->second;
        set_handles(s, h.member, member_handles{sender, h.control ? h.control : sender, h.relay});
        auto todo = s.logic->on_member_joined(h, now(self), w);
        if (!w.error.empty()) {
          if (old)
            set_handles(s, h.member, *old);
          else
            drop_handles(s, h.member);
          return w;
        }
        self->monitor(sender);
        fill_welcome(self, w);
        // A reconfigure among these may reach the member before this answer; it waits in the
        // member's mailbox until the answer is in.
        run(self, std::move(todo));
        return w;
      },
      [=](const step_done& d) {
        if (self->state.setup.status) note_vote(*self->state.setup.status, d);
        run(self, self->state.logic->on_vote(d, now(self)));
      },
      [=](const state_report& r) { run(self, self->state.logic->on_state_report(r, now(self))); },
      [=](regroup_atom) { run(self, self->state.logic->on_regroup(now(self))); },
      [=](const reconfigured& r) { run(self, self->state.logic->on_reconfigured(r, now(self))); },
      [=](const heartbeat& h) {
        // Workers beat without a sender (anon_send from their heartbeat thread).
        on_beat(self, h, caf::actor_cast<caf::actor>(self->current_sender()));
      },
      [=](const node_beats& b) {
        if (refused_bundle(self, "node_beats", b.beats.size())) return;
        for (const auto& h : b.beats) on_beat(self, h, nullptr);  // not the relay: its member
      },
      [=](const node_votes& b) {
        if (refused_bundle(self, "node_votes", b.votes.size())) return;
        self->state.metrics->relayed_votes->inc(static_cast<double>(b.votes.size()));
        for (const auto& d : b.votes) {
          if (self->state.setup.status) note_vote(*self->state.setup.status, d);
          run(self, self->state.logic->on_vote(d, now(self)));
        }
      },
      [=](const expert_load_report& r) {
        auto& s = self->state;
        if (s.experts && r.generation == s.logic->generation()) self->send(s.experts, r);
      },
      [=](const shard_written& w) { run(self, self->state.logic->on_shard_written(w, now(self))); },
      [=](const eval_done& e) { run(self, self->state.logic->on_eval_done(e, now(self))); },
      [=](const worker_exited& w) { run(self, self->state.logic->on_worker_exited(w, now(self))); },
      [=](shutdown_atom) { run(self, self->state.logic->on_shutdown(now(self))); },
      [=](preempt_atom) { run(self, self->state.logic->on_preempt(now(self))); },
      [=](resume_atom, int32_t pid) {
        ::kill(pid, SIGCONT);
        // A continue names only the processes: the fault it ends was logged when it fired.
        events::fault resumed;
        resumed.what = "continue";
        resumed.pids = {pid};
        emit(self, resumed);
      },
      [=](ckpt_done_atom, int64_t step, const std::string& path, const std::string& error) {
        on_committed(self, step, path, error);
      },
      [=](ckpt_gc_atom, const gc_event& gc) { emit(self, gc.event); },
      [=](ckpt_fallback_atom, const fallback_done& f) {
        run(self, self->state.logic->on_checkpoint_fallback(f.found, now(self)));
      },
      [=](lead_atom, int64_t epoch, const std::string&) {
        // Re-elected without a pause seen here: the new epoch from now on.
        self->state.setup.epoch = epoch;
      },
      [=](pause_atom) { pause(self); },
      [=](pause_atom, const std::string& why) { resume(self, 0, why); },
      [=](tick_atom) {
        auto& s = self->state;
        if (s.setup.still_leading && !s.setup.still_leading()) {
          // The lease lapsed (this process may just have woken from a stall): decide nothing.
          pause(self);
          self->delayed_send(self, s.setup.tick, tick_atom::value);
          return;
        }
        run(self, s.logic->on_tick(now(self)));
        if (const auto stall = s.logic->take_stall(); stall.count() > 0)
          monitoring::log(monitoring::level::warn, ctx(self),
                          "noticed a stall of " + std::to_string(stall.count()) +
                              " ms: this coordinator did not run (stopped, or its machine "
                              "stalled); every member's heartbeat clock starts again instead of "
                              "the members being declared hung");
        update_gauges(self);
        send_beats(self);
        if (!s.result_sent) self->delayed_send(self, s.setup.tick, tick_atom::value);
      },
  };
}

}  // namespace

std::vector<int64_t> load_skipped_batches(const std::string& run_dir) {
  const std::filesystem::path path = run_paths::skipped_batches(run_dir);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  const auto bytes = ckpt::io::read_file(path);
  try {
    const json doc = json::parse(bytes.begin(), bytes.end());
    std::vector<int64_t> steps = doc.at("skipped_steps").get<std::vector<int64_t>>();
    for (int64_t s : steps)
      if (s < 1) throw std::invalid_argument("step " + std::to_string(s) + " is not a step");
    std::sort(steps.begin(), steps.end());
    return steps;
  } catch (const std::exception& e) {
    throw std::runtime_error(path.string() + " is damaged (" + e.what() +
                             "); it lists the batches skipped after divergences; fix or remove it");
  }
}

void save_skipped_batches(const std::string& run_dir, const std::vector<int64_t>& steps) {
  const json doc = {{"skipped_steps", steps}};
  ckpt::io::write_file_atomically(run_paths::skipped_batches(run_dir), doc.dump() + "\n");
}

caf::actor spawn_job_supervisor(caf::actor_system& sys, job_setup setup) {
  return sys.spawn(job_supervisor, std::move(setup));
}

}  // namespace troupe::actors
