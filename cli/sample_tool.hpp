#pragma once
// `troupe sample`: text from a run's model. The committed checkpoint (the newest intact one, or
// --step N) is loaded into one process whatever layout wrote it; the prompt is fed through it
// once and each new token against a cache of every layer's keys and values
// (runtime/model/generate.hpp). Byte-level runs read and write bytes; token-file runs encode
// and decode with the SentencePiece model their data names, or, without one, read and write ids.

#include <string>
#include <vector>

namespace troupe::cli {

/// The help text of `troupe sample`.
[[nodiscard]] std::string sample_help();

/// Runs `troupe sample` with the arguments after the command. Returns 0 when the text was
/// written, 1 for a damaged checkpoint or a failure while working (said on stderr). Bad usage
/// and bad input (no run directory, no checkpoint, a --step it lacks, bad numbers, a prompt the
/// vocabulary cannot hold, a tokenizer file gone) throw usage_error (exit 2).
int run_sample(const std::vector<std::string>& args);

}  // namespace troupe::cli
