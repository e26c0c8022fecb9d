// The run directory as untrusted input (issue 24): what a writer, a collection, a commit and a
// reader find on disk is checked before it is used, damage is moved aside and never spreads,
// and nothing there steers a write out of the directory.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <numeric>
#include <set>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/format.hpp"
#include "checkpoint/little_endian.hpp"
#include "checkpoint/shard_writer.hpp"
#include "runtime/sys/run_paths.hpp"
#include "test_support.hpp"

namespace troupe::ckpt {
namespace {

namespace fs = std::filesystem;

// One tensor "w" of `n` floats in every array, filled from `first` upwards.
struct one_tensor {
  explicit one_tensor(size_t n) : values(n) {
    for (auto& a : map.arrays) a = {{"w", {0, 0, 1, static_cast<int64_t>(n)}, 0, 1, 0, true}};
  }
  snapshot at(int64_t step, float first) {
    std::iota(values.begin(), values.end(), first);
    const std::span<const float> bufs[] = {values, values, values};
    snapshot s;
    s.step = step;
    s.adam_t = step;
    capture(map, bufs, s);
    return s;
  }
  state_map map;
  std::vector<float> values;
};

manifest manifest_of(const shard_report& r, int64_t step, size_t n, size_t chunk_floats) {
  manifest m;
  m.step = step;
  m.world = 1;
  m.global_numel = n;
  m.adam_t = step;
  m.chunk_floats = chunk_floats;
  m.config_json = "{}";
  m.tensors = {{"w", {static_cast<int64_t>(n)}, 0}};
  m.pieces = r.pieces;
  return m;
}

std::set<chunk_key> keys_of(const shard_report& r) {
  std::set<chunk_key> out;
  for (const auto& p : r.pieces) out.insert(p.chunks.begin(), p.chunks.end());
  return out;
}

size_t entries_in(const fs::path& dir) {
  std::error_code ec;
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    (void)e;
    ++n;
  }
  return n;
}

void flip_payload_byte(const fs::path& chunk) {
  auto bytes = testing::read_bytes(chunk);
  bytes[chunk_file::header_bytes + 1] ^= 0x10;
  testing::write_bytes(chunk, bytes);
}

// A chunk that is already stored is deduplicated against only once it is known good: a
// damaged copy (what a new process finds, or a file someone put under a future chunk's name)
// is moved aside and written afresh, so no manifest ever references it.
TEST(UntrustedStore, ADamagedStoredChunkIsMovedAsideAndWrittenAgainNotReused) {
  testing::temp_dir dir;
  one_tensor t(3000);  // 1024-float chunks: three of them
  const snapshot s = t.at(1, 0.0f);
  const shard_report first = make_fs_shard_writer(dir.str(), 4096)->write(s);
  const chunk_key victim = *keys_of(first).begin();
  flip_payload_byte(chunk_file::path_of(dir.str(), victim));
  chunk_file::known_good::forget_all(dir.str());  // as a new process finds the store

  const shard_report again = make_fs_shard_writer(dir.str(), 4096)->write(s);
  EXPECT_EQ(again.chunks_repaired, 1u);
  EXPECT_EQ(again.chunks_written, 1u) << "only the damaged chunk is written again";
  // The three arrays hold the same values: nine chunks of three contents.
  EXPECT_EQ(again.chunks_deduplicated, 8u) << "the intact ones are checked and reused";
  ASSERT_EQ(again.notes.size(), 1u);
  EXPECT_NE(again.notes[0].find(victim.hex()), std::string::npos) << again.notes[0];
  EXPECT_NO_THROW((void)chunk_file::read(dir.str(), victim, 1024, "w"));
  EXPECT_EQ(entries_in(run_paths::damaged_objects(dir.str())), 1u) << "moved, not deleted";
  commit_manifest(dir.str(), manifest_of(again, 1, 3000, 1024));
  EXPECT_TRUE(verify_checkpoint(dir.str(), 1).empty());
}

// The same process wrote the chunk and trusts it, and the file was written over since (a byte
// flipped in place): the next checkpoint with the same content checks it before it reuses it,
// and writes it again. Without that, every later checkpoint named the damaged file, and a
// rollback found none intact (found by the soak: a chunk of step 240 damaged before step 260
// was written).
TEST(UntrustedStore, AKnownChunkWrittenOverSinceIsCheckedAgainBeforeItIsReused) {
  testing::temp_dir dir;
  one_tensor t(3000);
  const snapshot s = t.at(3, 0.25f);
  const shard_report first = make_fs_shard_writer(dir.str(), 4096)->write(s);
  const chunk_key victim = *keys_of(first).begin();
  ASSERT_TRUE(chunk_file::known_good::contains(dir.str(), victim));
  flip_payload_byte(chunk_file::path_of(dir.str(), victim));
  const shard_report again = make_fs_shard_writer(dir.str(), 4096)->write(s);
  EXPECT_EQ(again.chunks_repaired, 1u);
  EXPECT_EQ(again.chunks_written, 1u) << "the damaged chunk is written again";
  commit_manifest(dir.str(), manifest_of(again, 3, 3000, 1024));
  EXPECT_TRUE(verify_checkpoint(dir.str(), 3).empty());
}

// The same process wrote the chunk (so it trusted it) and it was damaged since: a read that
// finds the damage ends that trust, and the next write of the same content writes it again
// instead of naming the damaged file (found by the soak: a rollback's replay re-committed a
// checkpoint whose chunk a restore had just found damaged).
TEST(UntrustedStore, AChunkFoundDamagedOnReadIsNoLongerReusedByThisProcess) {
  testing::temp_dir dir;
  one_tensor t(3000);
  const snapshot s = t.at(2, 0.5f);
  const shard_report first = make_fs_shard_writer(dir.str(), 4096)->write(s);
  const chunk_key victim = *keys_of(first).begin();
  ASSERT_TRUE(chunk_file::known_good::contains(dir.str(), victim));
  flip_payload_byte(chunk_file::path_of(dir.str(), victim));
  EXPECT_THROW((void)chunk_file::read(dir.str(), victim, 1024, "r"), checkpoint_error);
  EXPECT_FALSE(chunk_file::known_good::contains(dir.str(), victim));
  const shard_report again = make_fs_shard_writer(dir.str(), 4096)->write(s);
  EXPECT_EQ(again.chunks_repaired, 1u);
  EXPECT_NO_THROW((void)chunk_file::read(dir.str(), victim, 1024, "r"));
  commit_manifest(dir.str(), manifest_of(again, 2, 3000, 1024));
  EXPECT_TRUE(verify_checkpoint(dir.str(), 2).empty());
}

TEST(UntrustedStore, WhateverLiesUnderAFutureChunksNameIsMovedAside) {
  testing::temp_dir dir;
  one_tensor t(3000);
  const snapshot s = t.at(7, 1.0f);
  // Learn the names this snapshot's chunks will take, in a scratch store.
  testing::temp_dir scratch;
  const auto names = keys_of(make_fs_shard_writer(scratch.str(), 4096)->write(s));
  ASSERT_EQ(names.size(), 3u);
  auto it = names.begin();
  const fs::path as_file = chunk_file::path_of(dir.str(), *it++);
  const fs::path as_dir = chunk_file::path_of(dir.str(), *it++);
  const fs::path as_link = chunk_file::path_of(dir.str(), *it++);
  const fs::path outside = dir.path() / "outside.txt";
  testing::write_text(outside, "not a chunk");
  for (const fs::path& p : {as_file, as_dir, as_link}) fs::create_directories(p.parent_path());
  testing::write_text(as_file, "a file someone left here");
  fs::create_directories(as_dir / "inside");
  fs::create_symlink(outside, as_link);

  const shard_report r = make_fs_shard_writer(dir.str(), 4096)->write(s);
  EXPECT_EQ(r.chunks_written, 3u);
  EXPECT_EQ(r.chunks_repaired, 3u);
  std::ifstream in(outside);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "not a chunk");
  commit_manifest(dir.str(), manifest_of(r, 7, 3000, 1024));
  EXPECT_TRUE(verify_checkpoint(dir.str(), 7).empty());
  EXPECT_EQ(entries_in(run_paths::damaged_objects(dir.str())), 3u);
}

