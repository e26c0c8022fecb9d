#pragma once
// Internal to `troupe ckpt` (cli/ckpt_tool.cpp, cli/ckpt_views.cpp): what its subcommands
// share. Everything goes through the public checkpoint API; what that lacks (sizes on disk,
// chunk sets) is computed here from the manifests and the files.

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.hpp"

namespace troupe::cli::ckpt_tool {

/// A failure that is not bad usage: printed as "troupe ckpt: ...", exit 1.
class tool_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The step LATEST names; nullopt when there is none. Throws checkpoint_error when damaged.
std::optional<int64_t> latest_step(const std::string& run_dir);
/// The same, nullopt when LATEST is damaged too.
std::optional<int64_t> latest_step_or_none(const std::string& run_dir);
/// Throws tool_error unless `run_dir` is a directory with a checkpoints directory.
void require_checkpoints(const std::string& run_dir);

/// "512 B", "1.4 MiB".
std::string human(uint64_t bytes);

/// Format 2 and later: pieces in content-addressed chunks.
bool chunked(const ckpt::manifest& m);
std::set<ckpt::chunk_key> distinct_chunks(const ckpt::manifest& m);
/// Format 1: the recorded sizes of its shard files.
uint64_t shard_bytes(const ckpt::manifest& m);
/// manifest.layout (format 2) or "dp<world>" (format 1).
std::string layout_of(const ckpt::manifest& m);

/// Sizes of chunk files on disk (0 for a missing one), each looked up once.
class chunk_sizes {
 public:
  explicit chunk_sizes(std::string run_dir) : run_dir_(std::move(run_dir)) {}
  uint64_t of(const ckpt::chunk_key& key);
  uint64_t total(const std::set<ckpt::chunk_key>& keys);

 private:
  std::string run_dir_;
  std::map<ckpt::chunk_key, uint64_t> sizes_;
};

using row = std::vector<std::string>;
/// Left-aligned columns two spaces apart, trailing blanks trimmed, on stdout.
void print_table(const std::vector<row>& rows, const std::string& indent = "");

/// `troupe ckpt inspect`: step = nullopt for the one LATEST names.
int inspect(const std::string& run_dir, std::optional<int64_t> step);
/// `troupe ckpt hash`: step = nullopt for the one LATEST names.
int hash(const std::string& run_dir, std::optional<int64_t> step);
/// `troupe ckpt diff`: steps = nullopt for the two newest committed ones.
int diff(const std::string& run_dir, std::optional<std::pair<int64_t, int64_t>> steps);

}  // namespace troupe::cli::ckpt_tool
