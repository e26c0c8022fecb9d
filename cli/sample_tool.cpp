// `troupe sample`: loads a run's model (cli/run_model.hpp), turns the prompt into token ids,
// generates with the KV-cache decoder and writes the text.

#include "cli/sample_tool.hpp"

#include <sentencepiece_processor.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "cli/command_line.hpp"
#include "cli/run_model.hpp"
#include "runtime/model/generate.hpp"
#include "runtime/sys/printable.hpp"
#include "runtime/trainer.hpp"

namespace troupe::cli {

namespace fs = std::filesystem;

namespace {

const std::string command = "troupe sample";

/// The most tokens one call generates: far past any use, and a bound on the memory the
/// sequence takes.
constexpr int64_t max_tokens = 100'000'000;

struct sample_options {
  std::string run_dir;
  std::optional<int64_t> step;
  std::string prompt;
  int64_t tokens = 0;
  sampling_options sampling;
  bool verbose = false;
};

double parse_temperature(const command_line& cl, const std::string& text) {
  double v = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) ||
      v < 0 || v > 1e6)
    throw cl.error("--temperature must be a number in [0, 1e6] (0 = greedy), got '" + text + "'");
  return v;
}

sample_options parse_options(const std::vector<std::string>& args) {
  command_line cl(command);
  for (const char* v : {"--step", "--prompt", "--tokens", "--temperature", "--top-k", "--seed"})
    cl.value(v);
  cl.flag("--verbose");
  cl.parse(args, 1, "arguments (RUN_DIR)");
  sample_options o;
  if (cl.positional().empty()) throw cl.error("RUN_DIR is required");
  o.run_dir = cl.positional()[0];
  if (const auto s = cl.last("--step")) o.step = parse_step_option(cl, *s);
  const auto prompt = cl.last("--prompt");
  if (!prompt) throw cl.error("--prompt TEXT is required (what the text starts with)");
  o.prompt = *prompt;
  const auto tokens = cl.last("--tokens");
  if (!tokens) throw cl.error("--tokens N is required (how many tokens to generate)");
  o.tokens = cl.integer("--tokens", *tokens, 0, max_tokens);
  if (const auto t = cl.last("--temperature")) o.sampling.temperature = parse_temperature(cl, *t);
  if (const auto k = cl.last("--top-k"))
    o.sampling.top_k = static_cast<int>(cl.integer("--top-k", *k, 0, 1 << 30));
  if (const auto s = cl.last("--seed"))
    o.sampling.seed = static_cast<uint64_t>(cl.integer("--seed", *s, 0, INT64_MAX));
  o.verbose = cl.has("--verbose");
  return o;
}

/// How text becomes ids and back for one run.
class codec {
 public:
  codec(const run_vocabulary& v, int64_t model_vocab) : v_(v) {
    // Ids the data cannot hold are never drawn (a model trained with a wider --vocab).
    limit_ = std::min(v.size, model_vocab);
    if (v.bytes || v.tokenizer.empty()) return;
    std::error_code ec;
    if (!fs::is_regular_file(v.tokenizer, ec))
      throw usage_error(command + ": the tokenizer " + v.tokenizer + " that the run's data " +
                        v.data + " names (its sidecar's \"tokenizer\") is missing; put it back " +
                        "beside the sidecar");
    sp_.emplace();
    if (const auto status = sp_->Load(v.tokenizer); !status.ok())
      throw usage_error(command + ": the tokenizer " + v.tokenizer + " (named by " + v.data +
                        "'s sidecar) is not a SentencePiece model: " + status.error_message());
    limit_ = std::min<int64_t>(limit_, sp_->GetPieceSize());
  }

  /// The ids below which a token may be drawn.
  int64_t limit() const { return limit_; }
  bool bytes() const { return v_.bytes; }

  std::vector<token_id> encode(const std::string& prompt) const {
    std::vector<token_id> ids;
    if (v_.bytes) {
      for (const char c : prompt) ids.push_back(static_cast<unsigned char>(c));
    } else if (sp_) {
      std::vector<int> pieces;
      if (const auto status = sp_->Encode(prompt, &pieces); !status.ok())
        throw usage_error(command +
                          ": the tokenizer cannot encode the prompt: " + status.error_message());
      for (const int p : pieces) ids.push_back(static_cast<token_id>(p));
    } else {
      ids = parse_ids(prompt);
    }
    if (ids.empty())
      throw usage_error(command + ": the prompt gives no token; the model needs at least one " +
                        "to start from");
    for (const token_id id : ids)
      if (static_cast<int64_t>(id) >= limit_)
        throw usage_error(command + ": the prompt's token " + std::to_string(id) +
                          " is not below the vocabulary (" + std::to_string(limit_) + ")");
    return ids;
  }

  /// The whole text of `ids`, prompt included (bytes are written as they come instead).
  std::string decode(const std::vector<token_id>& ids) const {
    if (sp_) {
      std::vector<int> pieces(ids.begin(), ids.end());
      std::string text;
      if (const auto status = sp_->Decode(pieces, &text); !status.ok())
        throw std::runtime_error(std::string("the tokenizer cannot decode the tokens: ") +
                                 status.error_message());
      return text;
    }
    std::string out;
    for (const token_id id : ids) out += (out.empty() ? "" : " ") + std::to_string(id);
    return out + "\n";
  }

