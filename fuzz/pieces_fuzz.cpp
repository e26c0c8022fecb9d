// libFuzzer target: the bytes are a rank's checkpoint report (the JSON that encode_pieces
// writes), handed to decode_pieces. It may throw ckpt::checkpoint_error and nothing else;
// what it accepts must survive encode_pieces -> decode_pieces unchanged. Earlier findings
// (fuzz/findings/) are fixed and kept in the seed corpus as regression inputs.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe::ckpt;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<saved_piece> pieces;
  try {
    pieces = decode_pieces(text);
  } catch (const checkpoint_error&) {
    return 0;
  }
  const std::string again = encode_pieces(pieces);
  std::vector<saved_piece> back;
  try {
    back = decode_pieces(again);
  } catch (const checkpoint_error& e) {
    std::fprintf(stderr, "pieces_fuzz: an accepted report does not decode once encoded again: %s\n",
                 e.what());
    std::abort();
  }
  if (back != pieces) {
    std::fprintf(stderr, "pieces_fuzz: an accepted report changes when encoded and decoded\n");
    std::abort();
  }
  return 0;
}
