// The sidecar of a token file: the width chosen for a vocabulary, the JSON written and read
// back, and every malformed sidecar refused with an error that names the file.

#include "runtime/data/token_sidecar.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace troupe {
namespace {

namespace fs = std::filesystem;

const char* const good =
    R"({"format": "troupe.tokens", "version": 1, "dtype": "uint16", "vocab_size": 4000, )"
    R"("tokens": 12345, "tokenizer": "tokenizer.model"})";

// The message of the error that parsing `text` throws ("" when it parses).
std::string refusal(const std::string& text) {
  try {
    parse_token_sidecar(text, "data/train.bin.json");
  } catch (const token_sidecar_error& e) {
    EXPECT_EQ(e.path(), "data/train.bin.json");
    EXPECT_NE(std::string(e.what()).find("data/train.bin.json"), std::string::npos) << e.what();
    return e.what();
  }
  return "";
}

// `good` with one key's value replaced (`value` "" removes the key).
std::string with(const std::string& key, const std::string& value) {
  std::string text = good;
  const std::string quoted = "\"" + key + "\": ";
  const size_t at = text.find(quoted);
  size_t end = text.find_first_of(",}", at);
  if (value.empty()) {
    if (text[end] == ',') ++end;
    while (text[end] == ' ') ++end;
    text.erase(at, end - at);
    // A removed last key leaves ", }".
    const size_t dangling = text.rfind(", }");
    if (dangling != std::string::npos) text.erase(dangling, 2);
    return text;
  }
  text.replace(at + quoted.size(), end - at - quoted.size(), value);
  return text;
}

TEST(token_sidecar, the_width_is_the_narrowest_that_holds_every_id) {
  EXPECT_EQ(token_dtype_for_vocab(1), token_dtype::uint16);
  EXPECT_EQ(token_dtype_for_vocab(256), token_dtype::uint16);
  EXPECT_EQ(token_dtype_for_vocab(50257), token_dtype::uint16);  // GPT-2's
  EXPECT_EQ(token_dtype_for_vocab(65536), token_dtype::uint16);  // ids 0..65535
  EXPECT_EQ(token_dtype_for_vocab(65537), token_dtype::uint32);
  EXPECT_EQ(token_dtype_for_vocab(100277), token_dtype::uint32);
  EXPECT_EQ(token_width(token_dtype::uint16), 2);
  EXPECT_EQ(token_width(token_dtype::uint32), 4);
  EXPECT_EQ(token_dtype_name(token_dtype::uint16), "uint16");
  EXPECT_EQ(token_dtype_name(token_dtype::uint32), "uint32");
}

TEST(token_sidecar, its_path_is_the_token_files_with_json_appended) {
  EXPECT_EQ(token_sidecar_path("data/train.bin"), "data/train.bin.json");
  EXPECT_EQ(token_sidecar_path("val.bin"), "val.bin.json");
}

TEST(token_sidecar, parses_the_documented_shape) {
  const token_sidecar s = parse_token_sidecar(good, "x.json");
  EXPECT_EQ(s.dtype, token_dtype::uint16);
  EXPECT_EQ(s.vocab_size, 4000);
  EXPECT_EQ(s.tokens, 12345);
  EXPECT_EQ(s.tokenizer, "tokenizer.model");
  const token_sidecar wide =
      parse_token_sidecar(R"({"tokens": 12345, "dtype": "uint32", "tokenizer": "t.model", )"
                          R"("vocab_size": 4000, "version": 1, "format": "troupe.tokens"})",
                          "x.json");  // keys in any order
  EXPECT_EQ(wide.dtype, token_dtype::uint32);
}

TEST(token_sidecar, what_is_written_reads_back_the_same) {
  for (const token_sidecar& s :
       {token_sidecar{token_dtype::uint16, 65536, 0, "tokenizer.model"},
        token_sidecar{token_dtype::uint32, 100277, int64_t{1} << 40, "../tok/m.model"},
        token_sidecar{token_dtype::uint16, 1, 7, ""}}) {
    const std::string text = format_token_sidecar(s);
    EXPECT_EQ(parse_token_sidecar(text, "x.json"), s) << text;
  }
  EXPECT_EQ(format_token_sidecar({token_dtype::uint16, 4000, 12, "tokenizer.model"}),
            "{\"format\":\"troupe.tokens\",\"version\":1,\"dtype\":\"uint16\",\"vocab_size\":"
            "4000,\"tokens\":12,\"tokenizer\":\"tokenizer.model\"}\n");
}

TEST(token_sidecar, refuses_anything_but_the_documented_shape) {
  ASSERT_EQ(refusal(good), "");
  // Not a sidecar at all.
  EXPECT_NE(refusal("").find("not valid JSON"), std::string::npos);
  EXPECT_NE(refusal("{\"format\": ").find("not valid JSON"), std::string::npos);
  EXPECT_NE(refusal("[1, 2]").find("JSON object"), std::string::npos);
  // Every key is required.
  for (const char* key : {"format", "version", "dtype", "vocab_size", "tokens", "tokenizer"})
    EXPECT_NE(refusal(with(key, "")).find(std::string("\"") + key + "\" is missing"),
              std::string::npos)
        << key << ": " << with(key, "");
  // A key it does not know.
  EXPECT_NE(refusal(with("tokens", "5, \"bos\": 1")).find("unknown key \"bos\""),
            std::string::npos);
  // Format and version.
  EXPECT_NE(refusal(with("format", "\"numpy\"")).find("\"format\""), std::string::npos);
  EXPECT_NE(refusal(with("version", "2")).find("version 2"), std::string::npos);
  EXPECT_NE(refusal(with("version", "\"1\"")).find("must be an integer"), std::string::npos);
  // The dtype.
  for (const char* dtype : {"\"int16\"", "\"uint8\"", "\"float32\"", "\"UINT16\"", "16"})
    EXPECT_NE(refusal(with("dtype", dtype)).find("dtype"), std::string::npos) << dtype;
  // The vocabulary: positive, an integer, and within the width.
  for (const char* vocab :
       {"0", "-5", "65537", "4000.0", "4e3", "\"4000\"", "null", "99999999999999999999999"})
    EXPECT_NE(refusal(with("vocab_size", vocab)).find("vocab_size"), std::string::npos) << vocab;
  const auto uint32_with = [](const std::string& vocab) {
    return R"({"format": "troupe.tokens", "version": 1, "dtype": "uint32", "vocab_size": )" +
           vocab + R"(, "tokens": 1, "tokenizer": ""})";
  };
  EXPECT_EQ(refusal(uint32_with("65537")), "");
  EXPECT_EQ(refusal(uint32_with("4294967296")), "");  // ids 0..2^32-1
  EXPECT_NE(refusal(uint32_with("4294967297")).find("vocab_size"), std::string::npos);
  // The count of tokens and the tokenizer.
  for (const char* tokens : {"-1", "1.5", "\"12\"", "true"})
    EXPECT_NE(refusal(with("tokens", tokens)).find("tokens"), std::string::npos) << tokens;
  for (const char* tokenizer : {"null", "3", "[\"tokenizer.model\"]"})
    EXPECT_NE(refusal(with("tokenizer", tokenizer)).find("tokenizer"), std::string::npos)
        << tokenizer;
}

class token_sidecar_files : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("token_sidecar_test." + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(token_sidecar_files, written_atomically_and_read_back) {
  const std::string path = (dir_ / "train.bin.json").string();
  const token_sidecar s{token_dtype::uint16, 4000, 99, "tokenizer.model"};
  write_token_sidecar(path, s);
  EXPECT_EQ(read_token_sidecar(path), s);
  // Written again over the first: still one file, no temporary left beside it.
  write_token_sidecar(path, {token_dtype::uint32, 70000, 5, "tokenizer.model"});
  EXPECT_EQ(read_token_sidecar(path).vocab_size, 70000);
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++files;
  EXPECT_EQ(files, 1u);
}

TEST_F(token_sidecar_files, a_missing_or_odd_file_is_refused_by_name) {
  const std::string missing = (dir_ / "none.bin.json").string();
  try {
    read_token_sidecar(missing);
    FAIL() << "a missing sidecar was read";
  } catch (const token_sidecar_error& e) {
    EXPECT_EQ(e.path(), missing);
    EXPECT_NE(std::string(e.what()).find("cannot be found"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_token_sidecar(dir_.string()), token_sidecar_error);  // a directory
  const std::string big = (dir_ / "big.json").string();
  std::ofstream(big) << std::string(100000, ' ') << good;
  EXPECT_THROW(read_token_sidecar(big), token_sidecar_error);
  // A data_error, as every other bad corpus: the reader's callers need one catch.
  EXPECT_THROW(read_token_sidecar(missing), data_error);
  // Written where no file can be: the error names the sidecar.
  try {
    write_token_sidecar((dir_ / "no" / "such" / "x.json").string(),
                        {token_dtype::uint16, 4000, 1, ""});
    FAIL() << "a sidecar was written into a missing directory";
  } catch (const token_sidecar_error& e) {
    EXPECT_NE(std::string(e.what()).find("x.json"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe
