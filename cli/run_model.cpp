// A run directory's model at a step: picks the committed checkpoint, checks that it holds the
// built-in GPT its config describes, and reads its parameters through the restore path.

#include "cli/run_model.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/state_map.hpp"
#include "cli/checkpoint_choice.hpp"
#include "cli/command_line.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/data/token_sidecar.hpp"
#include "runtime/sys/printable.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::cli {

namespace fs = std::filesystem;
using ckpt::manifest;

namespace {

std::string step_name(int64_t step) { return "checkpoint step " + std::to_string(step); }

/// RUN_DIR/config.json, or a usage_error saying that RUN_DIR is not a run directory.
train_config read_run_config(const std::string& command, const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec))
    throw usage_error(command + ": " + run_dir +
                      " is not a directory; give the --run-dir of a `troupe run` (default "
                      "runs/latest)");
  const fs::path path = run_paths::config(run_dir);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw usage_error(command + ": " + run_dir + " is not a run directory: it has no " +
                      path.filename().string() + "; give the --run-dir of a `troupe run`");
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return config_from_json(text.str());
  } catch (const std::exception& e) {
    throw usage_error(command + ": " + path.string() + " is not a run's config (" + e.what() + ")");
  }
}

/// The model `m` holds, built from its own config with the vocabulary its wte has; a
/// usage_error when it is not the built-in GPT (another workload, tensors that do not match).
std::unique_ptr<gpt> model_of(const std::string& command, const manifest& m) {
  const auto refuse = [&](const std::string& why) {
    return usage_error(command + ": " + step_name(m.step) + " " + why);
  };
  if (m.format_version == ckpt::workload_format_version)
    throw refuse(
        "holds a program's own model (a `troupe run -- PROGRAM` job), not troupe's built-in "
        "GPT; use that model from its own program");
  model_config mc;
  try {
    mc = config_from_json(m.config_json).model;
  } catch (const std::exception& e) {
    throw refuse(std::string("has a config this troupe cannot read (") + e.what() + ")");
  }
  if (m.tensors.empty())
    throw refuse(
        "lists no tensors (an old format 1 manifest): resume the run once with this troupe "
        "and use the checkpoint it writes");
  const auto wte = std::find_if(m.tensors.begin(), m.tensors.end(),
                                [](const ckpt::tensor_entry& t) { return t.name == "wte.weight"; });
  if (wte != m.tensors.end() && wte->shape.size() == 2) mc.vocab = static_cast<int>(wte->shape[0]);
  std::unique_ptr<gpt> model;
  try {
    model = std::make_unique<gpt>(mc);
  } catch (const std::exception& e) {
    throw refuse(std::string("describes a model troupe cannot build: ") + e.what());
  }
  // The checkpoint's tensors must be exactly the model's: names, shapes and places.
  const auto& table = model->param_table();
  if (m.tensors.size() != table.size() || m.global_numel != model->num_params())
    throw refuse("does not hold the GPT its config describes (" + std::to_string(m.tensors.size()) +
                 " tensors of " + std::to_string(m.global_numel) + " values, the model has " +
                 std::to_string(table.size()) + " of " + std::to_string(model->num_params()) + ")");
  for (size_t i = 0; i < table.size(); ++i) {
    const ckpt::tensor_entry& t = m.tensors[i];
    if (t.name != table[i].name || t.shape != table[i].shape || t.offset != table[i].offset ||
        t.type != dtype::f32)
      throw refuse("does not hold the GPT its config describes: tensor " + std::to_string(i) +
                   " is " + t.name + ", the model's is " + table[i].name);
  }
  return model;
}

struct chosen {
  manifest m;
  std::vector<float> params;
};

chosen read_checkpoint(const std::string& command, const std::string& run_dir, int64_t step,
                       std::unique_ptr<gpt>& model) {
  chosen c;
  c.m = ckpt::read_manifest(run_dir, step);
  model = model_of(command, c.m);
  c.params = ckpt::load_full_params(run_dir, c.m);
  return c;
}

}  // namespace

run_vocabulary vocabulary_of(const std::string& path) {
  run_vocabulary v;
  v.data = path;
  std::error_code ec;
  const std::string sidecar = token_sidecar_path(path);
  if (!fs::exists(path, ec) && !fs::exists(sidecar, ec)) return v;  // a text corpus, gone
  if (!fs::exists(path, ec)) {  // a token file, gone: its sidecar still says what ids mean
    const token_sidecar s = read_token_sidecar(sidecar);
    v.bytes = false;
    v.size = s.vocab_size;
    if (!s.tokenizer.empty())
      v.tokenizer = fs::absolute(fs::path(sidecar).parent_path() / s.tokenizer).string();
    return v;
  }
  const corpus_file f = describe_corpus(path);
  v.bytes = !f.token_file;
  v.size = f.vocab;
  v.tokenizer = f.tokenizer;
  return v;
}

run_model load_run_model(const std::string& command, const std::string& run_dir,
                         std::optional<int64_t> step) {
  run_model r;
  r.run_dir = run_dir;
  r.cfg = read_run_config(command, run_dir);
  if (r.cfg.external_workload())
    throw usage_error(command + ": " + run_dir +
                      " is a `troupe run -- PROGRAM` job: its model is the program's own, not "
                      "troupe's built-in GPT");
  const std::string where = run_paths::checkpoints(run_dir).string();
  std::error_code ec;
  const std::vector<int64_t> steps =
      fs::is_directory(where, ec) ? ckpt::list_committed(run_dir) : std::vector<int64_t>{};
  if (steps.empty())
    throw usage_error(command + ": " + run_dir +
                      " has no committed checkpoint yet (troupe run --checkpoint-every K "
                      "writes them)");
  std::unique_ptr<gpt> model;
  std::optional<chosen> c;
  read_chosen_checkpoint(command, run_dir, steps, step,
                         [&](int64_t s) { c = read_checkpoint(command, run_dir, s, model); });
  std::copy(c->params.begin(), c->params.end(), model->params());
  r.step = c->m.step;
  r.layout = c->m.format_version == ckpt::shard_format_version || c->m.layout.empty()
                 ? "dp" + std::to_string(c->m.world)
                 : c->m.layout;
  r.model = std::move(model);
  try {
    r.vocab = vocabulary_of(r.cfg.data);
  } catch (const data_error& e) {
    throw usage_error(command + ": the run's data cannot say what its tokens are: " + e.what());
  }
  return r;
}

int64_t parse_step_option(const command_line& cl, const std::string& text) {
  std::string digits = text;
  if (digits.starts_with("step-")) digits = digits.substr(5);
  int64_t v = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || v < 0)
    throw cl.error("--step must be a non-negative integer, got '" + text + "'");
  return v;
}

int exit_code_of(const std::string& command, const std::function<int()>& work) {
  try {
    return work();
  } catch (const usage_error&) {
    throw;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: %s\n", command.c_str(), sys::printable_lines(e.what()).c_str());
    return 1;
  }
}

}  // namespace troupe::cli
