#include "runtime/sys/run_paths.hpp"

#include <string>

namespace troupe::run_paths {

namespace fs = std::filesystem;

fs::path config(const fs::path& run_dir) { return run_dir / "config.json"; }
fs::path events(const fs::path& run_dir) { return run_dir / "events.jsonl"; }
fs::path coordinator_address(const fs::path& run_dir) { return run_dir / "coordinator.addr"; }
fs::path rendezvous(const fs::path& run_dir) { return run_dir / "rendezvous.json"; }
fs::path join_token(const fs::path& run_dir) { return run_dir / "join.token"; }
fs::path incarnation(const fs::path& run_dir) { return run_dir / "incarnation"; }
fs::path skipped_batches(const fs::path& run_dir) { return run_dir / "skipped_batches.json"; }

fs::path checkpoints(const fs::path& run_dir) { return run_dir / "checkpoints"; }
fs::path latest(const fs::path& run_dir) { return checkpoints(run_dir) / "LATEST"; }
fs::path damaged(const fs::path& run_dir) { return checkpoints(run_dir) / "damaged"; }
fs::path damaged_objects(const fs::path& run_dir) { return damaged(run_dir) / "objects"; }
fs::path chunks(const fs::path& run_dir) { return checkpoints(run_dir) / "chunks"; }
fs::path recycled_chunks(const fs::path& run_dir) {
  return checkpoints(run_dir) / "recycled-chunks";
}
fs::path run_lock(const fs::path& run_dir) { return checkpoints(run_dir) / ".lock"; }
fs::path chunk_store_lock(const fs::path& run_dir) { return checkpoints(run_dir) / ".chunks.lock"; }

fs::path archived(const fs::path& run_dir, int64_t seconds) {
  return fs::path(run_dir.string() + ".prev-" + std::to_string(seconds));
}

fs::path metrics_address(const fs::path& run_dir) { return run_dir / "metrics.addr"; }

fs::path standby_metrics_address(const fs::path& run_dir, int pid) {
  return run_dir / "coordinators" / (std::to_string(pid) + ".metrics.addr");
}

}  // namespace troupe::run_paths
