#include "actors/rank.hpp"

#include "actors/connect.hpp"
#include "actors/messages.hpp"
#include "actors/stage.hpp"
#include "chaos/faulty_communicator.hpp"
#include "checkpoint/checkpoint.hpp"
#include "monitoring/log.hpp"
#include "runtime/comm/host_communicator.hpp"
#include "runtime/comm/store.hpp"
#include "runtime/config.hpp"
#include "runtime/data/dataset.hpp"
#include "strategies/engine.hpp"
#include "strategies/planner.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <filesystem>
#include <fstream>
#include <chrono>
#include <memory>
#include <optional>

namespace troupe::actors {
namespace {

using clock_type = std::chrono::steady_clock;

// The process's peak resident set (VmHWM), in bytes; 0 if /proc cannot tell.
int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// Why the loop ended early: the coordinator said so, or it is gone.
struct stop_signal {
  int exit_code;
  std::string why;
};

// Everything one rank owns for the lifetime of a generation. Replaced as a whole when
// the job reconfigures (a later issue); no globals.
struct rank_context {
  caf::blocking_actor* self = nullptr;
  caf::actor coordinator;
  int rank = 0;
  int world = 0;
  uint64_t generation = 0;
  train_config cfg;
  std::unique_ptr<comm::kv_store> store;
  std::unique_ptr<strategies::training_engine> engine;
  std::unique_ptr<stage_link> stage;  // pipeline layouts only
  monitoring::log_context log_ctx() const { return {"rank", rank, generation, -1}; }
};

// Waits for the coordinator's word on `step`. Returns the commit, or throws stop_signal.
commit await_commit(rank_context& rc, int64_t step) {
  std::optional<commit> got;
  std::optional<stop_signal> stop;
  const auto now = clock_type::now();
  const auto deadline = now + std::chrono::milliseconds(rc.cfg.step_timeout_ms * 2);
  // The commit usually arrives within a millisecond; a thread that sleeps for it can lose a
  // whole scheduler tick on a busy machine, so poll the mailbox briefly before blocking.
  const auto spin_until = now + std::chrono::milliseconds(2);
  while (!got && !stop) {
    auto t = clock_type::now();
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - t);
    if (left.count() <= 0) {
      stop = stop_signal{1, "no commit for step " + std::to_string(step) + " within " +
                                std::to_string(rc.cfg.step_timeout_ms * 2 / 1000) + " s"};
      break;
    }
    auto wait = t < spin_until ? std::chrono::milliseconds(0) : left;
    rc.self->receive(
        [&](const commit& c) {
          if (c.generation == rc.generation && c.step == step) got = c;
        },
        [&](const abort_generation& a) {
          if (a.generation == rc.generation) stop = stop_signal{1, "generation aborted: " + a.reason};
        },
        [&](stop_atom) { stop = stop_signal{0, "stopped by the coordinator"}; },
        [&](caf::down_msg& dm) {
          if (dm.source == rc.coordinator.address())
            stop = stop_signal{1, "lost the coordinator (" + rc.self->system().render(dm.reason) + ")"};
        },
        caf::after(wait) >> [] {});
    // While polling, leave the core to the coordinator: on a machine where ranks fill every
    // core, the commit cannot be sent while we spin on it.
    if (!got && !stop && wait.count() == 0) std::this_thread::yield();
  }
  if (stop) throw *stop;
  return *got;
}

// Non-blocking look at the mailbox between steps, so a stop or a lost coordinator is
// noticed without waiting for the next vote.
void poll_control(rank_context& rc) {
  std::optional<stop_signal> stop;
  bool more = true;
  while (more && !stop) {
    more = false;
    rc.self->receive(
        [&](const abort_generation& a) {
          more = true;
          if (a.generation == rc.generation) stop = stop_signal{1, "generation aborted: " + a.reason};
        },
        [&](stop_atom) { stop = stop_signal{0, "stopped by the coordinator"}; },
        [&](caf::down_msg& dm) {
          more = true;
          if (dm.source == rc.coordinator.address())
            stop = stop_signal{1, "lost the coordinator (" + rc.self->system().render(dm.reason) + ")"};
        },
        caf::after(std::chrono::seconds(0)) >> [] {});
  }
  if (stop) throw *stop;
}

// After the last step: stay until the coordinator says stop (it may still be collecting
// shards), but never past a deadline.
int await_stop(rank_context& rc) {
  int code = -1;
  const auto deadline = clock_type::now() + std::chrono::milliseconds(rc.cfg.step_timeout_ms * 2);
  while (code < 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
    if (left.count() <= 0) {
      monitoring::log(monitoring::level::error, rc.log_ctx(), "the coordinator never said stop; exiting");
      return 1;
    }
    rc.self->receive([&](stop_atom) { code = 0; },
                     [&](const abort_generation& a) {
                       if (a.generation == rc.generation) code = 1;
                     },
                     [&](caf::down_msg& dm) {
                       if (dm.source == rc.coordinator.address()) code = 0;  // job over, coordinator gone
                     },
                     [&](const commit&) {}, caf::after(left) >> [] {});
  }
  return code;
}

// Loads the committed checkpoint the coordinator resumed from into the engine.
void restore(rank_context& rc, int64_t start_step, strategies::training_engine& engine) {
  auto man = ckpt::latest_committed(rc.cfg.run_dir);
  if (!man || man->step != start_step)
    throw std::runtime_error("checkpoint for step " + std::to_string(start_step) + " not found in " +
                             rc.cfg.run_dir);
  engine.restore(ckpt::load_full_state(rc.cfg.run_dir, *man));
}

shard_written write_checkpoint_shard(rank_context& rc, int64_t step, strategies::training_engine& engine) {
  shard_written out;
  out.generation = rc.generation;
  out.step = step;
  out.rank = rc.rank;
  try {
    auto entry = ckpt::write_shard(rc.cfg.run_dir, engine.checkpoint_shard(step));
    out.file = entry.file;
    out.bytes = entry.bytes;
    out.hash = entry.hash;
    out.offset = entry.range.offset;
    out.count = entry.range.count;
  } catch (const std::exception& e) {
    out.ok = false;
    out.error = e.what();
  }
  return out;
}

// A pipeline stage's passes of this session, as a Chrome trace: runs/<job>/traces/rank<r>.json.
// Every stage's clock is the machine's steady clock, so the files of one pipeline merge.
void write_pipeline_trace(rank_context& rc, const strategies::training_engine& engine) {
  const std::string trace = engine.pipeline_trace();
  if (trace.empty()) return;
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(rc.cfg.run_dir) / "traces";
  std::filesystem::create_directories(dir, ec);
  std::ofstream out(dir / ("rank" + std::to_string(rc.rank) + ".json"));
  out << trace;
  if (!out) monitoring::log(monitoring::level::warn, rc.log_ctx(), "could not write the pipeline trace to " + dir.string());
}

// A pipeline stage's actor, connected to its neighbours' (actors/stage.hpp), watching every pass.
void connect_stage(rank_context& rc, const strategies::layout& shape) {
  const auto view = strategies::view_of(shape, rc.rank);
  const auto plan = strategies::make_plan(shape, rc.cfg.model, strategies::constraints_from(rc.cfg));
  const int s = view.at.pp, p = shape.pp;
  int next_slots = 0;
  if (s + 1 < p) {
    const auto schedule = strategies::make_schedule(strategies::parse_schedule_kind(rc.cfg.parallel.schedule), p,
                                                    plan.micro_batches_per_replica);
    // The next stage's activation slots, plus the one activation this stage's send holds.
    next_slots = strategies::peak_live_activations(schedule)[static_cast<size_t>(s + 1)] + 1;
  }
  rc.stage = std::make_unique<stage_link>(rc.self->system(), *rc.store, rc.generation, view.pp.name, s, p, next_slots,
                                          std::chrono::milliseconds(rc.cfg.step_timeout_ms));
  rc.engine->set_pipeline_observer(rc.stage.get());
}

int train(rank_context& rc, const welcome& w) {
  rc.generation = w.generation;
  rc.world = w.world;
  rc.cfg = config_from_json(w.config_json);
  set_blas_threads(rc.cfg.blas_threads);
  const auto op_timeout = std::chrono::milliseconds(rc.cfg.step_timeout_ms);

  rc.store = comm::connect_tcp_store(w.store_host, static_cast<uint16_t>(w.store_port), op_timeout);
  comm::gloo_options gopts;
  gopts.connect_timeout = op_timeout;

  auto data = byte_dataset::open(rc.cfg.data, rc.cfg.val_fraction);
  strategies::layout shape;
  shape.dp = w.dp;
  shape.tp = w.tp;
  shape.pp = w.pp;
  shape.ep = w.ep;
  shape.order = w.rank_order;
  // Shared memory for groups on this host, TCP otherwise (TROUPE_TRANSPORT=tcp|shm overrides).
  // Chaos tests reach a worker's data plane through TROUPE_CHAOS_RANK<r>; unset, this is a no-op.
  auto connect = [&](const comm::comm_identity& id) {
    return chaos::inject_from_environment(comm::make_host_communicator(*rc.store, id, gopts), rc.rank);
  };
  rc.engine = std::make_unique<strategies::training_engine>(rc.cfg, shape, rc.rank, rc.generation, connect);
  auto& engine = *rc.engine;
  if (shape.pp > 1) connect_stage(rc, shape);
  engine.init(rc.cfg.seed);
  if (w.start_step > 0) restore(rc, w.start_step, engine);
  const comm::op_options step_opts{op_timeout};

  double prev_control = 0, prev_peer_wait = 0, prev_optim = 0;
  for (int64_t step = w.start_step + 1; step <= session_last_step(rc.cfg); ++step) {
    poll_control(rc);
    auto t0 = clock_type::now();
    if (rc.stage) rc.stage->begin_step(step);
    grad_result g = engine.compute(data, step - 1);
    auto t1 = clock_type::now();
    const double model_comm_s = engine.take_model_comm_seconds();
    if (auto load = engine.take_expert_load(); !load.tokens.empty()) {  // MoE: one rank per ep group
      expert_load_report report;
      report.generation = rc.generation;
      report.step = step;
      report.rank = rc.rank;
      report.blocks = static_cast<int32_t>(load.tokens.size());
      report.experts = static_cast<int32_t>(load.tokens.front().size());
      for (const auto& block : load.tokens) report.tokens.insert(report.tokens.end(), block.begin(), block.end());
      report.dropped = std::move(load.dropped);
      rc.self->send(rc.coordinator, report);
    }
    step_done vote;
    vote.generation = rc.generation;
    vote.step = step;
    vote.rank = rc.rank;
    try {
      engine.reduce(step_opts);
    } catch (const comm::comm_error& e) {
      vote.ok = false;
      vote.error = e.what();
      rc.self->send(rc.coordinator, vote);
      throw stop_signal{1, std::string("gradient reduction failed: ") + e.what()};
    }
    auto t2 = clock_type::now();
    if (engine.reports_loss()) {
      vote.loss_sum = g.loss_sum;
      vote.tokens = g.tokens;
    }
    vote.lr = engine.learning_rate(step - 1);
    vote.compute_s = seconds_between(t0, t1) - model_comm_s;
    vote.comm_s = seconds_between(t1, t2) + model_comm_s;
    vote.control_s = prev_control;
    vote.peer_wait_s = prev_peer_wait;
    vote.optim_s = prev_optim;
    if (step == w.start_step + 1) {
      vote.optim_state_bytes = static_cast<int64_t>(engine.optimizer_state_bytes());
      vote.peak_rss_bytes = peak_rss_bytes();
    }
    rc.self->send(rc.coordinator, vote);

    commit c = await_commit(rc, step);
    auto t3 = clock_type::now();
    try {
      // ZeRO's all-gather and tensor parallelism's norm are collectives too: a failure here
      // is a failed step like any other.
      engine.apply(step - 1, step_opts);
    } catch (const comm::comm_error& e) {
      throw stop_signal{1, std::string("applying the step failed: ") + e.what()};
    }
    auto t4 = clock_type::now();
    // The round trip less the time our vote waited at the coordinator for the slowest
    // peer's: that wait is imbalance of the step, reported on its own.
    prev_peer_wait = std::min(c.peer_wait_s, seconds_between(t2, t3));
    prev_control = seconds_between(t2, t3) - prev_peer_wait;
    prev_optim = seconds_between(t3, t4);
    if (step == session_last_step(rc.cfg)) write_pipeline_trace(rc, engine);
    if (c.checkpoint) rc.self->send(rc.coordinator, write_checkpoint_shard(rc, step, engine));
    if (c.evaluate) {
      auto share = engine.evaluate(data);
      eval_done e;
      e.generation = rc.generation;
      e.step = step;
      e.rank = rc.rank;
      e.loss_sum = share.loss_sum;
      e.batches = share.batches;
      rc.self->send(rc.coordinator, e);
    }
  }
  return await_stop(rc);
}

void rank_actor(caf::blocking_actor* self, caf::actor coordinator, int rank, std::shared_ptr<std::atomic<int>> code) {
  rank_context rc;
  rc.self = self;
  rc.coordinator = coordinator;
  rc.rank = rank;
  self->monitor(coordinator);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  std::optional<welcome> w;
  std::string error;
  self->request(coordinator, std::chrono::seconds(30), hello{protocol_version, rank, getpid(), host})
      .receive([&](welcome& x) { w = std::move(x); },
               [&](caf::error& e) { error = "the coordinator did not answer hello: " + self->system().render(e); });
  if (w && !w->error.empty()) error = "the coordinator refused this rank: " + w->error;
  if (!error.empty()) {
    monitoring::log(monitoring::level::error, rc.log_ctx(), error);
    code->store(1);
    return;
  }
  try {
    code->store(train(rc, *w));
  } catch (const stop_signal& s) {
    if (s.exit_code != 0) monitoring::log(monitoring::level::error, rc.log_ctx(), s.why);
    code->store(s.exit_code);
  } catch (const std::exception& e) {
    monitoring::log(monitoring::level::error, rc.log_ctx(), e.what());
    step_done vote;
    vote.generation = rc.generation;
    vote.step = -1;
    vote.rank = rank;
    vote.ok = false;
    vote.error = e.what();
    self->send(coordinator, vote);
    code->store(1);
  }
  if (rc.engine) rc.engine->abort();
}

}  // namespace

int run_worker(const worker_args& args) {
  system_config cfg;
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  monitoring::log_context lc{"rank", args.rank, 0, -1};
  std::string error;
  auto coordinator = connect_to_coordinator(sys, args.coordinator_host, args.coordinator_port,
                                            std::chrono::milliseconds(args.connect_timeout_ms), error);
  if (!coordinator) {
    monitoring::log(monitoring::level::error, lc, error);
    return 1;
  }
  auto code = std::make_shared<std::atomic<int>>(1);
  sys.spawn(rank_actor, coordinator, args.rank, code);
  sys.await_all_actors_done();
  return code->load();
}

}  // namespace troupe::actors
