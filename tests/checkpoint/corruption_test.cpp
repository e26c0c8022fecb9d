// damaged_checkpoint checkpoints: every fault is reported as a typed error that names the file,
// never a crash and never silently wrong state.

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/format.hpp"
#include "checkpoint/hash.hpp"
#include "test_support.hpp"

namespace troupe::ckpt {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;
using testing::make_full;
using testing::read_bytes;
using testing::step_path;
using testing::temp_dir;
using testing::write_bytes;
using testing::write_checkpoint;
using testing::write_text;

class damaged_checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    full_ = make_full(77, 10);
    manifest_ = write_checkpoint(dir_.str(), full_, 3);
  }
  fs::path shard(int rank) const {
    return step_path(dir_.str(), 10) / format::shard_file_name(rank);
  }
  /// Rewrites the header of `rank`'s shard after `edit`, with a valid header checksum, so
  /// that only the edited field is wrong.
  template <class Edit>
  void rewrite_header(int rank, Edit&& edit) {
    std::vector<char> bytes = read_bytes(shard(rank));
    format::shard_header h =
        format::decode_header(reinterpret_cast<const unsigned char*>(bytes.data()));
    edit(h);
    const auto raw = format::encode_header(h);
    std::copy(raw.begin(), raw.end(), reinterpret_cast<unsigned char*>(bytes.data()));
    write_bytes(shard(rank), bytes);
  }
  void expect_load_error(error_kind kind, const std::string& needle) {
    expect_error([&] { load_full_state(dir_.str(), manifest_); }, kind, needle);
  }

  temp_dir dir_;
  full_state full_;
  manifest manifest_;
};

TEST_F(damaged_checkpoint, AnyFlippedByteInAnyShardIsCaughtNamingTheFile) {
  for (int rank = 0; rank < 3; ++rank) {
    const fs::path path = shard(rank);
    const std::vector<char> clean = read_bytes(path);
    for (size_t i = 0; i < clean.size(); ++i) {
      std::vector<char> bad = clean;
      bad[i] = static_cast<char>(bad[i] ^ 0x10);
      write_bytes(path, bad);
      try {
        load_full_state(dir_.str(), manifest_);
        ADD_FAILURE() << "flip at byte " << i << " of rank " << rank << " went unnoticed";
      } catch (const checkpoint_error& e) {
        EXPECT_EQ(e.path(), path.string());
        EXPECT_NE(std::string(e.what()).find(path.filename().string()), std::string::npos);
      }
    }
    write_bytes(path, clean);
  }
  EXPECT_EQ(load_full_state(dir_.str(), manifest_).params, full_.params);
}

TEST_F(damaged_checkpoint, BodyFlipSaysTheHashDoesNotMatch) {
  std::vector<char> bytes = read_bytes(shard(1));
  bytes[bytes.size() - 5] ^= 1;
  write_bytes(shard(1), bytes);
  expect_load_error(error_kind::corrupt, "shard-00001.bin");
  expect_load_error(error_kind::corrupt, "hashes to");
}

TEST_F(damaged_checkpoint, TruncatedShard) {
  std::vector<char> bytes = read_bytes(shard(2));
  bytes.resize(bytes.size() - 100);
  write_bytes(shard(2), bytes);
  expect_load_error(error_kind::truncated, "shard-00002.bin");
  bytes.resize(10);  // shorter than the header
  write_bytes(shard(2), bytes);
  expect_load_error(error_kind::truncated, "truncated");
  write_bytes(shard(2), {});
  expect_load_error(error_kind::truncated, "shard-00002.bin");
}

TEST_F(damaged_checkpoint, MissingShard) {
  fs::remove(shard(0));
  expect_load_error(error_kind::missing, "shard-00000.bin");
  expect_load_error(error_kind::missing, "does not exist");
}

TEST_F(damaged_checkpoint, WrongMagic) {
  std::vector<char> bytes = read_bytes(shard(1));
  bytes[0] = 'X';
  write_bytes(shard(1), bytes);
  expect_load_error(error_kind::bad_magic, "shard-00001.bin");
  expect_load_error(error_kind::bad_magic, "TRPCKPT");
}

TEST_F(damaged_checkpoint, FutureShardFormatVersion) {
  rewrite_header(0, [](format::shard_header& h) { h.format_version = 99; });
  expect_load_error(error_kind::unsupported_version, "format_version 99");
  expect_load_error(error_kind::unsupported_version, "newer troupe");
}

TEST_F(damaged_checkpoint, OtherByteOrder) {
  std::vector<char> bytes = read_bytes(shard(0));
  std::reverse(bytes.begin() + 12, bytes.begin() + 16);
  // Re-seal the header so that only the byte order is "wrong".
  const uint64_t sum = hash64(bytes.data(), 56, format::header_hash_seed);
  for (int i = 0; i < 8; ++i)
    bytes[56 + static_cast<size_t>(i)] = static_cast<char>(sum >> (8 * i));
  write_bytes(shard(0), bytes);
  expect_load_error(error_kind::wrong_endianness, "byte order");
}

