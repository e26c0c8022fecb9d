// The corpus: text and token files, splits, windows as a pure function of (seed, step,
// sample), and the errors a user sees for a bad corpus.

#include "runtime/data/dataset.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "runtime/data/token_sidecar.hpp"

namespace troupe {
namespace {

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 7 + i / 251) % 256);
  return v;
}

TEST(dataset, splits_the_tail_for_validation) {
  const token_dataset d = token_dataset::from_bytes(pattern(1000), 0.1);
  EXPECT_EQ(d.train_size(), 900u);
  EXPECT_EQ(d.val_size(), 100u);
}

TEST(dataset, windows_are_consecutive_bytes_with_shifted_targets) {
  const std::vector<uint8_t> bytes = pattern(1000);
  const token_dataset d = token_dataset::from_bytes(bytes, 0.1);
  const int T = 16, n = 5;
  std::vector<token_id> in(n * T), tg(n * T);
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
  const token_dataset d = token_dataset::from_bytes(pattern(100000), 0.05);
  const int T = 32, G = 16;
  std::vector<token_id> all_in(G * T), all_tg(G * T);
  d.fill_train(9, 41, 0, G, T, all_in.data(), all_tg.data());
  for (int world : {2, 4, 8}) {
    for (int rank = 0; rank < world; ++rank) {
      const int share = G / world;
      std::vector<token_id> in(share * T), tg(share * T);
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
  const token_dataset again = token_dataset::from_bytes(pattern(100000), 0.05);
  EXPECT_EQ(d.train_offset(9, 41, 3, T), again.train_offset(9, 41, 3, T));
}

TEST(dataset, offsets_cover_the_split) {
  const token_dataset d = token_dataset::from_bytes(pattern(200), 0.5);
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
  const token_dataset d = token_dataset::open(path, 0.2, 64);
  EXPECT_EQ(d.train_size(), 400u);
  EXPECT_EQ(d.val_size(), 100u);
  EXPECT_EQ(d.path(), path);

  try {
    token_dataset::open(path, 0.2, 128);  // the validation split cannot hold 129 bytes
    FAIL() << "expected data_error";
  } catch (const data_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("too small"), std::string::npos);
  }
  std::vector<token_id> in(200), tg(200);
  EXPECT_THROW(d.fill_val(1, 0, 0, 1, 100, in.data(), tg.data()), data_error);
  std::remove(path.c_str());

  try {
    token_dataset::open(path, 0.2);
    FAIL() << "expected data_error";
  } catch (const data_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("make_corpus"), std::string::npos);
  }
  EXPECT_THROW(token_dataset::from_bytes(pattern(10), 1.0), data_error);
  EXPECT_THROW(token_dataset::from_bytes({}, 0.1), data_error);
}

// A token file of `width` bytes per id with its sidecar; returns its path.
std::string write_token_file(const std::string& name, const std::vector<uint32_t>& ids, int width,
                             int64_t vocab, int64_t sidecar_tokens = -1) {
  auto path = (std::filesystem::temp_directory_path() / name).string();
  {
    std::ofstream out(path, std::ios::binary);
    for (uint32_t id : ids) out.write(reinterpret_cast<const char*>(&id), width);  // little-endian
  }
  token_sidecar meta;
  meta.dtype = width == 2 ? token_dtype::uint16 : token_dtype::uint32;
  meta.vocab_size = vocab;
  meta.tokens = sidecar_tokens >= 0 ? sidecar_tokens : static_cast<int64_t>(ids.size());
  write_token_sidecar(token_sidecar_path(path), meta);
  return path;
}

void remove_token_file(const std::string& path) {
  std::remove(path.c_str());
  std::remove(token_sidecar_path(path).c_str());
}

std::vector<uint32_t> ids_below(uint32_t vocab, size_t n) {
  std::vector<uint32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<uint32_t>((i * 2654435761u) % vocab);
  return ids;
}

