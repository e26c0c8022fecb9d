#pragma once
// Internal to `troupe tokenize` (cli/tokenize_*.cpp): what its parts share — the name its
// messages begin with, its two kinds of failure, the options its command line gives, and the
// progress line of a long pass over the corpus.

#include <sentencepiece_processor.h>

#include <bit>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cli/command_line.hpp"

namespace troupe::cli::tokenize {

/// What every message of the command begins with.
inline const std::string command = "troupe tokenize";

// Token files are little-endian, and ids are copied to and from them as the CPU stores them.
static_assert(std::endian::native == std::endian::little, "token ids are copied as stored");

/// A failure while working, not in what the user gave: exit 1.
class tool_failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The user's mistake: "troupe tokenize: WHAT", exit 2.
[[nodiscard]] usage_error bad_input(const std::string& what);

/// strerror(e), for messages.
[[nodiscard]] std::string errno_text(int e);

/// SentencePiece's message without the source location and the failed check before it
/// ("./src/x.cc(12) [a == b] Vocabulary size too high" -> "Vocabulary size too high").
[[nodiscard]] std::string spm_message(const sentencepiece::util::Status& status);

/// "812.0 MB": bytes in decimal megabytes, as the messages give sizes.
[[nodiscard]] std::string megabytes(uint64_t bytes);

/// What the command line asks for (cli/tokenize_tool.cpp parses it).
struct tokenize_options {
  std::string corpus, out_dir;
  int64_t vocab = 0;
  std::string model_type = "bpe";
  double val_fraction = 0.05;
  double sample_mb = 64;
  std::string tokenizer;  ///< --tokenizer: encode with this model, train none
  int threads = 0;
  bool check = false;
  std::string decode;  ///< --decode TOKENS.bin
};

/// "troupe tokenize: encoding train.bin: 812.0 MB of 3891.0 MB (97.1 MB/s)" on stderr, once a
/// second on a terminal (one line, redrawn) and every 10 s elsewhere; quiet for the first
/// second, so that short runs print nothing.
class progress {
 public:
  explicit progress(std::string what);
  ~progress();
  progress(const progress&) = delete;
  progress& operator=(const progress&) = delete;

  /// `done` of `total` bytes, shown if it is time to.
  void update(uint64_t done, uint64_t total);

 private:
  using steady = std::chrono::steady_clock;

  std::string what_;
  bool tty_;
  std::chrono::seconds period_;
  steady::time_point start_, last_{};
  bool drawn_ = false;
};

}  // namespace troupe::cli::tokenize
