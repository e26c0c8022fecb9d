#pragma once
// The manifest's JSON form and the structural rules every manifest must satisfy; internal
// to checkpoint/ (the public manifest struct lives in checkpoint.hpp).

#include <filesystem>
#include <string>
#include <string_view>

#include "checkpoint/checkpoint.hpp"

namespace troupe::ckpt::manifest_json {

/// The manifest as JSON in the schema of its format_version: version 2, what ranks write
/// (manifest_v2.cpp: one line per field, tensor and piece), or version 1 (manifest.cpp:
/// pretty-printed). Either ends with manifest_hash, the seal over the rest.
std::string to_json(const manifest& m);

/// Parses manifest JSON of version 1 or 2 read from `where` (named in errors), after checking
/// its kind, version and seal. Throws checkpoint_error: unsupported_version for a newer
/// format, corrupt for anything malformed or a seal that does not match. The result has also
/// passed validate().
manifest from_json(std::string_view text, const std::filesystem::path& where);

/// Checks the rules a manifest of its format_version must satisfy. Both: world >= 1, step
/// >= 0, tensors inside the flat layout, with unique names and not overlapping. Version 2:
/// at least one tensor, chunk_floats in 1..2^28, global_numel at most 2^40, every piece's rank
/// in the world, its box inside its tensor and as many chunks as its offset and box need, and
/// the pieces of each (state array, tensor) tiling the tensor exactly. Version 1: one shard per
/// rank 0..world-1, shard ranges tiling [0, global_numel) without gap or overlap, plain file
/// names, valid hashes. Throws checkpoint_error of `kind` naming `where` and the first broken
/// rule.
void validate(const manifest& m, const std::filesystem::path& where, error_kind kind);

}  // namespace troupe::ckpt::manifest_json
