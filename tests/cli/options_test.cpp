// Command-line options and config validation: every mistake names the field to fix.

#include "cli/options.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/config.hpp"
#include "runtime/settings.hpp"

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

// `troupe run [options] -- PROGRAM ARGS`: the program is the workers'; what a data-parallel
// job of one's own cannot use is refused by name (exit 2), never silently dropped.
TEST(OptionsTest, AProgramAfterTheDashesIsTheWorkersAndItsRefusalsSayWhy) {
  const auto o = parse({"--world", "3", "--", "python3", "train.py", "--lr", "3e-4"});
  EXPECT_EQ(o.cfg.workload_command,
            (std::vector<std::string>{"python3", "train.py", "--lr", "3e-4"}));
  EXPECT_EQ(o.cfg.world, 3) << "options before the dashes are troupe's";
  EXPECT_NE(error_of<usage_error>({"--"}).find("must be followed by the workers' program"),
            std::string::npos);
  const auto replicas = error_of<usage_error>({"--replicate-checkpoints", "--", "./prog"});
  EXPECT_NE(replicas.find("--replicate-checkpoints has nothing to add"), std::string::npos)
      << replicas;
}

TEST(OptionsTest, DefaultsAreValid) {
  auto o = parse({});
  EXPECT_EQ(o.cfg.world, 2);
  EXPECT_EQ(o.cfg.metrics_port, 9400);
  EXPECT_FALSE(o.cfg.resume);
}

TEST(OptionsTest, FlagsAndEqualsFormsSetFields) {
  auto o =
      parse({"--world", "4", "--steps=20", "--seed", "7", "--run-dir", "/tmp/x", "--metrics-port",
             "0", "--checkpoint-every", "5", "--set", "optim.weight_decay=0"});
  EXPECT_EQ(o.cfg.world, 4);
  EXPECT_EQ(o.cfg.steps, 20);
  EXPECT_EQ(o.cfg.seed, 7u);
  EXPECT_EQ(o.cfg.run_dir, "/tmp/x");
  EXPECT_EQ(o.cfg.metrics_port, 0);
  EXPECT_EQ(o.cfg.checkpoint_every, 5);
  EXPECT_EQ(o.cfg.optim.weight_decay, 0.0);
}

TEST(OptionsTest, EverySettingHasItsFlagAndEqualsForm) {
  // Each setting in the table is reachable as --flag VALUE and --flag=VALUE, and --help
  // lists it with its config key.
  const std::string help = job_options_help();
  for (const auto& s : settings()) {
    if (s.flag.empty()) continue;
    EXPECT_NE(help.find(s.flag), std::string::npos) << s.flag << " is not in --help";
    EXPECT_NE(help.find("[" + s.key), std::string::npos) << s.key << " is not in --help";
    if (s.key == "resume") continue;  // needs a run: ResumeStartsFromTheRunsOwnConfig
    if (s.is_switch()) {
      std::vector<std::string> args = {s.flag + "=true"};
      if (s.key == "replicate_checkpoints") args.insert(args.end(), {"--nodes", "2"});
      auto o = parse(args);
      EXPECT_EQ(s.get(o.cfg), nlohmann::json(s.switch_sets)) << s.flag;
      continue;
    }
    train_config defaults;
    const std::string now = setting_text(s, defaults);
    if (now.empty()) continue;  // the empty string is refused where it means "not set"
    auto spaced = parse({s.flag, now});
    auto joined = parse({s.flag + "=" + now});
    EXPECT_EQ(s.get(spaced.cfg), s.get(joined.cfg)) << s.flag;
    EXPECT_EQ(s.get(spaced.cfg), s.get(defaults)) << s.flag;
  }
}

TEST(OptionsTest, UnknownOptionSuggestsTheClosest) {
  auto msg = error_of<usage_error>({"--resum", "--steps", "5"});
  EXPECT_NE(msg.find("unknown option '--resum'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean --resume?"), std::string::npos) << msg;
  msg = error_of<usage_error>({"--stpes=5"});
  EXPECT_NE(msg.find("did you mean --steps?"), std::string::npos) << msg;
  msg = error_of<usage_error>({"--world", "--steps", "5"});
  EXPECT_NE(msg.find("--world needs a value"), std::string::npos) << msg;
}

TEST(OptionsTest, ResumeStartsFromTheRunsOwnConfig) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("troupe-options-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  train_config run;
  run.model.n_layer = 2;
  run.model.d_model = 64;
  run.steps = 30;
  run.exit_after_step = 15;
  run.elastic.faults = "kill:rank=1:step=8";
  run.run_dir = dir.string();
  {
    std::ofstream out(dir / "config.json");
    out << to_config_file(run).dump(2);
  }
  // Only --run-dir and --resume: the run's shape comes back; a session's early exit and
  // faults do not.
  auto o = parse({"--run-dir", dir.string(), "--resume"});
  EXPECT_TRUE(o.cfg.resume);
  EXPECT_EQ(o.cfg.model.n_layer, 2);
  EXPECT_EQ(o.cfg.model.d_model, 64);
  EXPECT_EQ(o.cfg.steps, 30);
  EXPECT_EQ(o.cfg.exit_after_step, 0);
  EXPECT_TRUE(o.cfg.elastic.faults.empty());
  ASSERT_TRUE(o.saved.has_value());
  // What may change does; what shapes the math is refused, naming the setting.
  o = parse({"--run-dir", dir.string(), "--resume", "--steps", "60", "--world", "4"});
  EXPECT_EQ(o.cfg.steps, 60);
  EXPECT_EQ(o.cfg.world, 4);
  auto changes = changed_settings(*o.saved, o.cfg);
  EXPECT_EQ(changes.size(), 2u);
  auto msg = error_of<usage_error>({"--run-dir", dir.string(), "--resume", "--layers", "3"});
  EXPECT_NE(msg.find("model.n_layer (--layers) cannot change"), std::string::npos) << msg;
  // A config.json that is not a plain file (here a FIFO, whose open would block) is refused.
  std::filesystem::remove(dir / "config.json");
  ASSERT_EQ(::mkfifo((dir / "config.json").c_str(), 0600), 0);
  msg = error_of<config_error>({"--run-dir", dir.string(), "--resume"});
  EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
  std::filesystem::remove_all(dir);
}

TEST(OptionsTest, PrintConfigReadsBack) {
  auto o = parse({"--layers", "2", "--lr=0.001", "--print-config"});
  EXPECT_TRUE(o.print_config);
  const auto path = std::filesystem::temp_directory_path() /
                    ("troupe-print-config-" + std::to_string(::getpid()) + ".json");
  {
    std::ofstream out(path);
    out << to_config_file(o.cfg).dump(2);
  }
  auto back = parse({"--config", path.string()});
  EXPECT_EQ(to_json(back.cfg), to_json(o.cfg));
  std::filesystem::remove(path);
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
  // 16 / 4 = 4 micro-batches: 3 ranks take 2, 1 and 1 (as after a shrink); 5 would idle one.
  EXPECT_EQ(parse({"--world", "3"}).cfg.world, 3);
  auto world = error_of<config_error>({"--world", "5"});
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
