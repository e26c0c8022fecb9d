#include "runtime/data/corpus_plan.hpp"

#include <algorithm>
#include <filesystem>
#include <vector>

namespace troupe {

void scan_token_ids(const corpus_file& file, uint64_t full_scan_bytes) {
  if (!file.token_file) return;  // every byte is below a text file's 256
  // The dataset reads and checks ids window by window; a window of the whole file (or of
  // each block) reads them all.
  const token_dataset data = token_dataset::open(file.path, 0.0);
  const uint64_t bytes = file.tokens * static_cast<uint64_t>(file.width);
  constexpr uint64_t block_tokens = uint64_t{1} << 18;
  std::vector<uint64_t> starts;
  if (bytes <= full_scan_bytes) {
    for (uint64_t at = 0; at < file.tokens; at += block_tokens) starts.push_back(at);
  } else {
    const uint64_t blocks = 64, per = (uint64_t{1} << 20) / static_cast<uint64_t>(file.width);
    for (uint64_t b = 0; b < blocks; ++b) {
      const uint64_t at = (file.tokens - per) / (blocks - 1) * b;
      for (uint64_t t = at; t < at + per; t += block_tokens) starts.push_back(t);
    }
  }
  std::vector<token_id> ids(block_tokens);
  for (uint64_t at : starts) {
    const uint64_t n = std::min(block_tokens, file.tokens - at);
    data.read(at, n, ids.data());
  }
}

void resolve_corpus(train_config& cfg) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_regular_file(cfg.data, ec)) {
    // preflight (read_host_facts) names what is wrong with it, with the setup's advice for the
    // default corpus; until then the model has the text's vocabulary.
    if (cfg.model.vocab == 0) cfg.model.vocab = 256;
    return;
  }
  try {
    const corpus_file train = describe_corpus(cfg.data);
    if (cfg.val_data.empty() && train.token_file && fs::path(cfg.data).filename() == "train.bin") {
      const fs::path beside = fs::path(cfg.data).parent_path() / "val.bin";
      if (fs::exists(beside, ec)) cfg.val_data = beside.string();
    }
    if (cfg.model.vocab == 0) {
      cfg.model.vocab = static_cast<int>(train.vocab);
    } else if (cfg.model.vocab < train.vocab) {
      throw config_error(
          "model.vocab (--vocab): " + std::to_string(cfg.model.vocab) + " is below the " +
          std::to_string(train.vocab) + " token ids of corpus '" + cfg.data + "'" +
          (train.token_file ? " (vocab_size in its sidecar)" : " (a text file: one per byte)") +
          "; leave --vocab out to take the data's, or give at least " +
          std::to_string(train.vocab));
    }
    scan_token_ids(train);
    if (!cfg.val_data.empty()) {
      const corpus_file val = describe_corpus(cfg.val_data);
      if (val.token_file != train.token_file || val.vocab != train.vocab)
        throw config_error(
            "val_data (--val-data): corpus '" + cfg.val_data + "' (" +
            (val.token_file ? "vocabulary " + std::to_string(val.vocab) : std::string("text")) +
            ") does not match --data '" + cfg.data + "' (" +
            (train.token_file ? "vocabulary " + std::to_string(train.vocab) : std::string("text")) +
            "); give a validation file made the same way as the training file");
      scan_token_ids(val);
    }
  } catch (const data_error& e) {
    throw config_error(std::string("data (--data, --val-data): ") + e.what());
  }
}

}  // namespace troupe
