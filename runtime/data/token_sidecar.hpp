#pragma once
// The sidecar of a token file: what a flat array of token ids (nanoGPT's train.bin layout, no
// header) holds, written beside it as TOKENS.json by `troupe tokenize` and read, strictly, by
// whoever opens the token file.
//
//   {"format": "troupe.tokens", "version": 1, "dtype": "uint16", "vocab_size": 4000,
//    "tokens": 1234567, "tokenizer": "tokenizer.model"}
//
// A sidecar rather than a header keeps the .bin files exactly nanoGPT's: readable by
// np.memmap(path, dtype=np.uint16) and by anything else that reads those.

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/data/dataset.hpp"

namespace troupe {

/// The width of one token id on disk (little-endian, unsigned).
enum class token_dtype { uint16, uint32 };

/// "uint16" or "uint32".
std::string_view token_dtype_name(token_dtype t);
/// Bytes per token id: 2 or 4.
int token_width(token_dtype t);
/// The narrowest width for ids below `vocab_size`: uint16 up to 65536 ids, uint32 above.
token_dtype token_dtype_for_vocab(int64_t vocab_size);

/// What a token file holds.
struct token_sidecar {
  static constexpr std::string_view format_name = "troupe.tokens";
  static constexpr int format_version = 1;

  token_dtype dtype = token_dtype::uint16;
  int64_t vocab_size = 0;  ///< every id in the file is below it
  int64_t tokens = 0;      ///< ids in the file: its size is tokens * token_width(dtype)
  /// The SentencePiece model that made the ids, relative to the sidecar's directory; empty
  /// when no tokenizer is known (ids made elsewhere).
  std::string tokenizer;

  bool operator==(const token_sidecar&) const = default;
};

/// A sidecar that cannot be used: missing, unreadable, not JSON, a key missing or unknown, a
/// value of the wrong type or out of range. `path()` is the sidecar's; the message starts with
/// it and says what is wrong.
class token_sidecar_error : public data_error {
 public:
  token_sidecar_error(std::string path, const std::string& what);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Where the sidecar of token file `token_file` is: its path with ".json" appended
/// ("data/train.bin" -> "data/train.bin.json").
std::string token_sidecar_path(const std::string& token_file);

/// The sidecar's JSON text (one line, keys in the order above, a newline at the end).
std::string format_token_sidecar(const token_sidecar& s);

/// Parses a sidecar's text. Strict: every key above must be there with its type ("version" 1,
/// "format" "troupe.tokens", "dtype" "uint16" or "uint32", "vocab_size" an integer in
/// [1, 65536] for uint16 and [1, 2^32] for uint32, "tokens" a non-negative integer,
/// "tokenizer" a string); any other key is refused. `path` names the file in errors.
/// Throws token_sidecar_error.
token_sidecar parse_token_sidecar(std::string_view text, const std::string& path);

/// Reads and parses the sidecar at `path` (a regular file of at most 64 KiB). Throws
/// token_sidecar_error.
token_sidecar read_token_sidecar(const std::string& path);

/// Writes `s` to `path` atomically: a temporary file beside it, flushed to disk, then renamed,
/// so that no reader ever sees half a sidecar. Throws token_sidecar_error.
void write_token_sidecar(const std::string& path, const token_sidecar& s);

}  // namespace troupe
