#pragma once
// `troupe tokenize`: trains a SentencePiece tokenizer on a text corpus and writes the corpus
// as token files (OUT_DIR/train.bin and val.bin, nanoGPT's layout, each with its sidecar
// runtime/data/token_sidecar.hpp) beside OUT_DIR/tokenizer.model; decodes them again
// (--decode) and checks that they give the corpus back byte for byte (--check).

#include <string>
#include <vector>

namespace troupe::cli {

/// The help text of `troupe tokenize`.
[[nodiscard]] std::string tokenize_help();

/// Runs `troupe tokenize` with the arguments after the command. Returns the exit code: 0 done
/// (for --check: the token files decode to the corpus), 1 an error while working (a failed
/// write, a SentencePiece failure, --check found a difference). Bad usage and bad input (a
/// corpus missing, empty, not a regular file or not UTF-8; OUT_DIR not writable; --vocab out
/// of range for the corpus) throw usage_error (exit 2).
int run_tokenize(const std::vector<std::string>& args);

}  // namespace troupe::cli
