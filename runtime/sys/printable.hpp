#pragma once
// The one escaping of text that troupe did not write itself (a file name found in a run
// directory, bytes read from a damaged file, an error from a library) before it reaches a
// console line, an event or a message: such text may hold invalid UTF-8, which a strict JSON
// encoder refuses, and control characters, which a terminal obeys.

#include <cstddef>
#include <string>
#include <string_view>

namespace troupe::sys {

/// `text` as valid UTF-8 with nothing a terminal acts on: well-formed UTF-8 sequences stay,
/// and every other byte and every control character (tab and newline included) becomes
/// `\xNN`. Backslashes stay as they are, so that escaping twice changes nothing (text is
/// escaped where it enters and again where it leaves). At most `max_bytes` of the input are
/// rendered; "..." marks a cut.
std::string printable(std::string_view text, size_t max_bytes = 4096);

/// printable, line by line: the newlines of a message that has several lines stay.
std::string printable_lines(std::string_view text, size_t max_bytes = 16384);

}  // namespace troupe::sys
