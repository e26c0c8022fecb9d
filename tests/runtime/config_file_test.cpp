// Config files are parsed within limits (size, depth, duplicate keys, types), numbers are read
// strictly, and a job is checked against the machine's memory and its corpus before it starts.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/config.hpp"
#include "runtime/preflight.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "troupe-config-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    const auto path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  // The message of the config_error loading `text` throws ("" and a failure when none).
  std::string error_loading(const std::string& text) {
    train_config cfg;
    try {
      load_config_file(write("c.json", text), cfg);
    } catch (const config_error& e) {
      return e.what();
    }
    ADD_FAILURE() << "accepted: " << text.substr(0, 80);
    return {};
  }

  fs::path dir_;
};

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_F(ConfigFileTest, DeepNestingIsRefusedBeforeParsing) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_TRUE(has(error_loading(deep), "deeper than 64"));
  const std::string objects = "{\"steps\": " + std::string(100000, '{');
  EXPECT_TRUE(has(error_loading(objects), "deeper than 64"));
  // Brackets inside strings and comments are not nesting.
  train_config cfg;
  const std::string name = std::string(200, '[') + "\\\"" + std::string(200, '{');
  load_config_file(write("ok.json", "// [[[[[[\n{\"data\": \"" + name + "\"}"), cfg);
  EXPECT_EQ(cfg.data, std::string(200, '[') + "\"" + std::string(200, '{'));
}

TEST_F(ConfigFileTest, DuplicateKeysAreRefusedByName) {
  EXPECT_TRUE(has(error_loading(R"({"steps": 5, "steps": 6})"), "'steps' twice"));
  EXPECT_TRUE(
      has(error_loading(R"({"model": {"n_layer": 2, "n_layer": 3}})"), "'model.n_layer' twice"));
  EXPECT_TRUE(
      has(error_loading(R"({"model": {"n_layer": 2}, "model": {"n_head": 2}})"), "'model' twice"));
  // The same name in two sections is two keys.
  train_config cfg;
  load_config_file(write("ok.json", R"({"model": {"n_layer": 2}, "steps": 3})"), cfg);
  EXPECT_EQ(cfg.model.n_layer, 2);
  EXPECT_EQ(cfg.steps, 3);
}

TEST_F(ConfigFileTest, SizeIsCappedBeforeReading) {
  const auto path = (dir_ / "big.json").string();
  std::ofstream(path) << "{}";
  fs::resize_file(path, 100u << 20);  // sparse: nothing is written
  train_config cfg;
  try {
    load_config_file(path, cfg);
    ADD_FAILURE() << "a 100 MB config file was accepted";
  } catch (const config_error& e) {
    EXPECT_TRUE(has(e.what(), "104857600 bytes, the limit is 1 MiB")) << e.what();
    EXPECT_TRUE(has(e.what(), path)) << e.what();
  }
  EXPECT_TRUE(has(error_loading(std::string((1u << 20) + 1, ' ')), "limit is 1 MiB"));
}

TEST_F(ConfigFileTest, TypesAndKeysAreNamed) {
  auto msg = error_loading(R"({"steps": "10"})");
  EXPECT_TRUE(has(msg, "'steps'") && has(msg, "integer")) << msg;
  msg = error_loading(R"({"steps": 1.5})");
  EXPECT_TRUE(has(msg, "'steps'") && has(msg, "integer")) << msg;
  msg = error_loading(R"({"optim": {"lr": true}})");
  EXPECT_TRUE(has(msg, "'optim.lr'") && has(msg, "number")) << msg;
  msg = error_loading(R"({"resume": 1})");
  EXPECT_TRUE(has(msg, "'resume'") && has(msg, "true or false")) << msg;
  msg = error_loading(R"({"run_dir": ["a"]})");
  EXPECT_TRUE(has(msg, "'run_dir'") && has(msg, "string")) << msg;
  msg = error_loading(R"({"model": 5})");
  EXPECT_TRUE(has(msg, "'model'") && has(msg, "object") && has(msg, "n_layer")) << msg;
  msg = error_loading(R"({"model": {"layers": 2}})");
  EXPECT_TRUE(has(msg, "'model.layers'") && has(msg, "n_layer")) << msg;
  msg = error_loading(R"({"stpes": 2})");
  EXPECT_TRUE(has(msg, "'stpes'") && has(msg, "steps")) << msg;
  msg = error_loading(R"({"steps": 99999999999999999999})");
  EXPECT_TRUE(has(msg, "'steps'")) << msg;
  EXPECT_TRUE(has(error_loading("[1, 2]"), "JSON object"));
  EXPECT_TRUE(has(error_loading("{\"steps\": "), "not valid JSON"));
  train_config cfg;
  EXPECT_THROW(load_config_file(dir_.string(), cfg), config_error);
  EXPECT_THROW(load_config_file((dir_ / "missing.json").string(), cfg), config_error);
}

