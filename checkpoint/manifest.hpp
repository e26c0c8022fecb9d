#pragma once
// The manifest's JSON form and the structural rules every manifest must satisfy; internal
// to checkpoint/ (the public manifest struct lives in checkpoint.hpp).

#include <filesystem>
#include <string>
#include <string_view>

#include "checkpoint/checkpoint.hpp"

namespace troupe::ckpt::manifest_json {

/// The manifest as pretty-printed JSON (format_version 1 schema, see manifest.cpp).
std::string to_json(const manifest& m);

/// Parses manifest JSON read from `where` (named in errors). Throws checkpoint_error:
/// unsupported_version for a newer format, corrupt for anything malformed. The result has
/// also passed validate().
manifest from_json(std::string_view text, const std::filesystem::path& where);

/// Checks the rules a manifest must satisfy: world >= 1, one shard per rank 0..world-1,
/// shard ranges tiling [0, global_numel) without gap or overlap, plain file names, valid
/// hashes, tensors inside the layout with unique names. Throws checkpoint_error of `kind`
/// naming `where` and the first broken rule.
void validate(const manifest& m, const std::filesystem::path& where, error_kind kind);

}  // namespace troupe::ckpt::manifest_json