TEST(UntrustedStore, AChunkFolderThatIsALinkIsMovedAsideNotWrittenThrough) {
  testing::temp_dir dir;
  testing::temp_dir elsewhere;
  one_tensor t(1000);
  const snapshot s = t.at(2, 3.0f);
  testing::temp_dir scratch;
  const chunk_key k = *keys_of(make_fs_shard_writer(scratch.str(), 4096)->write(s)).begin();
  const fs::path folder = chunk_file::path_of(dir.str(), k).parent_path();
  fs::create_directories(folder.parent_path());
  fs::create_directory_symlink(elsewhere.path(), folder);

  const shard_report r = make_fs_shard_writer(dir.str(), 4096)->write(s);
  EXPECT_EQ(r.chunks_written, 1u);
  EXPECT_EQ(entries_in(elsewhere.path()), 0u) << "nothing was written through the link";
  EXPECT_EQ(fs::symlink_status(folder).type(), fs::file_type::directory);
  EXPECT_NO_THROW((void)chunk_file::read(dir.str(), k, 1000, "w"));
}

// Recycled files are overwritten in place: only a plain file of ours, with one name and a
// chunk's size, may be; a link, a directory or a hard link there is skipped, and the save
// succeeds.
TEST(UntrustedStore, RecycledFilesThatAreNotPlainChunkFilesAreSkippedNotFollowed) {
  testing::temp_dir dir;
  const fs::path recycled = chunk_file::recycled_root(dir.str());
  fs::create_directories(recycled);
  const fs::path outside = dir.path() / "outside.txt";
  testing::write_text(outside, "precious");
  fs::create_symlink(outside, recycled / "00000000000000000000000000000001");
  fs::create_directory(recycled / "00000000000000000000000000000002");
  const fs::path linked = dir.path() / "hard-linked.txt";
  testing::write_text(linked, "also precious");
  fs::create_hard_link(linked, recycled / "00000000000000000000000000000003");

  one_tensor t(3000);
  const shard_report r = make_fs_shard_writer(dir.str(), 4096)->write(t.at(1, 5.0f));
  EXPECT_EQ(r.chunks_written, 3u);
  EXPECT_EQ(r.notes.size(), 3u) << "each foreign entry is reported";
  std::ifstream a(outside), b(linked);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}), "precious");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(b), {}), "also precious");
  commit_manifest(dir.str(), manifest_of(r, 1, 3000, 1024));
  EXPECT_TRUE(verify_checkpoint(dir.str(), 1).empty());
  // A collection neither fails on them nor follows them.
  const gc_result gc = collect_garbage(dir.str(), {1, 0}, std::chrono::seconds(0));
  EXPECT_EQ(gc.foreign.size(), 2u) << "the link and the directory";
  EXPECT_TRUE(fs::exists(outside));
  EXPECT_TRUE(fs::exists(linked));
}