// Both widths read back as the ids written, windows and all, and a text file with the same
// bytes samples the same offsets: the sampler counts tokens, whatever their width.
TEST(dataset, token_files_of_both_widths_read_back_their_ids) {
  for (const auto& [width, vocab] : {std::pair{2, 50000}, std::pair{4, 100000}}) {
    const auto ids = ids_below(static_cast<uint32_t>(vocab), 4000);
    const std::string path =
        write_token_file("troupe_tokens_" + std::to_string(width) + ".bin", ids, width, vocab);
    const corpus_file file = describe_corpus(path);
    EXPECT_TRUE(file.token_file);
    EXPECT_EQ(file.width, width);
    EXPECT_EQ(file.vocab, vocab);
    EXPECT_EQ(file.tokens, ids.size());
    const token_dataset d = token_dataset::open(path, 0.1, 32);
    EXPECT_EQ(d.vocab(), vocab);
    EXPECT_EQ(d.train_size(), 3600u);
    const int T = 32, n = 4;
    std::vector<token_id> in(n * T), tg(n * T);
    d.fill_train(5, 7, 0, n, T, in.data(), tg.data());
    const token_dataset text = token_dataset::from_bytes(pattern(4000), 0.1);
    for (int s = 0; s < n; ++s) {
      const size_t off = d.train_offset(5, 7, s, T);
      EXPECT_EQ(off, text.train_offset(5, 7, s, T));
      for (int t = 0; t < T; ++t) {
        EXPECT_EQ(in[s * T + t], ids[off + t]);
        EXPECT_EQ(tg[s * T + t], ids[off + t + 1]);
      }
    }
    remove_token_file(path);
  }
}

TEST(dataset, a_validation_file_holds_the_validation_windows) {
  const auto train_ids = ids_below(1000, 3000), val_ids = ids_below(999, 500);
  const std::string train = write_token_file("troupe_train.bin", train_ids, 2, 1000);
  const std::string val = write_token_file("troupe_val.bin", val_ids, 2, 1000);
  const token_dataset d = token_dataset::open(train, 0.2, 16, val);
  EXPECT_EQ(d.train_size(), 3000u);  // no share held out of the training file
  EXPECT_EQ(d.val_size(), 500u);
  std::vector<token_id> in(16), tg(16);
  d.fill_val(3, 1, 0, 1, 16, in.data(), tg.data());
  const size_t off = d.val_offset(3, 1, 0, 16);
  EXPECT_LE(off + 17, 500u);
  EXPECT_EQ(in[0], val_ids[off]);
  const std::string other = write_token_file("troupe_other.bin", val_ids, 2, 2000);
  EXPECT_THROW(token_dataset::open(train, 0.2, 16, other), data_error);
  for (const auto& p : {train, val, other}) remove_token_file(p);
}

// Each bad file is refused with a message naming it and what is wrong.
TEST(dataset, bad_token_files_are_refused_by_name) {
  auto refusal = [](const std::string& path) -> std::string {
    try {
      token_dataset::open(path, 0.1);
    } catch (const data_error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  const auto ids = ids_below(300, 1000);
  // Its size is not a multiple of the width: 1000 ids of 2 bytes, one byte more.
  std::string path = write_token_file("troupe_odd.bin", ids, 2, 300);
  { std::ofstream(path, std::ios::binary | std::ios::app).put('\0'); }
  std::string why = refusal(path);
  EXPECT_NE(why.find(path), std::string::npos) << why;
  EXPECT_NE(why.find("not a multiple of 2"), std::string::npos) << why;
  remove_token_file(path);
  // The sidecar counts other tokens than the file holds.
  path = write_token_file("troupe_count.bin", ids, 2, 300, 999);
  why = refusal(path);
  EXPECT_NE(why.find("its sidecar"), std::string::npos) << why;
  remove_token_file(path);
  // Empty.
  path = write_token_file("troupe_empty.bin", {}, 2, 300);
  why = refusal(path);
  EXPECT_NE(why.find("empty"), std::string::npos) << why;
  remove_token_file(path);
  // Not a regular file.
  why = refusal(std::filesystem::temp_directory_path().string());
  EXPECT_NE(why.find("not a regular file"), std::string::npos) << why;
  // An id at or above the vocabulary: refused when a window reads it.
  auto high = ids;
  for (auto& id : high) id = 299;
  high[500] = 300;
  path = write_token_file("troupe_high.bin", high, 2, 300);
  const token_dataset d = token_dataset::open(path, 0.1);
  std::vector<token_id> out(1000);
  try {
    d.read(0, 900, out.data());
    FAIL() << "an id of 300 was read under a vocabulary of 300";
  } catch (const data_error& e) {
    why = e.what();
  }
  EXPECT_NE(why.find("token 500 is 300"), std::string::npos) << why;
  EXPECT_NE(why.find(path), std::string::npos) << why;
  remove_token_file(path);
}

}  // namespace
}  // namespace troupe
