#include "actors/worker/rank.hpp"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "actors/wire/connect.hpp"
#include "actors/wire/messages.hpp"
#include "actors/wire/tls_transport.hpp"
#include "actors/worker/checkpoint_replica.hpp"
#include "actors/worker/rank_worker.hpp"
#include "actors/worker/stage.hpp"
#include "actors/worker/worker_control.hpp"
#include "chaos/schedule.hpp"
#include "checkpoint/async_checkpointer.hpp"
#include "checkpoint/durable_io.hpp"
#include "monitoring/log.hpp"
#include "runtime/comm/host_communicator.hpp"
#include "runtime/comm/store.hpp"
#include "runtime/config.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/model/gpt.hpp"
#include "runtime/preflight.hpp"
#include "runtime/sys/descriptors.hpp"
#include "runtime/sys/warm_memory.hpp"
#include "strategies/engine.hpp"
#include "strategies/planner.hpp"

namespace troupe::actors {
namespace {

using namespace worker_detail;

// The process's peak resident set (VmHWM), in bytes; 0 if /proc cannot tell.
int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

// CPU time of the calling thread (the step loop: BLAS runs on one thread per rank).
double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Whether a message stamped with `epoch` comes from a coordinator older than the leader this
// member follows: such a coordinator was deposed and may not steer it. Said once per epoch.
bool ignore_older(worker& w, int64_t epoch) {
  if (!from_older_epoch(epoch, w.epoch_seen)) return false;
  if (w.epoch_warned != epoch) {
    w.epoch_warned = epoch;
    monitoring::log(monitoring::level::warn, w.log_ctx(),
                    "ignored a message of an older coordinator (epoch " + std::to_string(epoch) +
                        " < " + std::to_string(w.epoch_seen) + ")");
  }
  return true;
}

// A stop carries no epoch: only the coordinator this member follows (or the member itself)
// may end it that way, never one it has left.
bool from_current_coordinator(worker& w) {
  const auto& sender = w.self->current_sender();
  if (!sender) return false;
  return w.coordinator.address().compare(sender) == 0 || w.self->address().compare(sender) == 0;
}

// What a control message means for the step loop: nothing, or the loop's end.
std::optional<loop_result> on_control(worker& w, const abort_generation& a) {
  if (ignore_older(w, a.epoch)) return std::nullopt;
  w.newest_generation = std::max(w.newest_generation, a.generation);
  if (a.final && (a.reason.starts_with(evicted_prefix) || a.reason.starts_with(removed_prefix)))
    return loop_result{loop_end::stopped, 0, a.reason};
  if (a.final) return loop_result{loop_end::stopped, 0, "the job ended: " + a.reason};
  if (a.generation > w.current.generation) {
    loop_result end{loop_end::aborted, a.generation, a.reason};
    if (!a.then.empty() && a.then.front().generation == a.generation) end.then = a.then.front();
    return end;
  }
  return std::nullopt;
}

std::optional<loop_result> on_coordinator_down(worker& w, const caf::down_msg& dm) {
  if (dm.source != w.coordinator.address()) return std::nullopt;
  const std::string why = "lost the coordinator (" + w.self->system().render(dm.reason) + ")";
  if (w.ha()) {  // a standby may lead by now: look for it instead of ending
    w.shared->rehoming().store(true);
    w.shared->abort_running(why);
    return loop_result{loop_end::coordinator_lost, 0, why};
  }
  w.shared->fence();  // nothing this process says may count any more
  return loop_result{loop_end::failed, 0, why};
}

// The heartbeat thread's word that the coordinator fell silent. It clears `rehoming` only once
// a leader took this member back on, so a notice that waited in the mailbox while that
// happened finds it clear and means nothing.
std::optional<loop_result> on_silent(worker& w) {
  if (!w.shared->rehoming().load()) return std::nullopt;
  char said[96];
  std::snprintf(said, sizeof said, "lost the coordinator (no heartbeat from it for %.2f s)",
                w.shared->coordinator_silence());
  return loop_result{loop_end::coordinator_lost, 0, said};
}

bool accept_stop(worker& w) { return from_current_coordinator(w); }

// Waits for the coordinator's word on `step`: its commit, or the end of this generation.
std::variant<commit, loop_result> await_commit(worker& w, int64_t step) {
  std::optional<commit> got;
  std::optional<loop_result> end;
  const auto now = clock_type::now();
  const auto deadline = now + std::chrono::milliseconds(w.cfg.step_timeout_ms * 2);
  // The commit usually arrives within a millisecond; a thread that sleeps for it can lose a
  // whole scheduler tick on a busy machine, so poll the mailbox briefly before blocking.
  const auto spin_until = now + std::chrono::milliseconds(2);
  while (!got && !end) {
    auto t = clock_type::now();
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - t);
    if (left.count() <= 0)
      return loop_result{loop_end::failed, 0,
                         "no commit for step " + std::to_string(step) + " within " +
                             std::to_string(w.cfg.step_timeout_ms * 2 / 1000) + " s"};
    auto wait = t < spin_until ? std::chrono::milliseconds(0) : left;
    w.self->receive(
        [&](const commit& c) {
          if (ignore_older(w, c.epoch)) return;
          if (c.generation == w.current.generation && c.step == step) got = c;
        },
        [&](const abort_generation& a) { end = on_control(w, a); },
        [&](stop_atom) {
          if (accept_stop(w)) end = loop_result{loop_end::stopped, 0, "stopped by the coordinator"};
        },
        [&](const reconfigure& r) {
          if (ignore_older(w, r.epoch)) return;
          w.newest_generation = std::max(w.newest_generation, r.generation);
        },
        [&](caf::down_msg& dm) { end = on_coordinator_down(w, dm); },
        [&](silent_atom) { end = on_silent(w); }, caf::after(wait) >> [] {});
    // While polling, leave the core to the coordinator: on a machine where ranks fill every
    // core, the commit cannot be sent while we spin on it.
    if (!got && !end && wait.count() == 0) std::this_thread::yield();
  }
  if (end) return *end;
  return *got;
}

// Non-blocking look at the mailbox between steps.
std::optional<loop_result> poll_control(worker& w) {
  std::optional<loop_result> end;
  bool more = true;
  while (more && !end) {
    more = false;
    w.self->receive(
        [&](const abort_generation& a) {
          more = true;
          end = on_control(w, a);
        },
        [&](stop_atom) {
          more = true;
          if (accept_stop(w)) end = loop_result{loop_end::stopped, 0, "stopped by the coordinator"};
        },
        [&](const commit&) { more = true; },
        [&](caf::down_msg& dm) {
          more = true;
          end = on_coordinator_down(w, dm);
        },
        [&](silent_atom) {
          more = true;
          end = on_silent(w);
        },
        caf::after(std::chrono::seconds(0)) >> [] {});
  }
  return end;
}

// After a failed step: the coordinator decides (an abort opens the next generation), but
// never later than a deadline.
loop_result await_decision(worker& w) {
  const auto deadline = clock_type::now() + std::chrono::milliseconds(w.cfg.step_timeout_ms * 2);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
    if (left.count() <= 0)
      return {loop_end::failed, 0, "the coordinator did not answer a failed step in time"};
    std::optional<loop_result> end;
    w.self->receive([&](const abort_generation& a) { end = on_control(w, a); },
                    [&](stop_atom) {
                      if (accept_stop(w))
                        end = loop_result{loop_end::stopped, 0, "stopped by the coordinator"};
                    },
                    [&](const commit&) {},
                    [&](caf::down_msg& dm) { end = on_coordinator_down(w, dm); },
                    [&](silent_atom) { end = on_silent(w); }, caf::after(left) >> [] {});
    if (end) return *end;
  }
}

