#pragma once
// Helpers shared by the parsers of the manifest formats (manifest.cpp, manifest_v2.cpp):
// typed field access that names the broken field, and the manifest's seal. Internal.

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/durable_io.hpp"
#include "checkpoint/format.hpp"
#include "checkpoint/hash.hpp"

namespace troupe::ckpt::manifest_json {

namespace fs = std::filesystem;

namespace detail {

// Key order matters for the seal, so the manifest is handled as an ordered document.
using doc_json = nlohmann::ordered_json;

inline constexpr const char* seal_key = "manifest_hash";
/// Deepest nesting a manifest may have (real ones have 5 levels).
inline constexpr int max_manifest_depth = 16;
/// Bounds a format 2 manifest may claim: 2^40 floats (4 TiB) in all, 2^28 floats per chunk.
inline constexpr uint64_t max_global_numel = uint64_t{1} << 40;
inline constexpr uint64_t max_chunk_floats = uint64_t{1} << 28;

/// The seal of `doc`, which must not contain seal_key.
inline std::string seal_of(const doc_json& doc) {
  const std::string compact = doc.dump();
  return hash_to_hex(hash64(compact.data(), compact.size()));
}

/// A malformed field is reported by its JSON path; nlohmann's own message is too vague.
[[noreturn]] inline void bad_field(const fs::path& where, const std::string& field,
                                   const std::string& what) {
  io::fail(error_kind::corrupt, where,
           "manifest field \"" + field + "\" " + what +
               ". The manifest is damaged or was edited by hand; restore it from a copy or "
               "restore from an earlier checkpoint.");
}

inline const doc_json& field(const doc_json& obj, const char* key, const fs::path& where,
                             const std::string& context) {
  const auto it = obj.find(key);
  if (it == obj.end()) bad_field(where, context + key, "is missing");
  return *it;
}

inline uint64_t get_uint(const doc_json& obj, const char* key, const fs::path& where,
                         const std::string& context = "") {
  const doc_json& v = field(obj, key, where, context);
  if (!v.is_number_unsigned()) bad_field(where, context + key, "is not a non-negative integer");
  return v.get<uint64_t>();
}

inline int64_t get_int(const doc_json& obj, const char* key, const fs::path& where,
                       int64_t max_value, const std::string& context = "") {
  const uint64_t v = get_uint(obj, key, where, context);
  if (v > static_cast<uint64_t>(max_value)) bad_field(where, context + key, "is out of range");
  return static_cast<int64_t>(v);
}

inline std::string get_string(const doc_json& obj, const char* key, const fs::path& where,
                              const std::string& context = "") {
  const doc_json& v = field(obj, key, where, context);
  if (!v.is_string()) bad_field(where, context + key, "is not a string");
  return v.get<std::string>();
}

inline const doc_json& get_array(const doc_json& obj, const char* key, const fs::path& where) {
  const doc_json& v = field(obj, key, where, "");
  if (!v.is_array()) bad_field(where, key, "is not an array");
  return v;
}

[[noreturn]] inline void broken(const fs::path& where, error_kind kind, const std::string& rule) {
  const std::string fix = kind == error_kind::invalid_argument
                              ? " This is a bug in the caller that assembled the manifest."
                              : " The manifest is damaged or was edited by hand; restore it "
                                "from a copy or restore from an earlier checkpoint.";
  io::fail(kind, where, "invalid manifest: " + rule + "." + fix);
}

inline bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace detail

/// Version 2 and 3 halves of to_json / from_json / validate (manifest_v2.cpp).
std::string to_json_v2(const manifest& m);
manifest from_json_v2(const detail::doc_json& doc, const fs::path& where, int version = 2);
void validate_v2(const manifest& m, const fs::path& where, error_kind kind);
/// Format 3's additions (manifest_v3.cpp): its top-level fields (arrays, counters, extras),
/// a tensor's array and dtype, and their rules (for a format 2 manifest: that it has none).
void parse_v3_fields(const detail::doc_json& doc, const fs::path& where, manifest& m);
void parse_v3_tensor(const detail::doc_json& t, const fs::path& where, const std::string& ctx,
                     tensor_entry& e);
void validate_v3_fields(const manifest& m, const fs::path& where, error_kind kind);
/// `text` as a JSON object, nested at most as deep as a manifest may be; throws
/// checkpoint_error of `kind` naming the field "extras" otherwise.
detail::doc_json parse_extras(std::string_view text, const fs::path& where, error_kind kind);
/// The "tensors" table of any version: names, shapes (up to 8 sizes below 2^31), offsets.
std::vector<tensor_entry> parse_tensor_table(const detail::doc_json& doc, const fs::path& where,
                                             int version = 2);
/// The rules on the tensor table that both versions share.
void validate_tensors(const manifest& m, const fs::path& where, error_kind kind);

}  // namespace troupe::ckpt::manifest_json
