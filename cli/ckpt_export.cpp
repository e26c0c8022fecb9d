// `troupe ckpt export`: picks a committed checkpoint, reads its parameters through the
// restore path, maps them to GPT-2's names and orientation and writes the file atomically.

#include "cli/ckpt_export.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/state_map.hpp"
#include "cli/checkpoint_choice.hpp"
#include "cli/ckpt_common.hpp"
#include "cli/command_line.hpp"
#include "runtime/sys/printable.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::cli::ckpt_tool {

namespace fs = std::filesystem;
using ckpt::manifest;
using ckpt::tensor_entry;

namespace {

// ---- the model ---------------------------------------------------------------------------

std::string step_name(const manifest& m) { return "checkpoint step " + std::to_string(m.step); }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out;
  for (const int64_t d : shape) out += (out.empty() ? "" : "x") + std::to_string(d);
  return out.empty() ? "scalar" : out;
}

/// Every tensor of the dense built-in GPT of `s`, by name, with its shape (gpt.cpp's table).
std::map<std::string, std::vector<int64_t>> expected_tensors(const gpt_shape& s) {
  const int64_t C = s.d_model;
  std::map<std::string, std::vector<int64_t>> out = {{"wte.weight", {s.vocab, C}},
                                                     {"wpe.weight", {s.context, C}},
                                                     {"ln_f.weight", {C}},
                                                     {"ln_f.bias", {C}}};
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    for (const char* ln : {"ln_1.", "ln_2."}) {
      out[p + ln + "weight"] = {C};
      out[p + ln + "bias"] = {C};
    }
    out[p + "attn.qkv.weight"] = {3 * C, C};
    out[p + "attn.qkv.bias"] = {3 * C};
    out[p + "attn.proj.weight"] = {C, C};
    out[p + "attn.proj.bias"] = {C};
    out[p + "mlp.fc.weight"] = {4 * C, C};
    out[p + "mlp.fc.bias"] = {4 * C};
    out[p + "mlp.proj.weight"] = {C, 4 * C};
    out[p + "mlp.proj.bias"] = {C};
  }
  return out;
}

const tensor_entry* find_tensor(const manifest& m, const std::string& name) {
  const auto it = std::find_if(m.tensors.begin(), m.tensors.end(),
                               [&](const tensor_entry& t) { return t.name == name; });
  return it == m.tensors.end() ? nullptr : &*it;
}

int64_t config_int(const nlohmann::json& model, const char* key, int64_t fallback) {
  const auto it = model.find(key);
  return it != model.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

// ---- reading -----------------------------------------------------------------------------

struct chosen {
  manifest m;
  gpt_shape shape;
  std::vector<float> params;
};

chosen read_checkpoint(const std::string& run_dir, int64_t step) {
  chosen c;
  c.m = ckpt::read_manifest(run_dir, step);
  c.shape = gpt_shape_of(c.m);
  c.params = ckpt::load_full_params(run_dir, c.m);
  return c;
}

/// --step N: that checkpoint, or an error. Without: the newest at or before LATEST whose
/// parameters read back intact, passing over damaged ones (said on stderr).
chosen pick_checkpoint(const std::string& run_dir, std::optional<int64_t> step) {
  std::optional<chosen> c;
  read_chosen_checkpoint("troupe ckpt export", run_dir, ckpt::list_committed(run_dir), step,
                         [&](int64_t s) { c = read_checkpoint(run_dir, s); });
  return std::move(*c);
}

// ---- the command line --------------------------------------------------------------------

int64_t parse_step(const command_line& cl, std::string text) {
  const std::string original = text;
  if (text.starts_with("step-")) text = text.substr(5);
  int64_t v = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < 0)
    throw cl.error("--step must be a non-negative integer, got '" + original + "'");
  return v;
}

std::string joined_formats() {
  std::string out;
  for (const std::string_view f : ckpt::tensor_file_formats())
    out += (out.empty() ? "" : ", ") + std::string(f);
  return out;
}

/// The file's metadata: the step, troupe's shape, and GPT2Config's arguments as JSON.
std::vector<std::pair<std::string, std::string>> gpt2_metadata(const manifest& m,
                                                               const gpt_shape& shape) {
  const nlohmann::json hf = {{"vocab_size", shape.vocab},  {"n_positions", shape.context},
                             {"n_embd", shape.d_model},    {"n_layer", shape.n_layer},
                             {"n_head", shape.n_head},     {"activation_function", "gelu_new"},
                             {"layer_norm_epsilon", 1e-5}, {"tie_word_embeddings", true}};
  return {{"format", "pt"},
          {"troupe_step", std::to_string(m.step)},
          {"troupe_layout", m.layout},
          {"d_model", std::to_string(shape.d_model)},
          {"n_head", std::to_string(shape.n_head)},
          {"n_layer", std::to_string(shape.n_layer)},
          {"context", std::to_string(shape.context)},
          {"vocab", std::to_string(shape.vocab)},
          {"weight_orientation", "conv1d"},
          {"gpt2_config", hf.dump()}};
}

}  // namespace

