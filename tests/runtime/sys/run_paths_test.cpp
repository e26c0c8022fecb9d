// The names of a run directory's files are a contract with its readers (scripts, the Python
// tests, `troupe ckpt`, the agents of a Slurm job): each is pinned here.

#include "runtime/sys/run_paths.hpp"

#include <gtest/gtest.h>

namespace troupe::run_paths {
namespace {

TEST(RunPathsTest, NamesEveryFileBelowTheRunDirectory) {
  const std::filesystem::path dir = "/runs/a";
  EXPECT_EQ(config(dir), "/runs/a/config.json");
  EXPECT_EQ(events(dir), "/runs/a/events.jsonl");
  EXPECT_EQ(coordinator_address(dir), "/runs/a/coordinator.addr");
  EXPECT_EQ(rendezvous(dir), "/runs/a/rendezvous.json");
  EXPECT_EQ(join_token(dir), "/runs/a/join.token");
  EXPECT_EQ(skipped_batches(dir), "/runs/a/skipped_batches.json");
  EXPECT_EQ(checkpoints(dir), "/runs/a/checkpoints");
  EXPECT_EQ(latest(dir), "/runs/a/checkpoints/LATEST");
  EXPECT_EQ(damaged(dir), "/runs/a/checkpoints/damaged");
  EXPECT_EQ(damaged_objects(dir), "/runs/a/checkpoints/damaged/objects");
  EXPECT_EQ(chunks(dir), "/runs/a/checkpoints/chunks");
  EXPECT_EQ(recycled_chunks(dir), "/runs/a/checkpoints/recycled-chunks");
  EXPECT_EQ(run_lock(dir), "/runs/a/checkpoints/.lock");
  EXPECT_EQ(chunk_store_lock(dir), "/runs/a/checkpoints/.chunks.lock");
}

TEST(RunPathsTest, AnEmptyRunDirectoryGivesTheRelativeName) {
  EXPECT_EQ(run_lock("").string(), "checkpoints/.lock");
  EXPECT_EQ(checkpoints("").string(), "checkpoints");
  EXPECT_EQ(events("").string(), "events.jsonl");
}

TEST(RunPathsTest, AnEarlierRunIsArchivedBesideTheRunDirectory) {
  EXPECT_EQ(archived("/runs/a", 1733400000), "/runs/a.prev-1733400000");
  EXPECT_EQ(archived("rel/b", 7).string(), "rel/b.prev-7");
  EXPECT_LE(archived("x", 9999999999).filename().string().size() - 1, archive_suffix_bytes);
}

}  // namespace
}  // namespace troupe::run_paths
