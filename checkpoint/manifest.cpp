// The manifest's JSON form (dispatching on format_version: manifest_v2.cpp holds version 2,
// the one ranks write), the schema and validation of version 1, which only old checkpoints
// have, and the same-run check of a restore.
//
// Schema of format_version 1 (every key required, no others read):
//
//   { "kind": "troupe-checkpoint-manifest", "format_version": 1,
//     "step": int, "world": int, "global_numel": uint, "seed": uint,
//     "hash_algorithm": "trp64", "config_json": string (the job config, verbatim),
//     "tensors": [ { "name": string, "shape": [int...], "offset": uint } ... ],
//     "shards":  [ { "rank": int, "file": string, "bytes": uint, "hash": 16 hex digits,
//                    "offset": uint, "count": uint } ... ],
//     "manifest_hash": 16 hex digits }
//
// manifest_hash seals the manifest itself, in both versions: trp64 of the compact JSON dump
// (no spaces, keys in file order) of the document without that key. Any edit, by a disk or a
// person, shows. Version 2 names its chunk hash "xxh3-128" in hash_algorithm; version 1's
// shard hashes are trp64.

#include "checkpoint/manifest.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "checkpoint/durable_io.hpp"
#include "checkpoint/format.hpp"
#include "checkpoint/hash.hpp"
#include "checkpoint/manifest_fields.hpp"
#include "runtime/sys/printable.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace manifest_json {

using namespace detail;

std::string to_json(const manifest& m) {
  if (m.format_version >= 2) return to_json_v2(m);
  doc_json tensors = doc_json::array();
  for (const tensor_entry& t : m.tensors) {
    tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}});
  }
  doc_json shards = doc_json::array();
  for (const shard_entry& s : m.shards) {
    shards.push_back({{"rank", s.rank},
                      {"file", s.file},
                      {"bytes", s.bytes},
                      {"hash", s.hash},
                      {"offset", s.range.offset},
                      {"count", s.range.count}});
  }
  // Key order as written here, which reads better than alphabetical.
  doc_json doc;
  doc["kind"] = format::manifest_kind;
  doc["format_version"] = m.format_version;
  doc["step"] = m.step;
  doc["world"] = m.world;
  doc["global_numel"] = m.global_numel;
  doc["seed"] = m.seed;
  doc["hash_algorithm"] = hash_algorithm_name;
  doc["config_json"] = m.config_json;
  doc["tensors"] = tensors;
  doc["shards"] = shards;
  doc[seal_key] = seal_of(doc);
  return doc.dump(2) + "\n";
}

namespace {

/// The manifest's parser: nlohmann's own DOM builder, with a depth bound and a watch for
/// duplicate keys on top. A parsed object keeps one of two equal keys, so a duplicate name
/// would vanish unseen; this remembers the first key found twice among the top-level fields
/// or in an object directly under them (format 3's counters and extras). Deeper objects are
/// not tracked. (nlohmann 3.11.2's callback parser, used before, searches an object's parent
/// for a discarded value at the end of every object: quadratic in the pieces, 9 s for the
/// 210,000 pieces of a 70,000-rank job.)
class bounded_parser {
 public:
  bounded_parser(doc_json& out, const fs::path& where) : dom_(out), where_(where) {}

  bool null() { return value() && dom_.null(); }
  bool boolean(bool v) { return value() && dom_.boolean(v); }
  bool number_integer(doc_json::number_integer_t v) { return value() && dom_.number_integer(v); }
  bool number_unsigned(doc_json::number_unsigned_t v) { return value() && dom_.number_unsigned(v); }
  bool number_float(doc_json::number_float_t v, const doc_json::string_t& text) {
    return value() && dom_.number_float(v, text);
  }
  bool string(doc_json::string_t& v) { return value() && dom_.string(v); }
  bool binary(doc_json::binary_t& v) { return value() && dom_.binary(v); }
  bool start_object(std::size_t n) {
    deeper();
    if (depth_ < 3) keys_[static_cast<size_t>(depth_ - 1)].clear();
    return dom_.start_object(n);
  }
  bool key(doc_json::string_t& k) {
    if (depth_ > max_manifest_depth) too_deep();
    if ((depth_ == 1 || depth_ == 2) && first_.empty()) {
      if (depth_ == 1) parent_ = k;
      if (!keys_[static_cast<size_t>(depth_ - 1)].insert(k).second)
        first_ = depth_ == 1 ? k : parent_ + "/" + k;
    }
    return dom_.key(k);
  }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    deeper();
    return dom_.start_array(n);
  }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  template <class Exception>
  bool parse_error(std::size_t at, const std::string& token, const Exception& e) {
    return dom_.parse_error(at, token, e);
  }

