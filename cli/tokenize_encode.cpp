// `troupe tokenize CORPUS OUT_DIR`: the tokenizer first (trained, or given and checked), then
// the corpus encoded block by block — blocks encoded in parallel, written in order to
// temporary files — and last every file renamed into place in an order that a crash at any
// moment leaves consistent. Nothing holds the corpus or its tokens whole.

#include "cli/tokenize_encode.hpp"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli/tokenize_blocks.hpp"
#include "cli/tokenize_encoder.hpp"
#include "cli/tokenize_files.hpp"
#include "cli/tokenize_train.hpp"
#include "runtime/data/token_sidecar.hpp"

namespace troupe::cli::tokenize {
namespace {

namespace fs = std::filesystem;
namespace spm = sentencepiece;
using steady = std::chrono::steady_clock;

struct encoded_block {
  std::string bytes;
  uint64_t tokens = 0;
};

/// Encodes [begin, end) of the corpus into `out`: blocks encoded by up to `threads` at once
/// and written in order. With `check_utf8`, each block is checked first (a usage_error at the
/// first byte that is not UTF-8). Returns the tokens written.
uint64_t encode_range(const input_file& in, uint64_t begin, uint64_t end,
                      const token_encoder& encoder, int threads, bool check_utf8, output_file& out,
                      progress& shown, uint64_t shown_base, uint64_t shown_total) {
  block_reader blocks(in, begin, end);
  std::deque<std::future<encoded_block>> running;
  uint64_t tokens = 0;
  const auto write_front = [&] {
    encoded_block b = running.front().get();
    running.pop_front();
    out.write(b.bytes);
    tokens += b.tokens;
  };
  std::string text;
  uint64_t offset = 0;
  while (blocks.next(text, offset)) {
    if (check_utf8)
      if (const size_t bad = first_malformed_utf8(text); bad != std::string::npos)
        throw not_utf8(in, offset + bad);
    while (running.size() >= static_cast<size_t>(threads)) write_front();
    running.push_back(std::async(std::launch::async, [&encoder, t = std::move(text)] {
      encoded_block b;
      b.bytes.reserve(t.size());
      b.tokens = encoder.encode(t, b.bytes);
      return b;
    }));
    text = std::string();
    shown.update(shown_base + blocks.position() - begin, shown_total);
  }
  while (!running.empty()) write_front();
  return tokens;
}

/// The tokenizer's serialized model and where it came from.
struct tokenizer_model {
  std::string bytes;
  corpus_sample sample;  ///< what it was trained on; empty for --tokenizer's
  double train_seconds = 0;
};

/// The tokenizer: trained on a sample of the training share (the corpus before `split`), or
/// the one given.
tokenizer_model make_tokenizer(const tokenize_options& o, const input_file& corpus,
                               uint64_t split) {
  tokenizer_model model;
  if (o.tokenizer.empty()) {
    const double keep =
        std::min(1.0, o.sample_mb * 1e6 / static_cast<double>(std::max<uint64_t>(split, 1)));
    model.sample = scan_corpus(corpus, split, keep);
    if (model.sample.sentences.empty())
      throw bad_input("corpus " + o.corpus + " has no text to train on in its training share");
    std::fprintf(stderr, "%s: training a %lld-piece %s tokenizer on %s of %s (%zu sentences)\n",
                 command.c_str(), static_cast<long long>(o.vocab), o.model_type.c_str(),
                 megabytes(model.sample.bytes).c_str(), megabytes(split).c_str(),
                 model.sample.sentences.size());
    const auto t0 = steady::now();
    model.bytes = train_tokenizer(o, model.sample);
    model.train_seconds = std::chrono::duration<double>(steady::now() - t0).count();
  } else {
    const input_file given(o.tokenizer, "tokenizer");
    model.bytes.resize(given.size());
    given.read_at(0, model.bytes.data(), model.bytes.size());
  }
  return model;
}

/// `model` loaded into `sp` and shown fit for use: a trained one has the --vocab asked for,
/// and either gives text back unchanged. What fails is the user's mistake for a given
/// tokenizer and a tool_failure for a trained one (but a --vocab too large for the corpus is
/// the user's). Returns its vocabulary size.
int64_t load_checked(const tokenize_options& o, const tokenizer_model& model,
                     spm::SentencePieceProcessor& sp) {
  if (const auto status = sp.LoadFromSerializedProto(model.bytes); !status.ok()) {
    if (o.tokenizer.empty())
      throw tool_failure("the trained tokenizer does not load: " + spm_message(status));
    throw bad_input("tokenizer " + o.tokenizer + " is not a SentencePiece model" +
                    (spm_message(status).empty() ? "" : ": " + spm_message(status)));
  }
  const int64_t vocab = sp.GetPieceSize();
  if (o.tokenizer.empty() && vocab != o.vocab)  // BPE stops where no pair is left to merge
    throw bad_input("--vocab " + std::to_string(o.vocab) + " is more than corpus " + o.corpus +
                    " can fill: its sample gave " + std::to_string(vocab) +
                    " pieces; give --vocab " + std::to_string(vocab) +
                    " or less, or a larger corpus (or --sample-mb)");
  if (const auto failure =
          round_trip_failure(sp, token_encoder(sp, token_dtype::uint32), model.sample.sentences)) {
    if (o.tokenizer.empty())
      throw tool_failure("the trained tokenizer does not give text back unchanged: " + *failure);
    throw bad_input("tokenizer " + o.tokenizer + " does not give text back unchanged (" + *failure +
                    "); train one with troupe tokenize CORPUS OUT_DIR --vocab N");
  }
  return vocab;
}

/// A share of the corpus (train.bin's or val.bin's) and the token file it becomes.
struct share {
  std::string name;
  uint64_t begin, end;
  std::unique_ptr<output_file> file;
  uint64_t tokens = 0;
};

/// The corpus encoded into train.bin (before `split`) and val.bin (from it, if anything is
/// there), each written and flushed under its temporary name.
std::vector<share> encode_shares(const tokenize_options& o, const input_file& corpus,
                                 uint64_t split, const token_encoder& encoder) {
  const fs::path dir(o.out_dir);
  std::vector<share> shares;
  shares.push_back({"train.bin", 0, split, nullptr});
  if (split < corpus.size()) shares.push_back({"val.bin", split, corpus.size(), nullptr});
  progress shown("encoding " + o.corpus);
  for (auto& s : shares) {
    s.file = std::make_unique<output_file>((dir / s.name).string());
    // A given tokenizer's corpus was never read whole (scan_corpus), so it is checked here.
    s.tokens = encode_range(corpus, s.begin, s.end, encoder, o.threads, !o.tokenizer.empty(),
                            *s.file, shown, s.begin, corpus.size());
    s.file->finish();
  }
  return shares;
}

/// In place, so that a crash at any moment leaves no token file beside a sidecar or a
/// tokenizer of another run (a reader takes a .bin without a sidecar for text): the earlier
/// run's token files go first, then the model comes, then each sidecar and last its file.
void commit_in_place(const fs::path& dir, output_file& model_file, std::vector<share>& shares,
                     token_dtype dtype, int64_t vocab) {
  for (const char* name : {"train.bin", "val.bin"}) remove_if_there((dir / name).string());
  if (shares.size() == 1) remove_if_there(token_sidecar_path((dir / "val.bin").string()));
  model_file.commit();
  for (auto& s : shares) {
    try {
      write_token_sidecar(token_sidecar_path(s.file->path()),
                          {dtype, vocab, static_cast<int64_t>(s.tokens), "tokenizer.model"});
    } catch (const token_sidecar_error& e) {
      throw tool_failure(e.what());
    }
    s.file->commit();
  }
}

}  // namespace

int run_encode(const tokenize_options& o) {
  const auto started = steady::now();
  const input_file corpus(o.corpus, "corpus");
  prepare_out_dir(o.out_dir);
  const uint64_t split = split_offset(corpus, o.val_fraction);
  const fs::path dir(o.out_dir);

  const tokenizer_model model = make_tokenizer(o, corpus, split);
  spm::SentencePieceProcessor sp;
  const int64_t vocab = load_checked(o, model, sp);
  const token_dtype dtype = token_dtype_for_vocab(vocab);

  // The token files, under temporary names until all are written.
  const token_encoder encoder(sp, dtype);
  const auto t0 = steady::now();
  output_file model_file((dir / "tokenizer.model").string());
  model_file.write(model.bytes);
  model_file.finish();
  std::vector<share> shares = encode_shares(o, corpus, split, encoder);
  const double encode_seconds = std::chrono::duration<double>(steady::now() - t0).count();
  commit_in_place(dir, model_file, shares, dtype, vocab);

  std::printf("%s: %s (%s) -> %s\n", command.c_str(), o.corpus.c_str(),
              megabytes(corpus.size()).c_str(), o.out_dir.c_str());
  if (o.tokenizer.empty())
    std::printf("  tokenizer.model  %s, %lld pieces, trained on %s in %.1f s\n",
                o.model_type.c_str(), static_cast<long long>(vocab),
                megabytes(model.sample.bytes).c_str(), model.train_seconds);
  else
    std::printf("  tokenizer.model  %lld pieces, copied from %s\n", static_cast<long long>(vocab),
                o.tokenizer.c_str());
  for (const auto& s : shares)
    std::printf(
        "  %-16s %llu %s tokens of %s (%.2f bytes a token), sidecar %s.json\n", s.name.c_str(),
        static_cast<unsigned long long>(s.tokens), std::string(token_dtype_name(dtype)).c_str(),
        megabytes(s.end - s.begin).c_str(),
        s.tokens ? static_cast<double>(s.end - s.begin) / static_cast<double>(s.tokens) : 0.0,
        s.name.c_str());
  std::printf("  encoded in %.2f s (%.1f MB/s, %d threads); %.1f s in all\n", encode_seconds,
              static_cast<double>(corpus.size()) / 1e6 / std::max(encode_seconds, 1e-9), o.threads,
              std::chrono::duration<double>(steady::now() - started).count());
  return 0;
}

}  // namespace troupe::cli::tokenize