// A pipeline stage's passes of this session, as a Chrome trace: runs/<job>/traces/rank<r>.json.
void write_pipeline_trace(worker& w) {
  if (!w.current.gpt) return;
  const std::string trace = w.current.gpt->pipeline_trace();
  if (trace.empty()) return;
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(w.cfg.run_dir) / "traces";
  std::filesystem::create_directories(dir, ec);
  // Replaced by rename, never written through a link planted there (docs/SECURITY.md).
  try {
    if (std::filesystem::symlink_status(dir, ec).type() != std::filesystem::file_type::directory)
      throw std::runtime_error("it is not a directory");
    ckpt::io::write_file_atomically(dir / ("rank" + std::to_string(w.current.rank) + ".json"),
                                    trace);
  } catch (const std::exception& e) {
    monitoring::log(monitoring::level::warn, w.log_ctx(),
                    "could not write the pipeline trace to " + dir.string() + ": " + e.what());
  }
}

// A failed part of a step, as a value for the coordinator.
step_done failed_vote(worker& w, int64_t step, const std::string& op, const std::exception& e) {
  step_done vote;
  vote.generation = w.current.generation;
  vote.step = step;
  vote.rank = w.current.rank;
  vote.ok = false;
  vote.error = e.what();
  vote.error_op = op;
  if (auto* ce = dynamic_cast<const comm::comm_error*>(&e)) {
    vote.error_kind = static_cast<int32_t>(ce->code());
    const std::string text = ce->what();
    if (auto at = text.find("group "); at != std::string::npos) {
      auto end = text.find_first_of(",)", at);
      vote.error_group =
          text.substr(at + 6, end == std::string::npos ? std::string::npos : end - at - 6);
    }
  }
  return vote;
}

