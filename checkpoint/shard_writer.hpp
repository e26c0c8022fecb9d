#pragma once
// The write side of a checkpoint, as a seam: a rank copies what it holds into a snapshot
// (the only part that stalls training), and a shard_writer persists the snapshot as
// content-addressed chunks and reports which chunks hold which boxes. The filesystem writer
// is the one backend today; an object store can take its place without touching the ranks.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/chunk_file.hpp"
#include "checkpoint/state_map.hpp"

namespace troupe::ckpt {

/// One box a rank writes, at `data_offset` in its snapshot's data.
struct snapshot_piece {
  int array = 0;  ///< index into array_names
  std::string tensor;
  box where;
  size_t data_offset = 0;
};

/// A copy of the state one rank writes at one step. The data buffer is allocated once and
/// reused by every later snapshot (fresh memory is slow to touch on these machines).
struct snapshot {
  int rank = 0;
  int world = 1;
  uint64_t generation = 0;
  int64_t step = 0;
  int64_t adam_t = 0;
  std::vector<snapshot_piece> pieces;
  std::vector<float> data;
  size_t used = 0;  ///< floats of `data` in use
};

/// Copies this rank's share of every piece of `map` (its replica_index's balanced part of
/// each box) out of `buffers` (array_names order) into `into`, growing its buffer only the
/// first time (or when the layout grew).
void capture(const state_map& map, std::span<const std::span<const float>> buffers, snapshot& into);

/// capture's first half: lists the pieces of `into` and sizes (so touches) its buffer,
/// copying nothing. Done ahead of the first checkpoint, it keeps first-touch page faults out
/// of training.
void lay_out(const state_map& map, std::span<const std::span<const float>> buffers, snapshot& into);

/// A box persisted as chunks: element i of the box (row-major) is element offset + i of its
/// chunks laid end to end. A large box starts its own chunks (offset 0); small boxes are
/// packed together, so one begins inside a chunk. Every chunk but a piece's last holds
/// exactly chunk_floats floats; the last holds at least what the piece needs of it.
struct saved_piece {
  int rank = 0;
  int array = 0;
  std::string tensor;
  box where;
  std::vector<chunk_key> chunks;
  uint64_t offset = 0;  ///< where the box starts in its first chunk
  friend bool operator==(const saved_piece&, const saved_piece&) = default;
};

/// How many floats chunk `index` of `p` holds: exactly chunk_floats for all but the piece's
/// last chunk; for the last, at least what the piece needs of it (it may be shared).
struct chunk_extent {
  size_t min_floats = 0;
  size_t max_floats = 0;
};
inline chunk_extent extent_of(const saved_piece& p, size_t index, size_t chunk_floats) {
  if (index + 1 < p.chunks.size()) return {chunk_floats, chunk_floats};
  const size_t end = static_cast<size_t>(p.offset) + p.where.numel();
  return {end - index * chunk_floats, chunk_floats};
}

/// What a writer tells the coordinator once a snapshot is durable.
struct shard_report {
  int rank = 0;
  int64_t step = 0;
  int64_t adam_t = 0;
  std::vector<saved_piece> pieces;
  uint64_t bytes_written = 0;       ///< chunk bytes that reached the disk (headers included)
  uint64_t bytes_deduplicated = 0;  ///< chunk bytes already stored, so not written again
  size_t chunks_written = 0;
  size_t chunks_deduplicated = 0;
  double write_s = 0;
  /// What the write found in the store and dealt with, for the rank's log: a damaged chunk
  /// moved aside and written again, something foreign skipped in the recycled files.
  std::vector<std::string> notes;
  size_t chunks_repaired = 0;  ///< stored copies found damaged, moved aside and rewritten
};

/// Persists snapshots. write() returns only when every chunk it reports is durable; it
/// throws checkpoint_error (io, with the cause, e.g. a full disk) otherwise.
class shard_writer {
 public:
  virtual ~shard_writer() = default;
  virtual shard_report write(const snapshot& s) = 0;
  /// Gets ready to write snapshots shaped like `layout` (its data is not read): a backend
  /// allocates and touches its buffers here rather than during the first write.
  virtual void prepare(const snapshot& /*layout*/) {}
  /// Floats per chunk (the last chunk of a box may be shorter).
  [[nodiscard]] virtual size_t chunk_floats() const = 0;
};

/// Told of every chunk of a snapshot (new or already stored) once all are staged, in order,
/// on the writer's thread: (rank, step, key, floats). The in-memory replica rides on it.
using chunk_observer =
    std::function<void(int rank, int64_t step, const chunk_key&, std::span<const float>)>;

/// How the filesystem writer spreads one write over threads.
struct fs_writer_options {
  /// A snapshot of at least this many bytes, written by a thread at normal priority, shares
  /// its chunks with helper threads (sys::helpers_for_this_thread); smaller ones, and any
  /// written at idle priority, are written by the writer's thread alone.
  size_t share_from_bytes = size_t{16} << 20;
  unsigned max_helpers = 3;
  /// Reads every chunk it wrote back from the disk (its cached pages dropped first) and
  /// compares it with what was written before reporting the write durable
  /// (--verify-checkpoints after-write).
  bool verify_after_write = false;
};

/// The filesystem backend: chunks under RUN_DIR/checkpoints/chunks, each written to a
/// temporary name, made durable and renamed. A chunk already stored is not written again when
/// it is known good: written or checked by this process (chunk_file::known_good), or read back
/// now and found to hold exactly the bytes it should. Anything else under its name is moved
/// aside (RUN_DIR/checkpoints/damaged/objects) and the chunk written afresh; no link in the
/// store or among the recycled files is ever followed.
std::unique_ptr<shard_writer> make_fs_shard_writer(const std::string& run_dir, size_t chunk_bytes,
                                                   chunk_observer observer = {},
                                                   fs_writer_options options = {});

}  // namespace troupe::ckpt
