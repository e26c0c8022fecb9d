// `troupe ckpt`: offline tools for a run directory's checkpoints (ls, inspect, verify,
// diff, gc). This file parses the command line and runs ls, verify and gc; inspect and diff
// are in ckpt_views.cpp.

#include "cli/ckpt_tool.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/format.hpp"
#include "cli/ckpt_common.hpp"
#include "cli/ckpt_export.hpp"
#include "cli/options.hpp"
#include "runtime/sys/printable.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::cli {
namespace ckpt_tool {

namespace fs = std::filesystem;
using ckpt::chunk_key;
using ckpt::manifest;

// ---- the run directory -------------------------------------------------------------------

std::optional<int64_t> latest_step(const std::string& run_dir) {
  auto m = ckpt::latest_committed(run_dir);
  return m ? std::optional<int64_t>(m->step) : std::nullopt;
}

std::optional<int64_t> latest_step_or_none(const std::string& run_dir) {
  try {
    return latest_step(run_dir);
  } catch (const ckpt::checkpoint_error&) {
    return std::nullopt;
  }
}

void require_checkpoints(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec))
    throw tool_error(run_dir + " is not a directory; give a job's run directory (its --run-dir)");
  if (!fs::is_directory(run_paths::checkpoints(run_dir), ec))
    throw tool_error(
        run_dir + " has no checkpoints directory (" + run_paths::checkpoints(run_dir).string() +
        "): no job has checkpointed there; give a job's run directory (its --run-dir)");
}

// ---- sizes and chunk sets ----------------------------------------------------------------

std::string human(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = -1;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

bool chunked(const manifest& m) { return m.format_version >= 2; }

std::set<chunk_key> distinct_chunks(const manifest& m) {
  std::set<chunk_key> out;
  for (const auto& p : m.pieces) out.insert(p.chunks.begin(), p.chunks.end());
  return out;
}

uint64_t chunk_sizes::of(const chunk_key& key) {
  auto [it, fresh] = sizes_.try_emplace(key, 0);
  if (fresh) {
    std::error_code ec;
    const auto n = fs::file_size(ckpt::chunk_file::path_of(run_dir_, key), ec);
    it->second = ec ? 0 : n;
  }
  return it->second;
}

uint64_t chunk_sizes::total(const std::set<chunk_key>& keys) {
  uint64_t sum = 0;
  for (const auto& k : keys) sum += of(k);
  return sum;
}

uint64_t shard_bytes(const manifest& m) {
  uint64_t sum = 0;
  for (const auto& s : m.shards) sum += s.bytes;
  return sum;
}

std::string layout_of(const manifest& m) {
  if (chunked(m)) return m.layout.empty() ? "?" : m.layout;
  return "dp" + std::to_string(m.world);
}

// ---- output ------------------------------------------------------------------------------

void print_table(const std::vector<row>& rows, const std::string& indent) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    if (width.size() < r.size()) width.resize(r.size(), 0);
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  for (const auto& r : rows) {
    std::string line = indent;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line.append(width[i] + 2 - r[i].size(), ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::puts(line.c_str());
  }
}

}  // namespace ckpt_tool

namespace {

using namespace ckpt_tool;

// ---- arguments ---------------------------------------------------------------------------

struct parsed_args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;  ///< "--step" -> "12"
};

usage_error usage(const std::string& sub, const std::string& what) {
  return usage_error("troupe ckpt " + sub + ": " + what + "; see troupe ckpt " + sub + " --help");
}

/// Splits `args` into positional arguments and the options in `allowed` (each takes a value,
/// as "--opt V" or "--opt=V"). Anything else starting with '-' is a usage error.
parsed_args parse_args(const std::string& sub, const std::vector<std::string>& args,
                       const std::set<std::string>& allowed) {
  command_line cl("troupe ckpt " + sub);
  for (const auto& flag : allowed) cl.value(flag);
  cl.parse(args, args.size());
  parsed_args out;
  out.positional = cl.positional();
  for (const auto& [flag, value] : cl.given())
    if (flag != "--help") out.options[flag] = value;
  return out;
}