TEST(UntrustedStore, ADirectoryUnderAChunksNameDoesNotStopCollection) {
  testing::temp_dir dir;
  one_tensor t(1000);
  auto writer = make_fs_shard_writer(dir.str(), 4096);
  for (int64_t step = 1; step <= 2; ++step)
    commit_manifest(dir.str(), manifest_of(writer->write(t.at(step, static_cast<float>(step))),
                                           step, 1000, 1024));
  const fs::path planted = chunk_file::root(dir.str()) / "ab" / std::string(32, 'a');
  fs::create_directories(planted / "deep");
  gc_result gc;
  ASSERT_NO_THROW(gc = collect_garbage(dir.str(), {1, 0}, std::chrono::seconds(0)));
  EXPECT_EQ(gc.removed_steps, std::vector<int64_t>{1});
  EXPECT_EQ(gc.foreign.size(), 1u);
  EXPECT_TRUE(fs::is_directory(planted / "deep")) << "skipped, not deleted";
}

// A committed manifest that cannot be read (bytes that are not UTF-8 among them) is damage:
// the collection quarantines its checkpoint and says so, deleting nothing, and the next one
// goes on without it.
TEST(UntrustedStore, AnUnreadableManifestIsQuarantinedAndTheNextCollectionGoesOn) {
  testing::temp_dir dir;
  one_tensor t(1000);
  auto writer = make_fs_shard_writer(dir.str(), 4096);
  for (int64_t step = 1; step <= 3; ++step)
    commit_manifest(dir.str(), manifest_of(writer->write(t.at(step, static_cast<float>(step))),
                                           step, 1000, 1024));
  testing::write_text(testing::step_path(dir.str(), 1) / "manifest.json", "\xff\xfe{\"x\x1b[31m");
  const auto on_disk_before = entries_in(chunk_file::root(dir.str()));
  testing::expect_error(
      [&] {
        (void)collect_garbage(dir.str(), {1, 0}, std::chrono::seconds(0));
      },
      error_kind::corrupt, "deleted nothing");
  EXPECT_EQ(list_committed(dir.str()), (std::vector<int64_t>{2, 3}));
  const auto quarantined = list_quarantined(dir.str());
  ASSERT_EQ(quarantined.size(), 1u);
  EXPECT_EQ(quarantined[0].step, 1);
  EXPECT_EQ(quarantined[0].reason, "unreadable-manifest");
  EXPECT_EQ(entries_in(chunk_file::root(dir.str())), on_disk_before);
  const gc_result gc = collect_garbage(dir.str(), {1, 0}, std::chrono::seconds(0));
  EXPECT_EQ(gc.removed_steps, std::vector<int64_t>{2});
  EXPECT_EQ(list_committed(dir.str()), std::vector<int64_t>{3});
}

