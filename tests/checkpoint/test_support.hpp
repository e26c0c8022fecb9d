#pragma once
// Shared fixtures of the checkpoint tests: a private temporary run directory and
// deterministic training states that are easy to compare.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"

namespace troupe::ckpt::testing {

/// A fresh directory under /tmp (mkdtemp), removed with everything in it at the end.
class temp_dir {
 public:
  temp_dir() {
    std::string pattern = "/tmp/troupe-ckpt-test-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  [[nodiscard]] std::string str() const { return path_.string(); }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// A full state whose every value encodes its index and array, so misplaced elements show.
inline full_state make_full(size_t n, int64_t step, uint64_t seed = 42) {
  full_state f;
  f.step = step;
  f.adam_t = step + 1;
  f.seed = seed;
  f.rng_state = 0x1234'5678'9ABC'DEF0ULL ^ static_cast<uint64_t>(step);
  f.params.resize(n);
  f.exp_avg.resize(n);
  f.exp_avg_sq.resize(n);
  for (size_t i = 0; i < n; ++i) {
    f.params[i] = static_cast<float>(i) * 0.5f + static_cast<float>(step);
    f.exp_avg[i] = -static_cast<float>(i) * 0.25f;
    f.exp_avg_sq[i] = static_cast<float>(i % 97) * 1e-3f + 1e-8f;
  }
  return f;
}

inline const std::string test_config =
    R"({"model":{"d_model":64,"n_layer":2},"steps":100,"world":2})";

/// Writes every rank's shard of `full` for `world` ranks and commits the manifest.
inline manifest write_checkpoint(const std::string& run_dir, const full_state& full, int world,
                                 bool commit = true) {
  manifest m;
  m.format_version = shard_format_version;  // the flat-shard format
  m.step = full.step;
  m.world = world;
  m.global_numel = full.params.size();
  m.seed = full.seed;
  m.config_json = test_config;
  for (int r = 0; r < world; ++r)
    m.shards.push_back(write_shard(run_dir, slice_state(full, r, world)));
  if (commit) commit_manifest(run_dir, m);
  return m;
}

inline std::filesystem::path step_path(const std::string& run_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return std::filesystem::path(run_dir) / "checkpoints" / name;
}

inline std::vector<char> read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::filesystem::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

/// Runs `fn`, expects a checkpoint_error of `kind` whose message names `needle`.
template <class Fn>
void expect_error(Fn&& fn, error_kind kind, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected a checkpoint_error mentioning " << needle;
  } catch (const checkpoint_error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message does not name " << needle << ": " << e.what();
  }
}

}  // namespace troupe::ckpt::testing
