// Command-line options and config validation: every mistake names the field to fix.

#include "cli/options.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/config.hpp"

namespace troupe::cli {
namespace {

job_options parse(std::vector<std::string> args) { return parse_job_options(args, false); }

template <class Error>
std::string error_of(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

TEST(OptionsTest, DefaultsAreValid) {
  auto o = parse({});
  EXPECT_EQ(o.cfg.world, 2);
  EXPECT_EQ(o.cfg.metrics_port, 9400);
  EXPECT_FALSE(o.cfg.resume);
}

TEST(OptionsTest, FlagsAndEqualsFormsSetFields) {
  auto o =
      parse({"--world", "4", "--steps=20", "--seed", "7", "--run-dir", "/tmp/x", "--resume",
             "--metrics-port", "0", "--checkpoint-every", "5", "--set", "optim.weight_decay=0"});
  EXPECT_EQ(o.cfg.world, 4);
  EXPECT_EQ(o.cfg.steps, 20);
  EXPECT_EQ(o.cfg.seed, 7u);
  EXPECT_EQ(o.cfg.run_dir, "/tmp/x");
  EXPECT_TRUE(o.cfg.resume);
  EXPECT_EQ(o.cfg.metrics_port, 0);
  EXPECT_EQ(o.cfg.checkpoint_every, 5);
  EXPECT_EQ(o.cfg.optim.weight_decay, 0.0);
}

TEST(OptionsTest, UnknownOptionIsNamed) {
  EXPECT_NE(error_of<usage_error>({"--bogus", "1"}).find("--bogus"), std::string::npos);
  EXPECT_NE(error_of<usage_error>({"--world"}).find("needs a value"), std::string::npos);
  EXPECT_NE(error_of<usage_error>({"stray"}).find("stray"), std::string::npos);
}

TEST(OptionsTest, BadValuesNameTheOption) {
  auto msg = error_of<usage_error>({"--world", "two"});
  EXPECT_NE(msg.find("--world"), std::string::npos);
  EXPECT_NE(msg.find("integer"), std::string::npos);
  EXPECT_NE(error_of<usage_error>({"--lr", "fast"}).find("--lr"), std::string::npos);
}

TEST(OptionsTest, ImpossibleCombinationsNameTheConstraint) {
  auto heads = error_of<config_error>({"--heads", "3"});
  EXPECT_NE(heads.find("model.n_head"), std::string::npos);
  EXPECT_NE(heads.find("model.d_model"), std::string::npos);
  auto world = error_of<config_error>({"--world", "3"});  // 16 / 4 = 4 micro-batches
  EXPECT_NE(world.find("world"), std::string::npos);
  EXPECT_NE(world.find("micro-batches"), std::string::npos);
  EXPECT_NE(error_of<config_error>({"--batch", "10"}).find("micro_batch"), std::string::npos);
  EXPECT_NE(error_of<config_error>({"--exit-after-step", "500"}).find("exit_after_step"),
            std::string::npos);
}

TEST(OptionsTest, AnEmptyValueIsRefusedNotReadAsLeftOut) {
  // Left out, --data means the default corpus (resolved when the job starts).
  EXPECT_TRUE(parse({}).cfg.data.empty());
  for (const char* flag : {"--data", "--metrics-token", "--freeze", "--fault"}) {
    auto msg = error_of<usage_error>({flag, ""});
    EXPECT_NE(msg.find(flag), std::string::npos) << msg;
    EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
  }
  EXPECT_NE(error_of<usage_error>({"--data="}).find("--data"), std::string::npos);
  EXPECT_NE(error_of<config_error>({"--set", "data="}).find("'data' is empty"), std::string::npos);
  try {
    parse_job_options({"--host", ""}, true);
    ADD_FAILURE() << "troupe coordinator --host '' was accepted";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("--host"), std::string::npos) << e.what();
  }
}

TEST(OptionsTest, NumbersNoDoubleHoldsNameTheOption) {
  auto msg = error_of<usage_error>({"--lr", "1e400"});
  EXPECT_NE(msg.find("--lr"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1e400"), std::string::npos) << msg;
  msg = error_of<config_error>({"--set", "model.capacity_factor=-1e999"});
  EXPECT_NE(msg.find("model.capacity_factor"), std::string::npos) << msg;
}

TEST(ConfigTest, SetFieldRejectsUnknownAndMalformed) {
  train_config c;
  EXPECT_THROW(set_config_field(c, "model.bogus", "1"), config_error);
  EXPECT_THROW(set_config_field(c, "steps", "1.5"), config_error);
  EXPECT_THROW(set_config_field(c, "steps", "99999999999999"), config_error);
  EXPECT_THROW(set_config_field(c, "resume", "maybe"), config_error);
  set_config_field(c, "optim.lr", "1e-3");
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-3);
}

TEST(ConfigTest, JsonRoundTrip) {
  train_config c;
  c.world = 4;
  c.model.n_layer = 3;
  c.optim.lr = 0.0125;
  c.data = "/some/where.txt";
  auto back = config_from_json(to_json(c).dump());
  EXPECT_EQ(back.world, 4);
  EXPECT_EQ(back.model.n_layer, 3);
  EXPECT_DOUBLE_EQ(back.optim.lr, 0.0125);
  EXPECT_EQ(back.data, "/some/where.txt");
  EXPECT_EQ(to_json(back), to_json(c));
}

TEST(ConfigTest, SessionLastStep) {
  train_config c;
  c.steps = 20;
  EXPECT_EQ(session_last_step(c), 20);
  c.exit_after_step = 10;
  EXPECT_EQ(session_last_step(c), 10);
}

}  // namespace
}  // namespace troupe::cli
