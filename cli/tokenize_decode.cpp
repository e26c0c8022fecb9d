// Token files back to text for `troupe tokenize --decode` and `--check`. A file is opened with
// its sidecar (sizes checked against each other) and decoded in batches, so that neither the
// tokens nor the text are ever held whole.

#include "cli/tokenize_decode.hpp"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "cli/tokenize_common.hpp"
#include "cli/tokenize_files.hpp"
#include "runtime/data/token_sidecar.hpp"
#include "runtime/sys/printable.hpp"

namespace troupe::cli::tokenize {
namespace {

namespace fs = std::filesystem;
namespace spm = sentencepiece;

std::unique_ptr<spm::SentencePieceProcessor> load_tokenizer(const std::string& path,
                                                            const std::string& named_by) {
  input_file file(path, "tokenizer");
  std::string bytes(file.size(), '\0');
  file.read_at(0, bytes.data(), bytes.size());
  auto sp = std::make_unique<spm::SentencePieceProcessor>();
  const auto status = sp->LoadFromSerializedProto(bytes);
  if (!status.ok())
    throw bad_input("tokenizer " + path + " (" + named_by + ") is not a SentencePiece model" +
                    (spm_message(status).empty() ? "" : ": " + spm_message(status)));
  return sp;
}

/// A token file opened with its sidecar, its size checked against the sidecar.
struct token_file {
  explicit token_file(const std::string& path)
      : sidecar_path(token_sidecar_path(path)), in(path, "token file", true) {
    try {
      sidecar = read_token_sidecar(sidecar_path);
    } catch (const token_sidecar_error& e) {
      throw bad_input(e.what());
    }
    const uint64_t want =
        static_cast<uint64_t>(sidecar.tokens) * static_cast<uint64_t>(token_width(sidecar.dtype));
    if (in.size() != want)
      throw bad_input("token file " + path + " is " + std::to_string(in.size()) +
                      " bytes, but its sidecar " + sidecar_path + " says " +
                      std::to_string(sidecar.tokens) + " " +
                      std::string(token_dtype_name(sidecar.dtype)) + " tokens (" +
                      std::to_string(want) + " bytes): one of them is from another run");
    if (sidecar.tokenizer.empty())
      throw bad_input("token file " + path + " names no tokenizer in " + sidecar_path +
                      ": there is nothing to decode it with");
    tokenizer_path = (fs::path(sidecar_path).parent_path() / sidecar.tokenizer).string();
  }

