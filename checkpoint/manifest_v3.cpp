// Manifest format 3: format 2 (manifest_v2.cpp, which writes, parses and validates both)
// plus what a general workload's state needs. Its additions to format 2's schema:
//
//   "arrays":   [ "model" | "optim" | "extra" ... ]   each at most once; a piece's "array"
//                                                      names one of them
//   "counters": { name: int ... }                      replaces "adam_t", which is absent
//   "extras":   { ... }                                optional; at most 1 MiB of JSON
//   each tensor: "array": string (absent: in every array), "dtype": "f32" | "f64" | "f16" |
//                "bf16" | "i64" | "i32" | "i16" | "i8" | "u8" | "bool" (absent: f32)
//
// A tensor's offset and the layout's global_numel count 4-byte words: a non-f32 tensor is one
// row of words() words, and its pieces tile [1, words()] in its own array only.

#include <algorithm>
#include <limits>
#include <set>

#include "checkpoint/manifest.hpp"
#include "checkpoint/manifest_fields.hpp"
#include "runtime/sys/printable.hpp"

namespace troupe::ckpt {

size_t tensor_entry::words() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return type == dtype::f32 ? n : (n * dtype_bytes(type) + 3) / 4;
}

std::pair<int64_t, int64_t> tensor_entry::matrix() const {
  if (type == dtype::f32) return as_matrix(shape);
  return {1, static_cast<int64_t>(words())};
}

std::vector<std::string> manifest::state_arrays() const {
  if (format_version >= workload_format_version) return arrays;
  return {array_names.begin(), array_names.end()};
}

std::string manifest::array_name(int index) const {
  if (format_version >= workload_format_version) {
    return index >= 0 && static_cast<size_t>(index) < arrays.size()
               ? arrays[static_cast<size_t>(index)]
               : "?";
  }
  return index >= 0 && static_cast<size_t>(index) < array_names.size()
             ? std::string(array_names[static_cast<size_t>(index)])
             : "?";
}

std::vector<counter_entry> manifest::state_counters() const {
  if (format_version >= workload_format_version) return counters;
  if (format_version == 2) return {{"adam_t", adam_t}};
  return {};
}

int required_format_version(const manifest& m) {
  const bool general = !m.arrays.empty() || !m.counters.empty() || !m.extras_json.empty() ||
                       std::any_of(m.tensors.begin(), m.tensors.end(), [](const tensor_entry& t) {
                         return t.type != dtype::f32 || !t.array.empty();
                       });
  return general ? workload_format_version : format_version;
}

