// The byte corpus: splits, windows as a pure function of (seed, step, sample), and the
// errors a user sees for a bad corpus.

#include "runtime/data/dataset.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

namespace troupe {
namespace {

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 7 + i / 251) % 256);
  return v;
}

TEST(dataset, splits_the_tail_for_validation) {
  const byte_dataset d = byte_dataset::from_bytes(pattern(1000), 0.1);
  EXPECT_EQ(d.train_size(), 900u);
  EXPECT_EQ(d.val_size(), 100u);
}

TEST(dataset, windows_are_consecutive_bytes_with_shifted_targets) {
  const std::vector<uint8_t> bytes = pattern(1000);
  const byte_dataset d = byte_dataset::from_bytes(bytes, 0.1);
  const int T = 16, n = 5;
  std::vector<uint8_t> in(n * T), tg(n * T);
  d.fill_train(1, 3, 0, n, T, in.data(), tg.data());
  for (int s = 0; s < n; ++s) {
    const size_t off = d.train_offset(1, 3, s, T);
    EXPECT_LE(off + T + 1, d.train_size());
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(in[s * T + t], bytes[off + t]);
      EXPECT_EQ(tg[s * T + t], bytes[off + t + 1]);
    }
  }
  d.fill_val(1, 2, 0, n, T, in.data(), tg.data());
  for (int s = 0; s < n; ++s) {
    const size_t off = d.val_offset(1, 2, s, T);
    EXPECT_GE(off, d.train_size());
    EXPECT_LE(off + T + 1, d.train_size() + d.val_size());
    EXPECT_EQ(in[s * T], bytes[off]);
  }
}

// The property every parallel layout relies on: sample i of step s is the same window
// whichever rank asks for it and however the batch is cut.
TEST(dataset, samples_depend_only_on_seed_step_and_index) {
  const byte_dataset d = byte_dataset::from_bytes(pattern(100000), 0.05);
  const int T = 32, G = 16;
  std::vector<uint8_t> all_in(G * T), all_tg(G * T);
  d.fill_train(9, 41, 0, G, T, all_in.data(), all_tg.data());
  for (int world : {2, 4, 8}) {
    for (int rank = 0; rank < world; ++rank) {
      const int share = G / world;
      std::vector<uint8_t> in(share * T), tg(share * T);
      d.fill_train(9, 41, rank * share, share, T, in.data(), tg.data());
      EXPECT_TRUE(std::equal(in.begin(), in.end(), all_in.begin() + rank * share * T));
      EXPECT_TRUE(std::equal(tg.begin(), tg.end(), all_tg.begin() + rank * share * T));
    }
  }
  // Another step, seed or index gives another window.
  EXPECT_NE(d.train_offset(9, 41, 0, T), d.train_offset(9, 42, 0, T));
  EXPECT_NE(d.train_offset(9, 41, 0, T), d.train_offset(10, 41, 0, T));
  EXPECT_NE(d.train_offset(9, 41, 0, T), d.train_offset(9, 41, 1, T));
  // And the same arguments always give the same window (a second dataset object too).
  const byte_dataset again = byte_dataset::from_bytes(pattern(100000), 0.05);
  EXPECT_EQ(d.train_offset(9, 41, 3, T), again.train_offset(9, 41, 3, T));
}

TEST(dataset, offsets_cover_the_split) {
  const byte_dataset d = byte_dataset::from_bytes(pattern(200), 0.5);
  const int T = 8;
  size_t lo = 1000, hi = 0;
  for (int i = 0; i < 2000; ++i) {
    const size_t off = d.train_offset(1, i / 16, i % 16, T);
    lo = std::min(lo, off);
    hi = std::max(hi, off);
  }
  EXPECT_EQ(lo, 0u);
  EXPECT_EQ(hi, d.train_size() - T - 1);
}

TEST(dataset, open_reads_a_file_and_reports_bad_ones) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string path = (dir / "troupe_dataset_test.txt").string();
  {
    std::ofstream out(path, std::ios::binary);
    const std::vector<uint8_t> bytes = pattern(500);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  const byte_dataset d = byte_dataset::open(path, 0.2, 64);
  EXPECT_EQ(d.train_size(), 400u);
  EXPECT_EQ(d.val_size(), 100u);
  EXPECT_EQ(d.path(), path);

  try {
    byte_dataset::open(path, 0.2, 128);  // the validation split cannot hold 129 bytes
    FAIL() << "expected data_error";
  } catch (const data_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("too small"), std::string::npos);
  }
  std::vector<uint8_t> in(200), tg(200);
  EXPECT_THROW(d.fill_val(1, 0, 0, 1, 100, in.data(), tg.data()), data_error);
  std::remove(path.c_str());

  try {
    byte_dataset::open(path, 0.2);
    FAIL() << "expected data_error";
  } catch (const data_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("make_corpus"), std::string::npos);
  }
  EXPECT_THROW(byte_dataset::from_bytes(pattern(10), 1.0), data_error);
  EXPECT_THROW(byte_dataset::from_bytes({}, 0.1), data_error);
}

}  // namespace
}  // namespace troupe