/// A non-negative integer; "step-00000012" is accepted for a step.
int64_t parse_number(const std::string& sub, const std::string& what, std::string text) {
  const std::string original = text;
  if (text.starts_with("step-")) text = text.substr(5);
  int64_t v = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < 0)
    throw usage(sub, what + " must be a non-negative integer, got '" + original + "'");
  return v;
}

std::optional<int64_t> number_option(const std::string& sub, const parsed_args& a,
                                     const std::string& flag) {
  auto it = a.options.find(flag);
  if (it == a.options.end()) return std::nullopt;
  return parse_number(sub, flag, it->second);
}

// ---- ls ----------------------------------------------------------------------------------

int cmd_ls(const std::string& run_dir) {
  int rc = 0;
  std::optional<int64_t> latest;
  try {
    latest = latest_step(run_dir);
  } catch (const ckpt::checkpoint_error& e) {
    std::fprintf(stderr, "troupe ckpt: LATEST is unusable: %s\n", e.what());
    rc = 1;
  }
  chunk_sizes sizes(run_dir);
  std::vector<row> rows = {{"step", "", "format", "layout", "adam_t", "chunks", "bytes", "new"}};
  std::vector<std::string> damaged;
  std::set<chunk_key> previous;
  const std::vector<int64_t> steps = ckpt::list_committed(run_dir);
  for (int64_t step : steps) {
    const std::string mark = latest == step ? "LATEST" : "";
    manifest m;
    try {
      m = ckpt::read_manifest(run_dir, step);
    } catch (const ckpt::checkpoint_error& e) {
      rows.push_back({std::to_string(step), mark, "damaged"});
      damaged.push_back(e.what());
      previous.clear();
      rc = 1;
      continue;
    }
    if (chunked(m)) {
      std::set<chunk_key> keys = distinct_chunks(m), added;
      std::set_difference(keys.begin(), keys.end(), previous.begin(), previous.end(),
                          std::inserter(added, added.end()));
      rows.push_back({std::to_string(step), mark, std::to_string(m.format_version), layout_of(m),
                      std::to_string(m.adam_t), std::to_string(keys.size()),
                      human(sizes.total(keys)), human(sizes.total(added))});
      previous = std::move(keys);
    } else {
      rows.push_back({std::to_string(step), mark, std::to_string(m.format_version), layout_of(m),
                      "-", "-", human(shard_bytes(m)), human(shard_bytes(m))});
      previous.clear();
    }
  }
  if (steps.empty())
    std::printf("no committed checkpoints in %s\n", run_paths::checkpoints(run_dir).c_str());
  else
    print_table(rows);
  for (const auto& d : damaged) std::printf("damaged manifest: %s\n", d.c_str());

  const fs::path root = ckpt::chunk_file::root(run_dir);
  uint64_t files = 0, bytes = 0;
  std::error_code ec;
  if (fs::is_directory(root, ec)) {
    for (auto it = fs::recursive_directory_iterator(root, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      std::error_code e2;
      if (!it->is_regular_file(e2)) continue;
      if (chunk_key::from_hex(it->path().filename().string())) ++files;
      bytes += it->file_size(e2);
    }
  }
  std::printf("chunk store: %llu chunks, %s on disk (%s)\n", static_cast<unsigned long long>(files),
              human(bytes).c_str(), root.c_str());
  uint64_t spare_files = 0, spare_bytes = 0;
  for (const auto& f : fs::directory_iterator(ckpt::chunk_file::recycled_root(run_dir), ec)) {
    std::error_code e2;
    ++spare_files;
    spare_bytes += f.file_size(e2);
  }
  if (spare_files > 0) {
    std::printf(
        "recycled: %llu files, %s (the next checkpoint overwrites them; `troupe ckpt gc` "
        "frees them)\n",
        static_cast<unsigned long long>(spare_files), human(spare_bytes).c_str());
  }
  const auto quarantined = ckpt::list_quarantined(run_dir);
  if (!quarantined.empty()) {
    std::printf("quarantined (%s; kept, never deleted):\n", run_paths::damaged(run_dir).c_str());
    std::vector<row> q = {{"step", "why", "where"}};
    for (const auto& c : quarantined)
      q.push_back({std::to_string(c.step), c.reason, sys::printable(c.path)});
    print_table(q, "  ");
  }
  size_t moved = 0;
  for (const auto& f : fs::directory_iterator(run_paths::damaged_objects(run_dir), ec)) {
    (void)f;
    ++moved;
  }
  if (moved > 0)
    std::printf("moved out of a write's way: %zu object%s in %s\n", moved, moved == 1 ? "" : "s",
                run_paths::damaged_objects(run_dir).c_str());
  return rc;
}

// ---- verify ------------------------------------------------------------------------------

int cmd_verify(const std::string& run_dir, std::optional<int64_t> only) {
  int rc = 0;
  const std::vector<int64_t> committed = ckpt::list_committed(run_dir);
  if (!only) {
    try {
      if (!latest_step(run_dir) && committed.size() == 1) {
        // What a job stopped between its first manifest and LATEST leaves: no checkpoint was
        // committed yet, and the one written is complete (its manifest comes last).
        std::printf(
            "LATEST: not written yet: %s holds the only manifest; the job stopped before "
            "committing it. It is checked below; --resume starts from it if it verifies.\n",
            ckpt::format::step_dir_name(committed.front()).c_str());
      } else if (!latest_step(run_dir) && !committed.empty()) {
        std::printf("LATEST: missing: %s does not exist although step directories hold manifests\n",
                    run_paths::latest(run_dir).c_str());
        rc = 1;
      }
    } catch (const ckpt::checkpoint_error& e) {
      std::printf("LATEST: damaged\n  %s\n", e.what());
      rc = 1;
    }
  }
  const std::vector<int64_t> steps = only ? std::vector<int64_t>{*only} : committed;
  if (steps.empty()) {
    std::printf("no committed checkpoints in %s: nothing to verify\n",
                run_paths::checkpoints(run_dir).c_str());
    return 1;
  }
  size_t bad = 0;
  for (int64_t step : steps) {
    const auto problems = ckpt::verify_checkpoint(run_dir, step);
    if (problems.empty()) {
      std::printf("step %lld: ok\n", static_cast<long long>(step));
      continue;
    }
    ++bad;
    std::printf("step %lld: %zu problem%s\n", static_cast<long long>(step), problems.size(),
                problems.size() == 1 ? "" : "s");
    for (const auto& p : problems) {
      if (p.path.empty() || p.message.find(p.path) != std::string::npos)
        std::printf("  %s\n", p.message.c_str());
      else
        std::printf("  %s: %s\n", p.path.c_str(), p.message.c_str());
    }
  }
  if (bad) rc = 1;
  std::printf("%zu checkpoint%s checked, %zu damaged%s\n", steps.size(),
              steps.size() == 1 ? "" : "s", bad, rc ? "" : ": all intact");
  return rc;
}

// ---- gc ----------------------------------------------------------------------------------

int cmd_gc(const std::string& run_dir, size_t keep_last, int64_t keep_every) {
  auto lock = ckpt::run_lock::try_acquire(run_dir);
  if (!lock)
    throw tool_error("a job holds " + run_dir + " (the lock " +
                     run_paths::run_lock(run_dir).string() +
                     "); gc would race its checkpoints. Run it when the job has ended");
  const std::optional<int64_t> latest = latest_step(run_dir);
  if (!latest) {
    std::printf("nothing to collect: %s has no LATEST (no committed checkpoint)\n",
                run_paths::checkpoints(run_dir).c_str());
    return 0;
  }
  if (keep_last > 0) {  // the policy must keep what LATEST names, or a resume would fail
    const auto steps = ckpt::list_committed(run_dir);
    const size_t newer =
        static_cast<size_t>(steps.end() - std::upper_bound(steps.begin(), steps.end(), *latest));
    if (newer >= keep_last && !(keep_every > 0 && *latest % keep_every == 0))
      throw tool_error("LATEST names step " + std::to_string(*latest) + " but " +
                       std::to_string(newer) + " newer checkpoint(s) exist, so --keep-last " +
                       std::to_string(keep_last) + " would remove it. Keep more or fix LATEST");
  }
  const ckpt::gc_result r =
      ckpt::collect_garbage(run_dir, {keep_last, keep_every}, std::chrono::seconds(0));
  std::string removed;
  for (int64_t s : r.removed_steps) removed += (removed.empty() ? "" : ", ") + std::to_string(s);
  std::printf("gc of %s\n", run_paths::checkpoints(run_dir).c_str());
  print_table(
      {{"steps removed", removed.empty() ? "none" : removed},
       {"chunks removed", std::to_string(r.chunks_removed)},
       {"chunks kept", std::to_string(r.chunks_kept)},
       {"bytes freed", human(r.bytes_freed) + " (" + std::to_string(r.bytes_freed) + " bytes)"},
       {"temp files removed", std::to_string(r.temp_files_removed)}},
      "  ");
  return 0;
}

// ---- scrub -------------------------------------------------------------------------------

// Entries of the chunk store and the recycled files that troupe did not put there.
std::vector<std::string> foreign_entries(const std::string& run_dir) {
  std::vector<std::string> out;
  const auto type_of = [](const fs::path& p) {
    std::error_code ec;
    return fs::symlink_status(p, ec).type();
  };
  const auto scan = [&](const fs::path& folder, bool chunk_names) {
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(folder, ec)) {
      const std::string name = f.path().filename().string();
      if (type_of(f.path()) != fs::file_type::regular)
        out.push_back(f.path().string() + " is not a regular file");
      else if (chunk_names && !chunk_key::from_hex(name) && name.find(".tmp.") == std::string::npos)
        out.push_back(f.path().string() + " is not a chunk");
    }
  };
  const fs::path root = ckpt::chunk_file::root(run_dir);
  std::error_code ec;
  for (const auto& folder : fs::directory_iterator(root, ec)) {
    if (type_of(folder.path()) == fs::file_type::directory)
      scan(folder.path(), true);
    else
      out.push_back(folder.path().string() + " is not a directory");
  }
  const fs::path recycled = ckpt::chunk_file::recycled_root(run_dir);
  const fs::file_type t = type_of(recycled);
  if (t == fs::file_type::directory)
    scan(recycled, false);
  else if (t != fs::file_type::not_found)
    out.push_back(recycled.string() + " is not a directory");
  return out;
}

