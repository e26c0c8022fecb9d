// The pieces of format 2 on their own: box arithmetic, chunk files and their verification,
// manifest rules, and the asynchronous snapshot (a snapshot is the state at its step even
// while training goes on changing the buffers it was copied from).

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include "checkpoint/async_checkpointer.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/chunk_file.hpp"
#include "checkpoint/durable_io.hpp"
#include "checkpoint/manifest.hpp"
#include "tests/checkpoint/test_support.hpp"

namespace troupe::ckpt {
namespace {

namespace fs = std::filesystem;

TEST(Boxes, SubBoxesCoverARowMajorRangeExactly) {
  const box b{2, 3, 4, 5};  // 20 elements
  for (size_t first = 0; first < 20; ++first) {
    for (size_t count = 0; first + count <= 20; ++count) {
      size_t total = 0;
      size_t expected_at = first;
      for (const box& s : sub_boxes(b, first, count)) {
        // Each sub-box starts where the previous one ended, in row-major order.
        const size_t at = static_cast<size_t>((s.row - b.row) * b.cols + (s.col - b.col));
        EXPECT_EQ(at, expected_at);
        EXPECT_TRUE(s.cols == b.cols || s.rows == 1);
        total += s.numel();
        expected_at += s.numel();
      }
      EXPECT_EQ(total, count);
    }
  }
}

TEST(Boxes, IntersectAndRestrict) {
  EXPECT_EQ(intersect({0, 0, 4, 4}, {2, 3, 4, 4}), (box{2, 3, 2, 1}));
  EXPECT_FALSE(intersect({0, 0, 2, 2}, {2, 0, 2, 2}));
  // A ZeRO shard [5, 13) of two tensors laid out one after the other.
  const std::vector<placed_piece> params = {{"a", {0, 0, 2, 4}, 0, 2, 1, true},
                                            {"b", {0, 0, 1, 6}, 8, 2, 1, true}};
  const auto moments = restrict_to(params, 5, 8);
  size_t n = 0;
  for (const auto& p : moments) {
    EXPECT_EQ(p.local_offset, n);
    n += p.where.numel();
  }
  EXPECT_EQ(n, 8u);
  EXPECT_EQ(moments.front().tensor, "a");
  EXPECT_EQ(moments.back().tensor, "b");
}

TEST(Chunks, KeysNameContentAndDamageIsCaught) {
  testing::temp_dir dir;
  auto writer = make_fs_shard_writer(dir.str(), 64);  // 16 floats per chunk
  snapshot s;
  std::vector<float> a(40), b(40);
  std::iota(a.begin(), a.end(), 0.0f);
  b = a;
  state_map map;
  map.arrays[0] = {{"t", {0, 0, 4, 10}, 0, 1, 0, true}};
  const std::span<const float> bufs[] = {a, {}, {}};
  capture(map, bufs, s);
  shard_report first = writer->write(s);
  ASSERT_EQ(first.pieces.size(), 1u);
  EXPECT_EQ(first.pieces[0].chunks.size(), 3u);  // 16 + 16 + 8
  EXPECT_EQ(first.chunks_written, 3u);
  // The same content again: nothing new is written.
  shard_report again = writer->write(s);
  EXPECT_EQ(again.chunks_written, 0u);
  EXPECT_EQ(again.chunks_deduplicated, 3u);
  EXPECT_EQ(again.pieces, first.pieces);
  // Read back, verified; then damaged in three ways, each reported with the context.
  const chunk_key k = first.pieces[0].chunks[1];
  const auto back = chunk_file::read(dir.str(), k, 16, "t");
  EXPECT_EQ(back[0], 16.0f);
  const fs::path p = chunk_file::path_of(dir.str(), k);
  auto bytes = testing::read_bytes(p);
  bytes[chunk_file::header_bytes + 3] ^= 1;
  testing::write_bytes(p, bytes);
  testing::expect_error([&] { chunk_file::read(dir.str(), k, 16, "tensor t"); },
                        error_kind::corrupt, "tensor t");
  testing::expect_error([&] { chunk_file::read(dir.str(), k, 15, "t"); }, error_kind::corrupt,
                        "promises");
  bytes.resize(bytes.size() - 5);
  testing::write_bytes(p, bytes);
  testing::expect_error([&] { chunk_file::read(dir.str(), k, 16, "t"); }, error_kind::truncated,
                        "truncated");
  fs::remove(p);
  testing::expect_error([&] { chunk_file::read(dir.str(), k, 16, "held by t"); },
                        error_kind::missing, "held by t");
}

manifest tiny_manifest() {
  manifest m;
  m.step = 3;
  m.world = 2;
  m.global_numel = 12;
  m.chunk_floats = 4;
  m.tensors = {{"w", {3, 4}, 0}};
  const chunk_key k{1, 2};
  for (int a = 0; a < 3; ++a) {
    m.pieces.push_back({0, a, "w", {0, 0, 2, 4}, {k, k}});
    m.pieces.push_back({1, a, "w", {2, 0, 1, 4}, {k}});
  }
  return m;
}

TEST(ManifestV2, RoundTripsAndRefusesPiecesThatDoNotTile) {
  const manifest m = tiny_manifest();
  EXPECT_EQ(manifest_json::from_json(manifest_json::to_json(m), "m"), m);
  manifest gap = m;
  gap.pieces[1].where = {2, 0, 1, 3};
  gap.pieces[1].chunks = {chunk_key{1, 2}};
  testing::expect_error([&] { manifest_json::validate(gap, "m", error_kind::corrupt); },
                        error_kind::corrupt, "cover 11 of its 12");
  manifest overlap = m;
  overlap.pieces[1].where = {1, 0, 2, 4};
  overlap.pieces[1].chunks = {chunk_key{1, 2}, chunk_key{1, 2}};
  testing::expect_error([&] { manifest_json::validate(overlap, "m", error_kind::corrupt); },
                        error_kind::corrupt, "overlap");
  manifest outside = m;
  outside.pieces[1].where = {2, 1, 1, 4};
  testing::expect_error([&] { manifest_json::validate(outside, "m", error_kind::corrupt); },
                        error_kind::corrupt, "outside");
  manifest chunks = m;
  chunks.pieces[0].chunks.pop_back();
  testing::expect_error([&] { manifest_json::validate(chunks, "m", error_kind::corrupt); },
                        error_kind::corrupt, "needs 2");
}

TEST(AsyncCheckpointer, ASnapshotIsTheStateAtItsStepWhileTrainingChangesIt) {
  testing::temp_dir dir;
  std::vector<write_outcome> done;
  std::mutex mu;
  std::vector<float> params(1 << 16), m(1 << 16), v(1 << 16);
  std::iota(params.begin(), params.end(), 1.0f);
  std::fill(m.begin(), m.end(), 0.5f);
  std::fill(v.begin(), v.end(), 0.25f);
  const std::vector<float> at_step = params;
  state_map map;
  for (auto& a : map.arrays) a = {{"w", {0, 0, 256, 256}, 0, 1, 0, true}};
  {
    async_checkpointer ckpt(make_fs_shard_writer(dir.str(), 4096), overlap_policy::wait,
                            [&](write_outcome o) {
                              std::lock_guard lock(mu);
                              done.push_back(std::move(o));
                            });
    const std::span<const float> bufs[] = {params, m, v};
    EXPECT_EQ(ckpt.buffer_bytes(), 0u);
    ckpt.prepare(map, bufs);  // sized (and touched) before the first snapshot
    EXPECT_EQ(ckpt.buffer_bytes(), 3 * params.size() * sizeof(float));
    const snapshot_outcome taken = ckpt.take(map, bufs, {0, 1, 1, 7, 7});
    EXPECT_TRUE(taken.taken);
    // Training goes on at once: the buffers change while the write is in flight.
    for (float& x : params) x = -x;
    ckpt.wait_idle();
    EXPECT_EQ(ckpt.buffer_bytes(), 3 * params.size() * sizeof(float));
  }
  ASSERT_EQ(done.size(), 1u);
  ASSERT_TRUE(done[0].report) << done[0].error;
  manifest man;
  man.step = 7;
  man.world = 1;
  man.global_numel = params.size();
  man.adam_t = 7;
  man.chunk_floats = 1024;
  man.config_json = "{}";
  man.tensors = {{"w", {256, 256}, 0}};
  man.pieces = done[0].report->pieces;
  commit_manifest(dir.str(), man);
  const full_state back = load_full_state(dir.str(), *latest_committed(dir.str()));
  EXPECT_TRUE(back.params == at_step) << "the snapshot holds the state of step 7";
  EXPECT_TRUE(back.exp_avg == m);
  EXPECT_EQ(back.adam_t, 7);
}

TEST(ManifestV2, TheWrittenTextCarriesTheSealThatNlohmannComputesForAnyString) {
  // The writer builds the text by hand; a reader recomputes the seal from nlohmann's compact
  // dump of what it parsed. Strings that need escaping must come out byte for byte alike.
  manifest m = tiny_manifest();
  m.layout = "dp2 \"quoted\" back\\slash";
  m.config_json = "{\"note\":\"tab\\there, caf\xc3\xa9, \x7f\"}\n\x01\x1f";
  m.tensors[0].name = "w\n\t\"\x02/\xe2\x82\xac";
  for (saved_piece& p : m.pieces) p.tensor = m.tensors[0].name;
  const std::string text = manifest_json::to_json(m);
  EXPECT_EQ(manifest_json::from_json(text, "m"), m);
  EXPECT_NE(text.find("\n\"pieces\":["), std::string::npos) << "a line per field, for people";
  // Damage anywhere in the text is caught by the seal or the parser.
  std::string edited = text;
  edited[edited.find("\"step\":3") + 7] = '4';
  testing::expect_error([&] { (void)manifest_json::from_json(edited, "m"); }, error_kind::corrupt,
                        "manifest_hash");
}

// Step 3 of one 128x256 tensor (parameters, m, v): 32 chunks of 4 KiB per array.
snapshot many_chunk_snapshot() {
  std::vector<float> params(1 << 15), m(1 << 15), v(1 << 15);
  std::iota(params.begin(), params.end(), 1.0f);
  std::iota(m.begin(), m.end(), -3.0f);
  std::iota(v.begin(), v.end(), 7.0f);
  state_map map;
  for (auto& a : map.arrays) a = {{"w", {0, 0, 128, 256}, 0, 1, 0, true}};
  const std::span<const float> bufs[] = {params, m, v};
  snapshot snap;
  capture(map, bufs, snap);
  snap.step = 3;
  return snap;
}

TEST(ShardWriter, AWriteLeavesEveryChunkUnderItsNameAndNoTemporaryFile) {
  testing::temp_dir dir;
  // Boxes of several chunks each (chunk 4 KiB = 1024 floats), so many files and folders.
  const snapshot snap = many_chunk_snapshot();
  const auto writer = make_fs_shard_writer(dir.str(), 4096);
  const shard_report r = writer->write(snap);
  std::set<fs::path> expected;
  for (const saved_piece& p : r.pieces)
    for (const chunk_key& k : p.chunks) expected.insert(chunk_file::path_of(dir.str(), k));
  std::set<fs::path> found;
  for (const auto& f : fs::recursive_directory_iterator(chunk_file::root(dir.str())))
    if (f.is_regular_file()) found.insert(f.path());
  EXPECT_EQ(found, expected) << "only the named chunks remain, no temporary file";
  EXPECT_EQ(r.chunks_written, expected.size());
  // The same content again costs no file at all.
  const shard_report again = writer->write(snap);
  EXPECT_EQ(again.bytes_written, 0u);
  EXPECT_EQ(again.chunks_deduplicated, expected.size());
}

// Every write shares its chunks with helper threads, however small the snapshot.
constexpr fs_writer_options always_shared{.share_from_bytes = 0, .max_helpers = 3};

TEST(ShardWriter, HelpersWriteWhatOneThreadWritesAndTellTheObserverInOrder) {
  // Two arrays hold the same floats, so the same chunk comes up twice in one snapshot, on
  // whichever threads: it must be written once and counted once as deduplicated.
  std::vector<float> params(1 << 15), m(1 << 15), v(1 << 15);
  std::iota(params.begin(), params.end(), 1.0f);
  std::iota(m.begin(), m.end(), 1.0f);
  std::iota(v.begin(), v.end(), 7.0f);
  state_map map;
  for (auto& a : map.arrays)
    a = {{"w", {0, 0, 128, 256}, 0, 1, 0, true}, {"b", {0, 0, 1, 40}, 128 * 256, 1, 0, true}};
  params.resize(128 * 256 + 40, 0.5f);
  m.resize(128 * 256 + 40, 0.5f);
  v.resize(128 * 256 + 40, 0.25f);
  const std::span<const float> bufs[] = {params, m, v};
  snapshot snap;
  capture(map, bufs, snap);
  snap.step = 3;
  using told = std::pair<chunk_key, size_t>;
  const auto write_in = [&](const testing::temp_dir& dir, fs_writer_options options,
                            std::vector<told>& observed) {
    const auto writer = make_fs_shard_writer(
        dir.str(), 4096,
        [&](int, int64_t, const chunk_key& k, std::span<const float> f) {
          observed.emplace_back(k, f.size());
        },
        options);
    return writer->write(snap);
  };
  testing::temp_dir one_dir, shared_dir;
  std::vector<told> one_told, shared_told;
  const shard_report one =
      write_in(one_dir, fs_writer_options{.share_from_bytes = SIZE_MAX}, one_told);
  const shard_report shared = write_in(shared_dir, always_shared, shared_told);
  EXPECT_EQ(shared.pieces, one.pieces);
  EXPECT_EQ(shared.chunks_written, one.chunks_written);
  EXPECT_EQ(shared.bytes_written, one.bytes_written);
  EXPECT_EQ(shared.chunks_deduplicated, one.chunks_deduplicated);
  EXPECT_EQ(shared.bytes_deduplicated, one.bytes_deduplicated);
  EXPECT_EQ(one.chunks_deduplicated, 32u) << "m's 32 chunks of w are params'";
  EXPECT_EQ(shared_told, one_told);
  const auto files = [](const testing::temp_dir& dir) {
    std::set<fs::path> out;
    for (const auto& f : fs::recursive_directory_iterator(chunk_file::root(dir.str())))
      if (f.is_regular_file()) out.insert(fs::relative(f.path(), dir.path()));
    return out;
  };
  EXPECT_EQ(files(shared_dir), files(one_dir)) << "the same chunk files, no temporary one";
  for (const saved_piece& p : shared.pieces)
    for (const chunk_key& k : p.chunks)
      EXPECT_NO_THROW((void)chunk_file::read_range(shared_dir.str(), k, 1, 1024, "test"));
}

TEST(ShardWriter, AChunkThatCannotBeWrittenFailsTheWriteAndLeavesNoTemporaryFile) {
  const snapshot snap = many_chunk_snapshot();
  testing::temp_dir dir;
  // Files may not grow past a chunk's header (as a full disk refuses them): every chunk's job
  // fails with EFBIG, on the writer's thread and its helpers alike. (A file where a folder
  // belongs no longer fails a write: it is moved aside, see untrusted_test.cpp.)
  struct rlimit before {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit tight = before;
  tight.rlim_cur = chunk_file::header_bytes + 16;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &tight), 0);
  const auto writer = make_fs_shard_writer(dir.str(), 4096, {}, always_shared);
  EXPECT_THROW((void)writer->write(snap), checkpoint_error);
  ::setrlimit(RLIMIT_FSIZE, &before);
  std::signal(SIGXFSZ, old_handler);
  for (const auto& f : fs::recursive_directory_iterator(chunk_file::root(dir.str())))
    EXPECT_FALSE(f.is_regular_file()) << f.path() << " left behind";
}

TEST(DurableIo, AFailedFileSystemFlushNamesThePath) {
  testing::temp_dir dir;
  const fs::path gone = dir.path() / "no-such-folder";
  try {
    io::sync_file_system(gone, "flushing the staged chunks");
    FAIL() << "expected a checkpoint_error";
  } catch (const checkpoint_error& e) {
    EXPECT_NE(std::string(e.what()).find(gone.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("flushing the staged chunks"), std::string::npos);
  }
}

TEST(AsyncCheckpointer, SkipPolicyNeverTouchesTheSnapshotBeingWritten) {
  testing::temp_dir dir;
  // A writer that holds the first write until told, so the second snapshot meets it.
  struct slow_writer final : shard_writer {
    std::unique_ptr<shard_writer> inner;
    std::atomic<bool> release{false};
    shard_report write(const snapshot& s) override {
      while (!release) std::this_thread::yield();
      return inner->write(s);
    }
    size_t chunk_floats() const override { return inner->chunk_floats(); }
  };
  auto w = std::make_unique<slow_writer>();
  w->inner = make_fs_shard_writer(dir.str(), 4096);
  slow_writer* handle = w.get();
  std::vector<shard_report> reports;
  std::vector<float> x(100, 1.0f);
  state_map map;
  map.arrays[0] = {{"x", {0, 0, 1, 100}, 0, 1, 0, true}};
  const std::span<const float> bufs[] = {x, {}, {}};
  {
    async_checkpointer ckpt(std::move(w), overlap_policy::skip,
                            [&](write_outcome o) { reports.push_back(*o.report); });
    EXPECT_TRUE(ckpt.take(map, bufs, {0, 1, 1, 1, 1}).taken);
    x.assign(100, 2.0f);
    EXPECT_FALSE(ckpt.take(map, bufs, {0, 1, 1, 2, 2}).taken) << "skipped, not queued";
    handle->release = true;
  }
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].step, 1);
  const auto back = chunk_file::read(dir.str(), reports[0].pieces[0].chunks[0], 100, "x");
  EXPECT_EQ(back[0], 1.0f) << "the in-flight snapshot was not overwritten by the skipped one";
}