 private:
  std::vector<token_id> parse_ids(const std::string& text) const {
    std::vector<token_id> ids;
    size_t at = 0;
    while (at < text.size()) {
      if (text[at] == ' ' || text[at] == '\t' || text[at] == '\n' || text[at] == ',') {
        ++at;
        continue;
      }
      size_t end = at;
      while (end < text.size() && text[end] != ' ' && text[end] != '\t' && text[end] != '\n' &&
             text[end] != ',')
        ++end;
      uint64_t v = 0;
      const auto [stop, ec] = std::from_chars(text.data() + at, text.data() + end, v);
      if (ec != std::errc() || stop != text.data() + end || v > UINT32_MAX)
        throw usage_error(command + ": this run's data (" + v_.data +
                          ") names no tokenizer, so the prompt is token ids separated by "
                          "spaces (\"17 4 250\"); got '" +
                          text.substr(at, end - at) + "'");
      ids.push_back(static_cast<token_id>(v));
      at = end;
    }
    return ids;
  }

  run_vocabulary v_;
  int64_t limit_ = 0;
  std::optional<sentencepiece::SentencePieceProcessor> sp_;
};

int sample(const sample_options& o) {
  const auto load_start = std::chrono::steady_clock::now();
  run_model r = load_run_model(command, o.run_dir, o.step);
  const model_config& mc = r.model->config();
  const codec words(r.vocab, mc.vocab);
  const std::vector<token_id> prompt = words.encode(o.prompt);
  set_blas_threads(1);  // one row at a time: threads would only wait on each other
  sampling_options so = o.sampling;
  so.allowed = words.limit();
  token_sampler sampler(so);
  kv_decoder<float> decoder(*r.model);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();

  std::function<void(token_id)> emit;
  if (words.bytes()) {
    // Bytes go out as they come: the prompt as given, then each new byte.
    std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
    emit = [](token_id t) { std::fputc(static_cast<int>(t), stdout); };
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<token_id> out = generate(decoder, prompt, o.tokens, sampler, emit);
  const double gen_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!words.bytes()) {
    std::vector<token_id> all = prompt;
    all.insert(all.end(), out.begin(), out.end());
    const std::string text = words.decode(all);
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  std::fflush(stdout);
  if (o.verbose) {
    std::fprintf(stderr,
                 "%s: step %lld of %s (layout %s): %d layers, d_model %d, %d heads, context %d, "
                 "vocab %d%s; loaded in %.3f s\n",
                 command.c_str(), static_cast<long long>(r.step), r.run_dir.c_str(),
                 r.layout.c_str(), mc.n_layer, mc.d_model, mc.n_head, mc.context, mc.vocab,
                 mc.experts > 0 ? (", " + std::to_string(mc.experts) + " experts").c_str() : "",
                 load_s);
    std::fprintf(stderr,
                 "%s: generated %lld tokens after a prompt of %zu in %.3f ms: %.1f tokens/s "
                 "(prompt included, load excluded)\n",
                 command.c_str(), static_cast<long long>(out.size()), prompt.size(), gen_s * 1e3,
                 gen_s > 0 ? static_cast<double>(out.size()) / gen_s : 0.0);
  }
  return 0;
}

}  // namespace

std::string sample_help() {
  return R"(usage: troupe sample RUN_DIR --prompt TEXT --tokens N [options]

Generates text with the model of a run directory and writes the prompt and its continuation to
stdout. The committed checkpoint (the newest intact one, or --step N) is read through the
restore path, whatever layout wrote it (dp, ZeRO-1, tp, pp, ep), into one process; the prompt
goes through the model once, then each new token costs one position of every layer against a
cache of the keys and values before it (a KV cache).

What a token is follows the run's data (config.json's "data"):
  a text file                 the prompt's bytes are the tokens, and the output is bytes,
                              written as they are
  a token file and tokenizer  the prompt is encoded and the text decoded with the SentencePiece
                              model its sidecar names (troupe tokenize writes both); when that
                              file is gone: an error naming it, exit 2
  a token file, no tokenizer  the prompt is token ids separated by spaces ("17 4 250"), and the
                              output is the ids, space-separated, on one line

options:
  --prompt TEXT      what the text starts with (required; at least one token)
  --tokens N         tokens to generate after it (required), 0..100000000
  --step N           the checkpoint of step N (default: the newest intact one)
  --temperature T    the logits are divided by T before the softmax: below 1 sharper, above 1
                     flatter; 0 = greedy, the most likely token every time (default 1)
  --top-k K          draw among the K most likely tokens only; 0 = among all (default 0)
  --seed S           the draws' seed: the same checkpoint, prompt, options and seed give the
                     same text (default 1337)
  --verbose          on stderr: the checkpoint and model, and the time generation took in
                     tokens/s (the prompt's pass included, loading excluded)

Past the model's context each token is drawn from the last `context` tokens, as nanoGPT's
generate crops: the position embeddings are learned, so the cache is recomputed for that window
at every such step (a pass over `context` tokens each). An MoE model's experts take every token
routed to them: there is no capacity limit at inference. Ids the run's data cannot hold (a
model with a wider --vocab than its data) are never drawn.

Exit status: 0 done; 1 a damaged checkpoint (troupe ckpt verify says where) or an error while
working; 2 bad usage or input (RUN_DIR not a run directory, no checkpoint, a --step it has
not, bad numbers, a prompt out of the vocabulary, the tokenizer missing).
)";
}

int run_sample(const std::vector<std::string>& args) {
  const auto o = parse_options(args);
  return exit_code_of(command, [&] { return sample(o); });
}

}  // namespace troupe::cli