int cmd_scrub(const std::string& run_dir) {
  auto lock = ckpt::run_lock::try_acquire(run_dir);
  if (!lock)
    throw tool_error("a job holds " + run_dir + " (the lock " +
                     run_paths::run_lock(run_dir).string() +
                     "); scrub would race its checkpoints. Run it when the job has ended");
  int rc = 0;
  const std::vector<int64_t> steps = ckpt::list_committed(run_dir);
  int64_t latest = -1;  // -1: none (plain integers: GCC 12 misreads optionals here)
  std::string latest_state;
  try {
    latest = ckpt::read_latest_step(run_dir).value_or(-1);
    if (latest >= 0 && !std::binary_search(steps.begin(), steps.end(), latest))
      latest_state = "names " + ckpt::format::step_dir_name(latest) + ", which holds no manifest";
    else if (latest < 0 && !steps.empty())
      latest_state = "missing although step directories hold manifests";
  } catch (const ckpt::checkpoint_error& e) {
    latest_state = std::string("unreadable: ") + e.what();
  }
  if (!latest_state.empty()) {
    std::printf("LATEST: %s\n", sys::printable(latest_state).c_str());
    rc = 1;
  }
  int64_t newest_intact = -1;
  size_t damaged = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const int64_t step = *it;
    const auto problems = ckpt::verify_checkpoint(run_dir, step);
    if (problems.empty()) {
      std::printf("step %lld: ok\n", static_cast<long long>(step));
      if (newest_intact < 0 && (latest < 0 || step <= latest)) newest_intact = step;
      continue;
    }
    rc = 1;
    const std::string what = sys::printable(problems.front().message) +
                             (problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) +
                                                        " more damaged objects)"
                                                  : "");
    if (!ckpt::any_damage(problems)) {
      std::printf("step %lld: cannot be checked here, left in place: %s\n",
                  static_cast<long long>(step), what.c_str());
      continue;
    }
    ++damaged;
    const std::string where =
        ckpt::quarantine_checkpoint(run_dir, step, ckpt::damage_reason(problems.front().kind));
    std::printf("step %lld: damaged: %s\n  moved to %s\n", static_cast<long long>(step),
                what.c_str(), sys::printable(where).c_str());
  }
  if (latest != newest_intact || !latest_state.empty()) {
    ckpt::point_latest_at(
        run_dir, newest_intact >= 0 ? std::optional<int64_t>(newest_intact) : std::nullopt);
    if (newest_intact >= 0)
      std::printf("LATEST: now names %s\n", ckpt::format::step_dir_name(newest_intact).c_str());
    else
      std::printf("LATEST: removed: no intact checkpoint is left to name\n");
  }
  const std::vector<std::string> foreign = foreign_entries(run_dir);
  for (const std::string& f : foreign)
    std::printf("not troupe's, skipped by writers and collections: %s\n",
                sys::printable(f).c_str());
  std::printf("scrub of %s: %zu checkpoint%s checked, %zu damaged and quarantined%s\n",
              run_paths::checkpoints(run_dir).c_str(), steps.size(), steps.size() == 1 ? "" : "s",
              damaged, rc ? "" : ": all intact");
  return rc;
}