// Retention keeps the newest checkpoint known intact while anything newer is damaged, and
// removes nothing newer than it: a run whose newest checkpoints went bad keeps one to resume.
TEST(UntrustedStore, RetentionNeverRemovesTheNewestIntactCheckpointBehindDamagedOnes) {
  testing::temp_dir dir;
  one_tensor t(1000);
  auto writer = make_fs_shard_writer(dir.str(), 4096);
  std::vector<chunk_key> own;
  for (int64_t step = 1; step <= 4; ++step) {
    const shard_report r = writer->write(t.at(step, static_cast<float>(step) * 100));
    own.push_back(*keys_of(r).begin());
    commit_manifest(dir.str(), manifest_of(r, step, 1000, 1024));
  }
  flip_payload_byte(chunk_file::path_of(dir.str(), own[2]));  // step 3
  flip_payload_byte(chunk_file::path_of(dir.str(), own[3]));  // step 4 (LATEST)
  const gc_result gc = collect_garbage(dir.str(), {1, 0}, std::chrono::seconds(0));
  EXPECT_EQ(gc.removed_steps, std::vector<int64_t>{1}) << "only what is older than step 2";
  EXPECT_EQ(list_committed(dir.str()), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_TRUE(verify_checkpoint(dir.str(), 2).empty());
}

TEST(UntrustedStore, AQuarantinedCheckpointKeepsItsChunksAndIsListed) {
  testing::temp_dir dir;
  one_tensor t(1000);
  auto writer = make_fs_shard_writer(dir.str(), 4096);
  std::vector<chunk_key> own;
  for (int64_t step = 1; step <= 3; ++step) {
    const shard_report r = writer->write(t.at(step, static_cast<float>(step) * 100));
    own.push_back(*keys_of(r).begin());
    commit_manifest(dir.str(), manifest_of(r, step, 1000, 1024));
  }
  const std::string where = quarantine_checkpoint(dir.str(), 2, "corrupt");
  EXPECT_EQ(fs::path(where).filename(), "step-00000002-corrupt");
  EXPECT_EQ(quarantine_checkpoint(dir.str(), 1, "corrupt"),
            (run_paths::damaged(dir.str()) / "step-00000001-corrupt").string());
  EXPECT_EQ(list_committed(dir.str()), std::vector<int64_t>{3});
  ASSERT_EQ(list_quarantined(dir.str()).size(), 2u);
  (void)collect_garbage(dir.str(), {1, 0}, std::chrono::seconds(0));
  for (const chunk_key& k : own)
    EXPECT_TRUE(fs::exists(chunk_file::path_of(dir.str(), k))) << "a quarantined one's chunk";
}

TEST(UntrustedStore, LatestIsNeverReadOrWrittenThroughALink) {
  testing::temp_dir dir;
  one_tensor t(1000);
  commit_manifest(dir.str(), manifest_of(make_fs_shard_writer(dir.str(), 4096)->write(t.at(1, 0)),
                                         1, 1000, 1024));
  const fs::path latest = run_paths::latest(dir.str());
  const fs::path outside = dir.path() / "elsewhere";
  testing::write_text(outside, "step-00000001\n");
  fs::remove(latest);
  fs::create_symlink(outside, latest);
  testing::expect_error([&] { (void)read_latest_step(dir.str()); }, error_kind::corrupt,
                        "symbolic link");
  point_latest_at(dir.str(), 1);
  EXPECT_EQ(fs::symlink_status(latest).type(), fs::file_type::regular);
  std::ifstream in(outside);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "step-00000001\n");
}

