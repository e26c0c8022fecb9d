#pragma once
// Internal to `troupe tokenize`: the first pass over the corpus (every block checked to be
// UTF-8, lines of the training share sampled) and the SentencePiece tokenizer trained on the
// sample, with settings under which it gives any text back unchanged.

#include <cstdint>
#include <string>
#include <vector>

#include "cli/tokenize_common.hpp"
#include "cli/tokenize_files.hpp"

namespace troupe::cli::tokenize {

// 256 byte pieces (byte fallback: any text encodes), <unk>, <s>, </s> and the newline.
constexpr int64_t reserved_pieces = 256 + 4;
/// --vocab's range (the help gives it: 261..1048576): one learnt piece at least.
constexpr int64_t min_vocab = reserved_pieces + 1;
constexpr int64_t max_vocab = int64_t{1} << 20;

/// The tokenizer's training sentences, sampled from the corpus.
struct corpus_sample {
  std::vector<std::string> sentences;
  uint64_t bytes = 0;    ///< in the sentences
  uint64_t offered = 0;  ///< sentences of the training share, sampled or not
};

/// Reads the whole corpus: every block is checked to be UTF-8 (a usage_error at the first
/// byte that is not), and the lines before `split`, cut into sentences of at most 4096 bytes
/// (SentencePiece skips longer ones), are each kept with probability `keep` (a hash of the
/// sentence's index decides: the same corpus gives the same sample).
[[nodiscard]] corpus_sample scan_corpus(const input_file& in, uint64_t split, double keep);

/// The serialized model, trained on `sample` with o.vocab pieces of o.model_type on o.threads
/// threads. Settings that make decode(encode(text)) the identity: no normalization (identity
/// rule, spaces kept as they are, no dummy prefix), byte fallback for every character the
/// pieces do not cover, and the newline as a piece of its own (training sentences are lines,
/// so no learnt piece holds one). A --vocab the corpus cannot fill, or too small for its
/// characters, is a usage_error; any other failure of SentencePiece a tool_failure.
[[nodiscard]] std::string train_tokenizer(const tokenize_options& o, const corpus_sample& sample);

}  // namespace troupe::cli::tokenize