// ---- dispatch ----------------------------------------------------------------------------

int dispatch(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fputs(ckpt_help("").c_str(), stderr);
    return 2;
  }
  const std::string sub = args[0];
  if (sub == "--help" || sub == "-h" || sub == "help") {
    std::fputs(ckpt_help("").c_str(), stdout);
    return 0;
  }
  const std::string help = ckpt_help(sub);
  if (help.empty())
    throw usage_error("troupe ckpt: unknown subcommand '" + sub +
                      "'; subcommands: ls, inspect, verify, diff, hash, gc, scrub, export (see "
                      "troupe ckpt --help)");
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  for (const auto& a : rest) {
    if (a == "--help" || a == "-h") {
      std::fputs(help.c_str(), stdout);
      return 0;
    }
  }
  if (sub == "export") return export_checkpoint(rest);  // its own options: ckpt_export.cpp
  std::set<std::string> allowed;
  if (sub == "inspect" || sub == "verify" || sub == "hash") allowed = {"--step"};
  if (sub == "gc") allowed = {"--keep-last", "--keep-every"};
  const parsed_args a = parse_args(sub, rest, allowed);
  const size_t extra = sub == "diff" ? 2 : 0;
  if (a.positional.empty()) throw usage(sub, "RUN_DIR is required");
  if (a.positional.size() != 1 && a.positional.size() != 1 + extra)
    throw usage(sub, sub == "diff" ? "expected RUN_DIR and either no steps or two (A B)"
                                   : "unexpected argument '" + a.positional[1] + "'");
  const std::string& run_dir = a.positional[0];
  // Parse every number before touching the disk, so that bad usage is always exit 2.
  const auto step = number_option(sub, a, "--step");
  const auto keep_last = number_option(sub, a, "--keep-last");
  const auto keep_every = number_option(sub, a, "--keep-every");
  std::optional<std::pair<int64_t, int64_t>> pair;
  if (a.positional.size() == 3)
    pair = {parse_number(sub, "step A", a.positional[1]),
            parse_number(sub, "step B", a.positional[2])};
  require_checkpoints(run_dir);
  if (sub == "ls") return cmd_ls(run_dir);
  if (sub == "inspect") return inspect(run_dir, step);
  if (sub == "verify") return cmd_verify(run_dir, step);
  if (sub == "diff") return diff(run_dir, pair);
  if (sub == "hash") return hash(run_dir, step);
  if (sub == "scrub") return cmd_scrub(run_dir);
  return cmd_gc(run_dir, static_cast<size_t>(keep_last.value_or(0)), keep_every.value_or(0));
}

}  // namespace

int run_ckpt_tool(const std::vector<std::string>& args) {
  try {
    return dispatch(args);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "%s\n", sys::printable_lines(e.what()).c_str());
    return 2;
  } catch (const std::exception& e) {  // checkpoint_error names the file already
    std::fflush(stdout);
    std::fprintf(stderr, "troupe ckpt: %s\n", sys::printable_lines(e.what()).c_str());
    return 1;
  }
}

}  // namespace troupe::cli
