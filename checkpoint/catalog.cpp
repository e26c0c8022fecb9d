// Which checkpoints a run directory holds: LATEST and the manifests (retention is
// collect_garbage, maintenance.cpp).

#include <algorithm>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/durable_io.hpp"
#include "checkpoint/format.hpp"
#include "checkpoint/manifest.hpp"
#include "runtime/sys/printable.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::ckpt {

namespace fs = std::filesystem;

namespace {

/// Printable, bounded rendering of untrusted file content for an error message.
std::string quote(std::string_view text) { return "\"" + sys::printable(text, 64) + "\""; }

std::string list_for_message(const std::vector<int64_t>& steps) {
  if (steps.empty()) return "none";
  std::string out;
  for (int64_t s : steps) out += (out.empty() ? "" : ", ") + format::step_dir_name(s);
  return out;
}

}  // namespace

std::optional<int64_t> read_latest_step(const std::string& run_dir) {
  const fs::path latest = run_paths::latest(run_dir);
  std::error_code ec;
  if (fs::symlink_status(latest, ec).type() == fs::file_type::not_found) return std::nullopt;
  const auto raw = io::read_file(latest);
  std::string_view text(reinterpret_cast<const char*>(raw.data()), raw.size());
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) {
    text.remove_suffix(1);
  }
  const auto step = format::parse_step_dir_name(text);
  if (!step) {
    const std::vector<int64_t> found = list_committed(run_dir);
    io::fail(error_kind::corrupt, latest,
             "is corrupt: it contains " + quote(text) +
                 " where the name of a step directory (like step-00000010) belongs. Step "
                 "directories with a manifest: " +
                 list_for_message(found) +
                 ". Write the newest good one's name into LATEST, or remove LATEST to start "
                 "the run from scratch.");
  }
  return step;
}

manifest read_manifest(const std::string& run_dir, int64_t step) {
  const fs::path dir = format::step_dir(run_dir, step);
  const fs::path path = dir / format::manifest_name;
  std::error_code ec;
  const fs::file_type type = fs::symlink_status(dir, ec).type();
  if (type != fs::file_type::directory && type != fs::file_type::not_found)
    io::fail(error_kind::corrupt, dir,
             "is not a directory (a symbolic link?); troupe does not follow links inside a run "
             "directory. Run `troupe ckpt scrub` on the run directory.");
  const auto raw = io::read_file(path);
  manifest m = manifest_json::from_json(
      std::string_view(reinterpret_cast<const char*>(raw.data()), raw.size()), path);
  if (m.step != step) {
    io::fail(error_kind::mismatch, path,
             "records step " + std::to_string(m.step) + " but lives in the directory of step " +
                 std::to_string(step) + ": directories were renamed. Move it back.");
  }
  return m;
}

std::optional<manifest> latest_committed(const std::string& run_dir) {
  const std::optional<int64_t> step = read_latest_step(run_dir);
  if (!step) return std::nullopt;
  const fs::path latest = run_paths::latest(run_dir);
  const fs::path dir = format::step_dir(run_dir, *step);
  std::error_code ec;
  const auto fix = [&] {
    return ". Step directories with a manifest: " + list_for_message(list_committed(run_dir)) +
           ". Point LATEST at one of them (echo NAME > LATEST) or restore the missing files.";
  };
  if (fs::symlink_status(dir, ec).type() != fs::file_type::directory) {
    io::fail(
        error_kind::missing, latest,
        "names " + format::step_dir_name(*step) + " but that directory does not exist" + fix());
  }
  if (!fs::exists(dir / format::manifest_name, ec)) {
    io::fail(error_kind::missing, latest,
             "names " + format::step_dir_name(*step) + " but it has no " +
                 std::string(format::manifest_name) + fix());
  }
  return read_manifest(run_dir, *step);
}

std::vector<int64_t> list_committed(const std::string& run_dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  const fs::path root = run_paths::checkpoints(run_dir);
  if (!fs::is_directory(root, ec)) return steps;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    const auto step = format::parse_step_dir_name(entry.path().filename().string());
    // A step without a manifest is simply not committed; a link (as the step's directory or
    // as its manifest) is nothing troupe wrote, and is never followed.
    std::error_code type_ec;
    if (step && entry.symlink_status(type_ec).type() == fs::file_type::directory &&
        fs::symlink_status(entry.path() / format::manifest_name, type_ec).type() ==
            fs::file_type::regular) {
      steps.push_back(*step);
    }
  }
  if (ec) io::fail_errno(root, "listing", ec.value());
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace troupe::ckpt
