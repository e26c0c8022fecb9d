// safetensors: a length, a JSON header of dtypes, shapes and offsets, then the raw values.

#include "checkpoint/export/safetensors_writer.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "checkpoint/little_endian.hpp"

namespace troupe::ckpt {

namespace {

/// The tensors in the order their values are written: by name, byte for byte.
std::vector<const export_tensor*> sorted_tensors(const tensor_file& file) {
  std::vector<const export_tensor*> out;
  out.reserve(file.tensors.size());
  for (const export_tensor& t : file.tensors) out.push_back(&t);
  std::sort(out.begin(), out.end(),
            [](const export_tensor* a, const export_tensor* b) { return a->name < b->name; });
  return out;
}

}  // namespace

std::string safetensors_writer::header(const tensor_file& file) {
  validate_tensor_file(file);
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!file.metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : file.metadata) meta[key] = value;
    h["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const export_tensor* t : sorted_tensors(file)) {
    if (t->name == "__metadata__")
      throw std::invalid_argument("safetensors reserves the name __metadata__");
    const uint64_t end = offset + t->values.size_bytes();
    h[t->name] = {{"dtype", "F32"}, {"shape", t->shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = h.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  return text;
}

void safetensors_writer::write(const tensor_file& file, const byte_sink& out) const {
  const std::string text = header(file);
  unsigned char length[8];
  le::put(length, text.size(), sizeof length);
  out(length, sizeof length);
  out(text.data(), text.size());
  for (const export_tensor* t : sorted_tensors(file)) put_floats(out, t->values);
}

}  // namespace troupe::ckpt
