#include "actors/job_supervisor.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <caf/all.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "actors/checkpoint_committer.hpp"
#include "actors/expert_group.hpp"
#include "actors/job_metrics.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/durable_io.hpp"
#include "monitoring/log.hpp"
#include "strategies/mesh.hpp"
#include "strategies/state_layout.hpp"

namespace troupe::actors {

namespace {

using nlohmann::json;

// A worker process as the actor reaches it: its step loop and its control path.
struct member_handles {
  caf::actor rank;     // commits, reconfigurations, stop
  caf::actor control;  // aborts (reach a collective in flight)
};

struct supervisor_state {
  job_setup setup;
  std::optional<job_logic> logic;
  std::optional<job_metrics> metrics;
  std::map<int32_t, member_handles> members;
  std::vector<caf::actor> agents;
  std::vector<int32_t> agent_pids;  // by node
  size_t next_fault = 0;
  int next_member = 0;
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

void emit(self_ptr self, const json& event) {
  auto& st = self->state;
  st.metrics->observe(event);
  // Never silent: what the job could not save, and a step it refused, also go to the console
  // (events.jsonl may be on the very disk that is full).
  const std::string what = event.value("event", "");
  if (what == "checkpoint_failed") {
    const int64_t kept = st.logic->last_checkpoint_step();
    monitoring::log(
        monitoring::level::error, ctx(self),
        "checkpoint of step " + std::to_string(event.value("step", int64_t{-1})) +
            " failed: " + event.value("error", std::string()) + "; training goes on, " +
            (kept >= 0 ? "the last committed checkpoint stays (step " + std::to_string(kept) + ")"
                       : std::string("no checkpoint is committed yet")));
  } else if (what == "checkpoint_abandoned") {
    monitoring::log(monitoring::level::warn, ctx(self),
                    "checkpoint of step " + std::to_string(event.value("step", int64_t{-1})) +
                        " abandoned: " + event.value("reason", std::string()) + "; " +
                        event.value("then", std::string()));
  } else if (what == "checkpoint_gc_failed") {
    monitoring::log(monitoring::level::warn, ctx(self),
                    "checkpoint garbage collection: " + event.value("error", std::string()));
  } else if (what == "diverged") {
    monitoring::log(
        monitoring::level::error, ctx(self),
        "step " + std::to_string(event.value("step", int64_t{-1})) +
            " diverged: " + event.value("what", std::string()) + "; " +
            (event.value("action", std::string()) == "rollback"
                 ? "rolling back to the last committed checkpoint"
                 : "stopping (--on-divergence " + event.value("policy", std::string()) + ")"));
  }
  if (st.setup.events) {
    try {
      st.setup.events->write(event);
    } catch (const std::exception& e) {
      monitoring::log(monitoring::level::error, ctx(self),
                      std::string("events.jsonl: ") + e.what());
    }
  }
}

void run(self_ptr self, actions todo);
void inject_faults(self_ptr self);

void send_result(self_ptr self, const finish_job& f) {
  auto& st = self->state;
  if (st.result_sent) return;
  st.result_sent = true;
  // Every commit was confirmed before the job could end; the last retention runs here.
  if (st.committer && !st.logic->checkpoints_in_flight() && st.logic->last_checkpoint_step() >= 0)
    st.committer->collect_garbage(st.committer->requests());
  st.committer.reset();
  for (auto& a : st.agents)
    if (a) self->send(a, stop_atom::value);
  const auto& l = *st.logic;
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
  monitoring::log(f.exit_code == 0 ? monitoring::level::info : monitoring::level::error, ctx(self),
                  f.exit_code == 0 ? "job done: " + f.message : "job failed: " + f.message);
  self->send(st.setup.listener, result_atom::value, res);
}

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
  m.config_json = to_json(cfg);
  m.tensors = st.manifest_tensors;
  m.global_numel = st.global_numel;
  m.adam_t = c.adam_t;
  m.chunk_floats = static_cast<uint64_t>(cfg.checkpoint_chunk_kib) * 1024 / sizeof(float);
  m.layout = strategies::describe(st.logic->plan().shape) + (cfg.parallel.zero ? " zero1" : "");
  m.pieces = c.pieces;
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
  run(self, st.logic->on_checkpoint_committed(c, path, error));
  // Retention between checkpoints: only while no rank may be writing chunks of one.
  if (error.empty() && st.committer && !st.logic->checkpoints_in_flight())
    st.committer->collect_garbage(st.committer->requests());
}

// Carries out the logic's actions, in order.
void run(self_ptr self, actions todo) {
  auto& st = self->state;
  for (auto& a : todo) {
    std::visit(
        [&](auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, emit_event>) {
            emit(self, x.event);
          } else if constexpr (std::is_same_v<T, send_commit>) {
            if (x.msg.checkpoint && st.committer) st.committer->checkpoint_requested();
            if (auto it = st.members.find(x.member); it != st.members.end())
              self->send(it->second.rank, x.msg);
          } else if constexpr (std::is_same_v<T, send_reconfigure>) {
            if (auto it = st.members.find(x.member); it != st.members.end())
              self->send(it->second.rank, x.msg);
          } else if constexpr (std::is_same_v<T, send_abort>) {
            if (auto it = st.members.find(x.member); it != st.members.end())
              self->send(it->second.control, x.msg);
          } else if constexpr (std::is_same_v<T, send_stop>) {
            if (auto it = st.members.find(x.member); it != st.members.end())
              self->send(it->second.rank, stop_atom::value);
          } else if constexpr (std::is_same_v<T, commit_checkpoint>) {
            commit_manifest(self, x);
          } else if constexpr (std::is_same_v<T, finish_job>) {
            send_result(self, x);
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
  inject_faults(self);
  if (st.logic->state() == job_state::training && st.training_started == logic_time{}) {
    st.training_started = now(self);
    st.training_start_step = st.logic->committed();
  }
}

// An injected fault as events.jsonl shows it: the spec's fields and the processes it hit.
json fault_event(const chaos::fault& f, const std::vector<int32_t>& pids) {
  json e = json::parse(chaos::to_json(f));
  e["event"] = "fault";
  e["pids"] = pids;
  return e;
}

// Fires the injected faults whose step is about to begin: real signals to real processes.
void inject_faults(self_ptr self) {
  auto& st = self->state;
  const auto& l = *st.logic;
  while (st.next_fault < st.setup.faults.size() && l.state() == job_state::training &&
         st.setup.faults[st.next_fault].step <= l.committed() + 1) {
    const auto& f = st.setup.faults[st.next_fault++];
    if (f.kind == chaos::fault_action::slow) continue;  // the rank slows itself down
    if (f.kind == chaos::fault_action::diverge) {       // the rank poisons its own loss
      emit(self, fault_event(f, {}));
      continue;
    }
    if (f.target == chaos::fault_target::coordinator) {
      // The coordinator dies here, as if its machine did: every member must notice.
      emit(self, fault_event(f, {getpid()}));
      ::kill(getpid(), SIGKILL);
    }
    std::vector<int32_t> pids;
    if (f.target == chaos::fault_target::rank) {
      // A random schedule may name a rank the shrunken world no longer has.
      const int rank = f.id < l.world() ? f.id : f.id % std::max(1, l.world());
      for (const auto& m : l.members())
        if (m.live && m.rank == rank) pids.push_back(m.pid);
    } else {
      if (static_cast<size_t>(f.id) < st.agent_pids.size())
        pids.push_back(st.agent_pids[static_cast<size_t>(f.id)]);
      for (const auto& m : l.members())
        if (m.live && m.node == f.id) pids.push_back(m.pid);
    }
    const int sig = f.kind == chaos::fault_action::kill ? SIGKILL : SIGSTOP;
    for (int32_t pid : pids)
      if (pid > 0) ::kill(pid, sig);
    emit(self, fault_event(f, pids));
    if (f.kind == chaos::fault_action::stop && f.duration.count() > 0)
      for (int32_t pid : pids) self->delayed_send(self, f.duration, resume_atom::value, pid);
  }
}

void update_gauges(self_ptr self) {
  auto& st = self->state;
  const auto ages = st.logic->heartbeat_ages(now(self));
  for (size_t r = 0; r < ages.size(); ++r)
    st.metrics->heartbeat_age->with({{"rank", std::to_string(r)}}).set(ages[r]);
  const auto& scores = st.logic->straggler_scores();
  for (size_t r = 0; r < scores.size(); ++r)
    if (std::isfinite(scores[r]))
      st.metrics->straggler_score->with({{"rank", std::to_string(r)}}).set(scores[r]);
}

int32_t member_of(self_ptr self, const caf::actor_addr& addr) {
  for (const auto& [id, h] : self->state.members)
    if ((h.rank && h.rank.address() == addr) || (h.control && h.control.address() == addr))
      return id;
  return -1;
}

caf::behavior job_supervisor(self_ptr self, job_setup setup) {
  auto& st = self->state;
  st.setup = std::move(setup);
  st.started = now(self);
  st.metrics.emplace(*st.setup.metrics);
  job_params p;
  p.cfg = st.setup.cfg;
  p.start_step = st.setup.start_step;
  p.checkpoint_step = st.setup.start_step > 0 ? st.setup.start_step : -1;
  p.members = st.setup.plan.shape.world() + st.setup.spares;
  p.plan = st.setup.plan;
  p.bounds = st.setup.bounds;
  p.form_timeout = std::chrono::milliseconds(st.setup.form_timeout_ms);
  p.heartbeat_timeout = std::chrono::milliseconds(st.setup.heartbeat_timeout_ms);
  p.straggler_policy = st.setup.straggler_policy;
  p.replacement_wait = std::chrono::milliseconds(st.setup.cfg.elastic.replacement_wait_ms);
  p.max_restarts = st.setup.cfg.elastic.max_restarts;
  p.skipped_steps = st.setup.skipped_steps;
  st.logic.emplace(p, now(self));
  st.metrics->world->set(st.setup.plan.shape.world());
  st.metrics->step->set(static_cast<double>(st.setup.start_step));
  st.metrics->state->set(0);
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
  for (const auto& t : strategies::tensor_table(st.setup.cfg.model)) {
    st.manifest_tensors.push_back({t.name, t.shape, t.offset});
    const auto [rows, cols] = ckpt::as_matrix(t.shape);
    st.global_numel += static_cast<size_t>(rows * cols);
  }
  self->send(self, tick_atom::value);

  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    for (size_t node = 0; node < s.agents.size(); ++node) {
      auto& a = s.agents[node];
      if (a && dm.source == a.address()) {
        a = nullptr;
        if (!s.result_sent)
          emit(self, {{"event", "agent_lost"}, {"reason", self->system().render(dm.reason)}});
        run(self, s.logic->on_agent_lost(static_cast<int>(node), now(self)));
        return;
      }
    }
    const int32_t member = member_of(self, dm.source);
    if (member < 0) return;
    run(self, s.logic->on_member_lost(
                  member, loss_cause::connection,
                  "its connection closed (" + self->system().render(dm.reason) + ")", now(self)));
  });

  return {
      [=](const agent_hello& h) -> launch_plan {
        auto& s = self->state;
        launch_plan plan;
        plan.generation = s.logic->generation();
        if (h.protocol != protocol_version) {
          plan.error = "protocol version " + std::to_string(h.protocol) + " != coordinator's " +
                       std::to_string(protocol_version) + "; run the same troupe build everywhere";
          return plan;
        }
        if (s.logic->state() == job_state::done || s.logic->state() == job_state::failed) {
          plan.error = "the job is over";
          return plan;
        }
        const int first_members = s.setup.plan.shape.world() + s.setup.spares;
        const int node = static_cast<int>(s.agents.size());
        int count = h.slots;
        if (node < s.setup.nodes && count == 0) {
          // The first agents share the first members: node i takes its slice.
          const int per = first_members / s.setup.nodes, extra = first_members % s.setup.nodes;
          count = per + (node < extra ? 1 : 0);
        } else if (count <= 0) {
          plan.error = "this job already has its " + std::to_string(s.setup.nodes) +
                       " agents; pass --ranks K to add K workers";
          return plan;
        }
        auto agent = caf::actor_cast<caf::actor>(self->current_sender());
        s.agents.push_back(agent);
        s.agent_pids.push_back(h.pid);
        self->monitor(agent);
        plan.node = node;
        plan.max_restarts = s.setup.cfg.elastic.max_restarts;
        plan.heartbeat_timeout_ms = s.setup.heartbeat_timeout_ms;
        for (int i = 0; i < count; ++i) plan.members.push_back(s.next_member++);
        emit(self, {{"event", "agent_joined"},
                    {"host", h.host},
                    {"pid", h.pid},
                    {"node", node},
                    {"members", plan.members}});
        return plan;
      },
      [=](const hello& h) -> welcome {
        auto& s = self->state;
        welcome w;
        auto sender = caf::actor_cast<caf::actor>(self->current_sender());
        // Handles first: the logic's first actions may already address this member.
        auto previous = s.members.find(h.member);
        std::optional<member_handles> old;
        if (previous != s.members.end()) old = previous->second;
        s.members[h.member] = member_handles{sender, h.control ? h.control : sender};
        auto todo = s.logic->on_member_joined(h, now(self), w);
        if (!w.error.empty()) {
          if (old)
            s.members[h.member] = *old;
          else
            s.members.erase(h.member);
          return w;
        }
        self->monitor(sender);
        w.config_json = to_json(s.setup.cfg);
        w.store_host = s.setup.store_host;
        w.store_port = s.setup.store_port;
        w.heartbeat_interval_ms = std::max(50, s.setup.heartbeat_timeout_ms / 5);
        // A reconfigure among these may reach the member before this answer; it waits in the
        // member's mailbox until the answer is in.
        run(self, std::move(todo));
        return w;
      },
      [=](const step_done& d) { run(self, self->state.logic->on_vote(d, now(self))); },
      [=](const state_report& r) { run(self, self->state.logic->on_state_report(r, now(self))); },
      [=](const reconfigured& r) { run(self, self->state.logic->on_reconfigured(r, now(self))); },
      [=](const heartbeat& h) {
        auto& seen = self->state.stage_rejections[h.member];
        if (h.rejected_connections > seen) {
          self->state.metrics->stage_rejections->inc(
              static_cast<double>(h.rejected_connections - seen));
          seen = h.rejected_connections;
        }
        auto todo = self->state.logic->on_heartbeat(h, now(self));
        for (auto& a : todo)
          if (auto* abort = std::get_if<send_abort>(&a))  // an evicted member: answer it directly
            self->send(caf::actor_cast<caf::actor>(self->current_sender()), abort->msg);
        std::erase_if(todo, [](const action& a) { return std::holds_alternative<send_abort>(a); });
        run(self, std::move(todo));
      },
      [=](const expert_load_report& r) {
        auto& s = self->state;
        if (s.experts && r.generation == s.logic->generation()) self->send(s.experts, r);
      },
      [=](const shard_written& w) { run(self, self->state.logic->on_shard_written(w, now(self))); },
      [=](const eval_done& e) { run(self, self->state.logic->on_eval_done(e, now(self))); },
      [=](const worker_exited& w) {
        auto& s = self->state;
        emit(self, {{"event", "worker_exited"},
                    {"member", w.member},
                    {"pid", w.pid},
                    {"exit_code", w.exit_code},
                    {"signal", w.signal}});
        bool same_process = false;
        for (const auto& m : s.logic->members())
          if (m.id == w.member && m.pid == w.pid) same_process = true;
        if (!same_process) return;  // an earlier process of a restarted member
        std::string why = w.signal ? "process " + std::to_string(w.pid) + " killed by signal " +
                                         std::to_string(w.signal)
                                   : "process " + std::to_string(w.pid) + " exited with code " +
                                         std::to_string(w.exit_code);
        run(self, s.logic->on_member_lost(w.member, loss_cause::exit, why, now(self)));
      },
      [=](shutdown_atom) { run(self, self->state.logic->on_shutdown(now(self))); },
      [=](preempt_atom) { run(self, self->state.logic->on_preempt(now(self))); },
      [=](resume_atom, int32_t pid) {
        ::kill(pid, SIGCONT);
        emit(self, {{"event", "fault"}, {"what", "continue"}, {"pids", {pid}}});
      },
      [=](ckpt_done_atom, int64_t step, const std::string& path, const std::string& error) {
        on_committed(self, step, path, error);
      },
      [=](ckpt_gc_atom, const std::string& event) { emit(self, json::parse(event)); },
      [=](tick_atom) {
        auto& s = self->state;
        run(self, s.logic->on_tick(now(self)));
        update_gauges(self);
        // The members and agents watch for the coordinator's heartbeat as it watches theirs.
        const heartbeat beat{-1, s.logic->generation(), s.logic->committed()};
        for (const auto& m : s.logic->members())
          if (m.live)
            if (auto it = s.members.find(m.id); it != s.members.end())
              self->send(it->second.control, beat);
        for (auto& a : s.agents)
          if (a) self->send(a, beat);
        if (!s.result_sent) self->delayed_send(self, s.setup.tick, tick_atom::value);
      },
  };
}

}  // namespace

std::vector<int64_t> load_skipped_batches(const std::string& run_dir) {
  const std::filesystem::path path = std::filesystem::path(run_dir) / "skipped_batches.json";
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
  ckpt::io::write_file_atomically(std::filesystem::path(run_dir) / "skipped_batches.json",
                                  doc.dump() + "\n");
}

caf::actor spawn_job_supervisor(caf::actor_system& sys, job_setup setup) {
  return sys.spawn(job_supervisor, std::move(setup));
}

}  // namespace troupe::actors
