// Text to token ids for `troupe tokenize`, a line (or a piece of a long line) at a time, with
// U+2581 written as byte pieces; and the round trip every tokenizer must pass before use.

#include "cli/tokenize_encoder.hpp"

#include <cstdio>
#include <cstring>

#include "cli/tokenize_blocks.hpp"
#include "cli/tokenize_common.hpp"
#include "runtime/sys/printable.hpp"

namespace troupe::cli::tokenize {
namespace {

/// The most text handed to SentencePiece in one call: a line at a time, and a longer line in
/// pieces of this size. Its encoders cost more per byte on longer input (BPE, 8000 pieces, the
/// KJV: 4.2-4.6 MB/s a line at a time, 3.6 in 4 KiB pieces, 2.4 in 64 KiB pieces).
constexpr size_t encode_bytes = size_t{1} << 12;
/// SentencePiece's space mark (U+2581): the decoder turns every one into a space, so one in
/// the corpus itself is written as its three byte pieces.
constexpr std::string_view space_mark = "\xE2\x96\x81";

}  // namespace

token_encoder::token_encoder(const sentencepiece::SentencePieceProcessor& sp, token_dtype dtype)
    : sp_(sp), dtype_(dtype), unk_(sp.unk_id()) {
  if (const auto status = sp.Encode("\n", &newline_ids_); !status.ok())
    throw tool_failure("SentencePiece could not encode a newline: " + spm_message(status));
  for (const char c : space_mark) {
    char piece[8];
    std::snprintf(piece, sizeof piece, "<0x%02X>", static_cast<unsigned char>(c));
    mark_ids_.push_back(sp.PieceToId(piece));
  }
}

uint64_t token_encoder::encode(std::string_view text, std::string& out) const {
  std::vector<int> ids;
  uint64_t count = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    while (line.size() > encode_bytes) {
      const size_t n = cut_point(line.substr(0, encode_bytes), false);
      count += encode_piece(line.substr(0, n), out, ids);
      line.remove_prefix(n);
    }
    count += encode_piece(line, out, ids);
    if (nl == std::string_view::npos) break;
    append(newline_ids_, out);
    count += newline_ids_.size();
    text.remove_prefix(nl + 1);
  }
  return count;
}

uint64_t token_encoder::encode_piece(std::string_view text, std::string& out,
                                     std::vector<int>& ids) const {
  uint64_t count = 0;
  while (!text.empty()) {
    const size_t mark = text.find(space_mark);
    const std::string_view part = text.substr(0, mark);
    if (!part.empty()) {
      const auto status = sp_.Encode(part, &ids);
      if (!status.ok())
        throw tool_failure("SentencePiece could not encode: " + spm_message(status));
      append(ids, out);
      count += ids.size();
    }
    if (mark == std::string_view::npos) break;
    append(mark_ids_, out);
    count += mark_ids_.size();
    text.remove_prefix(mark + space_mark.size());
  }
  return count;
}

void token_encoder::append(const std::vector<int>& ids, std::string& out) const {
  const size_t width = static_cast<size_t>(token_width(dtype_));
  const size_t at = out.size();
  out.resize(at + ids.size() * width);
  char* p = out.data() + at;
  for (const int id : ids) {
    if (id == unk_)
      throw tool_failure(
          "the tokenizer has no piece for some text and no byte fallback; "
          "train one with troupe tokenize (without --tokenizer)");
    if (width == 2) {
      auto v = static_cast<uint16_t>(id);
      std::memcpy(p, &v, 2);
    } else {
      auto v = static_cast<uint32_t>(id);
      std::memcpy(p, &v, 4);
    }
    p += width;
  }
}

std::optional<std::string> round_trip_failure(const sentencepiece::SentencePieceProcessor& sp,
                                              const token_encoder& encoder,
                                              const std::vector<std::string>& sentences) {
  std::vector<std::string> probes = {
      " leading space,  two,   three\ttab\t\ttabs\n\nnewlines\r\nCRLF \n",
      "\xE2\x96\x81 the space mark \xE2\x96\x81\xE2\x96\x81 twice\n",
      "unseen: \xC3\xA9\xC3\xBC \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF \x01\x7f"
      " trailing  "};
  probes.back().push_back('\0');
  std::string joined;
  for (size_t i = 0; i < sentences.size() && i < 1000; ++i) joined += sentences[i] + "\n";
  probes.push_back(joined);
  for (const auto& p : probes) {
    std::string bytes;
    encoder.encode(p, bytes);
    std::vector<int> all;
    // The probe encoder writes uint32 ids, read back here.
    for (size_t i = 0; i + 4 <= bytes.size(); i += 4) {
      uint32_t v;
      std::memcpy(&v, bytes.data() + i, 4);
      all.push_back(static_cast<int>(v));
    }
    std::string back;
    if (!sp.Decode(all, &back).ok() || back != p) {
      size_t at = 0;
      while (at < back.size() && at < p.size() && back[at] == p[at]) ++at;
      return "\"" + sys::printable(p.substr(at, 40)) + "\" came back as \"" +
             sys::printable(back.substr(at, 40)) + "\"";
    }
  }
  return std::nullopt;
}

}  // namespace troupe::cli::tokenize
