#include "runtime/sys/printable.hpp"

#include <algorithm>
#include <cstdint>

namespace troupe::sys {

namespace {

// The length of the well-formed UTF-8 sequence at the start of `s`, or 0 when it is none
// (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF).
size_t utf8_sequence(std::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const auto continuation = [&](size_t i) { return i < s.size() && (byte(i) & 0xC0) == 0x80; };
  const uint8_t b = byte(0);
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return continuation(1) ? 2 : 0;
  if (b >= 0xE0 && b <= 0xEF) {
    if (!continuation(1) || !continuation(2)) return 0;
    if (b == 0xE0 && byte(1) < 0xA0) return 0;   // overlong
    if (b == 0xED && byte(1) >= 0xA0) return 0;  // a surrogate
    return 3;
  }
  if (b >= 0xF0 && b <= 0xF4) {
    if (!continuation(1) || !continuation(2) || !continuation(3)) return 0;
    if (b == 0xF0 && byte(1) < 0x90) return 0;   // overlong
    if (b == 0xF4 && byte(1) >= 0x90) return 0;  // past U+10FFFF
    return 4;
  }
  return 0;
}

}  // namespace

std::string printable(std::string_view text, size_t max_bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  const bool cut = text.size() > max_bytes;
  if (cut) text = text.substr(0, max_bytes);
  std::string out;
  out.reserve(text.size() + (cut ? 3 : 0));
  while (!text.empty()) {
    const auto b = static_cast<uint8_t>(text[0]);
    const size_t n = utf8_sequence(text);
    const bool control = n == 1 && (b < 0x20 || b == 0x7F);
    // C1 controls (U+0080..U+009F) are two bytes in UTF-8 and act on some terminals too.
    const bool c1 = n == 2 && b == 0xC2 && static_cast<uint8_t>(text[1]) < 0xA0;
    if (n == 0 || control || c1) {
      const size_t bad = c1 ? 2 : 1;
      for (size_t i = 0; i < bad; ++i) {
        const auto x = static_cast<uint8_t>(text[i]);
        out += "\\x";
        out += digits[x >> 4];
        out += digits[x & 0xF];
      }
      text.remove_prefix(bad);
      continue;
    }
    out.append(text.substr(0, n));
    text.remove_prefix(n);
  }
  if (cut) out += "...";
  return out;
}

std::string printable_lines(std::string_view text, size_t max_bytes) {
  const bool cut = text.size() > max_bytes;
  if (cut) text = text.substr(0, max_bytes);
  std::string out;
  for (size_t start = 0; start <= text.size();) {
    const size_t end = std::min(text.find('\n', start), text.size());
    out += printable(text.substr(start, end - start), max_bytes);
    if (end == text.size()) break;
    out += '\n';
    start = end + 1;
  }
  return cut ? out + "..." : out;
}

}  // namespace troupe::sys
