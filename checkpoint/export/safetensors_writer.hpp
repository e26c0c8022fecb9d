#pragma once
// The safetensors format, written from its specification
// (https://huggingface.co/docs/safetensors, "Format"):
//
//   8 bytes        N, the header's length, unsigned little-endian
//   N bytes        a JSON object: {"__metadata__": {string: string, ...},
//                  NAME: {"dtype": "F32", "shape": [...], "data_offsets": [BEGIN, END]}, ...}
//                  padded with spaces so that the data starts at a multiple of 8
//   the data       each tensor's values, row-major, little-endian, at [BEGIN, END) from the
//                  data's start; tensors sorted by name, each right after the one before

#include "checkpoint/export/tensor_file.hpp"

namespace troupe::ckpt {

/// Writes a tensor_file as safetensors. Every tensor is stored on its own: two names of one
/// tensor (export_tensor) are two copies, since the format has no aliasing.
class safetensors_writer final : public tensor_file_writer {
 public:
  [[nodiscard]] std::string_view format() const override { return "safetensors"; }
  void write(const tensor_file& file, const byte_sink& out) const override;
  /// The header as written: the JSON, padded, without the 8-byte length before it.
  [[nodiscard]] static std::string header(const tensor_file& file);
};

}  // namespace troupe::ckpt
