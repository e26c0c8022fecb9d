#include "actors/job_supervisor.hpp"

#include "actors/expert_group.hpp"

#include "checkpoint/checkpoint.hpp"
#include "cli/progress.hpp"
#include "monitoring/log.hpp"

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

namespace troupe::actors {

bool checkpoint_due(int64_t step, int64_t total_steps, int every) {
  if (step == total_steps) return true;  // the last step is always kept
  return every > 0 && step % every == 0;
}

bool evaluation_due(int64_t step, int64_t total_steps, int every) {
  if (step == total_steps) return true;
  return every > 0 && step % every == 0;
}

namespace {

using clock_type = std::chrono::steady_clock;
using nlohmann::json;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

// The metrics the coordinator exports; one registry per coordinator process.
struct job_metrics {
  monitoring::counter* steps;
  monitoring::counter* tokens;
  monitoring::counter* checkpoints;
  monitoring::counter* ranks_lost;
  monitoring::gauge* loss;
  monitoring::gauge* val_loss;
  monitoring::gauge* tokens_per_s;
  monitoring::gauge* world;
  monitoring::gauge* generation;
  monitoring::gauge* step;
  monitoring::gauge* lr;
  monitoring::gauge* compute_s;
  monitoring::gauge* comm_s;
  monitoring::gauge* control_s;
  monitoring::histogram* step_seconds;

