#pragma once
// Asynchronous checkpoints: at a committed step a rank copies its state into a snapshot
// buffer allocated once (the stall), and a background thread persists it through a
// shard_writer while training goes on. At most one snapshot is in flight; a new one waits
// for it or is skipped, by policy, and never touches the buffer being written.

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "checkpoint/shard_writer.hpp"
#include "runtime/sys/idle_priority.hpp"

namespace troupe::ckpt {

/// What to do when a snapshot is due while the previous one is still being written.
enum class overlap_policy { wait, skip };
/// "wait" | "skip"; nullopt otherwise.
std::optional<overlap_policy> parse_overlap_policy(std::string_view text);

/// Identifies a snapshot: who takes it, in which generation, at which step.
struct snapshot_meta {
  int rank = 0;
  int world = 1;
  uint64_t generation = 0;
  int64_t step = 0;
  int64_t adam_t = 0;
  /// A program's state table and extras (workload.command), for the coordinator's manifest;
  /// "" for the built-in GPT. Carried to the write's report untouched.
  std::string state_table_json = {};
};

/// How taking a snapshot went, for the rank's report.
struct snapshot_outcome {
  bool taken = false;   ///< false: skipped because a write was in flight (policy skip)
  double stall_s = 0;   ///< time training was held: the wait (policy wait) plus the copy
  double waited_s = 0;  ///< the part of stall_s spent waiting for the previous write
};

/// The end of one background write: the report, or the error that stopped it.
struct write_outcome {
  snapshot_meta meta;
  double stall_s = 0;       ///< what taking the snapshot held training for
  size_t buffer_bytes = 0;  ///< the snapshot buffer's size
  std::optional<shard_report> report;
  std::string error;
};

class async_checkpointer {
 public:
  /// `done` runs on the writer thread after each write (success or failure).
  async_checkpointer(std::unique_ptr<shard_writer> writer, overlap_policy policy,
                     std::function<void(write_outcome)> done);
  /// Finishes the write in flight (a committed checkpoint must not be cut short), then stops.
  ~async_checkpointer();
  async_checkpointer(const async_checkpointer&) = delete;
  async_checkpointer& operator=(const async_checkpointer&) = delete;

  /// Copies this rank's share of `map` out of `buffers` and queues it for writing.
  snapshot_outcome take(const state_map& map, std::span<const std::span<const float>> buffers,
                        const snapshot_meta& meta);
  /// Sizes and touches the snapshot buffer and the writer's own for snapshots of `map`, so the
  /// first checkpoint does not pay for fresh memory. Does nothing while a write is in flight.
  void prepare(const state_map& map, std::span<const std::span<const float>> buffers);
  /// Blocks until no write is in flight.
  void wait_idle();
  [[nodiscard]] bool busy() const;
  /// Bytes held by the snapshot buffer (allocated once, reused).
  [[nodiscard]] size_t buffer_bytes() const;

 private:
  void run();

  std::unique_ptr<shard_writer> writer_;
  overlap_policy policy_;
  std::function<void(write_outcome)> done_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  snapshot buffer_;
  snapshot_meta queued_meta_;
  double queued_stall_s_ = 0;
  bool pending_ = false;  // buffer_ holds a snapshot not yet written
  bool stopping_ = false;
  // Writes run on cores that training leaves idle, for at most half a second each.
  sys::idle_lane lane_{std::chrono::milliseconds(500)};
  std::thread thread_;
};

}  // namespace troupe::ckpt