// Runs one generation's steps until the session's last step, or until it ends otherwise.
loop_result train(worker& w, int64_t start_step) {
  auto& g = w.current;
  auto& work = *g.work;
  const comm::op_options step_opts{std::chrono::milliseconds(w.cfg.step_timeout_ms)};
  auto fail_step = [&](int64_t step, const std::string& op, const std::exception& e) {
    monitoring::log(monitoring::level::warn, w.log_ctx(),
                    op + " of step " + std::to_string(step) + " failed: " + e.what());
    // The coordinator already ended this generation (its abort is here): a vote for it
    // would only be counted as stale, and at many ranks the coordinator has better to do.
    const bool program = dynamic_cast<const program_error*>(&e) != nullptr;
    if (program || !w.shared->superseded(g.generation))
      tell_coordinator(w, failed_vote(w, step, program ? program_failure_op : op, e));
    return await_decision(w);
  };
  double prev_control = 0, prev_peer_wait = 0, prev_optim = 0, prev_ckpt_stall = 0;
  for (int64_t step = start_step + 1; step <= session_last_step(w.cfg); ++step) {
    if (auto end = poll_control(w)) return *end;
    w.shared->step().store(step);
    auto t0 = clock_type::now();
    const double cpu0 = thread_cpu_seconds();
    step_outcome done;
    const int64_t position = data_position(step, w.skipped_steps);
    const chaos::step_injection injected = w.faults.on_step_begin(g.rank, step, position);
    try {
      if (g.stage) g.stage->begin_step(step);
      step_work work_of_step;
      work_of_step.step = step;
      work_of_step.data_position = position;
      work_of_step.global_batch = w.cfg.batch;
      work_of_step.seed = w.cfg.seed;
      done = work.compute(work_of_step);
      // An injected straggler: this rank's compute takes `factor` times as long, burning CPU
      // as slow hardware would.
      if (injected.slowdown > 1.0) {
        const double extra = (injected.slowdown - 1.0) * (thread_cpu_seconds() - cpu0);
        for (const double until = thread_cpu_seconds() + extra; thread_cpu_seconds() < until;) {
        }
      }
    } catch (const std::exception& e) {
      return fail_step(step, "compute", e);
    }
    auto t1 = clock_type::now();
    const double cpu1 = thread_cpu_seconds();
    const double model_comm_s = done.model_comm_s;
    if (auto load = g.gpt ? g.gpt->take_expert_load() : strategies::expert_load{};
        !load.tokens.empty()) {  // MoE: one rank per ep group
      expert_load_report report;
      report.generation = g.generation;
      report.step = step;
      report.rank = g.rank;
      report.blocks = static_cast<int32_t>(load.tokens.size());
      report.experts = static_cast<int32_t>(load.tokens.front().size());
      for (const auto& block : load.tokens)
        report.tokens.insert(report.tokens.end(), block.begin(), block.end());
      report.dropped = std::move(load.dropped);
      tell_coordinator(w, report);
    }
    try {
      work.reduce({step_opts});
    } catch (const std::exception& e) {
      return fail_step(step, "reduce", e);
    }
    auto t2 = clock_type::now();
    step_done vote;
    vote.generation = g.generation;
    vote.step = step;
    vote.rank = g.rank;
    // A rank whose loss another reports (a tp peer, an early pipeline stage) counts none.
    vote.loss_sum = done.loss_sum;
    vote.tokens = done.count;
    vote.grad_norm = work.local_grad_norm();
    if (const auto settled = work.reduced_loss_sum()) vote.loss_sum = *settled;
    if (injected.diverge) {
      // An injected bad batch: the coordinator must refuse to commit this step.
      monitoring::log(monitoring::level::warn, w.log_ctx(),
                      "fault: the batch of step " + std::to_string(step) + " diverges (NaN loss)");
      vote.loss_sum = std::nan("");
      vote.grad_norm = std::nan("");
    }
    vote.loss_class = wire_encode(vote.loss_sum);
    vote.grad_norm_class = wire_encode(vote.grad_norm);
    vote.lr = work.learning_rate(step);
    vote.compute_s = seconds_between(t0, t1) - model_comm_s;
    vote.compute_cpu_s = cpu1 - cpu0;
    vote.comm_s = seconds_between(t1, t2) + model_comm_s;
    vote.control_s = prev_control;
    vote.peer_wait_s = prev_peer_wait;
    vote.optim_s = prev_optim;
    vote.ckpt_stall_s = prev_ckpt_stall;
    if (step == start_step + 1) {
      vote.optim_state_bytes = static_cast<int64_t>(work.optimizer_state_bytes());
      vote.peak_rss_bytes = peak_rss_bytes();
    }
    tell_coordinator(w, vote);

    auto answer = await_commit(w, step);
    if (auto* end = std::get_if<loop_result>(&answer)) return *end;
    const commit c = std::get<commit>(answer);
    auto t3 = clock_type::now();
    try {
      // ZeRO's all-gather and tensor parallelism's norm are collectives too; a failure in the
      // middle leaves parameters half updated, so the state is no longer usable.
      g.state_step = -1;
      work.apply({step, w.cfg.steps, step_opts, wire_decode(c.loss, c.loss_class)});
      g.state_step = step;
    } catch (const std::exception& e) {
      return fail_step(step, "apply", e);
    }
    auto t4 = clock_type::now();
    // The round trip less the time our vote waited at the coordinator for the slowest
    // peer's: that wait is imbalance of the step, reported on its own.
    prev_peer_wait = std::min(c.peer_wait_s, seconds_between(t2, t3));
    prev_control = seconds_between(t2, t3) - prev_peer_wait;
    prev_optim = seconds_between(t3, t4);
    if (step == session_last_step(w.cfg)) write_pipeline_trace(w);
    prev_ckpt_stall = 0;
    if (c.checkpoint) {
      take_checkpoint(w, step);
      prev_ckpt_stall = seconds_between(t4, clock_type::now());  // training held for the snapshot
    }
    if (c.evaluate) {
      try {
        const eval_result share = work.evaluate({});
        eval_done evaluated{g.generation, step, g.rank, share.loss_sum, share.batches};
        evaluated.loss_class = wire_encode(evaluated.loss_sum);
        tell_coordinator(w, evaluated);
      } catch (const std::exception& e) {
        return fail_step(step + 1, "evaluate", e);
      }
    }
    if (c.hold) return await_decision(w);  // the next generation starts at this boundary
  }
  return {loop_end::finished, 0, ""};
}