// ---- the mapping -------------------------------------------------------------------------

gpt_shape gpt_shape_of(const manifest& m) {
  const auto refuse = [&](const std::string& why) {
    return usage_error("troupe ckpt export: " + step_name(m) + " " + why);
  };
  if (m.format_version == ckpt::workload_format_version)
    throw refuse(
        "holds a program's own model (a format 3 checkpoint of a `troupe run -- "
        "PROGRAM` job), not troupe's built-in GPT: export writes the built-in GPT only; "
        "save that model from its own program");
  if (m.tensors.empty())
    throw tool_error(step_name(m) +
                     " lists no tensors (an old format 1 manifest): resume the run "
                     "once with this troupe and export the checkpoint it writes");
  const nlohmann::json config = nlohmann::json::parse(m.config_json, nullptr, false);
  const nlohmann::json model =
      config.is_object() && config.contains("model") && config["model"].is_object()
          ? config["model"]
          : nlohmann::json::object();
  const int64_t experts = config_int(model, "experts", 0);
  if (experts > 0)
    throw refuse("has Mixture-of-Experts MLPs (" + std::to_string(experts) +
                 " experts per block), which GPT-2 has no names for: export writes the dense "
                 "GPT only");
  gpt_shape s;
  const tensor_entry* wte = find_tensor(m, "wte.weight");
  const tensor_entry* wpe = find_tensor(m, "wpe.weight");
  if (wte == nullptr || wpe == nullptr || wte->shape.size() != 2 || wpe->shape.size() != 2)
    throw refuse("has no [V, C] wte.weight and [T, C] wpe.weight: it is not troupe's GPT");
  s.vocab = wte->shape[0];  // the vocabulary is what the checkpoint holds, not a constant
  s.d_model = wte->shape[1];
  s.context = wpe->shape[0];
  while (find_tensor(m, "h." + std::to_string(s.n_layer) + ".ln_1.weight") != nullptr) ++s.n_layer;
  s.n_head = config_int(model, "n_head", 0);
  if (s.n_head < 1 || s.d_model % s.n_head != 0)
    throw tool_error(step_name(m) + ": its config's model.n_head (" + std::to_string(s.n_head) +
                     ") does not divide d_model " + std::to_string(s.d_model));
  const auto expected = expected_tensors(s);
  for (const tensor_entry& t : m.tensors) {
    const auto it = expected.find(t.name);
    if (it == expected.end())
      throw refuse("has tensor " + t.name + ", which GPT-2 has no name for");
    if (it->second != t.shape)
      throw refuse("has " + t.name + " of shape " + shape_text(t.shape) + " where GPT-2 needs " +
                   shape_text(it->second));
    if (t.type != dtype::f32) throw refuse("has " + t.name + " in another dtype than f32");
  }
  if (m.tensors.size() != expected.size())
    throw refuse("lacks some of the GPT's tensors (" + std::to_string(m.tensors.size()) + " of " +
                 std::to_string(expected.size()) + ")");
  return s;
}

