// Config files are parsed within limits (size, depth, duplicate keys, types), numbers are read
// strictly, and a job is checked against the machine's memory and its corpus before it starts.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/config.hpp"
#include "runtime/preflight.hpp"
#include "runtime/settings.hpp"

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

TEST_F(ConfigFileTest, NumbersNoDoubleHoldsNameTheirKeyAndValue) {
  // The parser gives up on the whole text at such a number; the message still says where.
  auto msg = error_loading(R"({"lr": 1e400})");
  EXPECT_TRUE(has(msg, "'lr'") && has(msg, "1e400") && has(msg, "out of range")) << msg;
  msg = error_loading(R"({"steps": 5, "optim": {"eps": 1e-8, "lr": 1e400}})");
  EXPECT_TRUE(has(msg, "'optim.lr'") && has(msg, "1e400")) << msg;
  msg = error_loading(R"({"model": {"n_layer": 2}, "elastic": {"heartbeat_timeout_ms": -1e999}})");
  EXPECT_TRUE(has(msg, "'elastic.heartbeat_timeout_ms'") && has(msg, "-1e999")) << msg;
  msg = error_loading(R"({"elastic": {"faults": ["kill:rank=1:step=3", 1e400]}})");
  EXPECT_TRUE(has(msg, "'elastic.faults'") && has(msg, "1e400")) << msg;
  // An integer of 400 digits is named, and quoted cut short.
  msg = error_loading("{\"steps\": 1" + std::string(400, '0') + "}");
  EXPECT_TRUE(has(msg, "'steps'") && has(msg, "1000000000") && has(msg, "...")) << msg;
  EXPECT_LT(msg.size(), 400u) << msg;
}

TEST_F(ConfigFileTest, AnEmptyStringIsNotReadAsLeftOut) {
  auto msg = error_loading(R"({"data": ""})");
  EXPECT_TRUE(has(msg, "'data'") && has(msg, "empty") && has(msg, "default corpus")) << msg;
  // Left out, it stays unset: the job's default corpus applies.
  train_config cfg;
  load_config_file(write("ok.json", R"({"steps": 3})"), cfg);
  EXPECT_TRUE(cfg.data.empty());
  // RUN_DIR/config.json writes "" for no metrics token and nothing frozen; it reads back.
  load_config_file(write("written.json", R"({"metrics_token_file": "", "optim": {"freeze": ""}})"),
                   cfg);
  EXPECT_TRUE(cfg.metrics_token_file.empty());
  // On the command line (and --set) an empty value is refused for each of them.
  for (const char* name : {"data", "metrics_token_file", "optim.freeze"}) {
    try {
      set_config_field(cfg, name, "");
      ADD_FAILURE() << name << " took an empty value";
    } catch (const config_error& e) {
      EXPECT_TRUE(has(e.what(), std::string("'") + name + "' is empty")) << e.what();
    }
  }
  EXPECT_THROW(set_config_field(cfg, "elastic.faults", ""), config_error);
  // troupe's own JSON keeps "" for what is not set.
  EXPECT_EQ(to_json(config_from_json(to_json(train_config{}).dump())), to_json(train_config{}));
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

// The message of the config_error `f` throws ("" when none).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const config_error& e) {
    return e.what();
  }
  return {};
}

TEST(PreflightTest, PathsTooLongAreRefusedByName) {
  // 5,000 bytes in components of 200: over PATH_MAX.
  std::string deep = "/tmp";
  while (deep.size() < 5000) deep += "/" + std::string(200, 'a');
  auto msg = error_of([&] { check_run_dir_length(deep); });
  EXPECT_TRUE(has(msg, "--run-dir") && has(msg, "PATH_MAX") && has(msg, "checkpoints/chunks"))
      << msg;
  EXPECT_LT(msg.size(), 600u) << "the path is quoted cut short: " << msg;
  // Close to PATH_MAX, but without the room for what is written below the run directory.
  std::string near = "/tmp";
  while (near.size() < 4000) near += "/" + std::string(10, 'b');
  EXPECT_TRUE(has(error_of([&] { check_run_dir_length(near); }), "128 bytes kept"));
  EXPECT_TRUE(error_of([&] { check_path_length(near, "data", "--data"); }).empty());
  // One component over NAME_MAX; the last one keeps room for the ".prev-<seconds>" suffix.
  msg = error_of([&] { check_path_length("/tmp/" + std::string(300, 'c'), "data", "--data"); });
  EXPECT_TRUE(has(msg, "--data") && has(msg, "NAME_MAX") && has(msg, "300 bytes")) << msg;
  msg = error_of([&] { check_run_dir_length("/tmp/" + std::string(250, 'd')); });
  EXPECT_TRUE(has(msg, "--run-dir") && has(msg, ".prev-")) << msg;
  EXPECT_TRUE(error_of([&] { check_run_dir_length("/tmp/" + std::string(239, 'e')); }).empty());
  EXPECT_TRUE(error_of([&] { check_run_dir_length("/tmp/runs/latest"); }).empty());
}