// After the last step: stay until the coordinator says stop (it may still be collecting
// shards, or recover and ask this generation for the final checkpoint), never past a deadline.
loop_result await_stop(worker& w) {
  const auto deadline = clock_type::now() + std::chrono::milliseconds(w.cfg.step_timeout_ms * 2);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
    if (left.count() <= 0) return {loop_end::failed, 0, "the coordinator never said stop"};
    std::optional<loop_result> end;
    w.self->receive(
        [&](stop_atom) {
          if (accept_stop(w)) end = loop_result{loop_end::stopped, 0, ""};
        },
        [&](const abort_generation& a) { end = on_control(w, a); },
        [&](caf::down_msg& dm) {
          // The job is over and the coordinator gone: nothing is lost. With standby
          // coordinators the next leader may still want the final checkpoint, or the stop.
          if (w.ha())
            end = on_coordinator_down(w, dm);
          else if (dm.source == w.coordinator.address())
            end = loop_result{loop_end::stopped, 0, ""};
        },
        [&](silent_atom) { end = on_silent(w); },
        [&](const commit& c) {
          if (ignore_older(w, c.epoch)) return;
          // A generation formed after the last step writes the final checkpoint.
          if (c.generation == w.current.generation && c.checkpoint && w.current.work)
            take_checkpoint(w, c.step);
        },
        caf::after(left) >> [] {});
    if (end) return *end;
  }
}