// The chunk files on disk, by key.
std::set<chunk_key> chunks_on_disk(const std::string& run_dir) {
  std::set<chunk_key> out;
  for (const auto& f : fs::recursive_directory_iterator(chunk_file::root(run_dir)))
    if (auto key = chunk_key::from_hex(f.path().filename().string())) out.insert(*key);
  return out;
}

// What every committed manifest references: all that a collection may keep.
std::set<chunk_key> chunks_referenced(const std::string& run_dir) {
  std::set<chunk_key> out;
  for (int64_t step : list_committed(run_dir))
    for (const saved_piece& p : read_manifest(run_dir, step).pieces)
      out.insert(p.chunks.begin(), p.chunks.end());
  return out;
}

// The manifest of a single-rank checkpoint of 1024-float chunks, as the coordinator makes it.
manifest one_rank_manifest(int64_t step, size_t numel, std::vector<tensor_entry> tensors,
                           const shard_report& r) {
  manifest man;
  man.step = step;
  man.world = 1;
  man.global_numel = numel;
  man.adam_t = step;
  man.chunk_floats = 1024;
  man.config_json = "{}";
  man.tensors = std::move(tensors);
  man.pieces = r.pieces;
  return man;
}

TEST(GarbageCollection, RememberedManifestsLeaveExactlyWhatAFullCollectionLeaves) {
  testing::temp_dir dir;
  auto writer = make_fs_shard_writer(dir.str(), 4096);
  // One frozen tensor (the same chunks at every step) and one that changes every step.
  std::vector<float> frozen(3000, 0.5f), moving(3000);
  state_map map;  // parameters and both moments alike
  for (auto& a : map.arrays)
    a = {{"frozen", {0, 0, 1, 3000}, 0, 1, 0, true}, {"moving", {0, 0, 1, 3000}, 3000, 1, 0, true}};
  std::vector<float> flat(6000);
  gc_memory memory;
  memory.sweep_every = 3;
  const retention_policy keep_two{2, 0};
  for (int64_t step = 1; step <= 7; ++step) {
    std::iota(moving.begin(), moving.end(), static_cast<float>(step) * 1e4f);
    std::copy(frozen.begin(), frozen.end(), flat.begin());
    std::copy(moving.begin(), moving.end(), flat.begin() + 3000);
    const std::span<const float> bufs[] = {flat, flat, flat};
    snapshot snap;
    snap.step = step;
    capture(map, bufs, snap);
    const shard_report r = writer->write(snap);
    const manifest man =
        one_rank_manifest(step, 6000, {{"frozen", {3000}, 0}, {"moving", {3000}, 3000}}, r);
    commit_manifest(dir.str(), man);
    // Step 4's manifest is not remembered: the collection must read it from disk.
    if (step != 4) memory.remember(man);
    if (step == 5) {  // chunks a writer left behind when it died before its commit
      std::vector<float> orphan(1024, -1.0f);
      snapshot lost;
      lost.step = 99;
      const std::span<const float> orphan_bufs[] = {orphan, orphan, orphan};
      state_map orphan_map;
      for (auto& a : orphan_map.arrays) a = {{"orphan", {0, 0, 1, 1024}, 0, 1, 0, true}};
      capture(orphan_map, orphan_bufs, lost);
      (void)writer->write(lost);
    }
    const gc_result gc = collect_garbage(dir.str(), keep_two, std::chrono::seconds(0), memory);
    const std::set<chunk_key> referenced = chunks_referenced(dir.str());
    const std::set<chunk_key> on_disk = chunks_on_disk(dir.str());
    EXPECT_EQ(list_committed(dir.str()).size(), std::min<size_t>(step, 2)) << "step " << step;
    // Collections 1, 4 and 7 sweep (every third); the others remove the released chunks by
    // name, so the orphan, never referenced, stays from step 5 until the sweep of step 7.
    if (step == 5 || step == 6) {
      EXPECT_EQ(on_disk.size(), referenced.size() + 1) << "step " << step;
    } else {
      EXPECT_EQ(on_disk, referenced) << "step " << step;
    }
    for (const chunk_key& k : referenced) EXPECT_TRUE(on_disk.contains(k)) << "step " << step;
    if (step >= 3) {
      EXPECT_FALSE(gc.removed_steps.empty()) << "step " << step;
    }
    // Memory holds exactly the committed steps, no more.
    EXPECT_EQ(memory.references.size(), list_committed(dir.str()).size());
  }
  EXPECT_EQ(memory.collections, 7u);
}

