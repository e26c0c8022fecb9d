// The commit protocol: nothing counts until the manifest and LATEST are in place, a crash
// before that leaves the previous checkpoint, and committed data is never overwritten.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include "checkpoint/checkpoint.hpp"
#include "test_support.hpp"

namespace troupe::ckpt {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;
using testing::make_full;
using testing::step_path;
using testing::temp_dir;
using testing::write_checkpoint;

TEST(Commit, NothingCommittedInAnEmptyRunDir) {
  temp_dir dir;
  EXPECT_FALSE(latest_committed(dir.str()).has_value());
  EXPECT_FALSE(latest_committed(dir.str() + "/does-not-exist").has_value());
  EXPECT_TRUE(list_committed(dir.str()).empty());
}

TEST(Commit, UncommittedStepDirIsIgnored) {
  temp_dir dir;
  write_checkpoint(dir.str(), make_full(50, 10), 2, /*commit=*/false);
  EXPECT_TRUE(fs::exists(step_path(dir.str(), 10) / "shard-00000.bin"));
  EXPECT_FALSE(latest_committed(dir.str()).has_value());
  EXPECT_TRUE(list_committed(dir.str()).empty());
}

TEST(Commit, CrashBeforeCommitLeavesThePreviousCheckpoint) {
  temp_dir dir;
  const full_state old_state = make_full(50, 10);
  write_checkpoint(dir.str(), old_state, 2);
  // Step 20: every shard durable, one stray temporary file, but the coordinator died
  // before the manifest.
  write_checkpoint(dir.str(), make_full(50, 20), 2, /*commit=*/false);
  testing::write_text(step_path(dir.str(), 20) / "shard-00001.bin.tmp.999.0", "partial");

  const std::optional<manifest> latest = latest_committed(dir.str());
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 10);
  EXPECT_EQ(load_full_state(dir.str(), *latest).params, old_state.params);
}

TEST(Commit, CrashBetweenManifestAndLatestKeepsThePreviousAndRetrySucceeds) {
  temp_dir dir;
  write_checkpoint(dir.str(), make_full(50, 10), 2);
  const fs::path latest_file = fs::path(dir.str()) / "checkpoints" / "LATEST";
  const std::vector<char> latest_before = testing::read_bytes(latest_file);
  const manifest m = write_checkpoint(dir.str(), make_full(50, 20), 2);
  testing::write_bytes(latest_file, latest_before);  // as if LATEST's rename never happened

  EXPECT_EQ(latest_committed(dir.str())->step, 10);
  EXPECT_EQ(list_committed(dir.str()), (std::vector<int64_t>{10, 20}));
  commit_manifest(dir.str(), m);  // the coordinator's retry is idempotent
  EXPECT_EQ(latest_committed(dir.str())->step, 20);
}

TEST(Commit, RefusesWhenAShardIsMissingAndKeepsLatest) {
  temp_dir dir;
  write_checkpoint(dir.str(), make_full(50, 10), 2);
  manifest m = write_checkpoint(dir.str(), make_full(50, 20), 2, /*commit=*/false);
  fs::remove(step_path(dir.str(), 20) / "shard-00001.bin");
  expect_error([&] { commit_manifest(dir.str(), m); }, error_kind::missing, "shard-00001.bin");
  EXPECT_FALSE(fs::exists(step_path(dir.str(), 20) / "manifest.json"));
  EXPECT_EQ(latest_committed(dir.str())->step, 10);
}

TEST(Commit, RefusesEntriesThatDoNotDescribeTheirFiles) {
  temp_dir dir;
  manifest m = write_checkpoint(dir.str(), make_full(50, 20), 2, /*commit=*/false);
  manifest wrong_size = m;
  wrong_size.shards[0].bytes += 1;
  expect_error([&] { commit_manifest(dir.str(), wrong_size); }, error_kind::truncated,
               "shard-00000.bin");
  manifest wrong_hash = m;
  wrong_hash.shards[1].hash = "00000000deadbeef";
  expect_error([&] { commit_manifest(dir.str(), wrong_hash); }, error_kind::mismatch,
               "shard-00001.bin");
  manifest swapped = m;
  std::swap(swapped.shards[0].file, swapped.shards[1].file);
  EXPECT_THROW(commit_manifest(dir.str(), swapped), checkpoint_error);
  manifest gap = m;
  gap.shards[1].range.offset += 1;
  expect_error([&] { commit_manifest(dir.str(), gap); }, error_kind::invalid_argument, "gap");
  manifest short_list = m;
  short_list.shards.pop_back();
  expect_error([&] { commit_manifest(dir.str(), short_list); }, error_kind::invalid_argument,
               "one per rank");
  EXPECT_FALSE(latest_committed(dir.str()).has_value());
  commit_manifest(dir.str(), m);
  EXPECT_EQ(latest_committed(dir.str())->step, 20);
}

