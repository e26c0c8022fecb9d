#pragma once
// Which samples of a map-style dataset a step trains on (docs/WORKLOAD.md "Determinism"): a
// pure function of (seed, data position, slot in the global batch), so any world, any rank, a
// redo and a resume all draw the same global batch, with no sampler state to checkpoint.
//
// Global slot k = data_position * G + slot is sample perm(seed, k / N)(k % N): each run of N
// consecutive slots (an epoch) visits every sample once, in an order of its own, and a batch
// may straddle two epochs. perm is a 4-round Feistel network on the bits of the smallest power
// of four >= N (two halves of equal width), keyed per round by hash_words(seed, epoch, round,
// tag); values that land outside [0, N) are encrypted again (cycle walking) until they land
// inside, which keeps a bijection of [0, N) and costs fewer than 4 encryptions per index on
// average (the power of four is less than 4N). Only 64-bit unsigned integer arithmetic: the same
// indices on every platform and compiler.

#include <array>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/data/random.hpp"
#include "runtime/workload/workload.hpp"

namespace troupe {

/// One epoch's keyed bijection of [0, n). Cheap to make (4 hashes), O(1) memory.
class epoch_permutation {
 public:
  /// `shuffle` false: the identity (a dataset read in order, epoch after epoch).
  epoch_permutation(uint64_t seed, int64_t epoch, int64_t n, bool shuffle)
      : n_(static_cast<uint64_t>(n)), shuffle_(shuffle) {
    while ((uint64_t{1} << (2 * half_bits_)) < n_) ++half_bits_;
    mask_ = (uint64_t{1} << half_bits_) - 1;
    for (uint64_t r = 0; r < keys_.size(); ++r)
      keys_[r] = hash_words(seed, static_cast<uint64_t>(epoch), r, key_tag);
  }

  /// The sample at position `i` (0 <= i < n) of this epoch.
  [[nodiscard]] int64_t operator()(int64_t i) const {
    if (!shuffle_) return i;
    uint64_t x = static_cast<uint64_t>(i);
    do x = encrypt(x);
    while (x >= n_);
    return static_cast<int64_t>(x);
  }

 private:
  /// Keeps these keys apart from every other use of hash_words(seed, ...) in troupe.
  static constexpr uint64_t key_tag = 0x73616d706c6572ULL;  // "sampler"

  [[nodiscard]] uint64_t encrypt(uint64_t x) const {
    uint64_t left = x >> half_bits_;
    uint64_t right = x & mask_;
    for (const uint64_t key : keys_) {
      const uint64_t next = left ^ (splitmix64(key ^ right) & mask_);
      left = right;
      right = next;
    }
    return (left << half_bits_) | right;
  }

  uint64_t n_;
  bool shuffle_;
  int half_bits_ = 0;
  uint64_t mask_ = 0;
  std::array<uint64_t, 4> keys_{};
};

/// troupe's sampler over a dataset of `dataset_size` samples for a job whose steps take
/// `global_batch` samples each. Immutable once made (the arguments are checked once).
class sampler {
 public:
  /// Largest dataset: the Feistel halves must fit 31 bits each.
  static constexpr int64_t max_dataset_size = int64_t{1} << 62;

  /// Throws std::invalid_argument naming the value for dataset_size outside
  /// [1, max_dataset_size] or global_batch <= 0.
  sampler(uint64_t seed, int64_t dataset_size, int global_batch, bool shuffle = true)
      : seed_(seed), dataset_size_(dataset_size), global_batch_(global_batch), shuffle_(shuffle) {
    if (dataset_size <= 0 || dataset_size > max_dataset_size)
      throw std::invalid_argument("sampler: dataset_size must be in [1, 2^62], not " +
                                  std::to_string(dataset_size));
    if (global_batch <= 0)
      throw std::invalid_argument("sampler: global_batch must be positive, not " +
                                  std::to_string(global_batch));
  }

  [[nodiscard]] uint64_t seed() const { return seed_; }
  [[nodiscard]] int64_t dataset_size() const { return dataset_size_; }
  [[nodiscard]] int global_batch() const { return global_batch_; }
  [[nodiscard]] bool shuffle() const { return shuffle_; }

  /// Epoch `epoch`'s order of the dataset.
  [[nodiscard]] epoch_permutation permutation(int64_t epoch) const {
    return {seed_, epoch, dataset_size_, shuffle_};
  }

  /// The dataset index of slot `slot` (0 <= slot < global_batch) of the global batch at
  /// `data_position` (>= 0). Throws std::invalid_argument for arguments out of range, or a
  /// global slot beyond 2^63.
  [[nodiscard]] int64_t index(int64_t data_position, int slot) const {
    const int64_t k = global_slot(data_position, slot);
    return permutation(k / dataset_size_)(k % dataset_size_);
  }

  /// The dataset indices of `share`'s slots [first, first + count) of the global batch at
  /// `data_position`, in slot order (share.micro_batch only cuts them, it does not reorder).
  [[nodiscard]] std::vector<int64_t> indices(int64_t data_position, sample_span share) const {
    if (share.first < 0 || share.count < 0 || share.first > global_batch_ - share.count)
      throw std::invalid_argument("sampler: share [" + std::to_string(share.first) + ", +" +
                                  std::to_string(share.count) + ") is not within a batch of " +
                                  std::to_string(global_batch_));
    std::vector<int64_t> out;
    out.reserve(static_cast<size_t>(share.count));
    if (share.count == 0) return out;
    (void)global_slot(data_position, share.first + share.count - 1);  // checks the last too
    int64_t k = global_slot(data_position, share.first);
    // One permutation per epoch the share touches (at most two unless G > N).
    int64_t epoch = k / dataset_size_;
    epoch_permutation perm = permutation(epoch);
    for (int i = 0; i < share.count; ++i, ++k) {
      if (k / dataset_size_ != epoch) perm = permutation(epoch = k / dataset_size_);
      out.push_back(perm(k % dataset_size_));
    }
    return out;
  }

 private:
  [[nodiscard]] int64_t global_slot(int64_t data_position, int slot) const {
    if (slot < 0 || slot >= global_batch_)
      throw std::invalid_argument("sampler: slot " + std::to_string(slot) +
                                  " is not within a batch of " + std::to_string(global_batch_));
    if (data_position < 0)
      throw std::invalid_argument("sampler: data_position must be >= 0, not " +
                                  std::to_string(data_position));
    if (data_position > (std::numeric_limits<int64_t>::max() - slot) / global_batch_)
      throw std::invalid_argument("sampler: data_position " + std::to_string(data_position) +
                                  " is beyond the last batch a 64-bit slot can number");
    return data_position * global_batch_ + slot;
  }

  uint64_t seed_;
  int64_t dataset_size_;
  int global_batch_;
  bool shuffle_;
};

}  // namespace troupe
