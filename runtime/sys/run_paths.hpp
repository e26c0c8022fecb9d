#pragma once
// The name of every file and folder troupe keeps in a run directory, in one place: what the
// coordinator writes at its top, the checkpoints below it, the locks, and where an earlier run
// is moved aside. Every layer names a run directory's files through these functions.

#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace troupe::run_paths {

// Each function takes the run directory and returns the path below it. Given an empty path it
// returns the name relative to the run directory ("checkpoints/LATEST"), as messages quote it.

/// RUN_DIR/config.json: the validated config the job was started with.
std::filesystem::path config(const std::filesystem::path& run_dir);
/// RUN_DIR/events.jsonl: the job's history, one JSON object a line.
std::filesystem::path events(const std::filesystem::path& run_dir);
/// RUN_DIR/coordinator.addr: HOST:PORT where the coordinator's control plane listens.
std::filesystem::path coordinator_address(const std::filesystem::path& run_dir);
/// RUN_DIR/rendezvous.json: where the agents of a Slurm job find this attempt's coordinator.
std::filesystem::path rendezvous(const std::filesystem::path& run_dir);
/// RUN_DIR/join.token: the job's credentials (mode 0600).
std::filesystem::path join_token(const std::filesystem::path& run_dir);
/// RUN_DIR/incarnation: sixteen hex digits drawn when the run started, kept by --resume: what
/// the job's state in etcd is marked with, so that a later job under the same id never takes
/// it for its own.
std::filesystem::path incarnation(const std::filesystem::path& run_dir);
/// RUN_DIR/skipped_batches.json: the batches skipped after divergences, which a resumed
/// session skips too.
std::filesystem::path skipped_batches(const std::filesystem::path& run_dir);

/// RUN_DIR/checkpoints: the committed checkpoints (step-NNNNNNNN/, named by checkpoint/format)
/// and everything that keeps them.
std::filesystem::path checkpoints(const std::filesystem::path& run_dir);
/// RUN_DIR/checkpoints/LATEST: names the newest committed checkpoint (the commit record).
std::filesystem::path latest(const std::filesystem::path& run_dir);
/// RUN_DIR/checkpoints/damaged: quarantined checkpoints; nothing there is ever deleted.
std::filesystem::path damaged(const std::filesystem::path& run_dir);
/// RUN_DIR/checkpoints/damaged/objects: files moved out of the way of a write.
std::filesystem::path damaged_objects(const std::filesystem::path& run_dir);
/// RUN_DIR/checkpoints/chunks: the content-addressed chunk store.
std::filesystem::path chunks(const std::filesystem::path& run_dir);
/// RUN_DIR/checkpoints/recycled-chunks: collected chunk files kept for reuse.
std::filesystem::path recycled_chunks(const std::filesystem::path& run_dir);
/// RUN_DIR/checkpoints/.lock: held by the one job (or `troupe ckpt` command) using the run.
std::filesystem::path run_lock(const std::filesystem::path& run_dir);
/// RUN_DIR/checkpoints/.chunks.lock: shared by writers, exclusive for a garbage collection.
std::filesystem::path chunk_store_lock(const std::filesystem::path& run_dir);

/// RUN_DIR/metrics.addr: where the leading coordinator serves its metrics (`troupe status`).
std::filesystem::path metrics_address(const std::filesystem::path& run_dir);
/// RUN_DIR/coordinators/PID.metrics.addr: where standby coordinator PID serves its metrics.
std::filesystem::path standby_metrics_address(const std::filesystem::path& run_dir, int pid);

/// RUN_DIR.prev-<seconds>: where a fresh run moves an earlier run it finds in RUN_DIR.
std::filesystem::path archived(const std::filesystem::path& run_dir, int64_t seconds);
/// The most bytes archived() adds to the run directory's last component (".prev-" and ten
/// digits of seconds).
inline constexpr size_t archive_suffix_bytes = 16;

}  // namespace troupe::run_paths
