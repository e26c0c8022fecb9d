// A worker's checkpoints: its snapshot of a committed step, written in the background by a
// checkpointer it keeps across generations, and the report the coordinator commits from.

#include <span>
#include <vector>

#include "actors/wire/state_table.hpp"
#include "actors/worker/program_state.hpp"
#include "actors/worker/rank_worker.hpp"
#include "checkpoint/checkpoint.hpp"

namespace troupe::actors::worker_detail {
namespace {

// The report of a finished background write, sent from the writer's thread.
shard_written report_of(const ckpt::write_outcome& o, bool synchronous,
                        checkpoint_replica* replica) {
  shard_written out;
  out.generation = o.meta.generation;
  out.step = o.meta.step;
  out.rank = o.meta.rank;
  out.adam_t = o.meta.adam_t;
  out.state_table_json = o.meta.state_table_json;
  out.stall_s = o.stall_s;
  if (!o.report) {
    out.ok = false;
    out.error = o.error;
    return out;
  }
  out.pieces_json = ckpt::encode_pieces(o.report->pieces);
  out.bytes_written = o.report->bytes_written;
  out.bytes_deduplicated = o.report->bytes_deduplicated;
  out.write_s = o.report->write_s;
  if (synchronous) out.stall_s += o.report->write_s;  // the step waited for the write too
  out.buffer_bytes = o.buffer_bytes;
  if (replica) out.replicated_bytes = replica->take_sent_bytes();
  return out;
}

// Takes this rank's snapshot of committed step `step`: the copy holds training, the write
// runs in the background (or here, with checkpoint_async off) and reports when durable.
ckpt::async_checkpointer& checkpointer_of(worker& w) {
  if (!w.checkpointer) {
    const bool synchronous = !w.cfg.checkpoint_async;
    const std::shared_ptr<worker_shared> shared = w.shared;
    checkpoint_replica* replica = w.replica.get();
    ckpt::fs_writer_options options;
    options.verify_after_write = w.cfg.verify_checkpoints == "after-write";
    const monitoring::log_context ctx = w.log_ctx();
    w.checkpointer = std::make_unique<ckpt::async_checkpointer>(
        ckpt::make_fs_shard_writer(w.cfg.run_dir,
                                   static_cast<size_t>(w.cfg.checkpoint_chunk_kib) * 1024,
                                   replica ? replica->observer() : ckpt::chunk_observer{}, options),
        *ckpt::parse_overlap_policy(w.cfg.checkpoint_overlap),
        [shared, synchronous, replica, ctx](ckpt::write_outcome o) {
          // What the write found in the store (a damaged chunk rewritten, something foreign
          // skipped) is said where the rank speaks.
          if (o.report)
            for (const std::string& note : o.report->notes)
              monitoring::log(monitoring::level::warn,
                              {ctx.role, o.meta.rank, o.meta.generation, o.meta.step},
                              "checkpoint: " + note);
          // To the coordinator of now: after a takeover the report of a write begun under the
          // old leader goes to the new one (which drops it as stale); none while rehoming.
          if (!shared->fenced() && !shared->rehoming().load())
            caf::anon_send(shared->coordinator(), report_of(o, synchronous, replica));
        });
  }
  return *w.checkpointer;
}

}  // namespace

// Sizes the snapshot buffers for this generation's state before its first step: fresh memory
// costs ~0.3 GB/s to touch here, which the first checkpoint would otherwise take from
// training (with the writer's first buffers, tens of milliseconds).
void prepare_checkpoints(worker& w) {
  if (w.cfg.checkpoint_every <= 0 || !w.current.work || w.cfg.external_workload()) return;
  const state_view view = w.current.work->state();
  strategies::local_state state = strategies::local_state_of(view);
  std::vector<std::span<const float>> buffers(state.buffers.begin(), state.buffers.end());
  checkpointer_of(w).prepare(strategies::state_map_of(view), buffers);
}

void take_checkpoint(worker& w, int64_t step) {
  if (w.shared->fenced()) return;  // cut off from the coordinator: this process writes nothing
  const bool synchronous = !w.cfg.checkpoint_async;
  ckpt::async_checkpointer& checkpointer = checkpointer_of(w);
  ckpt::snapshot_meta meta{w.current.rank, w.current.world, w.current.generation, step, 0};
  try {
    const state_view view = w.current.work->state();
    ckpt::snapshot_outcome taken;
    if (w.cfg.external_workload()) {
      // A program's tensors, packed per state array; its table and extras go with the report.
      const packed_state packed = pack_program_state(view, false);
      meta.state_table_json = encode_state_table(view.tensors, view.extras_json);
      taken = checkpointer.take(packed.map, packed.readable(), meta);
    } else {
      strategies::local_state state = strategies::local_state_of(view);
      std::vector<std::span<const float>> buffers(state.buffers.begin(), state.buffers.end());
      meta.adam_t = *state.adam_t;
      taken = checkpointer.take(strategies::state_map_of(view), buffers, meta);
    }
    if (!taken.taken) {
      shard_written skipped;
      skipped.generation = meta.generation;
      skipped.step = step;
      skipped.rank = meta.rank;
      skipped.ok = false;
      skipped.skipped = true;
      skipped.error = "the previous checkpoint was still being written (checkpoint_overlap skip)";
      tell_coordinator(w, skipped);
      return;
    }
    if (synchronous) checkpointer.wait_idle();
  } catch (const std::exception& e) {
    shard_written failed;
    failed.generation = meta.generation;
    failed.step = step;
    failed.rank = meta.rank;
    failed.ok = false;
    failed.error = std::string("taking the snapshot failed: ") + e.what();
    tell_coordinator(w, failed);
  }
}

}  // namespace troupe::actors::worker_detail
