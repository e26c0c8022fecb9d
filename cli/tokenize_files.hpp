#pragma once
// Internal to `troupe tokenize`: the files it reads (the corpus, a tokenizer, token files) and
// writes (the token files, their sidecars, the tokenizer), so that a reader can share a file
// and a crash never leaves half a file under its final name.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace troupe::cli::tokenize {

/// A file read with pread only (several readers may share it).
class input_file {
 public:
  /// Opens `path`, a regular file with something in it (`what` names it in messages: "corpus");
  /// anything else is the user's mistake (usage_error).
  input_file(const std::string& path, const std::string& what, bool may_be_empty = false);
  ~input_file();
  input_file(const input_file&) = delete;
  input_file& operator=(const input_file&) = delete;

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  /// Reads [offset, offset + n) whole. Throws tool_failure.
  void read_at(uint64_t offset, char* into, size_t n) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// A file written under a temporary name beside its final one and renamed there by commit(),
/// so that the final name never holds half a file; dropped uncommitted, the temporary goes.
class output_file {
 public:
  /// Throws tool_failure when the temporary cannot be made.
  explicit output_file(std::string path);
  ~output_file();
  output_file(const output_file&) = delete;
  output_file& operator=(const output_file&) = delete;

  /// Appends `bytes`. Throws tool_failure.
  void write(std::string_view bytes);
  /// Flushed to disk and closed; still under the temporary name.
  void finish();
  /// Under its final name.
  void commit();
  uint64_t written() const { return written_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_, temp_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool committed_ = false;
};

/// `path` gone, whether it was there or not. Throws tool_failure.
void remove_if_there(const std::string& path);

/// OUT_DIR made if missing and shown writable now, before any long work (usage_error if not).
void prepare_out_dir(const std::string& dir);

}  // namespace troupe::cli::tokenize
