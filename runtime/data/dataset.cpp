#include "runtime/data/dataset.hpp"

#include <cmath>
#include <cstring>
#include <fstream>

#include "runtime/data/random.hpp"

namespace troupe {
namespace {

// Stream tags keep the training and validation hashes independent for equal (seed, index).
constexpr uint64_t train_stream = 0x7472'6169'6eULL;  // "train"
constexpr uint64_t val_stream = 0x76'616cULL;         // "val"

void check_fill_args(int first_sample, int count, int T) {
  if (first_sample < 0 || count < 0 || T <= 0) {
    throw std::invalid_argument("byte_dataset: need first_sample >= 0, count >= 0 and T > 0");
  }
}

}  // namespace

byte_dataset byte_dataset::open(const std::string& path, double val_fraction, int context) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw data_error("cannot open corpus '" + path +
                     "': check the path (config key 'data'), or build the default corpus with "
                     "scripts/make_corpus.sh");
  }
  std::vector<uint8_t> bytes;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) throw data_error("cannot read the size of corpus '" + path + "'");
  in.seekg(0, std::ios::beg);
  bytes.resize(static_cast<size_t>(size));
  if (size > 0 && !in.read(reinterpret_cast<char*>(bytes.data()), size)) {
    throw data_error("cannot read corpus '" + path + "': I/O error after " +
                     std::to_string(in.gcount()) + " of " + std::to_string(size) + " bytes");
  }
  byte_dataset d = from_bytes(std::move(bytes), val_fraction, path);
  if (context > 0) {
    const size_t need = static_cast<size_t>(context) + 1;
    if (d.train_size() < need || d.val_size() < need) {
      throw data_error("corpus '" + path + "' is too small: its training split has " +
                       std::to_string(d.train_size()) + " bytes and its validation split " +
                       std::to_string(d.val_size()) +
                       ", each needs at least context + 1 = " + std::to_string(need) +
                       "; use a larger file, a smaller model.context or "
                       "another val_fraction");
    }
  }
  return d;
}

byte_dataset byte_dataset::from_bytes(std::vector<uint8_t> bytes, double val_fraction,
                                      std::string name) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    throw data_error("val_fraction must lie in [0, 1) for corpus '" + name + "', got " +
                     std::to_string(val_fraction));
  }
  if (bytes.empty()) throw data_error("corpus '" + name + "' is empty: give a non-empty text file");
  const auto val =
      static_cast<size_t>(std::floor(static_cast<double>(bytes.size()) * val_fraction));
  const size_t split = bytes.size() - val;
  return byte_dataset(std::move(bytes), split, std::move(name));
}

size_t byte_dataset::window_offset(uint64_t h, size_t begin, size_t size, int T,
                                   const char* split) const {
  const size_t window = static_cast<size_t>(T) + 1;
  if (size < window) {
    throw data_error("corpus '" + path_ + "': the " + split + " split has " + std::to_string(size) +
                     " bytes, fewer than a window of T + 1 = " + std::to_string(window) +
                     "; use a larger file or a smaller context");
  }
  // Modulo bias is below size / 2^64: irrelevant for any corpus that fits in memory.
  return begin + static_cast<size_t>(h % (size - window + 1));
}

size_t byte_dataset::train_offset(uint64_t seed, int64_t step, int i, int T) const {
  const uint64_t h =
      hash_words(seed, train_stream, static_cast<uint64_t>(step), static_cast<uint64_t>(i));
  return window_offset(h, 0, train_size(), T, "training");
}

size_t byte_dataset::val_offset(uint64_t seed, int batch, int i, int T) const {
  const uint64_t h =
      hash_words(seed, val_stream, static_cast<uint64_t>(batch), static_cast<uint64_t>(i));
  return window_offset(h, split_, val_size(), T, "validation");
}

void byte_dataset::fill_train(uint64_t seed, int64_t step, int first_sample, int count, int T,
                              uint8_t* inputs, uint8_t* targets) const {
  check_fill_args(first_sample, count, T);
  for (int s = 0; s < count; ++s) {
    const uint8_t* w = bytes_.data() + train_offset(seed, step, first_sample + s, T);
    std::memcpy(inputs + static_cast<size_t>(s) * T, w, static_cast<size_t>(T));
    std::memcpy(targets + static_cast<size_t>(s) * T, w + 1, static_cast<size_t>(T));
  }
}

void byte_dataset::fill_val(uint64_t seed, int batch, int first_sample, int count, int T,
                            uint8_t* inputs, uint8_t* targets) const {
  check_fill_args(first_sample, count, T);
  for (int s = 0; s < count; ++s) {
    const uint8_t* w = bytes_.data() + val_offset(seed, batch, first_sample + s, T);
    std::memcpy(inputs + static_cast<size_t>(s) * T, w, static_cast<size_t>(T));
    std::memcpy(targets + static_cast<size_t>(s) * T, w + 1, static_cast<size_t>(T));
  }
}

}  // namespace troupe