  /// "counters/step" or "step"; empty when every key was unique.
  [[nodiscard]] const std::string& first_duplicate() const { return first_; }

 private:
  // A container opened inside `depth_` others, as the callback parser counted depth.
  void deeper() {
    if (depth_ > max_manifest_depth) too_deep();
    ++depth_;
  }
  bool value() const {
    if (depth_ > max_manifest_depth) too_deep();
    return true;
  }
  [[noreturn]] void too_deep() const { bad_field(where_, "(document)", "nests too deep"); }

  nlohmann::detail::json_sax_dom_parser<doc_json> dom_;
  const fs::path& where_;
  int depth_ = 0;
  std::array<std::set<std::string>, 2> keys_;  // of the top level, of the object under it
  std::string parent_, first_;
};

}  // namespace

manifest from_json(std::string_view text, const fs::path& where) {
  doc_json doc;
  bounded_parser parser(doc, where);
  try {
    // A manifest is a few levels deep; anything deeper is refused while parsing, before the
    // recursive seal could run out of stack on it.
    doc_json::sax_parse(text.begin(), text.end(), &parser);
  } catch (const doc_json::exception& e) {  // malformed text, or a number no double holds
    io::fail(error_kind::corrupt, where,
             std::string("is not valid JSON (") + sys::printable(e.what(), 256) +
                 "); it was damaged or written partially by a tool other than troupe. Restore "
                 "it from a copy or restore from an earlier checkpoint.");
  }
  if (!doc.is_object()) bad_field(where, "(top level)", "is not a JSON object");
  if (get_string(doc, "kind", where) != format::manifest_kind) {
    bad_field(where, "kind", "is not \"" + std::string(format::manifest_kind) + "\"");
  }
  // The version decides how to read everything else, so it is judged first.
  const uint64_t version = get_uint(doc, "format_version", where);
  if (version > static_cast<uint64_t>(newest_format_version)) {
    io::fail(error_kind::unsupported_version, where,
             "has format_version " + std::to_string(version) + " but this build reads up to " +
                 std::to_string(newest_format_version) +
                 ". It was written by a newer troupe; restore with that version.");
  }
  if (version < 1) bad_field(where, "format_version", "is 0, which no troupe ever wrote");
  if (version >= static_cast<uint64_t>(workload_format_version) &&
      !parser.first_duplicate().empty())
    bad_field(where, parser.first_duplicate(), "appears twice");
  const std::string recorded_seal = get_string(doc, seal_key, where);
  doc.erase(seal_key);
  if (const std::string seal = seal_of(doc); seal != recorded_seal) {
    io::fail(error_kind::corrupt, where,
             "does not match its manifest_hash (recorded " + recorded_seal + ", computed " + seal +
                 "): it was damaged or edited. Restore it from a copy or restore from an "
                 "earlier checkpoint.");
  }
  if (get_string(doc, "hash_algorithm", where) !=
      (version == 1 ? hash_algorithm_name : chunk_hash_name)) {
    bad_field(where, "hash_algorithm", "names a hash this build does not know");
  }
  if (version >= 2) return from_json_v2(doc, where, static_cast<int>(version));

  manifest m;
  m.format_version = static_cast<int>(version);
  m.step = get_int(doc, "step", where, std::numeric_limits<int64_t>::max());
  m.world = static_cast<int>(get_int(doc, "world", where, std::numeric_limits<int>::max()));
  m.global_numel = get_uint(doc, "global_numel", where);
  m.seed = get_uint(doc, "seed", where);
  m.config_json = get_string(doc, "config_json", where);

  m.tensors = parse_tensor_table(doc, where);

  const doc_json& shards = get_array(doc, "shards", where);
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string ctx = "shards/" + std::to_string(i) + "/";
    const doc_json& s = shards[i];
    if (!s.is_object()) bad_field(where, ctx, "is not an object");
    shard_entry e;
    e.rank = static_cast<int>(get_int(s, "rank", where, std::numeric_limits<int>::max(), ctx));
    e.file = get_string(s, "file", where, ctx);
    e.bytes = get_uint(s, "bytes", where, ctx);
    e.hash = get_string(s, "hash", where, ctx);
    e.range.offset = get_uint(s, "offset", where, ctx);
    e.range.count = get_uint(s, "count", where, ctx);
    m.shards.push_back(std::move(e));
  }
  validate(m, where, error_kind::corrupt);
  return m;
}