  std::string sidecar_path;
  input_file in;
  token_sidecar sidecar;
  std::string tokenizer_path;
};

/// The text of `file`, in pieces, to `sink`. Ids are decoded in batches, each cut before its
/// last piece and the byte pieces that continue it, so that no character whose bytes are byte
/// pieces is split between two batches (SentencePiece would decode each half to U+FFFD).
void decode_tokens(const token_file& file, const spm::SentencePieceProcessor& sp,
                   const std::function<void(std::string_view)>& sink) {
  const int pieces = sp.GetPieceSize();
  // The ids a batch must not end before: byte pieces of a byte that continues a character.
  std::vector<char> continues(static_cast<size_t>(pieces));
  for (int id = 0; id < pieces; ++id) {
    unsigned byte = 0;
    if (sp.IsByte(id) && std::sscanf(sp.IdToPiece(id).c_str(), "<0x%2X>", &byte) == 1)
      continues[static_cast<size_t>(id)] = (byte & 0xC0) == 0x80 ? 1 : 0;
  }
  const size_t width = static_cast<size_t>(token_width(file.sidecar.dtype));
  const uint64_t total = static_cast<uint64_t>(file.sidecar.tokens);
  constexpr uint64_t batch = uint64_t{1} << 18;
  std::vector<int> ids, head;
  std::string raw, text;
  progress shown("decoding " + file.in.path());
  for (uint64_t at = 0; at < total;) {
    const uint64_t n = std::min(batch, total - at);
    raw.resize(n * width);
    file.in.read_at(at * width, raw.data(), raw.size());
    for (uint64_t i = 0; i < n; ++i) {
      uint32_t id = 0;
      if (width == 2) {
        uint16_t v;
        std::memcpy(&v, raw.data() + i * 2, 2);
        id = v;
      } else {
        std::memcpy(&id, raw.data() + i * 4, 4);
      }
      if (id >= static_cast<uint32_t>(pieces) ||
          static_cast<int64_t>(id) >= file.sidecar.vocab_size)
        throw bad_input("token file " + file.in.path() + " holds id " + std::to_string(id) +
                        " at token " + std::to_string(at + i) + ", beyond the vocabulary (" +
                        std::to_string(std::min<int64_t>(pieces, file.sidecar.vocab_size)) +
                        " pieces): it is damaged or from another tokenizer");
      ids.push_back(static_cast<int>(id));
    }
    at += n;
    size_t cut = ids.size();
    if (at < total) {  // the last character's byte pieces may go on in the next batch
      while (cut > 0 && continues[static_cast<size_t>(ids[cut - 1])]) --cut;
      if (cut > 0) --cut;  // before the piece the continuation bytes follow
      if (cut == 0) cut = ids.size();
    }
    head.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(cut));
    const auto status = sp.Decode(head, &text);
    if (!status.ok())
      throw tool_failure("SentencePiece could not decode " + file.in.path() + ": " +
                         spm_message(status));
    sink(text);
    ids.erase(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(cut));
    shown.update(at * width, total * width);
  }
}

/// "train.bin decodes to "DECODED" where CORPUS has "EXPECTED" at byte OFFSET", each text
/// from the first byte that differs, cut to 40 bytes.
std::string first_difference(const std::string& name, std::string_view decoded,
                             const std::string& corpus_path, std::string_view expected,
                             uint64_t offset) {
  return name + " decodes to \"" + sys::printable(decoded.substr(0, 40)) + "\" where " +
         corpus_path + " has \"" + sys::printable(expected.substr(0, 40)) + "\" at byte " +
         std::to_string(offset);
}

}  // namespace

int run_decode(const std::string& tokens) {
  const token_file file(tokens);
  const auto sp = load_tokenizer(file.tokenizer_path, "named by " + file.sidecar_path);
  decode_tokens(file, *sp, [](std::string_view text) {
    if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size())
      throw tool_failure("cannot write the text to stdout: " + errno_text(errno));
  });
  if (std::fflush(stdout) != 0)
    throw tool_failure("cannot write the text to stdout: " + errno_text(errno));
  return 0;
}

int run_check(const std::string& corpus_path, const std::string& out_dir) {
  const input_file corpus(corpus_path, "corpus");
  std::vector<std::string> names = {"train.bin"};
  const std::string val = (fs::path(out_dir) / "val.bin").string();
  if (fs::exists(val) || fs::exists(token_sidecar_path(val))) names.push_back("val.bin");
  uint64_t at = 0, tokens = 0;
  std::string expected;
  std::optional<std::string> difference;
  for (const auto& name : names) {
    const token_file file((fs::path(out_dir) / name).string());
    const auto sp = load_tokenizer(file.tokenizer_path, "named by " + file.sidecar_path);
    decode_tokens(file, *sp, [&](std::string_view text) {
      if (difference) return;
      const uint64_t n = std::min<uint64_t>(text.size(), corpus.size() - at);
      expected.resize(n);
      corpus.read_at(at, expected.data(), n);
      size_t same = 0;
      while (same < n && expected[same] == text[same]) ++same;
      if (same < text.size()) {
        difference = first_difference(name, text.substr(same), corpus_path,
                                      std::string_view(expected).substr(same), at + same);
        return;
      }
      at += n;
    });
    if (difference) break;
    tokens += static_cast<uint64_t>(file.sidecar.tokens);
  }
  if (!difference && at != corpus.size())
    difference = "the token files decode to " + std::to_string(at) + " bytes, " + corpus_path +
                 " has " + std::to_string(corpus.size());
  if (difference) {
    std::fprintf(stderr, "%s: %s\n", command.c_str(), sys::printable_lines(*difference).c_str());
    return 1;
  }
  std::printf("%s: %s decodes to %s byte for byte (%llu bytes, %llu tokens)\n", command.c_str(),
              out_dir.c_str(), corpus_path.c_str(), static_cast<unsigned long long>(at),
              static_cast<unsigned long long>(tokens));
  return 0;
}

}  // namespace troupe::cli::tokenize