TEST_F(damaged_checkpoint, ShardsMixedBetweenSteps) {
  // A shard of another step with a valid header in this step's place.
  write_checkpoint(dir_.str(), make_full(77, 20), 3);
  fs::copy_file(step_path(dir_.str(), 20) / format::shard_file_name(1), shard(1),
                fs::copy_options::overwrite_existing);
  expect_load_error(error_kind::mismatch, "step 20");
  // Swapped ranks within one step.
  fs::copy_file(step_path(dir_.str(), 10) / format::shard_file_name(0), shard(1),
                fs::copy_options::overwrite_existing);
  EXPECT_THROW(load_full_state(dir_.str(), manifest_), checkpoint_error);
}

TEST_F(damaged_checkpoint, HashInManifestDisagrees) {
  manifest m = manifest_;
  m.shards[2].hash = "0123456789abcdef";
  expect_error([&] { load_full_state(dir_.str(), m); }, error_kind::corrupt, "0123456789abcdef");
}

TEST_F(damaged_checkpoint, ManifestOfAnotherModelIsRejectedBeforeReading) {
  manifest m = manifest_;
  m.global_numel = 78;  // ranges no longer tile the layout
  expect_error([&] { load_full_state(dir_.str(), m); }, error_kind::invalid_argument, "cover");
}

TEST_F(damaged_checkpoint, CorruptManifestJson) {
  const fs::path path = step_path(dir_.str(), 10) / "manifest.json";
  write_text(path, "{\"kind\": \"troupe-checkpoint-manifest\", \"format_vers");
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::corrupt, "manifest.json");
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::corrupt, "not valid JSON");
}

/// Re-seals edited manifest text the way the schema defines manifest_hash, so that a test
/// reaches the field checks behind the seal.
std::string reseal(const std::string& text) {
  auto doc = nlohmann::ordered_json::parse(text);
  doc.erase("manifest_hash");
  const std::string compact = doc.dump();
  doc["manifest_hash"] = hash_to_hex(hash64(compact.data(), compact.size()));
  return doc.dump(2);
}

TEST_F(damaged_checkpoint, EditedManifestBreaksItsSeal) {
  const fs::path path = step_path(dir_.str(), 10) / "manifest.json";
  const std::vector<char> clean = read_bytes(path);
  std::string text(clean.begin(), clean.end());
  text.replace(text.find("\"d_model"), 8, "\"d_modem");  // inside config_json
  write_text(path, text);
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::corrupt, "manifest_hash");
  write_text(path, reseal(text));
  EXPECT_NO_THROW(latest_committed(dir_.str()));
}

TEST_F(damaged_checkpoint, ManifestFieldsOfWrongTypeOrMissing) {
  const fs::path path = step_path(dir_.str(), 10) / "manifest.json";
  const std::vector<char> clean = read_bytes(path);
  std::string text(clean.begin(), clean.end());
  const auto replace = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    t.replace(t.find(from), from.size(), to);
    write_text(path, reseal(t));
  };
  replace("\"step\": 10", "\"step\": -10");
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::corrupt, "\"step\"");
  replace("\"world\": 3", "\"world\": \"three\"");
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::corrupt, "\"world\"");
  replace("\"world\": 3", "\"world\": 2");
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::corrupt, "one per rank");
  replace("\"hash\": \"", "\"hash\": \"zz");
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::corrupt, "hash");
  replace("\"file\": \"shard-00000.bin\"", "\"file\": \"../../etc/passwd\"");
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::corrupt, "plain file name");
  write_text(path, "[]");
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::corrupt, "not a JSON object");
}

TEST_F(damaged_checkpoint, FutureManifestFormatVersion) {
  const fs::path path = step_path(dir_.str(), 10) / "manifest.json";
  const std::vector<char> clean = read_bytes(path);
  std::string text(clean.begin(), clean.end());
  text.replace(text.find("\"format_version\": 1"), 19, "\"format_version\": 4");
  write_text(path, text);
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::unsupported_version,
               "format_version 4");
}

TEST_F(damaged_checkpoint, CorruptLatest) {
  const fs::path latest = fs::path(dir_.str()) / "checkpoints" / "LATEST";
  write_text(latest, "garbage\x01\n");
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::corrupt, "LATEST");
  // The message lists what can be restored instead.
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::corrupt, "step-00000010");
  write_text(latest, "");
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::corrupt, "is corrupt");
  write_text(latest, "step-10\n");  // not the canonical name
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::corrupt, "is corrupt");
}

TEST_F(damaged_checkpoint, LatestPointsAtNothing) {
  const fs::path latest = fs::path(dir_.str()) / "checkpoints" / "LATEST";
  write_text(latest, "step-00000099\n");
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::missing, "step-00000099");
  fs::create_directory(step_path(dir_.str(), 99));  // a directory without a manifest
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::missing, "manifest.json");
  // None of this touched the committed data: pointing LATEST back recovers it.
  write_text(latest, "step-00000010\n");
  EXPECT_EQ(load_full_state(dir_.str(), *latest_committed(dir_.str())).params, full_.params);
}

TEST_F(damaged_checkpoint, ManifestInTheWrongDirectory) {
  fs::rename(step_path(dir_.str(), 10), step_path(dir_.str(), 11));
  write_text(fs::path(dir_.str()) / "checkpoints" / "LATEST", "step-00000011\n");
  expect_error([&] { latest_committed(dir_.str()); }, error_kind::mismatch, "records step 10");
}

}  // namespace
}  // namespace troupe::ckpt
