#pragma once
// The corpus: a text file (each byte a token) or a token file (uint16 or uint32 ids described
// by a sidecar), mapped into memory and split into training and validation tokens; and the
// sample windows of every step as a pure function of (seed, step, sample index).

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/data/token.hpp"

namespace troupe {

/// A corpus that cannot be used; the message names the path and what to do about it.
class data_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What a corpus file is, read from its size and (for a token file) its sidecar, without
/// reading its tokens.
struct corpus_file {
  std::string path;
  bool token_file = false;  ///< false: a text file, one token per byte
  int width = 1;            ///< bytes per token on disk: 1 (text), 2 or 4
  int64_t vocab = 256;      ///< every token id is below it
  uint64_t tokens = 0;
  std::string tokenizer;  ///< a token file's tokenizer model (absolute path); "" = none
};

/// A token file is recognised by its sidecar, PATH + ".json"; anything else is text. Throws
/// data_error naming the file when it is missing, not a regular file, empty, when a token
/// file's size is not a multiple of its token width or disagrees with its sidecar's count,
/// or when the sidecar is malformed.
corpus_file describe_corpus(const std::string& path);

/// The tokens of one file, mapped read-only and shared through the page cache (or held in
/// memory for a corpus made up by a test).
class token_source;

/// A corpus's training and validation tokens. Training windows come from the training file;
/// validation windows from a validation file when one is given, else from the last
/// floor(tokens * val_fraction) tokens of the training file. Sampling never depends on the
/// world size or rank, so any partition of a step's global batch sees the same windows.
class token_dataset {
 public:
  /// Maps `path` (and `val_path`, "" = a held-out share of `path`). `context` (T), when
  /// positive, is checked now: each split must hold at least T + 1 tokens. Throws
  /// data_error if a file is unusable (describe_corpus), val_fraction is outside [0, 1)
  /// without a validation file, or the two files' vocabularies differ.
  static token_dataset open(const std::string& path, double val_fraction, int context = 0,
                            const std::string& val_path = "");

  /// A byte corpus already in memory (tests, synthetic corpora).
  static token_dataset from_bytes(std::vector<uint8_t> bytes, double val_fraction,
                                  std::string name = "<memory>");
  /// Token ids already in memory, each below `vocab` (tests).
  static token_dataset from_tokens(std::vector<token_id> tokens, int64_t vocab, double val_fraction,
                                   std::string name = "<memory>");

  size_t train_size() const { return train_size_; }
  size_t val_size() const { return val_size_; }
  int64_t vocab() const;
  const std::string& path() const;

  /// Fills `count` samples of training step `step`, global indices first_sample ..
  /// first_sample + count - 1. Sample i is the window of T + 1 tokens at an offset hashed
  /// from (seed, step, i): inputs get tokens [0, T), targets tokens [1, T + 1). inputs and
  /// targets hold count * T ids each. Throws data_error if T + 1 tokens do not fit in the
  /// training split, or a token id read is not below the vocabulary (a file that does not
  /// match its sidecar).
  void fill_train(uint64_t seed, int64_t step, int first_sample, int count, int T, token_id* inputs,
                  token_id* targets) const;

  /// Same for validation micro-batch `batch`, from the validation split.
  void fill_val(uint64_t seed, int batch, int first_sample, int count, int T, token_id* inputs,
                token_id* targets) const;

  /// Tokens [offset, offset + n) of the training file, widened, each checked against the
  /// vocabulary as fill_train checks them (corpus_plan.cpp reads a whole file so).
  void read(uint64_t offset, size_t n, token_id* out) const;

  /// Token offset of training sample i of `step` in the training file (exposed for tests).
  size_t train_offset(uint64_t seed, int64_t step, int i, int T) const;
  /// Token offset of validation sample i of micro-batch `batch` in the validation tokens'
  /// file (the training file when they are its held-out share).
  size_t val_offset(uint64_t seed, int batch, int i, int T) const;

 private:
  token_dataset(std::shared_ptr<const token_source> train, size_t train_size,
                std::shared_ptr<const token_source> val, size_t val_begin, size_t val_size);

  /// Offset of a T + 1 token window chosen by hash h inside split [begin, begin + size).
  size_t window_offset(uint64_t h, size_t begin, size_t size, int T, const char* split) const;
  void fill(const token_source& from, size_t offset, int T, token_id* inputs,
            token_id* targets) const;

  std::shared_ptr<const token_source> train_, val_;
  size_t train_size_ = 0;  ///< tokens [0, train_size_) of train_ are training
  size_t val_begin_ = 0;   ///< tokens [val_begin_, val_begin_ + val_size_) of val_ validation
  size_t val_size_ = 0;
};

}  // namespace troupe
