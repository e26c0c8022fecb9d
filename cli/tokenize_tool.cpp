// `troupe tokenize`: a SentencePiece tokenizer trained on a sample of a text corpus, and the
// corpus as token files beside it. Three passes over the corpus, each streamed in blocks that
// end at a line end (cli/tokenize_blocks.hpp): one reads it whole (UTF-8 checked, lines sampled
// for training: cli/tokenize_train.hpp), one encodes it (blocks encoded in parallel, written in
// order to temporary files: cli/tokenize_encode.hpp), and --check decodes the files and
// compares (cli/tokenize_decode.hpp). Nothing holds the corpus or its tokens whole. This file is
// the command line: its options, its help, and which mode runs.

#include "cli/tokenize_tool.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "cli/command_line.hpp"
#include "cli/tokenize_common.hpp"
#include "cli/tokenize_decode.hpp"
#include "cli/tokenize_encode.hpp"
#include "cli/tokenize_train.hpp"
#include "runtime/sys/printable.hpp"

namespace troupe::cli {
namespace {

using tokenize::command;
using tokenize::tokenize_options;

int64_t parse_integer(const command_line& cl, const std::string& flag, const std::string& text,
                      int64_t lo, int64_t hi, const std::string& why = "") {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi)
    throw cl.error(flag + " must be an integer from " + std::to_string(lo) + " to " +
                   std::to_string(hi) + why + ", got '" + text + "'");
  return v;
}

double parse_real(const command_line& cl, const std::string& flag, const std::string& text,
                  double lo, double hi, bool hi_open, const std::string& range) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !(v >= lo) ||
      (hi_open ? !(v < hi) : !(v <= hi)))
    throw cl.error(flag + " must be a number in " + range + ", got '" + text + "'");
  return v;
}

/// The options of `troupe tokenize ARGS`; bad usage throws usage_error.
tokenize_options parse_options(const std::vector<std::string>& args) {
  command_line cl(command);
  for (const char* v : {"--vocab", "--model-type", "--val-fraction", "--sample-mb", "--tokenizer",
                        "--threads", "--decode"})
    cl.value(v);
  cl.flag("--check");
  cl.parse(args, 2, "arguments (CORPUS and OUT_DIR)");
  tokenize_options o;
  for (const auto& [flag, v] : cl.given()) {
    if (flag == "--vocab") {
      o.vocab = parse_integer(cl, flag, v, tokenize::min_vocab, tokenize::max_vocab,
                              " (256 byte pieces, <unk>, <s>, </s> and the newline take 260)");
    } else if (flag == "--model-type") {
      if (v != "bpe" && v != "unigram")
        throw cl.error("--model-type must be bpe or unigram, got '" + v + "'");
      o.model_type = v;
    } else if (flag == "--val-fraction") {
      o.val_fraction = parse_real(cl, flag, v, 0, 1, true, "[0, 1)");
    } else if (flag == "--sample-mb") {
      o.sample_mb = parse_real(cl, flag, v, 1, 1e6, false, "[1, 1000000]");
    } else if (flag == "--tokenizer") {
      if (v.empty()) throw cl.error("--tokenizer needs a SentencePiece model file");
      o.tokenizer = v;
    } else if (flag == "--threads") {
      o.threads = static_cast<int>(parse_integer(cl, flag, v, 1, 256));
    } else if (flag == "--check") {
      o.check = true;
    } else if (flag == "--decode") {
      if (v.empty()) throw cl.error("--decode needs a token file (OUT_DIR/train.bin)");
      o.decode = v;
    }
  }
  const auto& pos = cl.positional();
  if (!o.decode.empty()) {
    if (!pos.empty() || cl.given().size() > 1)
      throw cl.error("--decode TOKENS.bin takes nothing else (its sidecar names the tokenizer)");
    return o;
  }
  if (pos.size() < 2)
    throw cl.error(pos.empty() ? "give the corpus and an output directory: troupe tokenize "
                                 "CORPUS OUT_DIR --vocab N"
                               : "give an output directory after the corpus: troupe tokenize "
                                 "CORPUS OUT_DIR --vocab N");
  o.corpus = pos[0];
  o.out_dir = pos[1];
  if (o.corpus.empty() || o.out_dir.empty()) throw cl.error("CORPUS and OUT_DIR must not be empty");
  if (o.check) {
    if (cl.given().size() > 1)
      throw cl.error("--check takes only CORPUS and OUT_DIR (the files say the rest)");
    return o;
  }
  if (o.vocab == 0 && o.tokenizer.empty())
    throw cl.error("--vocab N is required (pieces in the vocabulary, e.g. --vocab 4000)");
  if (o.vocab != 0 && !o.tokenizer.empty())
    throw cl.error("--vocab and --tokenizer exclude each other: the model's vocabulary is its own");
  if (o.threads == 0)
    o.threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  return o;
}

}  // namespace

std::string tokenize_help() {
  return R"(usage: troupe tokenize CORPUS OUT_DIR --vocab N [options]
       troupe tokenize CORPUS OUT_DIR --check
       troupe tokenize --decode OUT_DIR/train.bin > text

Trains a SentencePiece tokenizer on CORPUS (UTF-8 text) and writes the corpus as tokens:
  OUT_DIR/tokenizer.model   the tokenizer (byte fallback: any text encodes)
  OUT_DIR/train.bin         token ids, little-endian uint16 (uint32 above 65536 pieces), no
                            header: nanoGPT's layout
  OUT_DIR/val.bin           the same for the last --val-fraction of CORPUS, cut at a line end
  OUT_DIR/*.bin.json        each file's sidecar: {"format": "troupe.tokens", "version": 1,
                            "dtype", "vocab_size", "tokens", "tokenizer": "tokenizer.model"}
Decoding train.bin then val.bin gives CORPUS back byte for byte (whitespace, newlines and
characters never seen in training included); --check shows it.

options:
  --vocab N             pieces in the vocabulary, 261..1048576 (required unless --tokenizer)
  --model-type TYPE     bpe (default) or unigram
  --val-fraction F      share of CORPUS held out at its end for val.bin, in [0, 1)
                        (default 0.05; 0: no val.bin)
  --sample-mb M         MB of CORPUS's lines, sampled evenly from its training share, that
                        train the tokenizer (default 64): bounds training time and memory
                        for any size of corpus
  --tokenizer FILE      encode with this SentencePiece model, train none (copied to
                        OUT_DIR/tokenizer.model; it must give text back unchanged)
  --threads N           threads that encode (default: the CPUs, at most 8)
  --check               decode OUT_DIR's token files and compare them with CORPUS: exit 0
                        when they are the same, 1 at the first difference
  --decode TOKENS.bin   write the text of a token file to stdout (its sidecar names the
                        tokenizer)

Exit status: 0 done, 1 an error while working, 2 bad usage or input (a corpus missing, empty,
not a regular file or not UTF-8; OUT_DIR not writable; --vocab out of range for the corpus).
)";
}

int run_tokenize(const std::vector<std::string>& args) {
  const tokenize_options o = parse_options(args);
  try {
    if (!o.decode.empty()) return tokenize::run_decode(o.decode);
    if (o.check) return tokenize::run_check(o.corpus, o.out_dir);
    return tokenize::run_encode(o);
  } catch (const usage_error&) {
    throw;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", command.c_str(), sys::printable_lines(e.what()).c_str());
    return 1;
  }
}

}  // namespace troupe::cli
