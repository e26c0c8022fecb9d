// Round trips: what W ranks write, any world size reads back exactly.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.hpp"
#include "test_support.hpp"

namespace troupe::ckpt {
namespace {

using nlohmann::json;
using testing::make_full;
using testing::temp_dir;
using testing::write_checkpoint;

void expect_same(const full_state& a, const full_state& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.adam_t, b.adam_t);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.rng_state, b.rng_state);
  EXPECT_EQ(a.params, b.params);  // bit-exact: nothing is converted on the way
  EXPECT_EQ(a.exp_avg, b.exp_avg);
  EXPECT_EQ(a.exp_avg_sq, b.exp_avg_sq);
}

void expect_same(const shard_state& a, const shard_state& b) {
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.world, b.world);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.adam_t, b.adam_t);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.global_numel, b.global_numel);
  EXPECT_EQ(a.range, b.range);
  EXPECT_EQ(a.params, b.params);
  EXPECT_EQ(a.exp_avg, b.exp_avg);
  EXPECT_EQ(a.exp_avg_sq, b.exp_avg_sq);
}

TEST(OwnedRange, BalancedSplitFirstRanksTakeTheRemainder) {
  EXPECT_EQ(owned_range(10, 0, 3), (shard_range{0, 4}));
  EXPECT_EQ(owned_range(10, 1, 3), (shard_range{4, 3}));
  EXPECT_EQ(owned_range(10, 2, 3), (shard_range{7, 3}));
  EXPECT_EQ(owned_range(2, 3, 4), (shard_range{2, 0}));  // more ranks than elements
  for (size_t n : {0UL, 1UL, 7UL, 1000UL, 1001UL}) {
    for (int w = 1; w <= 9; ++w) {
      size_t next = 0;
      for (int r = 0; r < w; ++r) {
        const shard_range s = owned_range(n, r, w);
        EXPECT_EQ(s.offset, next);
        EXPECT_LE(s.count, n / static_cast<size_t>(w) + 1);
        EXPECT_GE(s.count, n / static_cast<size_t>(w));
        next += s.count;
      }
      EXPECT_EQ(next, n);
    }
  }
  EXPECT_THROW(owned_range(10, 3, 3), checkpoint_error);
  EXPECT_THROW(owned_range(10, 0, 0), checkpoint_error);
}

class round_trip_by_world : public ::testing::TestWithParam<int> {};

TEST_P(round_trip_by_world, EveryWorldReadsWhatThisWorldWrote) {
  const int world = GetParam();
  temp_dir dir;
  const full_state full = make_full(1003, 10);
  const manifest written = write_checkpoint(dir.str(), full, world);

  const std::optional<manifest> latest = latest_committed(dir.str());
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, written);

  full_state back = load_full_state(dir.str(), *latest);
  expect_same(back, full);
  ASSERT_EQ(back.rank_rng_states.size(), static_cast<size_t>(world));
}

INSTANTIATE_TEST_SUITE_P(worlds, round_trip_by_world, ::testing::Values(1, 2, 3));

TEST(Reshard, WrittenByFourReslicedForThree) {
  temp_dir dir;
  const full_state full = make_full(4099, 7);
  write_checkpoint(dir.str(), full, 4);
  const manifest m = *latest_committed(dir.str());
  const full_state back = load_full_state(dir.str(), m);
  for (int r = 0; r < 3; ++r) {
    const shard_state from_full = slice_state(back, r, 3);
    expect_same(from_full, slice_state(full, r, 3));
  }
  // The re-sliced shards are themselves a valid checkpoint of a world of 3.
  full_state later = back;
  later.step = 8;
  write_checkpoint(dir.str(), later, 3);
  expect_same(load_full_state(dir.str(), *latest_committed(dir.str())), later);
}

TEST(RoundTrip, MoreRanksThanElementsAndEmptyState) {
  temp_dir dir;
  const full_state tiny = make_full(3, 1);
  write_checkpoint(dir.str(), tiny, 5);  // ranks 3 and 4 own nothing
  const manifest m = *latest_committed(dir.str());
  expect_same(load_full_state(dir.str(), m), tiny);

  const full_state none = make_full(0, 2);
  write_checkpoint(dir.str(), none, 2);
  expect_same(load_full_state(dir.str(), *latest_committed(dir.str())), none);
}

