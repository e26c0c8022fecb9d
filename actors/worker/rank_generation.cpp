// A worker entering a generation: its communicators and engine for the plan, and its state
// from itself, a peer, a checkpoint or the seed.

#include <algorithm>

#include "actors/worker/program_state.hpp"
#include "actors/worker/rank_worker.hpp"
#include "actors/worker/runtime_reduced.hpp"
#include "actors/worker/state_transfer.hpp"
#include "chaos/faulty_communicator.hpp"
#include "checkpoint/checkpoint.hpp"
#include "runtime/auth/credentials.hpp"
#include "runtime/comm/host_communicator.hpp"
#include "runtime/trainer.hpp"
#include "strategies/pipeline_schedule.hpp"
#include "strategies/replan.hpp"

namespace troupe::actors::worker_detail {

namespace {

bool holds_state_at(const worker& w, int64_t step) {
  return w.current.work && w.current.state_step == step;
}

}  // namespace

// Builds this member's part of generation `r` and restores its state; answers `reconfigured`.
reconfigured enter_generation(worker& w, const reconfigure& r) {
  reconfigured out;
  out.generation = r.generation;
  out.member = w.member;
  out.rank = r.rank;
  const auto started = clock_type::now();
  generation_context next;
  next.generation = r.generation;
  next.rank = r.rank;
  next.world = r.world;
  try {
    next.plan = strategies::plan_from_json(r.plan_json);
    // Checked before connecting: a plan sent with the abort assumes this member holds its
    // rank's state at the last committed step; when it does not (an apply the abort broke),
    // the peers learn it from the coordinator's next abort instead of a connect timeout.
    if (r.rank >= 0 && r.source == state_source::self && !holds_state_at(w, r.start_step))
      throw std::runtime_error("asked to keep a state this process does not hold (step " +
                               std::to_string(w.current.state_step) + ", wanted " +
                               std::to_string(r.start_step) + ")");
    if (r.rank >= 0) {
      const auto op_timeout = std::chrono::milliseconds(w.cfg.step_timeout_ms);
      // A newer generation's abort ends every wait of this one's forming (store keys, the
      // segment's barrier) instead of leaving it waiting for peers lost meanwhile; so does
      // losing the coordinator whose store it waits on (with standby coordinators).
      const comm::cancel_check superseded = [shared = w.shared, g = r.generation] {
        return shared->superseded(g) || shared->rehoming().load();
      };
      comm::interruptible_store store(*w.store, superseded);
      comm::gloo_options gopts;
      gopts.bind_host = w.advertise;  // the node's address: peers on other hosts connect to it
      gopts.connect_timeout = op_timeout;
      gopts.cancelled = superseded;
      gopts.known_one_host = r.one_host;
      if (w.cfg.data_plane_auth == "tcp-md5") {
        const auto key = auth::derive_key(auth::process_credentials(), "gloo pairs");
        gopts.pair_key.assign(key.begin(), key.end());
      }
      // The group of before, shrunk to the ranks that are left, when the coordinator says so
      // (reconfigure::shrink_kept); else shared memory for groups on this host, TCP otherwise
      // (TROUPE_TRANSPORT=tcp|shm overrides). Chaos tests reach a worker's data plane through
      // TROUPE_CHAOS_RANK<r>.
      comm::communicator* shrink_source = nullptr;
      if (!r.shrink_kept.empty()) {
        if (w.current.generation == r.shrink_from && w.current.work)
          shrink_source = w.current.work->replica_group();
        if (!shrink_source)
          throw std::runtime_error("asked to shrink generation " + std::to_string(r.shrink_from) +
                                   "'s group, which this process does not hold (it is in " +
                                   "generation " + std::to_string(w.current.generation) + ")");
      }
      const std::vector<int> kept(r.shrink_kept.begin(), r.shrink_kept.end());
      const int rank = r.rank;
      auto connect = [&store, gopts, rank, shrink_source,
                      kept](const comm::comm_identity& id) -> std::unique_ptr<comm::communicator> {
        if (shrink_source && id.size == static_cast<int>(kept.size())) {
          auto shrunk = shrink_source->shrink(id, kept);
          if (!shrunk)
            throw comm::comm_error(comm::comm_errc::invalid,
                                   "group " + id.group + " of generation " +
                                       std::to_string(id.generation) +
                                       ": the group of before cannot shrink (not shared memory)");
          return chaos::inject_from_environment(std::move(shrunk), rank);
        }
        return chaos::inject_from_environment(comm::make_host_communicator(store, id, gopts), rank);
      };
      generation_env env;
      env.generation = r.generation;
      env.rank = r.rank;
      env.world = r.world;
      env.global_batch = w.cfg.batch;
      env.plan_json = r.plan_json;
      {  // this rank's replica group and its share of every step's samples
        const auto view = strategies::view_of(next.plan.shape, r.rank);
        env.dp = {view.dp.index, static_cast<int>(view.dp.ranks.size()), view.dp.ranks,
                  view.dp.name};
        if (!next.plan.replica_micro_batches.empty()) {
          const auto share = replica_share(next.plan.replica_micro_batches,
                                           next.plan.micro_batch_size, view.dp.index);
          env.share = {share.first, share.count, share.micro_batch};
        }
      }
      env.connect = connect;
      env.op_timeout = op_timeout;
      next.work = w.job->make_generation(env);
      if (w.job->traits().reduces == reduction::by_runtime)
        next.work = reduced_by_runtime(std::move(next.work), env);
      if (auto* gpt = dynamic_cast<strategies::gpt_generation*>(next.work.get()))
        next.gpt = &gpt->engine();
      if (next.plan.shape.pp > 1) {
        const auto view = strategies::view_of(next.plan.shape, r.rank);
        const int s = view.at.pp, p = next.plan.shape.pp;
        int next_slots = 0;
        if (s + 1 < p) {
          const auto schedule =
              strategies::make_schedule(strategies::parse_schedule_kind(w.cfg.parallel.schedule), p,
                                        next.plan.micro_batches_per_replica);
          // The next stage's activation slots, plus the one activation this stage's send holds.
          next_slots = strategies::peak_live_activations(schedule)[static_cast<size_t>(s) + 1] + 1;
        }
        next.stage =
            std::make_unique<stage_link>(w.self->system(), store, r.generation, view.pp.name, s, p,
                                         next_slots, op_timeout, w.advertise);
        if (next.gpt) next.gpt->set_pipeline_observer(next.stage.get());
      }
      w.shared->attach(next.work.get(), next.stage.get(), r.generation);
      const comm::op_options opts{op_timeout};
      const shared_group replicas{next.work->replica_group(),
                                  strategies::view_of(next.plan.shape, r.rank).dp.ranks};
      if (w.cfg.replicate_checkpoints) {
        if (!w.replica)
          w.replica = std::make_unique<checkpoint_replica>(
              *w.store, w.advertise, static_cast<size_t>(w.cfg.checkpoint_chunk_kib) * 1024,
              op_timeout);
        w.replica->enter_generation(store, r.generation, r.rank, r.world, w.node);
      }
      switch (r.source) {
        case state_source::init:
          next.work->init(w.cfg.seed);
          break;
        case state_source::checkpoint: {
          auto man = ckpt::read_manifest(w.cfg.run_dir, r.start_step);
          if (w.cfg.external_workload()) {  // a program's state: its table comes with it
            const ckpt::restore_stats stats =
                restore_program_checkpoint(*next.work, w.cfg.run_dir, man,
                                           w.replica ? w.replica->memory() : ckpt::memory_source{});
            out.bytes = stats.bytes_read;
            out.memory_bytes = stats.bytes_from_memory;
          } else if (man.format_version >= 2) {
            // Only the chunks of the boxes this rank holds in its new place, verified.
            const state_view view = next.work->state();
            strategies::local_state state = strategies::local_state_of(view);
            // With replicated checkpoints, the live ranks' memory first, then the disk.
            const ckpt::restore_stats stats = ckpt::restore_into(
                w.cfg.run_dir, man, strategies::state_map_of(view), state.buffers,
                w.replica ? w.replica->memory() : ckpt::memory_source{});
            out.bytes = stats.bytes_read;
            out.memory_bytes = stats.bytes_from_memory;
            *state.adam_t = man.adam_t;
          } else {  // format 1: one flat shard per rank of the writing world (the GPT's)
            if (!next.gpt)
              throw std::runtime_error("checkpoint " + std::to_string(r.start_step) +
                                       " is of format 1, which only the built-in GPT reads");
            next.gpt->init(w.cfg.seed);
            next.gpt->restore(ckpt::load_full_state(w.cfg.run_dir, man));
            for (const auto& s : man.shards) out.bytes += s.bytes;
          }
          break;
        }
        case state_source::self:
          next.work->keep_state(*w.current.work);
          break;
        case state_source::peer:
          out.bytes = receive_workload_state(connect, r.generation, r.source_rank, r.rank,
                                             *next.work, opts, replicas);
          break;
        case state_source::none:
          break;
      }
      for (int32_t to : r.send_to)
        send_workload_state(connect, r.generation, r.rank, to, *next.work, opts, replicas);
      next.state_step = r.start_step;
    }
  } catch (const std::exception& e) {
    w.shared->detach();
    out.ok = false;
    out.error = e.what();
    if (const auto* failed = dynamic_cast<const comm::connect_error*>(&e))
      out.error_cause = failed->cause();
    // The coordinator falls back to an earlier checkpoint for this one.
    if (const auto* bad = dynamic_cast<const ckpt::checkpoint_error*>(&e);
        bad && r.source == state_source::checkpoint && ckpt::is_damage(bad->kind()))
      out.error_cause = std::string(damaged_checkpoint_cause) + " " + std::to_string(r.start_step);
    out.seconds = seconds_between(started, clock_type::now());
    return out;
  }
  w.shared->detach();
  w.current = std::move(next);  // the old generation's engine and communicators go here
  w.shared->attach(w.current.work.get(), w.current.stage.get(), w.current.generation);
  w.shared->step().store(r.start_step);
  out.seconds = seconds_between(started, clock_type::now());
  return out;
}

state_report report_for(const worker& w, uint64_t generation) {
  state_report rep;
  rep.generation = generation;
  rep.member = w.member;
  if (w.current.work && w.current.state_step >= 0) {
    rep.held_generation = w.current.generation;
    rep.held_rank = w.current.rank;
    rep.held_step = w.current.state_step;
  }
  return rep;
}

}  // namespace troupe::actors::worker_detail
