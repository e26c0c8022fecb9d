// Training `troupe tokenize`'s SentencePiece tokenizer: the sample is taken here (a seeded hash
// of each sentence's index, so the same corpus trains the same model) and handed to the trainer
// from memory; its refusals of a --vocab are turned into advice on the --vocab to give.

#include "cli/tokenize_train.hpp"

#include <sentencepiece_trainer.h>

#include <algorithm>
#include <charconv>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "cli/tokenize_blocks.hpp"
#include "runtime/data/random.hpp"

namespace troupe::cli::tokenize {
namespace {

namespace spm = sentencepiece;

/// Training sentences are lines cut to at most this many bytes (SentencePiece skips longer
/// sentences; a corpus of one paragraph per line would otherwise train on nothing).
constexpr size_t max_sentence_bytes = 4096;
constexpr uint64_t sample_seed = 0x746f'6b65'6e69'7a65ULL;  // "tokenize"

/// The integer after `marker` in `text`, if there is one.
std::optional<int64_t> number_after(const std::string& text, const std::string& marker) {
  const size_t at = text.find(marker);
  if (at == std::string::npos) return std::nullopt;
  int64_t v = 0;
  const char* begin = text.data() + at + marker.size();
  const auto [end, ec] = std::from_chars(begin, text.data() + text.size(), v);
  if (ec != std::errc() || end == begin) return std::nullopt;
  return v;
}

/// The sampled sentences, as SentencePiece's trainer reads them.
class sentence_list : public spm::SentenceIterator {
 public:
  explicit sentence_list(const std::vector<std::string>& s) : s_(s) {}
  bool done() const override { return at_ >= s_.size(); }
  void Next() override { ++at_; }
  const std::string& value() const override { return s_[at_]; }
  spm::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& s_;
  size_t at_ = 0;
};

}  // namespace

corpus_sample scan_corpus(const input_file& in, uint64_t split, double keep) {
  corpus_sample out;
  progress shown("reading " + in.path());
  block_reader blocks(in, 0, in.size());
  std::string text, line;
  uint64_t offset = 0;
  const auto offer = [&](std::string_view sentence) {
    if (sentence.empty()) return;
    if (to_unit(hash_words(sample_seed, out.offered++, 0)) >= keep) return;
    out.sentences.emplace_back(sentence);
    out.bytes += sentence.size();
  };
  while (blocks.next(text, offset)) {
    if (const size_t bad = first_malformed_utf8(text); bad != std::string::npos)
      throw not_utf8(in, offset + bad);
    shown.update(blocks.position(), in.size());
    if (offset >= split) continue;
    const std::string_view train(text.data(), std::min<uint64_t>(text.size(), split - offset));
    for (size_t i = 0; i < train.size();) {
      const size_t nl = train.find('\n', i);
      const size_t end = nl == std::string_view::npos ? train.size() : nl;
      line.append(train.substr(i, end - i));
      size_t from = 0;
      while (line.size() - from > max_sentence_bytes) {  // a long line: several sentences
        const std::string_view rest = std::string_view(line).substr(from);
        const size_t cut = cut_point(rest.substr(0, max_sentence_bytes), false);
        offer(rest.substr(0, cut));
        from += cut;
      }
      line.erase(0, from);
      if (nl == std::string_view::npos) break;
      offer(line);
      line.clear();
      i = nl + 1;
    }
  }
  offer(line);
  return out;
}

std::string train_tokenizer(const tokenize_options& o, const corpus_sample& sample) {
  const std::unordered_map<std::string, std::string> spec = {
      {"model_type", o.model_type},
      {"vocab_size", std::to_string(o.vocab)},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"byte_fallback", "true"},
      {"user_defined_symbols", "\n"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_digits", "false"},
      {"hard_vocab_limit", "true"},
      {"input_sentence_size", "0"},  // the sample is ours (scan_corpus)
      {"shuffle_input_sentence", "false"},
      {"max_sentence_length", std::to_string(max_sentence_bytes)},
      {"num_threads", std::to_string(o.threads)},
      {"minloglevel", "1"},  // its INFO lines are many; warnings and errors still show
  };
  spm::SetRandomGeneratorSeed(1);  // the same corpus trains the same model
  sentence_list sentences(sample.sentences);
  std::string model;
  const auto status = spm::SentencePieceTrainer::Train(spec, &sentences, &model);
  if (!status.ok()) {
    const std::string why = spm_message(status);
    const std::string vocab = "--vocab " + std::to_string(o.vocab);
    if (const auto most = number_after(why, "value <= "))  // "Vocabulary size too high"
      throw bad_input(vocab + " is more than corpus " + o.corpus + " can fill: its sample gives " +
                      std::to_string(*most) + " pieces at most; give --vocab " +
                      std::to_string(*most) + " or less, or a larger corpus (or --sample-mb)");
    if (const auto least = number_after(why, " vs "))  // "smaller than required_chars"
      throw bad_input(vocab + " is too small for corpus " + o.corpus +
                      ": its characters and the reserved pieces take " + std::to_string(*least) +
                      "; give --vocab " + std::to_string(*least) + " or more");
    if (why.find("ocabulary size") != std::string::npos)
      throw bad_input(vocab + " does not fit corpus " + o.corpus + ": SentencePiece says \"" + why +
                      "\"");
    throw tool_failure("SentencePiece could not train the tokenizer: " + why);
  }
  return model;
}

}  // namespace troupe::cli::tokenize
