// The corpus in blocks that end at a line end, its UTF-8 check and its train/val split: each
// reads only what it needs, a block at a time, so that a corpus of any size fits.

#include "cli/tokenize_blocks.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cli/tokenize_common.hpp"

namespace troupe::cli::tokenize {
namespace {

bool continuation_byte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

}  // namespace

size_t cut_point(std::string_view text, bool last) {
  if (last) return text.size();
  if (const size_t nl = text.rfind('\n'); nl != std::string_view::npos) return nl + 1;
  if (const size_t sp = text.rfind(' '); sp != std::string_view::npos && sp > 0) return sp;
  size_t at = text.size();
  while (at > 1 && continuation_byte(text[at - 1])) --at;
  return at > 1 ? at - 1 : text.size();  // a "line" of one character: take it whole
}

bool block_reader::next(std::string& text, uint64_t& offset) {
  if (at_ >= end_) return false;
  const uint64_t n = std::min<uint64_t>(block_bytes, end_ - at_);
  text.resize(n);
  in_.read_at(at_, text.data(), n);
  text.resize(cut_point(text, at_ + n == end_));
  offset = at_;
  at_ += text.size();
  return true;
}

size_t first_malformed_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // ASCII eight bytes at a time: most text is mostly ASCII.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s + i, 8);
      if (w & 0x8080'8080'8080'8080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int more = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      more = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      more = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      more = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + static_cast<size_t>(more) >= n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (int k = 2; k <= more; ++k)
      if ((s[i + static_cast<size_t>(k)] & 0xC0) != 0x80) return i;
    i += static_cast<size_t>(more) + 1;
  }
  return std::string_view::npos;
}

usage_error not_utf8(const input_file& in, uint64_t offset) {
  uint64_t line = 1;
  std::string buf;
  for (uint64_t at = 0; at < offset;) {
    const uint64_t n = std::min<uint64_t>(block_bytes, offset - at);
    buf.resize(n);
    in.read_at(at, buf.data(), n);
    line += static_cast<uint64_t>(std::count(buf.begin(), buf.end(), '\n'));
    at += n;
  }
  unsigned char byte = 0;
  in.read_at(offset, reinterpret_cast<char*>(&byte), 1);
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02x", byte);
  return bad_input("corpus " + in.path() + " is not UTF-8 text: byte " + hex + " at offset " +
                   std::to_string(offset) + " (line " + std::to_string(line) +
                   ") does not begin or continue a UTF-8 character; convert it first (e.g. "
                   "iconv -f latin1 -t utf-8)");
}

uint64_t split_offset(const input_file& in, double val_fraction) {
  const uint64_t size = in.size();
  if (val_fraction <= 0) return size;
  const auto val_bytes = std::max<uint64_t>(
      1, static_cast<uint64_t>(std::llround(static_cast<double>(size) * val_fraction)));
  const uint64_t target = val_bytes >= size ? 1 : size - val_bytes;
  std::string buf;
  // Up: the first newline at target - 1 or after, that leaves something after it.
  for (uint64_t at = target - 1; at + 1 < size;) {
    const uint64_t n = std::min<uint64_t>(block_bytes, size - 1 - at);
    buf.resize(n);
    in.read_at(at, buf.data(), n);
    if (const size_t nl = buf.find('\n'); nl != std::string::npos) return at + nl + 1;
    at += n;
  }
  // Down: the last newline before it.
  for (uint64_t end = target - 1; end > 0;) {
    const uint64_t n = std::min<uint64_t>(block_bytes, end);
    buf.resize(n);
    in.read_at(end - n, buf.data(), n);
    if (const size_t nl = buf.rfind('\n'); nl != std::string::npos) return end - n + nl + 1;
    end -= n;
  }
  throw bad_input("corpus " + in.path() +
                  " is a single line: the validation share is cut at a line end; give "
                  "--val-fraction 0 (no val.bin) or a corpus of several lines");
}

}  // namespace troupe::cli::tokenize