TEST(ConfigNumbersTest, TextIsReadStrictly) {
  train_config c;
  for (const char* bad : {"nan", "inf", "-inf", "", " 1", "1x", "1e30", "2e9", "0x10", "+"})
    EXPECT_THROW(set_config_field(c, "steps", bad), config_error) << bad;
  for (const char* bad : {"nan", "inf", "-inf", "NaN", "", "1e999", "abc", "1.0.0", " 1"})
    EXPECT_THROW(set_config_field(c, "optim.lr", bad), config_error) << bad;
  EXPECT_THROW(set_config_field(c, "seed", "-1"), config_error);
  set_config_field(c, "seed", "18446744073709551615");
  EXPECT_EQ(c.seed, 18446744073709551615ULL);
  set_config_field(c, "optim.lr", "1e-3");
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-3);
  set_config_field(c, "steps", "-5");  // parsed; validate() refuses it
  EXPECT_THROW(validate(c), config_error);
}

TEST(ConfigValidateTest, RangesNameKeyFlagAndValue) {
  train_config c;
  c.step_timeout_ms = 2000000000;
  try {
    validate(c);
    ADD_FAILURE() << "accepted";
  } catch (const config_error& e) {
    EXPECT_TRUE(has(e.what(), "--step-timeout-ms") && has(e.what(), "2000000000")) << e.what();
  }
  c = {};
  c.optim.beta2 = 1.0;
  EXPECT_THROW(validate(c), config_error);
  c = {};
  c.model.experts = 2000000000;
  EXPECT_THROW(validate(c), config_error);
  validate(train_config{});
}

TEST(PreflightTest, MemoryAndCorpusAgainstTheMachine) {
  train_config c;
  c.data = "corpus.txt";
  host_facts facts;
  facts.memory_bytes = 64ULL << 30;
  facts.memory_source = "test";
  facts.data_bytes = 4 << 20;
  check_against_host(c, c.world, facts);  // the default job fits
  EXPECT_LT(estimate_rank_bytes(c), 256.0 * (1 << 20));
  // --micro-batches M trains micro-batches of batch / M: fewer of them means bigger
  // activations, which the estimate must count (it used to take micro_batch alone).
  train_config one_pass = c;
  one_pass.parallel.micro_batches = 1;
  EXPECT_GT(estimate_rank_bytes(one_pass), estimate_rank_bytes(c));

  auto message = [&](const train_config& cfg, const host_facts& f) -> std::string {
    try {
      check_against_host(cfg, cfg.world, f);
    } catch (const config_error& e) {
      return e.what();
    }
    return {};
  };
  train_config big = c;
  big.model.n_layer = 1024;
  big.model.d_model = 16384;
  auto msg = message(big, facts);
  EXPECT_TRUE(has(msg, "needs at least") && has(msg, "this machine has 64.00 GiB")) << msg;

  host_facts tiny = facts;
  tiny.data_bytes = 0;
  EXPECT_TRUE(has(message(c, tiny), "empty"));
  tiny.data_bytes = 100;
  msg = message(c, tiny);
  EXPECT_TRUE(has(msg, "corpus.txt") && has(msg, "validation split")) << msg;
  train_config many = c;
  many.eval_batches = 1 << 20;
  msg = message(many, facts);
  EXPECT_TRUE(has(msg, "eval_batches")) << msg;
  train_config wide = c;
  wide.batch = 1 << 20;
  wide.micro_batch = 4;
  tiny.data_bytes = 10000;
  msg = message(wide, tiny);
  EXPECT_TRUE(has(msg, "--batch")) << msg;
}

}  // namespace
}  // namespace troupe
