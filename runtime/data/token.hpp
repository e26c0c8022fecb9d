#pragma once
// The type of one token id, as the built-in GPT and its data read them.

#include <cstdint>

namespace troupe {

/// A token id: a byte of a text corpus, or an id from a token file (uint16 or uint32 on
/// disk, widened on reading). Always below the model's vocabulary size.
using token_id = uint32_t;

}  // namespace troupe