TEST(Commit, NeverOverwritesACommittedStep) {
  temp_dir dir;
  const full_state state = make_full(50, 10);
  const manifest m = write_checkpoint(dir.str(), state, 2);
  expect_error([&] { write_shard(dir.str(), slice_state(make_full(50, 10, 7), 0, 2)); },
               error_kind::already_committed, "already committed");
  manifest other = m;
  other.config_json = "{}";
  expect_error([&] { commit_manifest(dir.str(), other); }, error_kind::already_committed,
               "manifest.json");
  EXPECT_EQ(load_full_state(dir.str(), *latest_committed(dir.str())).params, state.params);
}

TEST(Commit, InconsistentShardStateIsRefusedBeforeWriting) {
  temp_dir dir;
  shard_state s = slice_state(make_full(50, 10), 0, 2);
  s.params.pop_back();
  expect_error([&] { write_shard(dir.str(), s); }, error_kind::invalid_argument, "params");
  s = slice_state(make_full(50, 10), 0, 2);
  s.range.offset = 40;
  expect_error([&] { write_shard(dir.str(), s); }, error_kind::invalid_argument, "range");
  s = slice_state(make_full(50, 10), 0, 2);
  s.rank = 2;
  expect_error([&] { write_shard(dir.str(), s); }, error_kind::invalid_argument, "rank");
  EXPECT_FALSE(fs::exists(step_path(dir.str(), 10)));
}

TEST(Commit, RanksWriteConcurrently) {
  temp_dir dir;
  const full_state full = make_full(100'003, 30);
  constexpr int world = 6;
  std::vector<shard_entry> entries(world);
  std::vector<std::thread> ranks;
  ranks.reserve(world);
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      entries[static_cast<size_t>(r)] = write_shard(dir.str(), slice_state(full, r, world));
    });
  }
  for (auto& t : ranks) t.join();
  manifest m;
  m.format_version = shard_format_version;  // the flat-shard format
  m.step = 30;
  m.world = world;
  m.global_numel = full.params.size();
  m.seed = full.seed;
  m.shards = entries;
  commit_manifest(dir.str(), m);
  EXPECT_EQ(load_full_state(dir.str(), *latest_committed(dir.str())).exp_avg_sq, full.exp_avg_sq);
  // No temporary file is left behind by a successful write.
  for (const auto& e : fs::directory_iterator(step_path(dir.str(), 30))) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  }
}

TEST(Retention, StaleTemporaryFilesGoAtTheNextStartAndNothingElse) {
  temp_dir dir;
  write_checkpoint(dir.str(), make_full(20, 10), 2);
  const fs::path root(dir.str());
  const std::vector<fs::path> stale = {root / "checkpoints" / "LATEST.tmp.777.0",
                                       root / "checkpoints" / "chunks" / "ab" / "ab01.tmp.777.1",
                                       root / "skipped_batches.json.tmp.777.2",
                                       root / "config.json.tmp"};
  for (const auto& p : stale) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "half";
  }
  auto lock = run_lock::try_acquire(dir.str());
  ASSERT_TRUE(lock);
  auto removed = remove_stale_temp_files(dir.str(), *lock);
  std::sort(removed.begin(), removed.end());
  std::vector<std::string> expected;
  for (const auto& p : stale) expected.push_back(p.string());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(removed, expected);
  for (const auto& p : stale) EXPECT_FALSE(fs::exists(p)) << p;
  EXPECT_EQ(latest_committed(dir.str())->step, 10) << "committed files stay";
  EXPECT_NO_THROW(load_full_state(dir.str(), *latest_committed(dir.str())));
}

}  // namespace
}  // namespace troupe::ckpt
