// The export writers' bytes: safetensors' length, padded header and contiguous sorted data;
// torch's zip of stored, 64-byte aligned entries with correct CRCs, a pickle that shares one
// storage between two names of one tensor; the atomic write; refusals of invalid files.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/export/safetensors_writer.hpp"
#include "checkpoint/export/tensor_file.hpp"
#include "checkpoint/export/torch_writer.hpp"
#include "checkpoint/little_endian.hpp"

namespace troupe::ckpt {
namespace {

namespace fs = std::filesystem;

std::string written(const tensor_file_writer& w, const tensor_file& f) {
  std::string out;
  w.write(f, [&](const void* data, size_t n) { out.append(static_cast<const char*>(data), n); });
  return out;
}

uint64_t get(const std::string& s, size_t at, size_t bytes) {
  return le::get(reinterpret_cast<const unsigned char*>(s.data() + at), bytes);
}

struct sample {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<float> b = {-1.5f};
  tensor_file file;
  sample() {
    file.tensors = {{"z.weight", {2, 3}, a}, {"a.bias", {1}, b}, {"tied", {2, 3}, a}};
    file.metadata = {{"format", "pt"}, {"note", "say \"hi\""}};
  }
};

TEST(Safetensors, HeaderIsPaddedJsonAndDataIsSortedAndContiguous) {
  sample s;
  const std::string bytes = written(safetensors_writer(), s.file);
  const uint64_t n = get(bytes, 0, 8);
  ASSERT_EQ((8 + n) % 8, 0u);
  ASSERT_LE(8 + n, bytes.size());
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
  const auto h = nlohmann::json::parse(header);
  EXPECT_EQ(h["__metadata__"]["note"], "say \"hi\"");
  EXPECT_EQ(h["a.bias"]["dtype"], "F32");
  EXPECT_EQ(h["a.bias"]["data_offsets"], nlohmann::json::array({0, 4}));
  EXPECT_EQ(h["tied"]["data_offsets"], nlohmann::json::array({4, 28}));  // a copy: no aliasing
  EXPECT_EQ(h["z.weight"]["data_offsets"], nlohmann::json::array({28, 52}));
  EXPECT_EQ(h["z.weight"]["shape"], nlohmann::json::array({2, 3}));
  ASSERT_EQ(bytes.size(), 8 + n + 52);
  float v[6];
  std::memcpy(v, bytes.data() + 8 + n + 28, sizeof v);
  EXPECT_EQ(std::vector<float>(v, v + 6), s.a);
  EXPECT_EQ(safetensors_writer::header(s.file), header);
}

TEST(TorchZip, Crc32OfTheCheckValue) {
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);
  EXPECT_EQ(crc32("6789", 4, crc32("12345", 5)), 0xCBF43926u);  // continues
}

/// The entries of a stored zip, read through its central directory.
std::map<std::string, std::string> unzip(const std::string& zip) {
  const size_t end = zip.size() - 22;
  EXPECT_EQ(get(zip, end, 4), 0x06054b50u);
  const uint64_t entries = get(zip, end + 10, 2);
  size_t at = get(zip, end + 16, 4);
  std::map<std::string, std::string> out;
  for (uint64_t i = 0; i < entries; ++i) {
    EXPECT_EQ(get(zip, at, 4), 0x02014b50u);
    const uint64_t crc = get(zip, at + 16, 4), size = get(zip, at + 24, 4);
    const uint64_t name_len = get(zip, at + 28, 2), local = get(zip, at + 42, 4);
    const std::string name = zip.substr(at + 46, name_len);
    EXPECT_EQ(get(zip, at + 10, 2), 0u) << name << ": stored, not compressed";
    EXPECT_EQ(get(zip, local, 4), 0x04034b50u);
    const size_t data = local + 30 + get(zip, local + 26, 2) + get(zip, local + 28, 2);
    EXPECT_EQ(data % 64, 0u) << name << " is not 64-byte aligned";
    EXPECT_EQ(zip.substr(local + 30 + name_len, 2), "FB");
    out[name] = zip.substr(data, size);
    EXPECT_EQ(crc32(out[name].data(), size), crc) << name;
    at += 46 + name_len;
  }
  return out;
}

TEST(TorchZip, ArchiveHasThePickleOneStoragePerTensorAndTheVersion) {
  sample s;
  const auto entries = unzip(written(torch_writer(), s.file));
  ASSERT_EQ(entries.size(), 5u);  // data.pkl, 2 storages (tied shares one), version, byteorder
  EXPECT_EQ(entries.at("archive/version"), "3\n");
  EXPECT_EQ(entries.at("archive/byteorder"), "little");
  ASSERT_EQ(entries.at("archive/data/0").size(), 24u);
  ASSERT_EQ(entries.at("archive/data/1").size(), 4u);
  float v[6];
  std::memcpy(v, entries.at("archive/data/0").data(), sizeof v);
  EXPECT_EQ(std::vector<float>(v, v + 6), s.a);
  const std::string& pickle = entries.at("archive/data.pkl");
  EXPECT_EQ(pickle.substr(0, 2), std::string("\x80\x02", 2));
  EXPECT_EQ(pickle.back(), '.');
  for (const char* word : {"collections\nOrderedDict\n", "torch._utils\n_rebuild_tensor_v2\n",
                           "torch\nFloatStorage\n", "troupe_metadata", "z.weight", "tied"})
    EXPECT_NE(pickle.find(word), std::string::npos) << word;
}

TEST(TensorFile, InvalidFilesAreRefused) {
  sample s;
  s.file.tensors[1].shape = {2};  // one value, the shape says two
  EXPECT_THROW(written(torch_writer(), s.file), std::invalid_argument);
  EXPECT_THROW(written(safetensors_writer(), s.file), std::invalid_argument);
  sample d;
  d.file.tensors[2].name = "z.weight";
  EXPECT_THROW(written(safetensors_writer(), d.file), std::invalid_argument);
  EXPECT_EQ(make_tensor_file_writer("onnx"), nullptr);
  EXPECT_EQ(make_tensor_file_writer("torch")->format(), "torch");
  EXPECT_THROW(numel_of(std::vector<int64_t>{2, -1}), std::invalid_argument);
}

TEST(TensorFile, WritesAtomicallyAndLeavesNothingOnFailure) {
  const fs::path dir = fs::temp_directory_path() / ("troupe-export-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path out = dir / "model.safetensors";
  sample s;
  const uint64_t n = write_tensor_file(safetensors_writer(), s.file, out);
  EXPECT_EQ(fs::file_size(out), n);
  s.file.tensors[0].shape = {7};
  EXPECT_THROW(write_tensor_file(torch_writer(), s.file, out), std::invalid_argument);
  EXPECT_EQ(fs::file_size(out), n);  // the old file stays whole
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  EXPECT_THROW(write_tensor_file(safetensors_writer(), sample().file, dir / "no" / "such"),
               checkpoint_error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe::ckpt
