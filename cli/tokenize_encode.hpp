#pragma once
// Internal to `troupe tokenize`: the command's main mode, CORPUS OUT_DIR -> OUT_DIR's
// tokenizer.model, train.bin, val.bin and their sidecars.

#include "cli/tokenize_common.hpp"

namespace troupe::cli::tokenize {

/// Trains a tokenizer on a sample of o.corpus (or takes o.tokenizer), encodes the corpus into
/// o.out_dir's token files on o.threads threads, and prints what it wrote. Returns 0; bad
/// input throws usage_error, a failure while working tool_failure (or what the system threw).
int run_encode(const tokenize_options& o);

}  // namespace troupe::cli::tokenize