  explicit job_metrics(monitoring::metrics_registry& r)
      : steps(&r.add_counter("troupe_steps_total", "Training steps committed")),
        tokens(&r.add_counter("troupe_tokens_total", "Tokens trained on in committed steps")),
        checkpoints(&r.add_counter("troupe_checkpoints_total", "Checkpoints committed")),
        ranks_lost(&r.add_counter("troupe_ranks_lost_total", "Ranks that died or were declared lost")),
        loss(&r.add_gauge("troupe_loss", "Training loss of the last committed step (nats per byte)")),
        val_loss(&r.add_gauge("troupe_validation_loss", "Last validation loss (nats per byte)")),
        tokens_per_s(&r.add_gauge("troupe_tokens_per_second", "Training throughput of the last step")),
        world(&r.add_gauge("troupe_world_size", "Ranks in the current generation")),
        generation(&r.add_gauge("troupe_generation", "Current generation of the job")),
        step(&r.add_gauge("troupe_step", "Last committed step")),
        lr(&r.add_gauge("troupe_learning_rate", "Learning rate of the last committed step")),
        compute_s(&r.add_gauge("troupe_step_compute_seconds", "Mean forward+backward time per rank, last step")),
        comm_s(&r.add_gauge("troupe_step_comm_seconds", "Mean gradient all-reduce time per rank, last step")),
        control_s(&r.add_gauge("troupe_step_control_seconds", "Mean wait for the commit per rank, last step")),
        step_seconds(&r.add_histogram("troupe_step_seconds", "Wall time between commits",
                                      monitoring::exponential_buckets(0.005, 2, 14))) {}
};

enum class phase { forming, training, finishing, ended };

struct votes {
  int64_t step = -1;
  int count = 0;
  double loss_sum = 0;
  int64_t tokens = 0;
  double lr = 0;
  double compute_s = 0, comm_s = 0, control_s = 0, peer_wait_s = 0;
  std::vector<clock_type::time_point> arrived;  // per rank: when its vote came in
};

struct job_state {
  job_setup setup;
  std::optional<job_metrics> metrics;
  phase current = phase::forming;
  uint64_t generation = 1;
  std::vector<caf::actor> ranks;
  int joined = 0;
  caf::actor agent;
  int64_t committed = 0;
  votes pending;
  // checkpoint being collected
  int64_t ckpt_step = -1;
  std::vector<ckpt::shard_entry> shards;
  int shards_in = 0;
  bool ckpt_ok = true;
  // validation being collected
  int64_t eval_step = -1;
  double eval_sum = 0;
  int64_t eval_batches = 0;
  int evals_in = 0;
  // results
  double last_loss = std::nan("");
  double last_val = -1;
  std::string last_checkpoint;
  int64_t tokens_trained = 0;
  clock_type::time_point started = clock_type::now();
  clock_type::time_point training_started;
  clock_type::time_point last_commit;
  bool result_sent = false;
  uint64_t watchdog_gen = 0;
  std::string pending_failure;  // a rank's failed vote, waiting briefly for its root cause
  std::vector<bool> reported_failure;  // per rank: voted !ok (so its exit is a consequence)
  std::optional<cli::progress_line> progress;
  caf::actor experts;  // the expert_group of an MoE job
  static inline const char* name = "job_supervisor";
};

using self_ptr = caf::stateful_actor<job_state>*;

monitoring::log_context ctx(self_ptr self) {
  return {"coordinator", -1, self->state.generation, self->state.committed};
}

std::string step_dir(const std::string& run_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return run_dir + "/checkpoints/" + name;
}

ckpt::manifest make_manifest(const train_config& cfg, int64_t step, const std::vector<ckpt::shard_entry>& shards) {
  ckpt::manifest m;
  m.step = step;
  m.world = cfg.world;
  m.seed = cfg.seed;
  m.config_json = to_json(cfg);
  m.shards = shards;
  for (const auto& s : shards) m.global_numel += s.range.count;
  return m;
}

void emit(self_ptr self, json event) {
  if (self->state.setup.events) self->state.setup.events->write(std::move(event));
}

// Ends the job: tells every rank and the agent, and hands the result to the launcher.
// The launcher stops this actor once the processes are gone.
void finish(self_ptr self, int exit_code, const std::string& message) {
  auto& st = self->state;
  if (st.result_sent) return;
  st.result_sent = true;
  st.current = phase::ended;
  if (st.progress) st.progress->finish();
  if (exit_code != 0)
    for (auto& r : st.ranks)
      if (r) self->send(r, abort_generation{st.generation, message});
  for (auto& r : st.ranks)
    if (r) self->send(r, stop_atom::value);
  if (st.agent) self->send(st.agent, stop_atom::value);
  job_result res;
  res.exit_code = exit_code;
  res.message = message;
  res.steps_done = st.committed;
  res.final_loss = st.last_loss;
  res.val_loss = st.last_val;
  double train_s = st.committed > st.setup.start_step ? seconds_since(st.training_started) : 0;
  res.tokens_per_s = train_s > 0 ? static_cast<double>(st.tokens_trained) / train_s : 0;
  res.wall_s = seconds_since(st.started);
  res.last_checkpoint = st.last_checkpoint;
  emit(self, {{"event", exit_code == 0 ? "job_done" : "job_failed"},
              {"exit_code", exit_code},
              {"message", message},
              {"step", st.committed},
              {"generation", st.generation}});
  monitoring::log(exit_code == 0 ? monitoring::level::info : monitoring::level::error, ctx(self),
                  exit_code == 0 ? "job done: " + message : "job failed: " + message);
  self->send(st.setup.listener, result_atom::value, res);
}

void fail(self_ptr self, const std::string& message) { finish(self, 1, message); }

// A watchdog on progress: ranks bound their own collectives, but a rank that hangs
// outside a collective (or before joining) must not hang the job.
void arm_watchdog(self_ptr self, std::chrono::milliseconds after) {
  self->delayed_send(self, after, tick_atom::value, ++self->state.watchdog_gen);
}

void maybe_done(self_ptr self) {
  auto& st = self->state;
  if (st.current != phase::finishing) return;
  if (st.ckpt_step >= 0 || st.eval_step >= 0) return;  // still collecting
  const auto& cfg = st.setup.cfg;
  finish(self, 0, st.committed < cfg.steps
                      ? "stopped after step " + std::to_string(st.committed) + " as asked (exit_after_step); --resume continues"
                      : "trained " + std::to_string(st.committed) + " steps");
}

void on_all_votes(self_ptr self) {
  auto& st = self->state;
  auto& v = st.pending;
  const auto& cfg = st.setup.cfg;
  const int world = cfg.world;
  const int64_t step = v.step;
  const double loss = v.loss_sum / static_cast<double>(v.tokens);
  const double step_s = seconds_since(st.last_commit);
  const double tps = static_cast<double>(v.tokens) / std::max(step_s, 1e-9);
  st.last_commit = clock_type::now();
  st.committed = step;
  st.last_loss = loss;
  st.tokens_trained += v.tokens;

  const int64_t last = session_last_step(cfg);
  commit c{st.generation, step, checkpoint_due(step, last, cfg.checkpoint_every),
           evaluation_due(step, last, cfg.eval_every), 0.0};
  const auto now = clock_type::now();
  for (size_t r = 0; r < st.ranks.size(); ++r) {
    c.peer_wait_s = std::chrono::duration<double>(now - v.arrived[r]).count();
    self->send(st.ranks[r], c);
  }
  if (c.checkpoint) {
    st.ckpt_step = step;
    st.shards.assign(world, {});
    st.shards_in = 0;
    st.ckpt_ok = true;
  }
  if (c.evaluate) {
    st.eval_step = step;
    st.eval_sum = 0;
    st.eval_batches = 0;
    st.evals_in = 0;
  }

  auto& m = *st.metrics;
  m.steps->inc();
  m.tokens->inc(static_cast<double>(v.tokens));
  m.loss->set(loss);
  m.tokens_per_s->set(tps);
  m.step->set(static_cast<double>(step));
  m.lr->set(v.lr);
  m.compute_s->set(v.compute_s / world);
  m.comm_s->set(v.comm_s / world);
  m.control_s->set(v.control_s / world);
  m.step_seconds->observe(step_s);
  emit(self, {{"event", "step"},
              {"step", step},
              {"loss", loss},
              {"lr", v.lr},
              {"tokens_per_s", tps},
              {"world", world},
              {"generation", st.generation},
              {"step_s", step_s},
              {"compute_s", v.compute_s / world},
              {"comm_s", v.comm_s / world},
              {"control_s", v.control_s / world},
              {"peer_wait_s", v.peer_wait_s / world}});
  if (st.progress) st.progress->update(step, cfg.steps, loss, tps);
  v = votes{};
  if (step >= last) st.current = phase::finishing;
  arm_watchdog(self, std::chrono::milliseconds(cfg.step_timeout_ms * 2));
  maybe_done(self);
}

void on_rank_lost(self_ptr self, int rank, const std::string& why) {
  auto& st = self->state;
  if (st.current == phase::ended) return;
  if (rank >= 0 && static_cast<size_t>(rank) < st.reported_failure.size() && st.reported_failure[rank]) {
    // It reported its failed step and then stopped: a consequence, not the cause. The
    // settle window (or the real cause) decides the verdict.
    emit(self, {{"event", "rank_exited_after_failure"}, {"rank", rank}, {"reason", why}});
    return;
  }
  st.metrics->ranks_lost->inc();
  emit(self, {{"event", "rank_lost"}, {"rank", rank}, {"reason", why}, {"step", st.committed},
              {"generation", st.generation}});
  // Recovery (shrink and re-plan) comes with the supervisor tree; today a lost rank
  // ends the job with the last committed checkpoint intact.
  fail(self, "rank " + std::to_string(rank) + " lost: " + why + "; resume with --resume from " +
                 (st.last_checkpoint.empty() ? std::string("the start (no checkpoint yet)")
                                             : st.last_checkpoint) +
                 (st.pending_failure.empty() ? "" : " (then: " + st.pending_failure + ")"));
}

int rank_of(self_ptr self, const caf::actor_addr& addr) {
  auto& ranks = self->state.ranks;
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] && ranks[i].address() == addr) return static_cast<int>(i);
  return -1;
}

