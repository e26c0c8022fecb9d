#pragma once
// Internal to `troupe tokenize`: the modes that read token files back as text — --decode, which
// writes a file's text to stdout, and --check, which compares OUT_DIR's files with the corpus.

#include <string>

namespace troupe::cli::tokenize {

/// `troupe tokenize --decode TOKENS`: the text of token file `tokens` (decoded with the
/// tokenizer its sidecar names) to stdout. Returns 0; a file that is missing, damaged or
/// does not match its sidecar throws usage_error, a failed write tool_failure.
int run_decode(const std::string& tokens);

/// `troupe tokenize CORPUS OUT_DIR --check`: OUT_DIR's train.bin, then val.bin if it is there,
/// decoded and compared with `corpus_path` byte for byte. Returns 0 when they are the same (said on
/// stdout), 1 at the first difference (said on stderr); bad files throw as run_decode's do.
int run_check(const std::string& corpus_path, const std::string& out_dir);

}  // namespace troupe::cli::tokenize