TEST(PreflightTest, DescriptorsNeededAgainstTheLimit) {
  train_config c;  // world 2, metrics on
  const long worker = descriptors_needed(c, process_role::worker);
  const long coordinator = descriptors_needed(c, process_role::coordinator);
  // At least what a 2-rank job was measured to hold (a worker 15, the coordinator 20 plus the
  // listeners' reserve), and well under the common soft limit of 1024.
  EXPECT_GE(worker, 30);
  EXPECT_GE(coordinator, 27);
  EXPECT_LE(std::max(worker, coordinator), 256);
  train_config big = c;
  big.world = 64;
  big.elastic.spares = 8;
  EXPECT_GT(descriptors_needed(big, process_role::worker), worker + 8 * 60);
  big.elastic.max_ranks = 128;  // the world may grow to it
  EXPECT_GT(descriptors_needed(big, process_role::worker), 8 * 128);
  EXPECT_GT(descriptors_needed(big, process_role::coordinator), coordinator);

  check_descriptor_limit(worker, worker, worker, "this job (world 2)");
  auto msg = error_of([&] { check_descriptor_limit(59, 16, 16, "this job (world 2)"); });
  EXPECT_TRUE(has(msg, "this job (world 2) needs up to 59") && has(msg, "is 16") &&
              has(msg, "ulimit -n 59") && has(msg, "hard limit"))
      << msg;
  msg = error_of([&] { check_descriptor_limit(59, 16, 4096, "a worker"); });
  EXPECT_TRUE(has(msg, "could not be raised to the hard limit 4096") && has(msg, "ulimit -n 59"))
      << msg;
}

TEST(PreflightTest, MemoryAndCorpusAgainstTheMachine) {
  train_config c;
  c.data = "corpus.txt";
  host_facts facts;
  facts.memory_bytes = 64ULL << 30;
  facts.memory_source = "test";
  facts.data_tokens = 4 << 20;
  check_against_host(c, c.world, facts);  // the default job fits
  EXPECT_LT(estimate_rank_bytes(c), 256.0 * (1 << 20));
  // --micro-batches M trains micro-batches of batch / M: fewer of them means bigger
  // activations, which the estimate must count (it used to take micro_batch alone).
  train_config one_pass = c;
  one_pass.parallel.micro_batches = 1;
  EXPECT_GT(estimate_rank_bytes(one_pass), estimate_rank_bytes(c));
  // The exact reduction (the default's auto here) keeps micro-batches' gradients apart.
  train_config fast = c;
  fast.parallel.reduction = "fast";
  EXPECT_GT(estimate_rank_bytes(c), estimate_rank_bytes(fast));

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
  tiny.data_tokens = 0;
  EXPECT_TRUE(has(message(c, tiny), "empty"));
  tiny.data_tokens = 100;
  msg = message(c, tiny);
  EXPECT_TRUE(has(msg, "corpus.txt") && has(msg, "validation split")) << msg;
  train_config many = c;
  many.eval_batches = 1 << 20;
  msg = message(many, facts);
  EXPECT_TRUE(has(msg, "eval_batches")) << msg;
  train_config wide = c;
  wide.batch = 1 << 20;
  wide.micro_batch = 4;
  tiny.data_tokens = 10000;
  msg = message(wide, tiny);
  EXPECT_TRUE(has(msg, "--batch")) << msg;
}

// A worker is welcomed with the settings it reads and nothing else: no etcd endpoint or
// credential path, no metrics port. Every other field arrives as the coordinator has it.
TEST(WorkerConfigTest, CarriesWhatWorkersReadAndNothingElse) {
  train_config cfg;
  cfg.etcd.endpoints = "https://10.0.0.1:2379";
  cfg.etcd.key = "/secret/etcd-client.key";
  cfg.metrics_port = 9555;
  cfg.steps = 123;
  cfg.optim.lr = 0.0042;
  cfg.elastic.heartbeat_timeout_ms = 777;
  cfg.parallel.tp = 2;
  const nlohmann::json sent = worker_config_json(cfg);
  const std::string text = sent.dump();
  EXPECT_EQ(text.find("10.0.0.1"), std::string::npos) << text;
  EXPECT_EQ(text.find("etcd-client.key"), std::string::npos) << text;
  EXPECT_FALSE(sent.contains("metrics_port"));
  EXPECT_FALSE(sent.contains("etcd"));
  const train_config got = config_from_json(text);
  size_t read = 0;
  for (const auto& s : settings()) {
    if (!read_by_workers(s)) {
      EXPECT_EQ(s.get(got), s.get(train_config{})) << s.key << " is the coordinator's own";
      continue;
    }
    ++read;
    EXPECT_EQ(s.get(got), s.get(cfg)) << s.key;
  }
  EXPECT_GT(read, settings().size() / 2);
  // Every field of the full config is a setting of the table: none can be lost on the way.
  const nlohmann::json full = to_json(cfg).flatten();
  for (const auto& [pointer, value] : full.items()) {
    std::string key = pointer.substr(1);
    std::replace(key.begin(), key.end(), '/', '.');
    // a list (elastic.faults) flattens to its elements
    bool known = find_setting(key) != nullptr;
    for (const auto& s : settings()) known = known || key.rfind(s.key + ".", 0) == 0;
    EXPECT_TRUE(known) << key;
  }
}

}  // namespace
}  // namespace troupe
