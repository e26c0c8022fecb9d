// Manifest format 3, a general workload's state: tensors of any dtype, each in its own state
// array (non-f32 ones carried as one row of 4-byte words), named counters and an extras
// document; written through the same shard writer and read back byte for byte. Damage in a
// chunk or in any new field is refused naming it, and format 2 (the GPT's) is unchanged.

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/chunk_file.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/manifest_fields.hpp"
#include "tests/checkpoint/test_support.hpp"

namespace troupe::ckpt {
namespace {

namespace fs = std::filesystem;
using doc_json = manifest_json::detail::doc_json;

/// One tensor of the test workload and the bytes it holds.
struct held {
  tensor_entry entry;
  std::vector<unsigned char> bytes;
};

/// A workload's state as a Python job declares it: each tensor in one array, of mixed
/// dtypes, scalars and odd sizes included, laid out one after the other in words.
std::vector<held> workload_state(unsigned seed) {
  std::vector<held> out;
  size_t offset = 0;
  const auto add = [&](std::string name, std::string array, std::vector<int64_t> shape,
                       dtype type) {
    held h;
    h.entry = {std::move(name), std::move(shape), offset, std::move(array), type};
    size_t numel = 1;
    for (int64_t d : h.entry.shape) numel *= static_cast<size_t>(d);
    h.bytes.resize(numel * dtype_bytes(type));
    for (size_t i = 0; i < h.bytes.size(); ++i)
      h.bytes[i] = static_cast<unsigned char>((i * 37 + seed + offset) & 0xff);
    if (type == dtype::boolean)
      for (auto& b : h.bytes) b &= 1;
    offset += h.entry.words();
    out.push_back(std::move(h));
  };
  add("model/fc.weight", "model", {3, 5}, dtype::f32);
  add("model/mask", "model", {7}, dtype::boolean);     // 7 bytes: 2 words, one byte padding
  add("optim/state/0/step", "optim", {}, dtype::i64);  // a scalar of 8 bytes: 2 words
  add("optim/scale", "optim", {}, dtype::f32);         // an f32 scalar: 1 word
  add("extra/counts", "extra", {3}, dtype::i64);
  add("extra/half", "extra", {3}, dtype::f16);  // 6 bytes: 2 words, two bytes padding
  return out;
}

size_t total_words(const std::vector<held>& state) {
  return state.back().entry.offset + state.back().entry.words();
}

/// One buffer of words per state array (model, optim, extra), each tensor at its offset.
std::vector<std::vector<float>> buffers_of(const std::vector<held>& state,
                                           const std::vector<std::string>& arrays) {
  std::vector<std::vector<float>> out(3, std::vector<float>(total_words(state), 0.0f));
  for (const held& h : state) {
    for (size_t a = 0; a < arrays.size(); ++a) {
      if (arrays[a] != h.entry.array) continue;
      std::memcpy(out[a].data() + h.entry.offset, h.bytes.data(), h.bytes.size());
    }
  }
  return out;
}

const std::vector<std::string> all_arrays = {"model", "optim", "extra"};

manifest table_of(const std::vector<held>& state, int64_t step) {
  manifest m;
  m.format_version = workload_format_version;
  m.step = step;
  m.world = 1;
  m.global_numel = total_words(state);
  m.seed = 7;
  m.layout = "python dp1";
  m.chunk_floats = 4;
  m.config_json = "{}";
  for (const held& h : state) m.tensors.push_back(h.entry);
  m.arrays = all_arrays;
  m.counters = {{"step", step}, {"epoch", -2}};
  m.extras_json = R"({"troupe":{"sampler":{"length":100,"shuffle":true}},"lr":0.001})";
  return m;
}

/// Writes `state` at `step` through the shard writer and commits a format 3 manifest.
manifest write_workload(const std::string& run_dir, const std::vector<held>& state, int64_t step) {
  manifest m = table_of(state, step);
  const auto writer = make_fs_shard_writer(run_dir, 16);  // 4 words per chunk: many chunks
  m.chunk_floats = writer->chunk_floats();
  const auto buffers = buffers_of(state, all_arrays);
  const std::span<const float> bufs[] = {buffers[0], buffers[1], buffers[2]};
  snapshot snap;
  snap.step = step;
  capture(full_state_map(m), bufs, snap);
  m.pieces = writer->write(snap).pieces;
  commit_manifest(run_dir, m);
  return m;
}

/// Restores every array of checkpoint `m` whole.
std::vector<std::vector<float>> read_back(const std::string& run_dir, const manifest& m) {
  std::vector<std::vector<float>> out(3, std::vector<float>(m.global_numel, 0.0f));
  const std::span<float> bufs[] = {out[0], out[1], out[2]};
  restore_into(run_dir, m, full_state_map(m), bufs);
  return out;
}

TEST(Format3, WordsOfATensorArePaddedToWholeWords) {
  const auto words = [](std::vector<int64_t> shape, dtype type) {
    return tensor_entry{"t", std::move(shape), 0, "model", type}.words();
  };
  EXPECT_EQ(words({3, 5}, dtype::f32), 15u);
  EXPECT_EQ(words({}, dtype::f32), 1u);
  EXPECT_EQ(words({}, dtype::i64), 2u);
  EXPECT_EQ(words({7}, dtype::boolean), 2u);
  EXPECT_EQ(words({3}, dtype::f16), 2u);
  EXPECT_EQ(words({2, 3}, dtype::bf16), 3u);
  EXPECT_EQ(words({5}, dtype::u8), 2u);
  EXPECT_EQ(words({0}, dtype::i8), 0u);
  EXPECT_EQ(words({3}, dtype::f64), 6u);
  // A non-f32 tensor is one row of words; an f32 tensor keeps its matrix view.
  const tensor_entry mask{"m", {4, 7}, 0, "model", dtype::boolean};
  EXPECT_EQ(mask.matrix(), (std::pair<int64_t, int64_t>{1, 7}));
  const tensor_entry w{"w", {4, 7}, 0, "model", dtype::f32};
  EXPECT_EQ(w.matrix(), (std::pair<int64_t, int64_t>{4, 7}));
}

TEST(Format3, AWorkloadStateRoundTripsByteForByte) {
  testing::temp_dir dir;
  const auto state = workload_state(1);
  const manifest written = write_workload(dir.str(), state, 5);
  const manifest m = read_manifest(dir.str(), 5);
  EXPECT_EQ(m, written);
  EXPECT_EQ(m.format_version, 3);
  EXPECT_EQ(m.state_arrays(), all_arrays);
  EXPECT_EQ(m.state_counters(), (std::vector<counter_entry>{{"step", 5}, {"epoch", -2}}));
  EXPECT_EQ(nlohmann::json::parse(m.extras_json)["troupe"]["sampler"]["length"], 100);
  ASSERT_EQ(m.tensors.size(), state.size());
  for (size_t i = 0; i < state.size(); ++i) EXPECT_EQ(m.tensors[i], state[i].entry);

  const auto back = read_back(dir.str(), m);
  for (const held& h : state) {
    const size_t a = static_cast<size_t>(
        std::find(all_arrays.begin(), all_arrays.end(), h.entry.array) - all_arrays.begin());
    const auto* bytes = reinterpret_cast<const unsigned char*>(back[a].data() + h.entry.offset);
    EXPECT_EQ(std::vector<unsigned char>(bytes, bytes + h.bytes.size()), h.bytes) << h.entry.name;
    // The padding of the last word travels as the zeros it was written as.
    for (size_t b = h.bytes.size(); b < h.entry.words() * 4; ++b)
      EXPECT_EQ(bytes[b], 0) << h.entry.name;
  }
  // Each tensor lives in its own array only: the others hold nothing of it.
  const held& mask = state[1];
  EXPECT_EQ(back[1][mask.entry.offset], 0.0f);
  EXPECT_EQ(back[2][mask.entry.offset], 0.0f);
  // The checkpoint reads back intact as a whole, chunk by chunk.
  EXPECT_TRUE(verify_checkpoint(dir.str(), 5).empty());
}

TEST(Format3, AFlippedByteInAChunkIsFoundNamingTheTensor) {
  testing::temp_dir dir;
  const manifest m = write_workload(dir.str(), workload_state(2), 3);
  const saved_piece& first = m.pieces.front();
  ASSERT_EQ(first.tensor, "model/fc.weight");
  const fs::path chunk = chunk_file::path_of(dir.str(), first.chunks.front());
  auto bytes = testing::read_bytes(chunk);
  bytes[chunk_file::header_bytes + 1] ^= 0x10;
  testing::write_bytes(chunk, bytes);
  testing::expect_error([&] { read_back(dir.str(), m); }, error_kind::corrupt,
                        "model of model/fc.weight");
  EXPECT_FALSE(verify_checkpoint(dir.str(), 3).empty());
}

/// The manifest of checkpoint `step` as a document, to damage and seal again.
doc_json manifest_doc(const std::string& run_dir, int64_t step) {
  const auto bytes = testing::read_bytes(testing::step_path(run_dir, step) / "manifest.json");
  doc_json doc = doc_json::parse(bytes.begin(), bytes.end());
  doc.erase(manifest_json::detail::seal_key);
  return doc;
}

/// `doc` sealed, so that only the field checks can refuse it.
std::string sealed(doc_json doc) {
  doc.erase(manifest_json::detail::seal_key);
  doc[manifest_json::detail::seal_key] = manifest_json::detail::seal_of(doc);
  return doc.dump();
}

void expect_refused(const std::string& text, const std::string& needle) {
  testing::expect_error([&] { manifest_json::from_json(text, "manifest.json"); },
                        error_kind::corrupt, needle);
}

TEST(Format3, DamagedFieldsAreRefusedNamingThem) {
  testing::temp_dir dir;
  write_workload(dir.str(), workload_state(3), 4);
  const doc_json clean = manifest_doc(dir.str(), 4);
  EXPECT_NO_THROW(manifest_json::from_json(sealed(clean), "manifest.json"));

  doc_json d = clean;
  d["tensors"][1]["dtype"] = "b00l";
  expect_refused(sealed(d), "tensors/1/dtype");
  d = clean;
  d["tensors"][1]["dtype"] = 3;
  expect_refused(sealed(d), "tensors/1/dtype");
  d = clean;
  d["tensors"][0]["array"] = "weights";
  expect_refused(sealed(d), "\"weights\"");
  d = clean;
  d["arrays"] = {"model", "optim", "moments"};
  expect_refused(sealed(d), "unknown state array \"moments\"");
  d = clean;
  d["arrays"] = {"model", "optim", "extra", "model"};
  expect_refused(sealed(d), "names model twice");
  d = clean;
  d["extras"]["blob"] = std::string(state_view::max_extras_bytes, 'x');
  expect_refused(sealed(d), "\"extras\"");
  d = clean;
  d["extras"] = {1, 2, 3};
  expect_refused(sealed(d), "\"extras\" is not an object");
  d = clean;
  d["counters"]["step"] = 1.5;
  expect_refused(sealed(d), "counters/step");
  d = clean;
  d["counters"]["step"] = "4";
  expect_refused(sealed(d), "counters/step");
  d = clean;
  d["counters"]["step"] = std::numeric_limits<uint64_t>::max();
  expect_refused(sealed(d), "counters/step");
  d = clean;
  d["counters"] = {1, 2};
  expect_refused(sealed(d), "\"counters\" is not an object");
  d = clean;
  d["tensors"][0]["shape"] = {2147483647, 2147483647, 2147483647};
  expect_refused(sealed(d), "larger than the whole layout");
  d = clean;
  d["tensors"][1]["name"] = "model/fc.weight";
  expect_refused(sealed(d), "appears twice");
  d = clean;
  d.erase("counters");
  expect_refused(sealed(d), "\"counters\" is missing");
  // A counter named twice: the parsed document keeps one, so the seal still matches, and
  // only the duplicate itself can be refused.
  std::string text = sealed(clean);
  text.replace(text.find("\"counters\":{"), 12, "\"counters\":{\"step\":4,");
  expect_refused(text, "counters/step\" appears twice");
}

TEST(Format3, AWriterThatIsHandedAFormat3TableCannotWriteFormat2) {
  testing::temp_dir dir;
  manifest m = table_of(workload_state(4), 1);
  EXPECT_EQ(required_format_version(m), workload_format_version);
  m.format_version = format_version;
  testing::expect_error([&] { commit_manifest(dir.str(), m); }, error_kind::invalid_argument,
                        "format 3 can");
  // A caller's extras must be a JSON object within the bound, or nothing is written.
  manifest bad = table_of(workload_state(4), 1);
  bad.extras_json = "[1]";
  testing::expect_error([&] { manifest_json::validate(bad, "m", error_kind::invalid_argument); },
                        error_kind::invalid_argument, "extras is not a JSON object");
  bad.extras_json = "{\"a\":\"" + std::string(state_view::max_extras_bytes, 'x') + "\"}";
  testing::expect_error([&] { manifest_json::validate(bad, "m", error_kind::invalid_argument); },
                        error_kind::invalid_argument, "extras is larger");
  bad = table_of(workload_state(4), 1);
  bad.adam_t = 3;  // format 3 has no such field: it would be dropped
  testing::expect_error([&] { manifest_json::validate(bad, "m", error_kind::invalid_argument); },
                        error_kind::invalid_argument, "keeps it in counters");
  bad = table_of(workload_state(4), 1);
  bad.counters.push_back({"step", 1});
  testing::expect_error([&] { manifest_json::validate(bad, "m", error_kind::invalid_argument); },
                        error_kind::invalid_argument, "counters names step twice");
}

std::string corpus_file(const char* name) {
  const fs::path path = fs::path(TROUPE_SOURCE_DIR) / "fuzz" / "corpus" / "manifest" / name;
  const auto bytes = testing::read_bytes(path);
  return {bytes.begin(), bytes.end()};
}

TEST(Format3, AFormat2ManifestReadsAsBeforeWithItsImpliedValues) {
  const std::string text = corpus_file("format2_world1.json");
  ASSERT_FALSE(text.empty());
  const manifest m = manifest_json::from_json(text, "format2_world1.json");
  EXPECT_EQ(m.format_version, 2);
  EXPECT_EQ(m.adam_t, 2);
  EXPECT_TRUE(m.arrays.empty());
  EXPECT_TRUE(m.counters.empty());
  EXPECT_TRUE(m.extras_json.empty());
  EXPECT_EQ(m.state_arrays(), (std::vector<std::string>{"params", "exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(m.state_counters(), (std::vector<counter_entry>{{"adam_t", 2}}));
  EXPECT_EQ(m.tensors.size(), 16u);
  for (const tensor_entry& t : m.tensors) {
    EXPECT_EQ(t.type, dtype::f32) << t.name;
    EXPECT_EQ(t.array, "") << t.name;
  }
  EXPECT_EQ(m.pieces.size(), 48u);
  EXPECT_EQ(required_format_version(m), 2);
  // Written again it is the same text: format 2's writer did not change by a byte.
  std::string again = manifest_json::to_json(m);
  std::erase(again, '\n');
  std::string compact = text;
  std::erase(compact, '\n');
  EXPECT_EQ(again, compact);
}

TEST(Format3, TheFuzzCorpusStartsFromValidFormat3Manifests) {
  for (const char* name : {"format3_world2.json", "format3_world1_every_array.json"}) {
    const manifest m = manifest_json::from_json(corpus_file(name), name);
    EXPECT_EQ(m.format_version, 3) << name;
    EXPECT_FALSE(m.counters.empty()) << name;
    EXPECT_EQ(manifest_json::from_json(manifest_json::to_json(m), name), m) << name;
  }
}

TEST(Format3, TheGptsCheckpointsStillSayFormat2) {
  testing::temp_dir dir;
  const auto writer = make_fs_shard_writer(dir.str(), 4096);
  std::vector<float> flat(12);
  for (size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<float>(i) * 0.5f;
  state_map map;  // params and both moments alike, as the GPT's engine lays them out
  for (auto& a : map.arrays) a = {{"w", {0, 0, 3, 4}, 0, 1, 0, true}};
  const std::span<const float> bufs[] = {flat, flat, flat};
  snapshot snap;
  snap.step = 2;
  capture(map, bufs, snap);
  manifest m;  // as the coordinator assembles it: the default format
  m.step = 2;
  m.world = 1;
  m.global_numel = 12;
  m.adam_t = 2;
  m.chunk_floats = writer->chunk_floats();
  m.config_json = "{}";
  m.tensors = {{"w", {3, 4}, 0}};
  m.pieces = writer->write(snap).pieces;
  EXPECT_EQ(m.format_version, 2);
  EXPECT_EQ(required_format_version(m), 2);
  commit_manifest(dir.str(), m);
  const auto bytes = testing::read_bytes(testing::step_path(dir.str(), 2) / "manifest.json");
  const std::string text(bytes.begin(), bytes.end());
  EXPECT_NE(text.find("\"format_version\":2,"), std::string::npos);
  EXPECT_NE(text.find("\"adam_t\":2,"), std::string::npos);
  for (const char* v3 : {"\"arrays\"", "\"counters\"", "\"extras\"", "\"dtype\""})
    EXPECT_EQ(text.find(v3), std::string::npos) << v3;
  const manifest back = read_manifest(dir.str(), 2);
  EXPECT_EQ(back, m);
  EXPECT_EQ(load_full_state(dir.str(), back).params, flat);
}

}  // namespace
}  // namespace troupe::ckpt
