#pragma once
// The job's event kinds of one topic (checkpoints: commits, failures, abandoned and skipped ones,
// garbage collection, restores and resumes); see monitoring/events/events.hpp for what every
// struct has and how they are written and read.

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "monitoring/events/event_field.hpp"

namespace troupe::events {

/// A checkpoint was committed ("checkpoint").
struct checkpoint {
  static constexpr std::string_view name = "checkpoint";
  int64_t step = 0;
  std::string path;
  uint64_t generation = 0;
  uint64_t bytes_written = 0;
  uint64_t bytes_deduplicated = 0;
  double stall_s = 0;
  double write_s = 0;
  uint64_t snapshot_buffer_bytes = 0;
  uint64_t replicated_bytes = 0;
  std::optional<int64_t> replaces;  ///< the abandoned checkpoint's step it stands for
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("step", e.step);
    f("path", e.path);
    f("generation", e.generation);
    f("bytes_written", e.bytes_written);
    f("bytes_deduplicated", e.bytes_deduplicated);
    f("stall_s", e.stall_s);
    f("write_s", e.write_s);
    f("snapshot_buffer_bytes", e.snapshot_buffer_bytes);
    f("replicated_bytes", e.replicated_bytes);
    f("replaces", e.replaces);
  }
  friend bool operator==(const checkpoint&, const checkpoint&) = default;
};

/// A checkpoint failed to save or commit ("checkpoint_failed").
struct checkpoint_failed {
  static constexpr std::string_view name = "checkpoint_failed";
  int64_t step = 0;
  std::optional<int> ranks_failed;  ///< absent when the commit (not a rank) failed
  std::string error;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("step", e.step);
    f("ranks_failed", e.ranks_failed);
    f("error", e.error);
  }
  friend bool operator==(const checkpoint_failed&, const checkpoint_failed&) = default;
};

/// A generation ended before every rank reported its share ("checkpoint_abandoned").
struct checkpoint_abandoned {
  static constexpr std::string_view name = "checkpoint_abandoned";
  int64_t step = 0;
  uint64_t generation = 0;
  int ranks_reported = 0;
  int world = 0;
  std::string reason;
  int64_t retake_from = 0;
  std::string then;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("step", e.step);
    f("generation", e.generation);
    f("ranks_reported", e.ranks_reported);
    f("world", e.world);
    f("reason", e.reason);
    f("retake_from", e.retake_from);
    f("then", e.then);
  }
  friend bool operator==(const checkpoint_abandoned&, const checkpoint_abandoned&) = default;
};

/// Checkpoint garbage collection removed something, or found entries not troupe's
/// ("checkpoint_gc").
struct checkpoint_gc {
  static constexpr std::string_view name = "checkpoint_gc";
  std::vector<std::string> foreign;  ///< each reported once per job, at most 32 at a time
  std::vector<int64_t> removed_steps;
  uint64_t chunks_removed = 0;
  uint64_t chunks_recycled = 0;
  uint64_t chunks_kept = 0;
  uint64_t bytes_freed = 0;
  double seconds = 0;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("foreign", e.foreign);
    f("removed_steps", e.removed_steps);
    f("chunks_removed", e.chunks_removed);
    f("chunks_recycled", e.chunks_recycled);
    f("chunks_kept", e.chunks_kept);
    f("bytes_freed", e.bytes_freed);
    f("seconds", e.seconds);
  }
  friend bool operator==(const checkpoint_gc&, const checkpoint_gc&) = default;
};

/// Checkpoint garbage collection failed ("checkpoint_gc_failed").
struct checkpoint_gc_failed {
  static constexpr std::string_view name = "checkpoint_gc_failed";
  std::string error;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("error", e.error);
  }
  friend bool operator==(const checkpoint_gc_failed&, const checkpoint_gc_failed&) = default;
};

/// A checkpoint due at `step` was not taken ("checkpoint_skipped").
struct checkpoint_skipped {
  static constexpr std::string_view name = "checkpoint_skipped";
  int64_t step = 0;
  std::string reason;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("step", e.step);
    f("reason", e.reason);
  }
  friend bool operator==(const checkpoint_skipped&, const checkpoint_skipped&) = default;
};

/// A rank of a new generation restored its state ("restored").
struct restored {
  static constexpr std::string_view name = "restored";
  int32_t rank = -1;
  int32_t member = -1;
  uint64_t generation = 0;
  std::string from;  ///< to_string(state_source)
  uint64_t bytes = 0;
  double seconds = 0;
  int64_t step = 0;
  std::optional<uint64_t> from_memory_bytes;  ///< only when some came from peers' memory
  std::optional<int32_t> peer_rank;           ///< only from a peer
  std::optional<int64_t> checkpoint_step;     ///< only from a checkpoint
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("rank", e.rank);
    f("member", e.member);
    f("generation", e.generation);
    f("from", e.from);
    f("bytes", e.bytes);
    f("seconds", e.seconds);
    f("step", e.step);
    f("from_memory_bytes", e.from_memory_bytes);
    f("peer_rank", e.peer_rank);
    f("checkpoint_step", e.checkpoint_step);
  }
  friend bool operator==(const restored&, const restored&) = default;
};

/// The `restored` events of a generation in one, for a job of more ranks than
/// --metrics-rank-labels ("restored_summary"): how many ranks restored from each source, the
/// bytes of all of them (and how many of those came from peers' memory), and the spread of a
/// rank's bytes and seconds.
struct restored_summary {
  static constexpr std::string_view name = "restored_summary";
  uint64_t generation = 0;
  int64_t step = 0;
  int32_t ranks = 0;
  std::map<std::string, int32_t> from;  ///< ranks by to_string(state_source)
  uint64_t bytes = 0;
  uint64_t from_memory_bytes = 0;
  spread<uint64_t> rank_bytes;
  spread<double> rank_seconds;
  std::optional<int64_t> checkpoint_step;  ///< only when some rank restored from a checkpoint
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("generation", e.generation);
    f("step", e.step);
    f("ranks", e.ranks);
    f("from", e.from);
    f("bytes", e.bytes);
    f("from_memory_bytes", e.from_memory_bytes);
    f("rank_bytes", e.rank_bytes);
    f("rank_seconds", e.rank_seconds);
    f("checkpoint_step", e.checkpoint_step);
  }
  friend bool operator==(const restored_summary&, const restored_summary&) = default;
};

/// --resume passed over a checkpoint (or LATEST) that did not read back ("checkpoint_fallback").
struct checkpoint_fallback {
  static constexpr std::string_view name = "checkpoint_fallback";
  int64_t step = -1;  ///< -1: LATEST itself
  std::string path;
  std::string error;
  std::string quarantined;
  int64_t resumed_step = 0;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("step", e.step);
    f("path", e.path);
    f("error", e.error);
    f("quarantined", e.quarantined);
    f("resumed_step", e.resumed_step);
  }
  friend bool operator==(const checkpoint_fallback&, const checkpoint_fallback&) = default;
};

/// The session resumes from a checkpoint ("resume").
struct resume {
  static constexpr std::string_view name = "resume";
  int64_t step = 0;
  std::string written_by;  ///< the layout that wrote it
  int format_version = 0;
  bool latest_repaired = false;
  nullable<int64_t> latest_was;  ///< what LATEST named, when it had to be repaired
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("step", e.step);
    f("written_by", e.written_by);
    f("format_version", e.format_version);
    f("latest_repaired", e.latest_repaired);
    f("latest_was", e.latest_was);
  }
  friend bool operator==(const resume&, const resume&) = default;
};

}  // namespace troupe::events