// Chunk headers record the payload's byte order (format 2); a reader refuses the order it
// cannot use, naming it, and still reads format 1 chunks (little endian, the only writers).
TEST(ChunkByteOrder, AChunkOfTheOtherByteOrderIsRefusedByName) {
  testing::temp_dir dir;
  std::vector<float> v(16);
  std::iota(v.begin(), v.end(), 1.0f);
  const chunk_key key = key_of(v.data(), v.size() * sizeof(float));
  const fs::path path = chunk_file::path_of(dir.str(), key);
  fs::create_directories(path.parent_path());
  const auto write_with = [&](std::vector<unsigned char> header) {
    std::vector<char> bytes(header.begin(), header.end());
    const char* raw = reinterpret_cast<const char*>(v.data());
    bytes.insert(bytes.end(), raw, raw + v.size() * sizeof(float));
    testing::write_bytes(path, bytes);
  };
  const uint16_t other = chunk_file::native_byte_order() == chunk_file::little_endian_tag
                             ? chunk_file::big_endian_tag
                             : chunk_file::little_endian_tag;
  write_with(chunk_file::header_for(key, v.size() * sizeof(float), other));
  testing::expect_error([&] { (void)chunk_file::read(dir.str(), key, 16, "w"); },
                        error_kind::wrong_endianness, "-endian byte order");
  auto unknown = chunk_file::header_for(key, v.size() * sizeof(float));
  le::put(unknown.data() + 14, 7, 2);
  write_with(unknown);
  testing::expect_error([&] { (void)chunk_file::read(dir.str(), key, 16, "w"); },
                        error_kind::corrupt, "byte order 7");
  write_with(chunk_file::header_for(key, v.size() * sizeof(float)));
  EXPECT_EQ(chunk_file::read(dir.str(), key, 16, "w"), v);
  if constexpr (std::endian::native == std::endian::little) {
    auto legacy = chunk_file::header_for(key, v.size() * sizeof(float));
    le::put(legacy.data() + 8, 1, 4);   // format 1
    le::put(legacy.data() + 12, 0, 4);  // its u32 encoding, no byte order
    write_with(legacy);
    EXPECT_EQ(chunk_file::read(dir.str(), key, 16, "w"), v);
  }
}

// --verify-checkpoints after-write: a chunk that reads back other than it was written fails
// the write (the checkpoint is then not committed) and is moved aside.
TEST(ReadBack, AChunkThatReadsBackDifferentlyFailsTheWrite) {
  testing::temp_dir dir;
  one_tensor t(1000);
  fs_writer_options verify;
  verify.verify_after_write = true;
  const snapshot s = t.at(1, 9.0f);
  EXPECT_NO_THROW((void)make_fs_shard_writer(dir.str(), 4096, {}, verify)->write(s));
  // The observer runs once the chunks are staged under temporary names and before they are
  // flushed and named: damaging them there is a disk that returns other bytes.
  testing::temp_dir bad;
  const chunk_observer damage = [&](int, int64_t, const chunk_key& key, std::span<const float>) {
    const fs::path folder = chunk_file::path_of(bad.str(), key).parent_path();
    for (const auto& f : fs::directory_iterator(folder))
      if (f.path().filename().string().find(".tmp.") != std::string::npos)
        flip_payload_byte(f.path());
  };
  testing::expect_error(
      [&] { (void)make_fs_shard_writer(bad.str(), 4096, damage, verify)->write(s); },
      error_kind::corrupt, "reads back differently");
  EXPECT_EQ(entries_in(run_paths::damaged_objects(bad.str())), 1u);
}

}  // namespace
}  // namespace troupe::ckpt
