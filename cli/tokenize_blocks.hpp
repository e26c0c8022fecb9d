#pragma once
// Internal to `troupe tokenize`: the corpus read in blocks that end at a line end, each checked
// to be UTF-8, and where its validation share begins — so that no pass holds the corpus whole
// and every block can be encoded on its own.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cli/command_line.hpp"
#include "cli/tokenize_files.hpp"

namespace troupe::cli::tokenize {

/// The unit of reading, encoding and writing: a block ends at the last line end in this many
/// bytes (at a space or a character boundary in a longer line).
constexpr size_t block_bytes = size_t{1} << 20;

/// Where to cut `text` so that the part before is whole lines (or, in a line longer than the
/// text, whole words or whole characters): just after its last newline, else just before its
/// last space, else before its last character's first byte; `text.size()` if it is all there
/// is (`last`).
[[nodiscard]] size_t cut_point(std::string_view text, bool last);

/// [begin, end) of a file in blocks of at most block_bytes, each cut by cut_point.
class block_reader {
 public:
  block_reader(const input_file& in, uint64_t begin, uint64_t end)
      : in_(in), at_(begin), end_(end) {}

  /// The next block into `text` and its offset into `offset`; false at the end.
  bool next(std::string& text, uint64_t& offset);
  /// Where the next block begins: the bytes read so far, counted from the file's start.
  uint64_t position() const { return at_; }

 private:
  const input_file& in_;
  uint64_t at_, end_;
};

/// The offset of the first byte in `text` that does not begin or continue a well-formed UTF-8
/// sequence (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF; a sequence cut
/// off by the end of `text` is malformed), or npos.
[[nodiscard]] size_t first_malformed_utf8(std::string_view text);

/// The corpus is not UTF-8 at `offset`: a usage_error saying where (line and byte).
[[nodiscard]] usage_error not_utf8(const input_file& in, uint64_t offset);

/// Where the validation share begins: the line end closest above size * (1 - fraction) (or,
/// when the last line holds that point, the one below it); the size itself for fraction 0.
/// A corpus of one line, with a share asked for, is a usage_error.
[[nodiscard]] uint64_t split_offset(const input_file& in, double val_fraction);

}  // namespace troupe::cli::tokenize