// The coordinator stopped this member: says why and returns the process's exit code. Removed
// or evicted, the process was told to go (its agent starts a removed member again); otherwise
// the job stopped (a scheduler's SIGTERM, a Ctrl-C, the job's end): no failure of this rank's,
// so no error line for log-based alerting to page on.
int log_stop(worker& w, const std::string& why) {
  const int code = exit_code_after_stop(why);
  const bool told_to_go = why.starts_with(evicted_prefix) || why.starts_with(removed_prefix);
  if (!why.empty())
    monitoring::log(told_to_go ? monitoring::level::warn : monitoring::level::info, w.log_ctx(),
                    why);
  return code;
}

// The member's life: wait for a generation, train in it, report after an abort, repeat.
int serve(worker& w) {
  const auto wait_limit = std::chrono::seconds(86400);  // the coordinator's loss ends any wait
  std::optional<reconfigure> pending;
  for (;;) {
    std::optional<loop_result> end;
    if (!pending && w.unwritten_heap > 0 && !w.current.work) {
      // A joined member that idles (as a spare, or until a grow admits it) writes the heap
      // its first engine will use, so that taking a lost rank's place costs no page faults;
      // any message interrupts it within 2 MiB.
      const auto got = sys::warm_heap(w.unwritten_heap, w.unwritten_heap,
                                      [&w] { return w.self->mailbox().empty(); });
      if (got.written >= w.unwritten_heap) w.unwritten_heap = 0;
    }
    if (!pending) {
      w.self->receive(
          [&](const reconfigure& r) {
            if (ignore_older(w, r.epoch)) return;
            if (r.generation >= w.newest_generation) pending = r;
          },
          [&](const abort_generation& a) {
            end = on_control(w, a);
            if (end && end->how == loop_end::aborted) {
              if (end->then)
                pending = std::move(end->then);
              else
                tell_coordinator(w, report_for(w, a.generation));
              end.reset();
            }
          },
          [&](stop_atom) {
            if (accept_stop(w)) end = loop_result{loop_end::stopped, 0, ""};
          },
          [&](const commit&) {}, [&](caf::down_msg& dm) { end = on_coordinator_down(w, dm); },
          [&](silent_atom) { end = on_silent(w); }, caf::after(wait_limit) >> [] {});
    }
    if (end && end->how == loop_end::coordinator_lost) {
      if (auto code = rehome(w, end->why)) return *code;
      continue;  // the leader's abort and reconfigure come next
    }
    if (end) {
      if (end->how == loop_end::failed) {
        monitoring::log(monitoring::level::error, w.log_ctx(), end->why);
        return 1;
      }
      return log_stop(w, end->why);
    }
    if (!pending) continue;
    const reconfigure r = *pending;
    pending.reset();
    w.newest_generation = std::max(w.newest_generation, r.generation);
    w.skipped_steps = r.skipped_steps;
    auto done = enter_generation(w, r);
    if (done.ok) tell_relay_placed(w, r.generation, r.rank);
    if (!done.ok)
      monitoring::log(
          monitoring::level::warn, w.log_ctx(),
          "could not join generation " + std::to_string(r.generation) + ": " + done.error);
    tell_coordinator(w, done);
    if (!done.ok || r.rank < 0) continue;  // the coordinator decides; a spare waits
    prepare_checkpoints(w);  // while the coordinator gathers the other members' answers
    if (r.source != state_source::self)
      monitoring::log(monitoring::level::info, w.log_ctx(),
                      "rank " + std::to_string(r.rank) + " of " + std::to_string(r.world) +
                          " from step " + std::to_string(r.start_step) +
                          " (state: " + to_string(r.source) + ")");
    auto result = train(w, r.start_step);
    if (result.how == loop_end::finished) result = await_stop(w);
    switch (result.how) {
      case loop_end::aborted:
        // The coordinator planned the next generation already (see abort_generation::then),
        // or plans it from every member's report.
        if (result.then)
          pending = std::move(result.then);
        else
          tell_coordinator(w, report_for(w, result.next_generation));
        break;
      case loop_end::stopped:
        return log_stop(w, result.why);
      case loop_end::failed:
        monitoring::log(monitoring::level::error, w.log_ctx(), result.why);
        return 1;
      case loop_end::coordinator_lost:
        if (auto code = rehome(w, result.why)) return *code;
        break;  // the leader's abort and reconfigure come next
      case loop_end::finished:
        return 0;
    }
  }
}

