#pragma once
// The byte corpus: one file split into train and validation bytes, and the sample
// windows of every step as a pure function of (seed, step, sample index).

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace troupe {

/// A corpus that cannot be used; the message names the path and what to do about it.
class data_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A byte-level corpus held in memory. The first (1 - val_fraction) of the file is the
/// training split and the rest the validation split. Sampling never depends on the world
/// size or rank, so any partition of a step's global batch sees the same windows.
class byte_dataset {
 public:
  /// Reads the whole file. `context` (T), when positive, is checked now: each split must
  /// hold at least T + 1 bytes. Throws data_error if the file is missing, unreadable or
  /// too small, or val_fraction is outside [0, 1).
  static byte_dataset open(const std::string& path, double val_fraction, int context = 0);

  /// Builds a dataset from bytes already in memory (tests, synthetic corpora).
  static byte_dataset from_bytes(std::vector<uint8_t> bytes, double val_fraction,
                                 std::string name = "<memory>");

  size_t train_size() const { return split_; }
  size_t val_size() const { return bytes_.size() - split_; }
  const std::string& path() const { return path_; }

  /// Fills `count` samples of training step `step`, global indices first_sample ..
  /// first_sample + count - 1. Sample i is the window of T + 1 bytes at an offset hashed
  /// from (seed, step, i): inputs get bytes [0, T), targets bytes [1, T + 1).
  /// inputs and targets hold count * T bytes each. Throws data_error if T + 1 bytes do
  /// not fit in the training split.
  void fill_train(uint64_t seed, int64_t step, int first_sample, int count, int T, uint8_t* inputs,
                  uint8_t* targets) const;

  /// Same for validation micro-batch `batch`, from the validation split.
  void fill_val(uint64_t seed, int batch, int first_sample, int count, int T, uint8_t* inputs,
                uint8_t* targets) const;

  /// Offset of training sample i of `step` in the file (exposed for tests).
  size_t train_offset(uint64_t seed, int64_t step, int i, int T) const;
  /// Offset of validation sample i of micro-batch `batch` in the file.
  size_t val_offset(uint64_t seed, int batch, int i, int T) const;

 private:
  byte_dataset(std::vector<uint8_t> bytes, size_t split, std::string path)
      : bytes_(std::move(bytes)), split_(split), path_(std::move(path)) {}

  /// Offset of a T + 1 byte window chosen by hash h inside split [begin, begin + size).
  size_t window_offset(uint64_t h, size_t begin, size_t size, int T, const char* split) const;

  std::vector<uint8_t> bytes_;
  size_t split_ = 0;  ///< bytes [0, split_) are training, [split_, size) validation
  std::string path_;
};

}  // namespace troupe
