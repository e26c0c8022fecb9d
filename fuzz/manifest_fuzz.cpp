// libFuzzer target: the bytes are a checkpoint manifest's JSON text, handed to
// manifest_json::from_json. It may throw ckpt::checkpoint_error and nothing else; any other
// exception, a crash, a sanitizer report or a hang is a finding.
//
// Every manifest is sealed by a hash of its own contents, which a mutation almost always
// breaks; so an input that parses as a JSON object is also re-sealed (manifest_hash
// recomputed) and parsed again, which lets the fuzzer reach the field checks and validate().
// A manifest that is accepted must survive to_json -> from_json unchanged and satisfy the
// rules the restore relies on. The findings of earlier runs (fuzz/findings/) are fixed and
// stay in the seed corpus as regression inputs.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/manifest_fields.hpp"

namespace {

using troupe::ckpt::checkpoint_error;
using troupe::ckpt::manifest;
namespace mj = troupe::ckpt::manifest_json;
using doc_json = mj::detail::doc_json;

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "manifest_fuzz: %s\n", what);
  std::abort();
}

/// What the restore assumes of an accepted format 2 or 3 manifest: every piece's chunks hold
/// exactly its box, starting at its offset (chunk i holds elements [i * chunk_floats,
/// (i + 1) * chunk_floats) of the run that begins `offset` floats before the box).
void check_accepted(const manifest& m) {
  if (m.format_version < 2) return;
  for (const auto& p : m.pieces) {
    if (p.offset >= m.chunk_floats) finding("an accepted piece starts past its first chunk");
    const auto numel = static_cast<unsigned __int128>(p.where.numel()) + p.offset;
    const auto per_chunk = static_cast<unsigned __int128>(m.chunk_floats);
    const auto chunks = static_cast<unsigned __int128>(p.chunks.size());
    if (chunks * per_chunk < numel || (chunks > 0 && (chunks - 1) * per_chunk >= numel)) {
      finding("an accepted piece's chunks do not hold exactly its box");
    }
  }
}

void parse(std::string_view text) {
  manifest m;
  try {
    m = mj::from_json(text, "fuzz/manifest.json");
  } catch (const checkpoint_error&) {
    return;
  }
  check_accepted(m);
  const std::string again = mj::to_json(m);
  manifest back;
  try {
    back = mj::from_json(again, "fuzz/manifest.json (rewritten)");
  } catch (const checkpoint_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    finding("an accepted manifest does not parse once written again");
  }
  if (!(back == m)) finding("an accepted manifest changes when written and read again");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  int depth = 0;
  doc_json doc = doc_json::parse(
      text.begin(), text.end(),
      [&depth](int d, doc_json::parse_event_t, doc_json&) {
        depth = std::max(depth, d);
        return true;
      },
      /*allow_exceptions=*/false);

  parse(text);

  // The same document with a valid seal (this harness's own dump is recursive too, so only
  // for documents of a modest depth; the library sees deeper ones above).
  if (doc.is_discarded() || !doc.is_object() || depth > 64) return 0;
  doc.erase(mj::detail::seal_key);
  const std::string seal = mj::detail::seal_of(doc);
  doc[mj::detail::seal_key] = seal;
  parse(doc.dump());
  return 0;
}