// When the heartbeat thread acts on a silent coordinator. With standbys, a leader silent for a
// heartbeat timeout is looked for anew (the old one, if it comes back first, takes this member
// back): a takeover need not wait for the coordinator timeout. Alone, the coordinator has
// declared this member lost after a heartbeat timeout of the same silence (a cut is silent
// both ways), so the member stops computing at twice that, leaving a paused coordinator (a
// stalled VM) time to wake first, and asks it back until the coordinator timeout.
silence_policy silence_policy_of(const worker& w) {
  const liveness_timeouts waits = liveness_of(w.cfg.elastic);
  if (w.ha()) return {waits.heartbeat, std::chrono::milliseconds(0)};
  return {waits.stop_computing(), waits.coordinator};
}

// Warming more than this would delay a large model's first generation for little gain.
constexpr size_t warm_limit_bytes = size_t{1} << 30;

// `coordinator` is reached already: the one at args.coordinators[first] (or the only one).
// What a workload may read of the job's settings.
job_settings settings_of(const train_config& cfg, const std::string& config_json) {
  job_settings s;
  s.steps = cfg.steps;
  s.last_step = session_last_step(cfg);
  s.global_batch = cfg.batch;
  s.micro_batch = cfg.micro_batch;
  s.seed = cfg.seed;
  s.bucket_bytes = cfg.bucket_bytes;
  s.compute_threads = cfg.blas_threads;
  s.run_dir = cfg.run_dir;
  s.config_json = config_json;
  return s;
}