caf::behavior job_supervisor(self_ptr self, job_setup setup) {
  auto& st = self->state;
  st.setup = std::move(setup);
  st.metrics.emplace(*st.setup.metrics);
  st.ranks.resize(st.setup.cfg.world);
  st.reported_failure.assign(st.setup.cfg.world, false);
  st.committed = st.setup.start_step;
  st.metrics->world->set(st.setup.cfg.world);
  st.metrics->generation->set(static_cast<double>(st.generation));
  st.metrics->step->set(static_cast<double>(st.committed));
  if (st.setup.cfg.progress) st.progress.emplace(st.setup.start_step);
  if (st.setup.cfg.model.experts > 0) {
    expert_group_setup eg;
    eg.blocks = st.setup.cfg.model.n_layer;
    eg.experts = st.setup.cfg.model.experts;
    eg.top_k = st.setup.cfg.model.top_k;
    eg.reports_per_step = std::max(1, st.setup.shape.dp / std::max(1, st.setup.shape.ep));
    eg.events = st.setup.events;
    eg.metrics = st.setup.metrics;
    st.experts = spawn_expert_group(self, eg);
  }
  arm_watchdog(self, std::chrono::milliseconds(st.setup.form_timeout_ms));

  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    if (s.agent && dm.source == s.agent.address()) {
      s.agent = nullptr;
      if (s.current != phase::ended) fail(self, "the agent process was lost (" + self->system().render(dm.reason) + ")");
      return;
    }
    int r = rank_of(self, dm.source);
    if (r < 0) return;
    s.ranks[r] = nullptr;
    if (s.current != phase::ended)
      on_rank_lost(self, r, "its connection closed (" + self->system().render(dm.reason) + ")");
  });

  return {
      [=](const agent_hello& h) -> launch_plan {
        auto& s = self->state;
        launch_plan plan;
        plan.generation = s.generation;
        if (h.protocol != protocol_version) {
          plan.error = "protocol version " + std::to_string(h.protocol) + " != coordinator's " +
                       std::to_string(protocol_version) + "; run the same troupe build everywhere";
          return plan;
        }
        if (s.agent) {
          plan.error = "this job already has its agent; multi-node placement is not supported yet";
          return plan;
        }
        s.agent = caf::actor_cast<caf::actor>(self->current_sender());
        self->monitor(s.agent);
        for (int r = 0; r < s.setup.cfg.world; ++r) plan.ranks.push_back(r);
        emit(self, {{"event", "agent_joined"}, {"host", h.host}, {"pid", h.pid}, {"ranks", plan.ranks}});
        return plan;
      },
      [=](const hello& h) -> welcome {
        auto& s = self->state;
        welcome w;
        w.generation = s.generation;
        w.world = s.setup.cfg.world;
        if (h.protocol != protocol_version) {
          w.error = "protocol version " + std::to_string(h.protocol) + " != coordinator's " +
                    std::to_string(protocol_version) + "; run the same troupe build everywhere";
          return w;
        }
        if (h.rank < 0 || h.rank >= s.setup.cfg.world) {
          w.error = "rank " + std::to_string(h.rank) + " is outside this job's world of " +
                    std::to_string(s.setup.cfg.world);
          return w;
        }
        if (s.current != phase::forming || s.ranks[h.rank]) {
          w.error = "rank " + std::to_string(h.rank) + " already joined generation " +
                    std::to_string(s.generation) + " (a stale or duplicate worker)";
          return w;
        }
        auto sender = caf::actor_cast<caf::actor>(self->current_sender());
        s.ranks[h.rank] = sender;
        self->monitor(sender);
        ++s.joined;
        w.config_json = to_json(s.setup.cfg);
        w.store_host = s.setup.store_host;
        w.store_port = s.setup.store_port;
        w.start_step = s.setup.start_step;
        w.dp = s.setup.shape.dp;
        w.tp = s.setup.shape.tp;
        w.pp = s.setup.shape.pp;
        w.ep = s.setup.shape.ep;
        w.rank_order = s.setup.shape.order;
        emit(self, {{"event", "rank_joined"}, {"rank", h.rank}, {"pid", h.pid}, {"host", h.host},
                    {"generation", s.generation}});
        if (s.joined == s.setup.cfg.world) {
          s.current = phase::training;
          s.training_started = s.last_commit = clock_type::now();
          emit(self, {{"event", "training_started"}, {"world", s.setup.cfg.world},
                      {"generation", s.generation}, {"start_step", s.setup.start_step},
                      {"layout", json::parse(s.setup.layout_json)}});
          monitoring::log(monitoring::level::info, ctx(self),
                          "all " + std::to_string(s.setup.cfg.world) + " ranks joined; training");
          arm_watchdog(self, std::chrono::milliseconds(s.setup.cfg.step_timeout_ms * 2));
        }
        return w;
      },
      [=](const step_done& d) {
        auto& s = self->state;
        if (d.generation != s.generation || s.current != phase::training) return;  // stale
        if (!d.ok) {
          if (d.rank >= 0 && static_cast<size_t>(d.rank) < s.reported_failure.size())
            s.reported_failure[d.rank] = true;
          // A rank whose peer died reports the broken collective, often before the peer's own
          // loss reaches us; give the root cause a moment to arrive so the verdict names it.
          if (s.pending_failure.empty()) {
            s.pending_failure = "rank " + std::to_string(d.rank) + " failed step " + std::to_string(d.step) + ": " + d.error;
            self->delayed_send(self, std::chrono::milliseconds(500), settle_atom::value);
          }
          return;
        }
        if (d.optim_state_bytes > 0)
          emit(self, {{"event", "memory"}, {"rank", d.rank}, {"step", d.step}, {"generation", s.generation},
                      {"optimizer_state_bytes", d.optim_state_bytes}, {"peak_rss_bytes", d.peak_rss_bytes},
                      {"zero", s.setup.cfg.parallel.zero}});
        auto& v = s.pending;
        if (v.step != d.step) {
          v = votes{};
          v.step = d.step;
          v.arrived.resize(s.ranks.size());
        }
        v.arrived[static_cast<size_t>(d.rank)] = clock_type::now();
        ++v.count;
        v.loss_sum += d.loss_sum;
        v.tokens += d.tokens;
        v.lr = d.lr;
        v.compute_s += d.compute_s;
        v.comm_s += d.comm_s;
        v.control_s += d.control_s;
        v.peer_wait_s += d.peer_wait_s;
        if (v.count == s.setup.cfg.world) on_all_votes(self);
      },
      [=](const expert_load_report& r) {
        auto& s = self->state;
        if (s.experts && r.generation == s.generation) self->send(s.experts, r);
      },
      [=](const shard_written& w) {
        auto& s = self->state;
        if (w.generation != s.generation || w.step != s.ckpt_step) return;
        if (!w.ok) {
          s.ckpt_ok = false;
          emit(self, {{"event", "checkpoint_failed"}, {"step", w.step}, {"rank", w.rank}, {"error", w.error}});
        } else {
          s.shards[w.rank] = ckpt::shard_entry{w.rank, w.file, w.bytes, w.hash, {w.offset, w.count}};
        }
        if (++s.shards_in < s.setup.cfg.world) return;
        int64_t step = s.ckpt_step;
        s.ckpt_step = -1;
        if (s.ckpt_ok) {
          try {
            ckpt::manifest man = make_manifest(s.setup.cfg, step, s.shards);
            ckpt::commit_manifest(s.setup.cfg.run_dir, man);
            s.last_checkpoint = step_dir(s.setup.cfg.run_dir, step);
            s.metrics->checkpoints->inc();
            emit(self, {{"event", "checkpoint"}, {"step", step}, {"path", s.last_checkpoint},
                        {"generation", s.generation}});
          } catch (const std::exception& e) {
            emit(self, {{"event", "checkpoint_failed"}, {"step", step}, {"error", e.what()}});
            monitoring::log(monitoring::level::error, ctx(self), std::string("checkpoint commit failed: ") + e.what());
          }
        }
        maybe_done(self);
      },
      [=](const eval_done& e) {
        auto& s = self->state;
        if (e.generation != s.generation || e.step != s.eval_step) return;
        s.eval_sum += e.loss_sum;
        s.eval_batches += e.batches;
        if (++s.evals_in < s.setup.cfg.world) return;
        s.last_val = s.eval_sum / static_cast<double>(std::max<int64_t>(s.eval_batches, 1));
        s.metrics->val_loss->set(s.last_val);
        emit(self, {{"event", "validation"}, {"step", s.eval_step}, {"val_loss", s.last_val},
                    {"generation", s.generation}});
        if (s.progress) s.progress->note("step " + std::to_string(s.eval_step) + ": validation loss " +
                                         cli::format_fixed(s.last_val, 4));
        s.eval_step = -1;
        maybe_done(self);
      },
      [=](const worker_exited& w) {
        auto& s = self->state;
        emit(self, {{"event", "worker_exited"}, {"rank", w.rank}, {"pid", w.pid}, {"exit_code", w.exit_code},
                    {"signal", w.signal}});
        if (s.current == phase::ended) return;
        std::string why = w.signal ? "process " + std::to_string(w.pid) + " killed by signal " + std::to_string(w.signal)
                                   : "process " + std::to_string(w.pid) + " exited with code " +
                                         std::to_string(w.exit_code);
        on_rank_lost(self, w.rank, why);
      },
      [=](settle_atom) {
        auto& s = self->state;
        if (s.current != phase::ended && !s.pending_failure.empty()) fail(self, s.pending_failure);
      },
      [=](shutdown_atom) {
        auto& s = self->state;
        if (s.current == phase::ended) return;
        emit(self, {{"event", "interrupted"}, {"step", s.committed}});
        finish(self, 130, "interrupted at step " + std::to_string(s.committed) +
                              (s.last_checkpoint.empty() ? "" : "; last checkpoint " + s.last_checkpoint));
      },
      [=](tick_atom, uint64_t gen) {
        auto& s = self->state;
        if (gen != s.watchdog_gen || s.current == phase::ended) return;
        if (s.current == phase::forming)
          fail(self, "only " + std::to_string(s.joined) + " of " + std::to_string(s.setup.cfg.world) +
                         " ranks joined within " + std::to_string(s.setup.form_timeout_ms / 1000) +
                         " s; check the agent's output for worker errors");
        else
          fail(self, "no progress for " + std::to_string(2 * s.setup.cfg.step_timeout_ms / 1000) +
                         " s after step " + std::to_string(s.committed) + " (a rank hung); raise step_timeout_ms if steps are that slow");
      },
  };
}

}  // namespace

caf::actor spawn_job_supervisor(caf::actor_system& sys, job_setup setup) {
  return sys.spawn(job_supervisor, std::move(setup));
}

}  // namespace troupe::actors