gpt2_state to_gpt2(const manifest& m, const gpt_shape& shape, std::span<const float> params) {
  gpt2_state out;
  out.shape = shape;
  const auto values_of = [&](const std::string& name) {
    const tensor_entry* t = find_tensor(m, name);
    if (t == nullptr) throw tool_error(step_name(m) + " has no tensor " + name);
    const size_t n = ckpt::numel_of(t->shape);
    if (t->offset + n > params.size())
      throw tool_error(step_name(m) + ": " + name + " lies outside the parameters");
    return params.subspan(t->offset, n);
  };
  // Reserved up front: file.tensors hold spans into these vectors.
  out.values.reserve(4 + 12 * static_cast<size_t>(shape.n_layer));
  const auto add = [&](std::string name, std::vector<int64_t> dims, std::vector<float> v) {
    out.values.push_back(std::move(v));
    out.file.tensors.push_back({std::move(name), std::move(dims), out.values.back()});
  };
  const auto copy = [&](const std::string& to, const std::string& from) {
    const auto v = values_of(from);
    add(to, find_tensor(m, from)->shape, std::vector<float>(v.begin(), v.end()));
  };
  // troupe's Linear weight [out, in] as GPT-2's Conv1D weight [in, out].
  const auto transposed = [&](const std::string& to, const std::string& from) {
    const auto v = values_of(from);
    const auto& dims = find_tensor(m, from)->shape;
    const auto rows = static_cast<size_t>(dims[0]), cols = static_cast<size_t>(dims[1]);
    std::vector<float> t(v.size());
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c) t[c * rows + r] = v[r * cols + c];
    add(to, {dims[1], dims[0]}, std::move(t));
  };
  copy("transformer.wte.weight", "wte.weight");
  const std::span<const float> wte = out.file.tensors.back().values;
  copy("transformer.wpe.weight", "wpe.weight");
  for (int64_t l = 0; l < shape.n_layer; ++l) {
    const std::string from = "h." + std::to_string(l) + ".";
    const std::string to = "transformer.h." + std::to_string(l) + ".";
    copy(to + "ln_1.weight", from + "ln_1.weight");
    copy(to + "ln_1.bias", from + "ln_1.bias");
    transposed(to + "attn.c_attn.weight", from + "attn.qkv.weight");
    copy(to + "attn.c_attn.bias", from + "attn.qkv.bias");
    transposed(to + "attn.c_proj.weight", from + "attn.proj.weight");
    copy(to + "attn.c_proj.bias", from + "attn.proj.bias");
    copy(to + "ln_2.weight", from + "ln_2.weight");
    copy(to + "ln_2.bias", from + "ln_2.bias");
    transposed(to + "mlp.c_fc.weight", from + "mlp.fc.weight");
    copy(to + "mlp.c_fc.bias", from + "mlp.fc.bias");
    transposed(to + "mlp.c_proj.weight", from + "mlp.proj.weight");
    copy(to + "mlp.c_proj.bias", from + "mlp.proj.bias");
  }
  copy("transformer.ln_f.weight", "ln_f.weight");
  copy("transformer.ln_f.bias", "ln_f.bias");
  // The head is tied: the same values as wte (one storage in a torch file, a copy in
  // safetensors, which cannot alias).
  out.file.tensors.push_back({"lm_head.weight", {shape.vocab, shape.d_model}, wte});

  out.file.metadata = gpt2_metadata(m, shape);
  return out;
}

// ---- the command -------------------------------------------------------------------------

int export_checkpoint(const std::vector<std::string>& args) {
  command_line cl("troupe ckpt export");
  cl.value("--step");
  cl.value("--format");
  cl.parse(args, 2, "arguments (RUN_DIR and OUT)");
  // Every option is checked before the disk is touched: bad usage is always exit 2.
  const auto& positional = cl.positional();
  if (positional.empty()) throw cl.error("RUN_DIR is required");
  if (positional.size() < 2) throw cl.error("OUT, the file to write, is required");
  const std::string& run_dir = positional[0];
  const fs::path out_path = positional[1];
  const auto format = cl.last("--format");
  if (!format) throw cl.error("--format is required: one of " + joined_formats());
  const auto writer = ckpt::make_tensor_file_writer(*format);
  if (!writer) throw cl.error("unknown --format '" + *format + "'; formats: " + joined_formats());
  std::optional<int64_t> step;
  if (const auto s = cl.last("--step")) step = parse_step(cl, *s);
  std::error_code ec;
  if (fs::is_directory(out_path, ec))
    throw cl.error("OUT " + out_path.string() + " is a directory; give the file to write");

  require_checkpoints(run_dir);
  const chosen c = pick_checkpoint(run_dir, step);
  const gpt2_state state = to_gpt2(c.m, c.shape, c.params);
  uint64_t bytes = 0;
  try {
    bytes = ckpt::write_tensor_file(*writer, state.file, out_path);
  } catch (const std::invalid_argument& e) {  // what the format cannot hold
    throw tool_error("cannot write " + out_path.string() + ": " + e.what());
  } catch (const ckpt::checkpoint_error& e) {  // the disk refused; nothing was left behind
    throw tool_error("cannot write " + out_path.string() + " (" + e.what() + ")");
  }
  const gpt_shape& s = c.shape;
  std::printf(
      "exported step %lld of %s (layout %s) as %s: GPT-2 with %lld layers, d_model %lld, %lld "
      "heads, context %lld, vocab %lld; %zu tensors, %s -> %s\n",
      static_cast<long long>(c.m.step), run_dir.c_str(), layout_of(c.m).c_str(), format->c_str(),
      static_cast<long long>(s.n_layer), static_cast<long long>(s.d_model),
      static_cast<long long>(s.n_head), static_cast<long long>(s.context),
      static_cast<long long>(s.vocab), state.file.tensors.size(), human(bytes).c_str(),
      out_path.c_str());
  return 0;
}

}  // namespace troupe::cli::ckpt_tool