void rank_actor(caf::blocking_actor* self, caf::actor coordinator, worker_args args, size_t first,
                std::shared_ptr<std::atomic<int>> code, workload_factory make, caf::actor relay) {
  worker w;
  w.self = self;
  w.coordinator = coordinator;
  w.relay = relay;
  w.member = args.member;
  w.node = args.node;
  w.coordinators = args.coordinators;
  w.leader_index = first;
  w.leader =
      w.ha() ? w.coordinators[first] : endpoint{args.coordinator_host, args.coordinator_port};
  if (w.coordinators.empty()) w.coordinators = {w.leader};  // rehoming asks it alone
  w.shared = std::make_shared<worker_shared>();
  auto control = self->spawn(control_actor, w.shared, caf::actor_cast<caf::actor>(self));
  w.control = control;
  auto finish = [&](int c) {
    code->store(c);
    self->send_exit(control, caf::exit_reason::user_shutdown);
  };
  hello greeting{protocol_version,          args.member, getpid(), this_host(), args.node, control,
                 comm::transport_identity()};
  greeting.relay = w.relay;
  // The relay hands this member the coordinator's beats from now on, before any generation.
  tell_relay_placed(w, 0, -1);
  std::optional<welcome> answer;
  std::string error;
  if (!w.ha()) {
    self->monitor(coordinator);
    self->request(coordinator, std::chrono::seconds(30), greeting)
        .receive([&](welcome& x) { answer = std::move(x); },
                 [&](caf::error& e) {
                   error = "the coordinator did not answer hello: " + self->system().render(e);
                 });
    if (answer && !answer->error.empty())
      error = "the coordinator refused this member: " + answer->error;
  } else {
    // Only the leader takes members on; the standbys say so, and the next one is asked.
    wire::search_start at;
    at.last_leader = first;
    at.deadline = clock_type::now() + std::chrono::milliseconds(args.connect_timeout_ms);
    at.connected = static_cast<bool>(coordinator);
    auto found =
        search_leader(self, w.coordinators, greeting, wire::worker_start_policy(), at, coordinator);
    if (found.actor) {
      answer = std::move(found.answer);
      w.coordinator = found.actor;
      w.leader_index = found.index;
      w.leader = w.coordinators[found.index];
      self->monitor(w.coordinator);
    } else if (found.ended && (found.ended->reason == wire::give_up_reason::refused ||
                               found.ended->reason == wire::give_up_reason::told_to_go)) {
      error = found.said;
    } else {
      error = "no coordinator of the job took this member on within " +
              std::to_string(args.connect_timeout_ms / 1000) + " s (asked " + joined(found.asked) +
              "; last answer: " + found.last + ")";
    }
  }
  if (!error.empty()) {
    monitoring::log(monitoring::level::error, w.log_ctx(), error);
    return finish(1);
  }
  std::optional<heartbeat_thread> beats;
  try {
    w.cfg = config_from_json(answer->config_json);
    // This process checked the smallest job's need at start; now the job's own (its world).
    const auto limits = sys::read_descriptor_limits();
    check_descriptor_limit(descriptors_needed(w.cfg, process_role::worker), limits.soft,
                           limits.hard,
                           "a worker of this job (world " + std::to_string(w.cfg.world) + ")");
    set_blas_threads(w.cfg.blas_threads);
    // As the coordinator does: a connection whose data stays unacknowledged past twice the
    // coordinator timeout belongs to a cut that everyone has acted on.
    set_control_socket_timeout(liveness_of(w.cfg.elastic).dead_connection());
    // Before the first reconfigure. A member of a forming job has the time to write what an
    // old and a new engine will use; one that joins a running job may be on a recovery's
    // path (a reconfigure may already wait), so it only marks its heap for huge pages and
    // faults it in and writes it while it idles (serve).
    // Only the built-in GPT's working set is known here; a program warms its own heap.
    const size_t engine = make ? 0
                               : std::min(working_set_bytes(w.cfg.model, w.cfg.micro_batch) +
                                              static_cast<size_t>(std::max(0, w.cfg.bucket_bytes)),
                                          warm_limit_bytes / 2);
    const bool forming = answer->generation == 0;
    if (forming)
      sys::warm_heap(2 * engine, 2 * engine);
    else  // huge pages at least, at once; the faults and writes wait for idle time (serve)
      sys::warm_heap(2 * engine, 0, [] { return false; });
    w.unwritten_heap = forming ? 0 : 2 * engine;
    w.epoch_seen = answer->epoch;
    w.shared->epoch_seen().store(w.epoch_seen);
    w.shared->set_coordinator(w.coordinator);
    // A silent coordinator is not the end: the heartbeat thread tells this actor, which stops
    // computing and asks for the leader again (rehome).
    beats.emplace(w.relay ? w.relay : w.coordinator, args.member, w.shared,
                  std::chrono::milliseconds(std::max(10, answer->heartbeat_interval_ms)),
                  silence_policy_of(w), caf::actor_cast<caf::actor>(self));
    w.beats = &*beats;
    const std::string store_host = store_host_of(*answer, w.leader);
    const auto store_port = static_cast<uint16_t>(answer->store_port);
    w.store = comm::connect_tcp_store(store_host, store_port,
                                      std::chrono::milliseconds(w.cfg.step_timeout_ms));
    if (make) {
      w.job = make(settings_of(w.cfg, answer->config_json));
    } else {
      w.data.emplace(token_dataset::open(w.cfg.data, w.cfg.val_fraction, 0, w.cfg.val_data));
      w.job = std::make_unique<strategies::gpt_workload>(w.cfg, *w.data);
    }
    // Every listener of this worker (gloo's pairs, its stage link, its checkpoint replica)
    // binds and advertises this: the node's address toward the coordinator, or the one its
    // agent was told (--iface, --advertise).
    w.advertise =
        args.advertise.empty() ? local_address_toward(store_host, store_port) : args.advertise;
    w.faults = chaos::fault_schedule(
        chaos::parse_faults(w.cfg.elastic.faults, w.cfg.world + w.cfg.elastic.spares,
                            w.cfg.elastic.nodes, session_last_step(w.cfg), w.cfg.steps));
    const int c = serve(w);
    w.beats = nullptr;
    w.shared->detach();
    w.current = {};
    finish(c);
  } catch (const std::exception& e) {
    w.shared->detach();
    monitoring::log(monitoring::level::error, w.log_ctx(), e.what());
    finish(1);
  }
}

