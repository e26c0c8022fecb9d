#pragma once
// Internal to `troupe tokenize`: text to token ids in the token files' layout, with what
// SentencePiece alone would not give back (U+2581, SentencePiece's space mark, and long
// lines), and the check that a tokenizer gives any text back unchanged.

#include <sentencepiece_processor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/data/token_sidecar.hpp"

namespace troupe::cli::tokenize {

/// Text to token ids in the file's layout (little-endian, 2 or 4 bytes each).
class token_encoder {
 public:
  /// Encodes with `sp` (which must outlive it). Throws tool_failure if `sp` cannot encode a
  /// newline.
  token_encoder(const sentencepiece::SentencePieceProcessor& sp, token_dtype dtype);

  /// Appends the ids of `text` (whole UTF-8 characters) to `out`; returns how many. Encoded a
  /// line at a time, as spm_encode does, with the newline's ids between the lines: the newline
  /// is a piece of its own that no other piece holds, so these are the ids of the text encoded
  /// whole, and SentencePiece's encoders cost more per byte on longer input. A line longer
  /// than encode_bytes (4 KiB, tokenize_encoder.cpp) goes in pieces cut before a space. Throws
  /// tool_failure.
  uint64_t encode(std::string_view text, std::string& out) const;

 private:
  /// `text` with every U+2581 in it written as its three byte pieces.
  uint64_t encode_piece(std::string_view text, std::string& out, std::vector<int>& ids) const;
  /// `ids` in the file's layout at the end of `out`; the unknown piece is a tool_failure.
  void append(const std::vector<int>& ids, std::string& out) const;

  const sentencepiece::SentencePieceProcessor& sp_;
  token_dtype dtype_;
  int unk_;
  std::vector<int> mark_ids_;     ///< the byte pieces of U+2581
  std::vector<int> newline_ids_;  ///< the newline's piece (or its byte piece, in a model of
                                  ///< another's without one)
};

/// decode(encode(text)) == text on a probe of every kind of text SentencePiece could change
/// (runs of spaces, tabs, newlines, a leading space, U+2581, characters never trained on) and
/// on the first training sentences: a tokenizer that fails it would write token files that do
/// not give the corpus back. `encoder` must write uint32 ids. Returns where the first text
/// that came back changed ("\"...\" came back as \"...\""), nullopt when none did.
[[nodiscard]] std::optional<std::string> round_trip_failure(
    const sentencepiece::SentencePieceProcessor& sp, const token_encoder& encoder,
    const std::vector<std::string>& sentences);

}  // namespace troupe::cli::tokenize