// A collection keeps up to recycle_up_to of the chunk files it removes, and the next write
// overwrites them in place (same inodes: no page or block is freed and allocated again) with
// content that reads back verified, whatever size each file had before.
class RecycledChunks : public ::testing::TestWithParam<bool> {};

TEST_P(RecycledChunks, CollectedChunkFilesAreOverwrittenByTheNextWriteAndFreedOffline) {
  testing::temp_dir dir;
  // 1024 floats per chunk; with GetParam(), helper threads take recycled files too.
  auto writer =
      make_fs_shard_writer(dir.str(), 4096, {}, GetParam() ? always_shared : fs_writer_options{});
  state_map map;  // 3000 floats per array: chunks of 1024, 1024 and 952 floats
  for (auto& a : map.arrays) a = {{"w", {0, 0, 1, 3000}, 0, 1, 0, true}};
  std::vector<float> params(3000), m(3000), v(3000);
  const auto write_step = [&](int64_t step) {
    std::iota(params.begin(), params.end(), static_cast<float>(step) * 1e4f);
    std::iota(m.begin(), m.end(), static_cast<float>(step) * 1e4f + 0.25f);
    std::iota(v.begin(), v.end(), static_cast<float>(step) * 1e4f + 0.5f);
    const std::span<const float> bufs[] = {params, m, v};
    snapshot snap;
    snap.step = step;
    capture(map, bufs, snap);
    const shard_report r = writer->write(snap);
    const manifest man = one_rank_manifest(step, 3000, {{"w", {3000}, 0}}, r);
    commit_manifest(dir.str(), man);
    return std::make_pair(r, man);
  };
  const auto recycled = [&] {  // the recycled files' inodes
    std::set<ino_t> out;
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(chunk_file::recycled_root(dir.str()), ec)) {
      struct stat st {};
      if (::stat(f.path().c_str(), &st) == 0) out.insert(st.st_ino);
    }
    return out;
  };
  gc_memory memory;
  memory.sweep_every = 1000;  // after the first, collections remove released chunks by name
  const retention_policy keep_one{1, 0};
  memory.remember(write_step(1).second);
  (void)collect_garbage(dir.str(), keep_one, std::chrono::seconds(0), memory);  // the sweep
  memory.remember(write_step(2).second);
  memory.recycle_up_to = 4;
  const gc_result first = collect_garbage(dir.str(), keep_one, std::chrono::seconds(0), memory);
  EXPECT_EQ(first.removed_steps, std::vector<int64_t>{1});
  EXPECT_EQ(first.chunks_removed, 9u) << "3 arrays x 3 chunks of step 1";
  EXPECT_EQ(first.chunks_recycled, 4u);
  EXPECT_EQ(chunks_on_disk(dir.str()), chunks_referenced(dir.str()));
  const std::set<ino_t> kept = recycled();
  ASSERT_EQ(kept.size(), 4u);

  const auto [third, third_manifest] = write_step(3);
  EXPECT_EQ(third.chunks_written, 9u);
  EXPECT_TRUE(recycled().empty()) << "the write took every recycled file";
  std::set<ino_t> written;
  for (const saved_piece& p : third.pieces)
    for (const chunk_key& k : p.chunks) {
      struct stat st {};
      ASSERT_EQ(::stat(chunk_file::path_of(dir.str(), k).c_str(), &st), 0);
      written.insert(st.st_ino);
    }
  for (ino_t ino : kept) EXPECT_TRUE(written.contains(ino)) << "inode " << ino << " reused";
  EXPECT_TRUE(verify_checkpoint(dir.str(), 3).empty()) << "every overwritten chunk verifies";

  memory.remember(third_manifest);
  memory.recycle_up_to = 9;
  const gc_result second = collect_garbage(dir.str(), keep_one, std::chrono::seconds(0), memory);
  EXPECT_EQ(second.chunks_recycled, 9u);
  EXPECT_EQ(second.bytes_freed, 0u) << "nothing deleted while it may be recycled";
  EXPECT_EQ(recycled().size(), 9u);
  // An offline collection (no memory, nothing recycled) deletes the recycled files too.
  const gc_result offline = collect_garbage(dir.str(), keep_one, std::chrono::seconds(0));
  EXPECT_TRUE(recycled().empty());
  EXPECT_GE(offline.bytes_freed, 9u * 3808u);
  EXPECT_TRUE(verify_checkpoint(dir.str(), 3).empty());
}

INSTANTIATE_TEST_SUITE_P(GarbageCollection, RecycledChunks, ::testing::Bool(),
                         [](const auto& test) { return test.param ? "Shared" : "OneThread"; });

}  // namespace
}  // namespace troupe::ckpt