void validate(const manifest& m, const fs::path& where, error_kind kind) {
  if (m.format_version == 2 || m.format_version == workload_format_version) {
    validate_v2(m, where, kind);
    return;
  }
  if (m.format_version != shard_format_version) {
    broken(where, kind,
           "format_version is " + std::to_string(m.format_version) + ", this build handles " +
               std::to_string(shard_format_version) + " to " +
               std::to_string(newest_format_version));
  }
  validate_v3_fields(m, where, kind);  // none of format 3's fields
  if (m.step < 0) broken(where, kind, "step is negative");
  if (m.world < 1) broken(where, kind, "world is " + std::to_string(m.world) + ", not >= 1");
  if (m.shards.size() != static_cast<size_t>(m.world)) {
    broken(where, kind,
           "it lists " + std::to_string(m.shards.size()) + " shards for a world of " +
               std::to_string(m.world) + " (one per rank is required)");
  }
  std::vector<const shard_entry*> by_rank(m.shards.size(), nullptr);
  for (const shard_entry& s : m.shards) {
    if (s.rank < 0 || s.rank >= m.world) {
      broken(where, kind, "shard rank " + std::to_string(s.rank) + " is outside the world");
    }
    if (by_rank[static_cast<size_t>(s.rank)] != nullptr) {
      broken(where, kind, "rank " + std::to_string(s.rank) + " has two shards");
    }
    by_rank[static_cast<size_t>(s.rank)] = &s;
    if (!is_plain_file_name(s.file)) {
      broken(where, kind, "shard file \"" + s.file + "\" is not a plain file name");
    }
    if (!hash_from_hex(s.hash)) {
      broken(where, kind, "shard hash \"" + s.hash + "\" is not 16 lowercase hex digits");
    }
    if (s.bytes < format::header_bytes) {
      broken(where, kind, "shard " + s.file + " is recorded as smaller than its header");
    }
  }
  // Ranges must tile the layout exactly; rank order need not be offset order, so that a
  // later layout (e.g. ZeRO with a different partition) fits the same manifest.
  std::vector<shard_range> ranges;
  for (const shard_entry& s : m.shards) ranges.push_back(s.range);
  std::sort(ranges.begin(), ranges.end(), [](const shard_range& a, const shard_range& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.count < b.count;
  });
  size_t next = 0;
  for (const shard_range& r : ranges) {
    if (r.offset != next) {
      broken(where, kind,
             "shard ranges leave a gap or overlap at element " + std::to_string(next) +
                 " (a shard starts at " + std::to_string(r.offset) + ")");
    }
    if (r.count > m.global_numel - next) {
      broken(where, kind, "a shard range runs past global_numel");
    }
    next += r.count;
  }
  if (next != m.global_numel) {
    broken(where, kind,
           "shards cover " + std::to_string(next) + " of " + std::to_string(m.global_numel) +
               " elements");
  }

  validate_tensors(m, where, kind);
}

