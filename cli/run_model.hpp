#pragma once
// The model of a run directory at a step, for the commands that use a trained model (`troupe
// sample`, `troupe eval`): the job's config, the committed checkpoint chosen (the newest
// intact one, or a given step), its parameters read through the restore path into one
// single-rank GPT whatever layout wrote them, and what the model's token ids stand for.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "runtime/config.hpp"
#include "runtime/model/gpt.hpp"

namespace troupe::cli {

class command_line;

/// What a run's token ids stand for, read from its training data.
struct run_vocabulary {
  bool bytes = true;      ///< a text corpus: each id is one byte
  int64_t size = 256;     ///< ids of the data are below it (the model's may be wider: --vocab)
  std::string tokenizer;  ///< a token file's SentencePiece model (absolute); "" = none named
  std::string data;       ///< the corpus it was read from
};

/// The vocabulary of corpus `path`: from describe_corpus, or, when the file is gone, from its
/// sidecar alone (a token file) or as bytes (no sidecar: a text file). Throws data_error for a
/// file or sidecar that is there but unusable.
run_vocabulary vocabulary_of(const std::string& path);

/// A run's model at one committed step.
struct run_model {
  std::string run_dir;
  int64_t step = 0;
  std::string layout;          ///< the layout that wrote the checkpoint ("dp2", "tp2", ...)
  train_config cfg;            ///< RUN_DIR/config.json: the job as it was last started
  std::unique_ptr<gpt> model;  ///< the checkpoint's parameters, single-rank
  run_vocabulary vocab;
};

/// Loads `run_dir`'s model at `step` (nullopt: the newest committed checkpoint at or before
/// LATEST whose parameters read back intact, passing over damaged ones with a line on stderr).
/// `command` ("troupe sample") starts every message. Throws usage_error (exit 2): RUN_DIR is
/// not a run directory (no readable config.json), it has no committed checkpoint, `step` has
/// none (the message lists the steps that have one), the checkpoint is not the built-in GPT
/// (a `troupe run -- PROGRAM` job's), or the run's data is unusable. Throws
/// ckpt::checkpoint_error (exit 1) when the checkpoint asked for is damaged, and
/// std::runtime_error (exit 1) when every checkpoint is.
run_model load_run_model(const std::string& command, const std::string& run_dir,
                         std::optional<int64_t> step);

/// What `work` returns; a usage_error passes on (exit 2), any other error is printed after
/// `command` ("troupe sample: ...") and gives exit 1.
int exit_code_of(const std::string& command, const std::function<int()>& work);

/// --step's value: N or step-N (as `troupe ckpt ls` prints it), N >= 0.
int64_t parse_step_option(const command_line& cl, const std::string& text);

}  // namespace troupe::cli
