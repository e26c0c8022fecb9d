#pragma once
// Reading the small files of a run directory that another process writes (a rendezvous, a
// join token, an address): never through a link, never more than a bound, never blocking on
// a FIFO someone put there.

#include <optional>
#include <string>

namespace troupe::sys {

/// The file's content (at most 4 KiB and one byte more, so a caller sees it was longer);
/// nullopt when it is not there (yet), with `why` left empty, or when it is there but unusable
/// (a link, not a regular file, unreadable), with `why` naming the path and the reason.
std::optional<std::string> read_small_file(const std::string& path, std::string& why);

}  // namespace troupe::sys
