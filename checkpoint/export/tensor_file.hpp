#pragma once
// Named float32 tensors written as a file another framework reads (`troupe ckpt export`): the
// writer interface, its factory, and the one atomic write every backend goes through. The
// backends are safetensors_writer.hpp and torch_writer.hpp.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe::ckpt {

/// One tensor of a file: row-major float32 values and their shape. Two tensors whose values
/// are the same span (same memory, same length) are one tensor under two names, which a
/// format that can say so (torch) stores once.
struct export_tensor {
  std::string name;
  std::vector<int64_t> shape;     ///< [] for a scalar
  std::span<const float> values;  ///< product(shape) values, not owned
};

/// What a file holds: its tensors, in the order a format that keeps an order writes them, and
/// string metadata (unique keys).
struct tensor_file {
  std::vector<export_tensor> tensors;
  std::vector<std::pair<std::string, std::string>> metadata;
};

/// Receives a file's bytes, in order.
using byte_sink = std::function<void(const void* data, size_t size)>;

/// Writes a tensor_file in one format.
class tensor_file_writer {
 public:
  virtual ~tensor_file_writer() = default;
  /// The name make_tensor_file_writer knows it by.
  [[nodiscard]] virtual std::string_view format() const = 0;
  /// Writes the whole file to `out`. Throws std::invalid_argument when `file` is not valid
  /// (see validate_tensor_file) or holds what the format cannot say.
  virtual void write(const tensor_file& file, const byte_sink& out) const = 0;
};

/// The writer of `format` ("safetensors" or "torch"), nullptr for another name.
std::unique_ptr<tensor_file_writer> make_tensor_file_writer(std::string_view format);
/// The formats make_tensor_file_writer knows, for messages.
std::vector<std::string_view> tensor_file_formats();

/// The number of values of `shape` (1 for a scalar). Throws std::invalid_argument for a
/// negative dimension or a product that overflows.
size_t numel_of(std::span<const int64_t> shape);

/// Throws std::invalid_argument unless every tensor has a non-empty name of its own and as
/// many values as its shape says, and every metadata key is unique.
void validate_tensor_file(const tensor_file& file);

/// Writes `file` with `writer` to `path` atomically and durably (a temporary sibling, fsync,
/// rename over `path`, fsync of its directory): a reader finds the old file or the whole new
/// one, never a part. Returns the bytes written. Throws checkpoint_error (io) when the disk
/// refuses, std::invalid_argument as write does; no temporary file is left behind.
uint64_t write_tensor_file(const tensor_file_writer& writer, const tensor_file& file,
                           const std::filesystem::path& path);

/// Appends `values` to `out` as little-endian float32, whatever the machine's byte order.
void put_floats(const byte_sink& out, std::span<const float> values);

}  // namespace troupe::ckpt
