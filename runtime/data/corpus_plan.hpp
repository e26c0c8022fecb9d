#pragma once
// Before a job starts (in the coordinator): what its corpus is, and the settings that follow
// from it. A token file brings its vocabulary and, named train.bin, its val.bin; the model's
// vocabulary is checked against the data's, and the token ids against both.

#include <cstdint>

#include "runtime/config.hpp"
#include "runtime/data/dataset.hpp"

namespace troupe {

/// Token ids read in full when the file is at most this size; a larger file is read in
/// blocks spread over it (every window the workers read is checked as it is read).
inline constexpr uint64_t full_id_scan_bytes = uint64_t{256} << 20;

/// Fills in cfg.val_data (val.bin beside a token file train.bin, when it exists and none was
/// given) and cfg.model.vocab (0 = the data's), and checks them: a vocabulary below the
/// data's, a validation file of another tokenizer, a token id at or above the vocabulary.
/// cfg.data must be set. Throws config_error naming the file, the setting and what to do.
void resolve_corpus(train_config& cfg);

/// Reads the token ids of `file` (all of them up to `full_scan_bytes`, else 64 blocks of
/// 1 MiB spread evenly) and throws data_error naming the first id not below the vocabulary
/// of its sidecar.
void scan_token_ids(const corpus_file& file, uint64_t full_scan_bytes = full_id_scan_bytes);

}  // namespace troupe