TEST(RoundTrip, RankRngStatesAreKeptPerRank) {
  temp_dir dir;
  const full_state full = make_full(100, 3);
  manifest m;
  m.format_version = shard_format_version;  // the flat-shard format
  m.step = 3;
  m.world = 2;
  m.global_numel = 100;
  m.seed = full.seed;
  for (int r = 0; r < 2; ++r) {
    shard_state s = slice_state(full, r, 2);
    s.rng_state = 1000 + static_cast<uint64_t>(r);
    m.shards.push_back(write_shard(dir.str(), s));
  }
  commit_manifest(dir.str(), m);
  const full_state back = load_full_state(dir.str(), m);
  EXPECT_EQ(back.rng_state, 1000U);
  EXPECT_EQ(back.rank_rng_states, (std::vector<uint64_t>{1000, 1001}));
}

TEST(Manifest, IsReadableJsonWithTensorTableAndConfig) {
  temp_dir dir;
  const full_state full = make_full(30, 10);
  manifest m;
  m.format_version = shard_format_version;  // the flat-shard format
  m.step = 10;
  m.world = 2;
  m.global_numel = 30;
  m.seed = full.seed;
  m.config_json = testing::test_config;
  m.tensors = {{"wte", {4, 5}, 0}, {"bias", {10}, 20}};
  for (int r = 0; r < 2; ++r) m.shards.push_back(write_shard(dir.str(), slice_state(full, r, 2)));
  commit_manifest(dir.str(), m);

  const auto text = testing::read_bytes(testing::step_path(dir.str(), 10) / "manifest.json");
  const auto doc = nlohmann::json::parse(text.begin(), text.end());
  EXPECT_EQ(doc["kind"], "troupe-checkpoint-manifest");
  EXPECT_EQ(doc["format_version"], shard_format_version);
  EXPECT_EQ(doc["hash_algorithm"], "trp64");
  EXPECT_EQ(doc["shards"][1]["file"], "shard-00001.bin");
  EXPECT_EQ(doc["tensors"][0]["shape"], nlohmann::json::array({4, 5}));
  EXPECT_EQ(doc["config_json"], testing::test_config);
  EXPECT_EQ(*latest_committed(dir.str()), m);
  EXPECT_EQ(read_manifest(dir.str(), 10), m);
}

TEST(Manifest, TensorTableMustFitTheLayout) {
  temp_dir dir;
  manifest m = write_checkpoint(dir.str(), make_full(30, 10), 2, /*commit=*/false);
  m.tensors = {{"a", {4, 5}, 0}, {"b", {20}, 15}};  // overlaps a, runs past the end
  testing::expect_error([&] { commit_manifest(dir.str(), m); }, error_kind::invalid_argument,
                        "tensor");
  EXPECT_FALSE(latest_committed(dir.str()).has_value());
}

TEST(Compatibility, SameConfigPassesInAnyKeyOrder) {
  manifest m;
  m.format_version = shard_format_version;  // the flat-shard format
  m.global_numel = 10;
  m.config_json = testing::test_config;
  EXPECT_NO_THROW(require_compatible(
      m, json::parse(R"({"world": 2, "steps": 100, "model": {"n_layer": 2, "d_model": 64}})"), 10));
}

TEST(Compatibility, DifferentRunIsRefusedNamingTheKey) {
  manifest m;
  m.format_version = shard_format_version;  // the flat-shard format
  m.step = 5;
  m.global_numel = 10;
  m.config_json = testing::test_config;
  testing::expect_error(
      [&] {
        require_compatible(
            m, json::parse(R"({"model":{"d_model":128,"n_layer":2},"steps":100,"world":2})"), 10);
      },
      error_kind::incompatible, "/model/d_model was 64, now 128");
  testing::expect_error([&] { require_compatible(m, json::parse(testing::test_config), 11); },
                        error_kind::incompatible, "11");
  // An elastic restart changes the world and a longer schedule the steps, on purpose.
  const std::vector<std::string> ignored = {"/world", "/steps"};
  EXPECT_NO_THROW(require_compatible(
      m, json::parse(R"({"model":{"d_model":64,"n_layer":2},"steps":500,"world":3})"), 10,
      ignored));
}

}  // namespace
}  // namespace troupe::ckpt
