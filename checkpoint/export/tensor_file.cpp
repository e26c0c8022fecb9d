// The writer factory, the checks every backend shares, and the atomic write.

#include "checkpoint/export/tensor_file.hpp"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>

#include "checkpoint/durable_io.hpp"
#include "checkpoint/export/safetensors_writer.hpp"
#include "checkpoint/export/torch_writer.hpp"

namespace troupe::ckpt {

namespace fs = std::filesystem;

std::unique_ptr<tensor_file_writer> make_tensor_file_writer(std::string_view format) {
  if (format == "safetensors") return std::make_unique<safetensors_writer>();
  if (format == "torch") return std::make_unique<torch_writer>();
  return nullptr;
}

std::vector<std::string_view> tensor_file_formats() { return {"safetensors", "torch"}; }

size_t numel_of(std::span<const int64_t> shape) {
  size_t n = 1;
  for (const int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("a tensor dimension is negative");
    const auto u = static_cast<size_t>(d);
    if (u != 0 && n > std::numeric_limits<size_t>::max() / u)
      throw std::invalid_argument("a tensor shape's size overflows");
    n *= u;
  }
  return n;
}

void validate_tensor_file(const tensor_file& file) {
  std::set<std::string_view> names;
  for (const export_tensor& t : file.tensors) {
    if (t.name.empty()) throw std::invalid_argument("a tensor has an empty name");
    if (!names.insert(t.name).second)
      throw std::invalid_argument("two tensors are named " + t.name);
    if (numel_of(t.shape) != t.values.size())
      throw std::invalid_argument("tensor " + t.name + " has " + std::to_string(t.values.size()) +
                                  " values, its shape says " + std::to_string(numel_of(t.shape)));
  }
  std::set<std::string_view> keys;
  for (const auto& [key, value] : file.metadata)
    if (!keys.insert(key).second) throw std::invalid_argument("two metadata entries are " + key);
}

void put_floats(const byte_sink& out, std::span<const float> values) {
  if constexpr (std::endian::native == std::endian::little) {
    out(values.data(), values.size_bytes());
  } else {
    constexpr size_t batch = 4096;
    unsigned char buffer[batch * 4];
    for (size_t i = 0; i < values.size(); i += batch) {
      const size_t n = std::min(batch, values.size() - i);
      for (size_t k = 0; k < n; ++k) {
        const auto bits = std::bit_cast<uint32_t>(values[i + k]);
        for (size_t b = 0; b < 4; ++b)
          buffer[k * 4 + b] = static_cast<unsigned char>((bits >> (8 * b)) & 0xFF);
      }
      out(buffer, n * 4);
    }
  }
}

uint64_t write_tensor_file(const tensor_file_writer& writer, const tensor_file& file,
                           const fs::path& path) {
  const fs::path temp = io::temp_path_for(path);
  io::unique_fd fd = io::create_temp(temp);
  uint64_t total = 0;
  try {
    // Small pieces (headers, pickle opcodes) are gathered; large ones go straight through.
    constexpr size_t buffer_bytes = size_t{1} << 20;
    std::vector<unsigned char> buffer;
    buffer.reserve(buffer_bytes);
    const auto flush = [&] {
      io::write_all(fd.get(), buffer.data(), buffer.size(), temp);
      buffer.clear();
    };
    writer.write(file, [&](const void* data, size_t size) {
      total += size;
      if (buffer.size() + size > buffer_bytes) flush();
      if (size >= buffer_bytes) {
        io::write_all(fd.get(), data, size, temp);
        return;
      }
      const auto* bytes = static_cast<const unsigned char*>(data);
      buffer.insert(buffer.end(), bytes, bytes + size);
    });
    flush();
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  io::publish(std::move(fd), temp, path);
  return total;
}

}  // namespace troupe::ckpt
