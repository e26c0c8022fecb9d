#pragma once
// The file torch.save writes for an OrderedDict of tensors (PyTorch's zip serialization,
// readable by torch.load from 1.6 on), written without Python:
//
//   a zip archive of stored (uncompressed) entries, each entry's data 64-byte aligned by a
//   padding extra field ("FB", as PyTorch's own writer does):
//     archive/data.pkl      pickle (protocol 2) of collections.OrderedDict([(name, tensor)]),
//                           each tensor torch._utils._rebuild_tensor_v2(storage, 0, shape,
//                           stride, False, OrderedDict()) and each storage the persistent id
//                           ('storage', torch.FloatStorage, KEY, 'cpu', numel)
//     archive/data/KEY      a storage's values, little-endian float32
//     archive/version       "3\n"
//     archive/byteorder     "little"
//
// The metadata of a tensor_file, when there is any, is the dict's attribute troupe_metadata
// ({key: value}, strings), as a state_dict's _metadata is; load_state_dict does not read it.
// Not written yet: archives past 4 GiB (ZIP64); such a file is refused.

#include "checkpoint/export/tensor_file.hpp"

namespace troupe::ckpt {

/// Writes a tensor_file as torch.save would write its OrderedDict of tensors. Two names of
/// one tensor (export_tensor) share one storage, as the tied weights of a module's
/// state_dict do.
class torch_writer final : public tensor_file_writer {
 public:
  [[nodiscard]] std::string_view format() const override { return "torch"; }
  void write(const tensor_file& file, const byte_sink& out) const override;
};

/// CRC-32 (ISO-HDLC, the zip format's) of `size` bytes, continuing from `crc` (0 to start).
uint32_t crc32(const void* data, size_t size, uint32_t crc = 0);

}  // namespace troupe::ckpt
