// The manifest of a job with tens of thousands of ranks: every data-parallel rank writes its
// balanced share of every tensor, so a tensor is cut into one piece per rank (two where a
// share crosses a row). The tiling check compared every pair of pieces and refused more than
// 4,096 per tensor, so such a job could not commit a checkpoint; these tests fail on that code
// (refused, or minutes of pairwise checks against the ctest timeout).

#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/manifest.hpp"
#include "tests/checkpoint/test_support.hpp"

namespace troupe::ckpt {
namespace {

// A [rows, cols] tensor cut into `world` balanced shares in every array, as the ranks of a
// data-parallel job write it (state_map.hpp: each replica writes its part of the box).
manifest sharded_manifest(int64_t rows, int64_t cols, int world) {
  manifest m;
  m.step = 7;
  m.world = world;
  m.global_numel = static_cast<uint64_t>(rows * cols);
  m.chunk_floats = 1024;
  m.tensors = {{"w", {rows, cols}, 0}};
  const box whole{0, 0, rows, cols};
  const size_t n = whole.numel();
  for (int a = 0; a < 3; ++a)
    for (int r = 0; r < world; ++r) {
      const size_t first = n * static_cast<size_t>(r) / static_cast<size_t>(world);
      const size_t last = n * static_cast<size_t>(r + 1) / static_cast<size_t>(world);
      if (last == first) continue;
      for (const box& b : sub_boxes(whole, first, last - first))
        m.pieces.push_back({r, a, "w", b, {chunk_key{static_cast<uint64_t>(r), 1}}});
    }
  return m;
}

TEST(ManifestScale, ValidatesTheSharesOfAHundredThousandRanksInSeconds) {
  // 210,000 elements over 70,001 ranks: shares of two or three elements, many crossing a row.
  const manifest m = sharded_manifest(300, 700, 70'001);
  ASSERT_GT(m.pieces.size(), 3u * 70'001u);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NO_THROW(manifest_json::validate(m, "m", error_kind::corrupt));
  // Round trip through the file format too: the reader applies the same bounds.
  EXPECT_EQ(manifest_json::from_json(manifest_json::to_json(m), "m").pieces.size(),
            m.pieces.size());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("validated and round-tripped %zu pieces in %.2f s\n", m.pieces.size(), seconds);

  // One piece moved a column left, deep in the middle: it overlaps its neighbour and leaves a
  // gap; the overlap is what is said (as the pairwise check said it).
  manifest shifted = m;
  for (saved_piece& p : shifted.pieces)
    if (p.array == 1 && p.rank == 35'000) {
      ASSERT_GT(p.where.col, 0);
      p.where.col -= 1;
      break;
    }
  testing::expect_error([&] { manifest_json::validate(shifted, "m", error_kind::corrupt); },
                        error_kind::corrupt, "two pieces of the exp_avg of w overlap");
  // One share missing: a gap, said with its size.
  manifest gap = m;
  for (size_t i = 0; i < gap.pieces.size(); ++i)
    if (gap.pieces[i].array == 2 && gap.pieces[i].rank == 123) {
      const size_t lost = gap.pieces[i].where.numel();
      gap.pieces.erase(gap.pieces.begin() + static_cast<std::ptrdiff_t>(i));
      testing::expect_error([&] { manifest_json::validate(gap, "m", error_kind::corrupt); },
                            error_kind::corrupt,
                            "cover " + std::to_string(210'000 - lost) + " of its 210000");
      break;
    }
  // Every share twice: covered twice over, and overlapping.
  manifest twice = sharded_manifest(300, 700, 20'000);
  const size_t half = twice.pieces.size();
  for (size_t i = 0; i < half; ++i) twice.pieces.push_back(twice.pieces[i]);
  testing::expect_error([&] { manifest_json::validate(twice, "m", error_kind::corrupt); },
                        error_kind::corrupt, "overlap");
}

// The sweep gives the pairwise check's verdict on every small arrangement: random boxes in a
// small tensor, some tilings, most not.
TEST(ManifestScale, TheSweepAgreesWithEveryPairCompared) {
  std::mt19937 rng(41);
  int tilings = 0, overlaps = 0, gaps = 0;
  for (int trial = 0; trial < 20'000; ++trial) {
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 5), cols = 1 + rng() % 6;
    manifest m;
    m.step = 1;
    m.world = 8;
    m.global_numel = static_cast<uint64_t>(rows * cols);
    m.chunk_floats = 64;
    m.tensors = {{"w", {rows, cols}, 0}};
    std::vector<box> boxes;
    if (trial % 3 == 0) {  // a true tiling: balanced shares of a random world
      const int world = 1 + static_cast<int>(rng() % 7);
      const size_t n = static_cast<size_t>(rows * cols);
      for (int r = 0; r < world; ++r) {
        const size_t first = n * r / world, last = n * (r + 1) / world;
        if (last > first)
          for (const box& b : sub_boxes({0, 0, rows, cols}, first, last - first))
            boxes.push_back(b);
      }
    } else {
      const int count = 1 + static_cast<int>(rng() % 6);
      for (int i = 0; i < count; ++i) {
        box b;
        b.row = static_cast<int64_t>(rng() % static_cast<uint32_t>(rows));
        b.col = static_cast<int64_t>(rng() % static_cast<uint32_t>(cols));
        b.rows = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(rows - b.row));
        b.cols = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(cols - b.col));
        boxes.push_back(b);
      }
    }
    bool overlap = false;
    size_t covered = 0;
    for (size_t i = 0; i < boxes.size(); ++i) {
      covered += boxes[i].numel();
      for (size_t j = i + 1; j < boxes.size(); ++j)
        overlap |= intersect(boxes[i], boxes[j]).has_value();
    }
    for (int a = 0; a < 3; ++a)
      for (const box& b : boxes) m.pieces.push_back({0, a, "w", b, {chunk_key{1, 1}}});
    const std::string expected = overlap                                       ? "overlap"
                                 : covered != static_cast<size_t>(rows * cols) ? "cover"
                                                                               : "";
    if (expected.empty()) {
      ++tilings;
      EXPECT_NO_THROW(manifest_json::validate(m, "m", error_kind::corrupt)) << "trial " << trial;
    } else {
      (overlap ? overlaps : gaps) += 1;
      testing::expect_error([&] { manifest_json::validate(m, "m", error_kind::corrupt); },
                            error_kind::corrupt, expected);
    }
  }
  EXPECT_GT(tilings, 1000);
  EXPECT_GT(overlaps, 1000);
  EXPECT_GT(gaps, 1000);
}

}  // namespace
}  // namespace troupe::ckpt
