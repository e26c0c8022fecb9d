// `troupe eval`: loads a run's model (cli/run_model.hpp) and measures its mean cross-entropy on
// the run's validation windows (runtime/trainer.hpp's evaluate, as the workers call it) or on
// every token of a file.

#include "cli/eval_tool.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "cli/command_line.hpp"
#include "cli/run_model.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/sys/printable.hpp"
#include "runtime/trainer.hpp"

namespace troupe::cli {

namespace {

const std::string command = "troupe eval";

struct eval_options {
  std::string run_dir;
  std::optional<int64_t> step;
  std::string data;  ///< "" = the run's own validation split
  std::optional<int> batches;
  std::optional<uint64_t> seed;
  bool json = false;
};

eval_options parse_options(const std::vector<std::string>& args) {
  command_line cl(command);
  for (const char* v : {"--step", "--data", "--batches", "--seed"}) cl.value(v);
  cl.flag("--json");
  cl.parse(args, 1, "arguments (RUN_DIR)");
  eval_options o;
  if (cl.positional().empty()) throw cl.error("RUN_DIR is required");
  o.run_dir = cl.positional()[0];
  if (const auto s = cl.last("--step")) o.step = parse_step_option(cl, *s);
  if (const auto d = cl.last("--data")) {
    if (d->empty()) throw cl.error("--data needs a file");
    o.data = *d;
  }
  if (const auto b = cl.last("--batches"))
    o.batches = static_cast<int>(cl.integer("--batches", *b, 1, 1 << 20));
  if (const auto s = cl.last("--seed")) {
    if (!o.data.empty())
      throw cl.error(
          "--seed places the windows of the run's validation split; with --data every token "
          "of the file is read in order, so leave it out");
    o.seed = static_cast<uint64_t>(cl.integer("--seed", *s, 0, INT64_MAX));
  }
  o.json = cl.has("--json");
  return o;
}

struct eval_result {
  double loss = 0;  ///< mean cross-entropy, nats per token
  int64_t tokens = 0;
  int batches = 0;
  std::string split;  ///< "validation" or "file"
  std::string data;   ///< the file the tokens came from
  std::string what;   ///< for people: "the validation split of X"
};

/// The run's validation split, as the workers evaluate it: token_dataset::open with the run's
/// data, val_data and val_fraction, then evaluate() over eval_batches x micro_batch windows.
eval_result validation_split(run_model& r, const eval_options& o) {
  train_config c = r.cfg;
  c.model = r.model->config();
  if (o.batches) c.eval_batches = *o.batches;
  if (o.seed) c.seed = *o.seed;
  const token_dataset ds = [&] {
    try {
      return token_dataset::open(c.data, c.val_fraction, c.model.context, c.val_data);
    } catch (const data_error& e) {
      throw usage_error(command + ": the run's validation data cannot be read: " + e.what() +
                        " (give --data FILE to evaluate on a file instead)");
    }
  }();
  eval_result out;
  out.loss = evaluate(*r.model, ds, c);
  out.batches = c.eval_batches;
  out.tokens = static_cast<int64_t>(c.eval_batches) * c.micro_batch * c.model.context;
  out.split = "validation";
  out.data = c.val_data.empty() ? c.data : c.val_data;
  std::ostringstream fraction;
  fraction << c.val_fraction;
  out.what = c.val_data.empty()
                 ? "the validation split of " + c.data + " (its last " + fraction.str() + ")"
                 : c.val_data;
  return out;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return in ? std::string(std::istreambuf_iterator<char>(in), {}) : std::string();
}

/// `path` must hold ids of the run's vocabulary: text for a byte-level run, a token file of the
/// same size of vocabulary (and, where both name one, the same tokenizer) for a token run.
void require_same_vocabulary(const run_model& r, const std::string& path) {
  run_vocabulary theirs;
  try {
    (void)describe_corpus(path);  // there, a regular file, not empty, its sidecar sound
    theirs = vocabulary_of(path);
  } catch (const data_error& e) {
    throw usage_error(command + ": --data " + e.what());
  }
  const run_vocabulary& ours = r.vocab;
  const auto kind = [](const run_vocabulary& v) {
    return v.bytes ? std::string("text (bytes, vocabulary 256)")
                   : "a token file of vocabulary " + std::to_string(v.size);
  };
  if (theirs.bytes != ours.bytes || theirs.size != ours.size ||
      theirs.size > r.model->config().vocab)
    throw usage_error(command + ": --data " + path + " is " + kind(theirs) + ", but the run " +
                      r.run_dir + " trained on " + kind(ours) + " (" + ours.data +
                      "): give a file of the same vocabulary");
  if (!theirs.tokenizer.empty() && !ours.tokenizer.empty() && theirs.tokenizer != ours.tokenizer) {
    const std::string a = file_bytes(theirs.tokenizer), b = file_bytes(ours.tokenizer);
    if (!a.empty() && !b.empty() && a != b)
      throw usage_error(command + ": --data " + path + " was made with the tokenizer " +
                        theirs.tokenizer + ", the run's data with another (" + ours.tokenizer +
                        "): the same ids would mean other text");
  }
}

/// Every token of `path` after the first, predicted once: consecutive windows of context + 1
/// tokens that overlap by one (a token is predicted from those before it in its window), up to
/// micro_batch windows per pass; the last window may be shorter. `batches` caps the passes.
eval_result whole_file(run_model& r, const eval_options& o) {
  require_same_vocabulary(r, o.data);
  const token_dataset ds = [&] {
    try {
      return token_dataset::open(o.data, 0.0);
    } catch (const data_error& e) {
      throw usage_error(command + ": --data " + e.what());
    }
  }();
  const size_t n = ds.train_size();
  if (n < 2)
    throw usage_error(command + ": --data " + o.data +
                      " holds one token: there is nothing to predict");
  const int T = r.model->config().context;
  const int B = std::max(1, r.cfg.micro_batch);
  std::vector<token_id> window(static_cast<size_t>(T) + 1);
  std::vector<token_id> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  eval_result out;
  double loss_sum = 0;
  size_t at = 0;  // the first token of the next window
  while (at + 1 < n && (!o.batches || out.batches < *o.batches)) {
    const int len = static_cast<int>(std::min<size_t>(T, n - 1 - at));
    int rows = 0;
    // Windows of one length share a pass; only the file's last window is shorter.
    while (rows < B && at + 1 < n && static_cast<int>(std::min<size_t>(T, n - 1 - at)) == len) {
      ds.read(at, static_cast<size_t>(len) + 1, window.data());
      std::copy(window.begin(), window.begin() + len, inputs.begin() + rows * len);
      std::copy(window.begin() + 1, window.begin() + len + 1, targets.begin() + rows * len);
      at += static_cast<size_t>(len);
      ++rows;
    }
    const double mean = r.model->forward_loss(inputs.data(), targets.data(), rows, len);
    loss_sum += mean * rows * len;
    out.tokens += static_cast<int64_t>(rows) * len;
    ++out.batches;
  }
  out.loss = loss_sum / static_cast<double>(out.tokens);
  out.split = "file";
  out.data = o.data;
  out.what = o.data;
  return out;
}

int evaluate_run(const eval_options& o) {
  run_model r = load_run_model(command, o.run_dir, o.step);
  // The workers' BLAS threads: the same partition of each product, the same rounding.
  set_blas_threads(r.cfg.blas_threads);
  const eval_result e = o.data.empty() ? validation_split(r, o) : whole_file(r, o);
  const double perplexity = std::exp(e.loss);
  if (o.json) {
    const nlohmann::json line = {
        {"step", r.step},     {"loss", e.loss},       {"perplexity", perplexity},
        {"tokens", e.tokens}, {"batches", e.batches}, {"split", e.split},
        {"data", e.data},     {"run_dir", r.run_dir}, {"layout", r.layout}};
    std::printf("%s\n", line.dump().c_str());
  } else {
    std::printf("step %lld: loss %.4f, perplexity %.2f over %lld tokens of %s\n",
                static_cast<long long>(r.step), e.loss, perplexity,
                static_cast<long long>(e.tokens), e.what.c_str());
  }
  return 0;
}

}  // namespace

std::string eval_help() {
  return R"(usage: troupe eval RUN_DIR [--step N] [--data FILE] [--batches B] [--seed S] [--json]

The loss (mean cross-entropy, nats per token) and perplexity (e^loss) of a run's model on
held-out tokens. The committed checkpoint (the newest intact one, or --step N) is read through
the restore path, whatever layout wrote it, into one process.

Without --data: the run's own validation split (config.json's data, val_data and
val_fraction), read as its workers read it: B micro-batches of micro_batch windows of
`context` tokens, placed by the seed. With the run's own B (eval_batches) and seed, the loss is
the job's `validation` event at that step in events.jsonl, up to rounding.

With --data FILE: all of FILE is held out. It must hold the run's vocabulary: text for a
byte-level run, a token file of the same vocabulary (and tokenizer) for a token-file run;
another is refused (exit 2). Every token after the first is predicted once, in consecutive
windows of context + 1 tokens that overlap by one (each token from those before it in its
window), micro_batch windows a pass.

options:
  --step N       the checkpoint of step N (default: the newest intact one)
  --data FILE    evaluate on every token of FILE instead of the validation split
  --batches B    micro-batches to read (default: the run's eval_batches; with --data, all of
                 FILE)
  --seed S       where the validation windows lie (default: the run's seed); not with --data
  --json         one JSON line: step, loss, perplexity, tokens, batches, split ("validation"
                 or "file"), data, run_dir, layout

Exit status: 0 done; 1 a damaged checkpoint (troupe ckpt verify says where) or an error while
working; 2 bad usage or input (RUN_DIR not a run directory, no checkpoint, a --step it has
not, bad numbers, a --data file that is missing, unusable or of another vocabulary).
)";
}

int run_eval(const std::vector<std::string>& args) {
  const auto o = parse_options(args);
  return exit_code_of(command, [&] { return evaluate_run(o); });
}

}  // namespace troupe::cli