namespace manifest_json {

using namespace detail;

namespace {

// Far above what a workload declares; bounds what a hostile manifest makes the validator do.
constexpr size_t max_counters = 4096;

}  // namespace

doc_json parse_extras(std::string_view text, const fs::path& where, error_kind kind) {
  // Bounded like the manifest around it: the seal and the writer's dump recurse.
  const doc_json::parser_callback_t shallow = [&](int depth, doc_json::parse_event_t, doc_json&) {
    if (depth > max_manifest_depth - 1) broken(where, kind, "extras nests too deep");
    return true;
  };
  doc_json extras = doc_json::parse(text.begin(), text.end(), shallow, /*allow_exceptions=*/false);
  if (extras.is_discarded() || !extras.is_object())
    broken(where, kind, "extras is not a JSON object");
  return extras;
}

void parse_v3_fields(const doc_json& doc, const fs::path& where, manifest& m) {
  const doc_json& arrays = get_array(doc, "arrays", where);
  for (size_t i = 0; i < arrays.size(); ++i) {
    const std::string ctx = "arrays/" + std::to_string(i);
    if (!arrays[i].is_string()) bad_field(where, ctx, "is not a string");
    // Judged here, before the pieces that name these arrays are read.
    const std::string name = arrays[i].get<std::string>();
    if (std::find(workload_array_names.begin(), workload_array_names.end(), name) ==
        workload_array_names.end())
      bad_field(where, ctx, "names an unknown state array \"" + sys::printable(name, 64) + "\"");
    if (std::find(m.arrays.begin(), m.arrays.end(), name) != m.arrays.end())
      bad_field(where, ctx, "names " + sys::printable(name, 64) + " twice");
    m.arrays.push_back(name);
  }
  const doc_json& counters = field(doc, "counters", where, "");
  if (!counters.is_object()) bad_field(where, "counters", "is not an object");
  if (counters.size() > max_counters) bad_field(where, "counters", "holds too many counters");
  for (const auto& [name, value] : counters.items()) {
    // A counter is an int64_t in memory; anything else would not read back as the same value.
    if (!value.is_number_integer() ||
        (value.is_number_unsigned() &&
         value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
      bad_field(where, "counters/" + sys::printable(name, 64), "is not a 64-bit integer");
    }
    m.counters.push_back({name, value.get<int64_t>()});
  }
  if (const auto it = doc.find("extras"); it != doc.end()) {
    if (!it->is_object()) bad_field(where, "extras", "is not an object");
    m.extras_json = it->dump();
    if (m.extras_json.size() > state_view::max_extras_bytes)
      bad_field(where, "extras", "is larger than the bound of 1 MiB");
  }
}

void parse_v3_tensor(const doc_json& t, const fs::path& where, const std::string& ctx,
                     tensor_entry& e) {
  if (const auto it = t.find("array"); it != t.end()) {
    if (!it->is_string()) bad_field(where, ctx + "array", "is not a string");
    e.array = it->get<std::string>();
  }
  if (const auto it = t.find("dtype"); it != t.end()) {
    const auto type = it->is_string() ? parse_dtype(it->get<std::string>()) : std::nullopt;
    if (!type) bad_field(where, ctx + "dtype", "names no dtype (f32, f64, f16, bf16, i64, ...)");
    e.type = *type;
  }
}

void validate_v3_fields(const manifest& m, const fs::path& where, error_kind kind) {
  if (m.format_version < workload_format_version) {
    // Format 2 cannot say any of this; writing it would silently drop it.
    if (required_format_version(m) == workload_format_version)
      broken(where, kind,
             "format_version " + std::to_string(m.format_version) +
                 " cannot hold arrays, counters, extras or a tensor that is not f32 in every "
                 "array (format 3 can)");
    return;
  }
  // Format 3 writes no adam_t; a value left there would be lost without a word.
  if (m.adam_t != 0) broken(where, kind, "adam_t is format 2's; format 3 keeps it in counters");
  if (m.arrays.empty()) broken(where, kind, "arrays lists no state array");
  std::set<std::string> seen;
  for (const std::string& a : m.arrays) {
    if (std::find(workload_array_names.begin(), workload_array_names.end(), a) ==
        workload_array_names.end())
      broken(where, kind, "arrays names an unknown state array \"" + sys::printable(a, 64) + "\"");
    if (!seen.insert(a).second) broken(where, kind, "arrays names " + a + " twice");
  }
  if (m.counters.size() > max_counters) broken(where, kind, "counters holds too many counters");
  std::set<std::string> names;
  for (const counter_entry& c : m.counters) {
    if (c.name.empty()) broken(where, kind, "counters holds one with an empty name");
    if (!names.insert(c.name).second) broken(where, kind, "counters names " + c.name + " twice");
  }
  for (const tensor_entry& t : m.tensors) {
    if (!t.array.empty() && !seen.contains(t.array))
      broken(where, kind,
             "tensor " + sys::printable(t.name, 64) + " is in array \"" +
                 sys::printable(t.array, 64) + "\", not in arrays");
    // A non-f32 tensor is one row of words, and a box's sizes are below 2^31.
    if (t.type != dtype::f32 &&
        t.words() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
      broken(where, kind, "tensor " + t.name + " is too large to be held as one row of words");
  }
  if (m.extras_json.empty()) return;
  if (m.extras_json.size() > state_view::max_extras_bytes)
    broken(where, kind, "extras is larger than the bound of 1 MiB");
  parse_extras(m.extras_json, where, kind);
}

}  // namespace manifest_json

}  // namespace troupe::ckpt