void validate_tensors(const manifest& m, const fs::path& where, error_kind kind) {
  std::vector<std::pair<size_t, size_t>> spans;  // [offset, end) of each tensor
  std::vector<std::string> names;
  for (const tensor_entry& t : m.tensors) {
    if (t.name.empty()) broken(where, kind, "a tensor has an empty name");
    names.push_back(t.name);
    // The layout counts 4-byte words, so a tensor of 1-byte elements has up to 4 per word;
    // bounding numel by that first keeps the product (and words()) from overflowing.
    const size_t per_word = t.type == dtype::f32 ? 1 : 4 / std::min<size_t>(4, dtype_bytes(t.type));
    const size_t max_numel = m.global_numel > std::numeric_limits<size_t>::max() / 4
                                 ? std::numeric_limits<size_t>::max() / 4
                                 : m.global_numel * per_word;
    size_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) broken(where, kind, "tensor " + t.name + " has a negative dimension");
      const auto du = static_cast<size_t>(d);
      if (du != 0 && numel > max_numel / du) {
        broken(where, kind, "tensor " + t.name + " is larger than the whole layout");
      }
      numel *= du;
    }
    const size_t words = t.words();
    if (t.offset > m.global_numel || words > m.global_numel - t.offset) {
      broken(where, kind, "tensor " + t.name + " runs past global_numel");
    }
    if (words > 0) spans.emplace_back(t.offset, t.offset + words);
  }
  std::sort(names.begin(), names.end());
  if (const auto dup = std::adjacent_find(names.begin(), names.end()); dup != names.end()) {
    broken(where, kind, "tensor name " + *dup + " appears twice");
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) {
      broken(where, kind, "two tensors overlap at element " + std::to_string(spans[i].first));
    }
  }
}

}  // namespace manifest_json

namespace {

/// The value at `path` in `doc`, abbreviated for an error message.
std::string value_at(const json& doc, const std::string& path) {
  try {
    const json::json_pointer ptr(path);
    if (!doc.contains(ptr)) return "absent";
    std::string s = doc.at(ptr).dump();
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return s;
  } catch (const json::exception&) {
    return "absent";  // e.g. the "/-" (append) pointers of a diff
  }
}

bool is_ignored(const std::string& path, std::span<const std::string> ignored) {
  return std::any_of(ignored.begin(), ignored.end(), [&](const std::string& prefix) {
    return path == prefix ||
           (path.starts_with(prefix) && path.size() > prefix.size() && path[prefix.size()] == '/');
  });
}

}  // namespace

namespace {

fs::path manifest_where(const manifest& m) {
  return run_paths::checkpoints("") / format::step_dir_name(m.step) / format::manifest_name;
}

void require_same_model(const manifest& m, size_t global_numel) {
  if (m.global_numel != global_numel) {
    io::fail(error_kind::incompatible, manifest_where(m),
             "holds a flat state of " + std::to_string(m.global_numel) +
                 " floats but this model has " + std::to_string(global_numel) +
                 ": it belongs to a model of another shape. Restore with that model's config "
                 "or use a new run directory.");
  }
}

void require_same_config(const manifest& m, const json& saved, const json& current,
                         std::span<const std::string> ignored) {
  std::string differences;
  size_t shown = 0;
  for (const json& op : json::diff(saved, current)) {
    const std::string path = op.at("path").get<std::string>();
    if (is_ignored(path, ignored)) continue;
    if (++shown > 5) {
      differences += "; ...";
      break;
    }
    differences += (differences.empty() ? "" : "; ") + path + " was " + value_at(saved, path) +
                   ", now " + value_at(current, path);
  }
  if (!differences.empty()) {
    io::fail(error_kind::incompatible, manifest_where(m),
             "was written by a run with a different config (" + differences +
                 "). Resume with the checkpoint's config, or start a new run directory.");
  }
}

}  // namespace

void require_compatible(const manifest& m, const json& config, size_t global_numel,
                        std::span<const std::string> ignored) {
  require_same_model(m, global_numel);
  json saved;
  try {
    saved = json::parse(m.config_json);
  } catch (const json::parse_error&) {
    io::fail(error_kind::incompatible, manifest_where(m),
             "was written with a different config (not comparable as JSON). Restore with the "
             "checkpoint's config or use a new run directory.");
  }
  require_same_config(m, saved, config, ignored);
}

}  // namespace troupe::ckpt
