#pragma once
// The one balanced split of troupe: n things cut into `parts` consecutive runs whose lengths
// differ by at most one, the longer runs first. The data plane cuts buffers with it and the
// checkpoint cuts state among the ranks that write it; one formula keeps them in step.

#include <algorithm>
#include <cstddef>

namespace troupe {

/// Run `index` of `n` elements cut into `parts` runs: its first element and its length.
struct balanced_run {
  size_t offset = 0;
  size_t count = 0;
};

/// Requires parts >= 1 and index < parts (callers check; this is arithmetic only).
constexpr balanced_run balanced_part(size_t n, size_t parts, size_t index) {
  const size_t base = n / parts;
  const size_t extra = n % parts;  // the first `extra` runs take one more
  return {index * base + std::min(index, extra), base + (index < extra ? 1 : 0)};
}

}  // namespace troupe