// A standby's member id: one line of decimal digits; nullopt at end of input or on anything
// else (the agent writes it; a standby that cannot read it is not used).
std::optional<int32_t> read_member_line(int fd) {
  std::string line;
  char c = 0;
  for (;;) {
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    if (c == '\n') break;
    if (c < '0' || c > '9' || line.size() >= 9) return std::nullopt;
    line.push_back(c);
  }
  if (line.empty()) return std::nullopt;
  return static_cast<int32_t>(std::stol(line));
}

}  // namespace

int run_worker(const worker_args& args, const workload_factory& make) {
  sys::retain_freed_memory();  // before CAF starts its threads
  system_config cfg;
  cfg.use_network();
  caf::actor_system sys{cfg};
  monitoring::log_context lc{"rank", -1, 0, -1};
  std::string error;
  caf::actor coordinator;
  size_t first = 0;
  if (args.coordinators.size() > 1) {
    // Any coordinator that answers will do here: the hello (rank_actor) finds the leader.
    auto names = endpoint_names(args.coordinators);
    wire::search_start at;
    at.deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(args.connect_timeout_ms);
    wire::leader_search_machine m(std::move(names), wire::worker_connect_policy(), at);
    for (;;) {
      const auto action = m.next(std::chrono::steady_clock::now());
      if (const auto* wait = std::get_if<wire::wait_until>(&action)) {
        std::this_thread::sleep_until(wait->until);
        continue;
      }
      if (const auto* g = std::get_if<wire::give_up>(&action)) {
        if (g->reason != wire::give_up_reason::other_job)  // another job's words say it all
          error = "cannot reach any coordinator of " + endpoints_text(args.coordinators) +
                  " within " + std::to_string(args.connect_timeout_ms / 1000) +
                  " s (last: " + error + ")";
        break;
      }
      const auto ask = std::get<wire::ask_endpoint>(action);
      const auto& e = args.coordinators[ask.index];
      coordinator = connect_to_coordinator(
          sys, e.host, e.port, std::max(std::chrono::milliseconds(1), ask.connect_within), error);
      if (coordinator) {
        first = ask.index;
        break;
      }
      m.on_answer(ask.ticket, {wire::verdict_of_connect_error(error), 0, std::nullopt, 0, error},
                  std::chrono::steady_clock::now());
    }
  } else {
    coordinator = connect_to_coordinator(sys, args.coordinator_host, args.coordinator_port,
                                         std::chrono::milliseconds(args.connect_timeout_ms), error);
  }
  if (!coordinator) {
    monitoring::log(monitoring::level::error, lc, error);
    return 1;
  }
  worker_args mine = args;
  if (args.standby) {
    const auto member = read_member_line(STDIN_FILENO);
    if (!member) return 0;  // not needed: the agent stops or is gone
    mine.member = *member;
  }
  // --relay: its agent's relay, on the node's address (actors/agent/node_relay.hpp). It stays
  // this worker's way to the leader through a takeover: the relay follows the new leader.
  caf::actor relay;
  if (const char* at = std::getenv("TROUPE_NODE_RELAY"); at && *at) {
    std::string host;
    uint16_t port = 0;
    if (!parse_endpoint(at, host, port)) {
      monitoring::log(
          monitoring::level::error, lc,
          std::string("TROUPE_NODE_RELAY must be HOST:PORT (its agent sets it), got '") + at + "'");
      return 1;
    }
    auto found = remote_job_actor_until(
        sys, host, port,
        std::chrono::steady_clock::now() + std::chrono::milliseconds(args.connect_timeout_ms));
    if (!found) {
      monitoring::log(monitoring::level::error, lc,
                      "cannot reach its agent's relay at " + std::string(at) + ": " +
                          sys.render(found.error()) + " (the agent may have ended)");
      return 1;
    }
    relay = *found;
  }
  auto code = std::make_shared<std::atomic<int>>(1);
  sys.spawn(rank_actor, coordinator, mine, first, code, make, relay);
  sys.await_all_actors_done();
  return code->load();
}

}  // namespace troupe::actors
