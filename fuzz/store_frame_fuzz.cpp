// libFuzzer target: the bytes are what a connection sends the key-value store once past the
// handshake, read as the server reads them (u32 length, then the body, frame after frame) and
// handed to wire::decode_request. Decoding may throw store_error{protocol} (the server closes
// the connection) or store_error{invalid} (it answers) and nothing else, must never allocate
// more than the frame holds, and what it accepts must survive encoding and decoding again.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "runtime/comm/store_wire.hpp"

namespace {

using namespace troupe::comm;

std::vector<char> encode(const wire::request& r) {
  wire::writer w;
  w.u8(uint8_t(r.op));
  switch (r.op) {
    case wire::opcode::set:
      w.str(r.keys.at(0)).blob(r.value);
      break;
    case wire::opcode::get:
    case wire::opcode::add:
      w.str(r.keys.at(0)).u64(r.number);
      break;
    case wire::opcode::wait:
    case wire::opcode::check:
      w.u32(static_cast<uint32_t>(r.keys.size()));
      for (const auto& k : r.keys) w.str(k);
      if (r.op == wire::opcode::wait) w.u64(r.number);
      break;
  }
  return w.finish();
}

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "store_frame_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t at = 0;
  while (size - at >= 4) {
    const uint32_t n = wire::frame_length(data + at);
    if (n == 0 || n > wire::max_frame_bytes) return 0;  // closed before allocating
    at += 4;
    if (size - at < n) return 0;  // the server waits for the rest
    const char* body = reinterpret_cast<const char*>(data + at);
    at += n;
    wire::request r;
    try {
      r = wire::decode_request(body, n);
    } catch (const store_error& e) {
      if (e.code() == store_errc::protocol) return 0;  // closed
      if (e.code() == store_errc::invalid) continue;   // answered with an error
      die("decode_request threw an unexpected store_error code");
    }
    const bool one_key =
        r.op == wire::opcode::set || r.op == wire::opcode::get || r.op == wire::opcode::add;
    if (one_key && r.keys.size() != 1) die("a one-key request decoded with another count");
    if (r.keys.size() > wire::max_keys_per_request) die("more keys than a request may name");
    size_t bytes = r.value.size();
    for (const auto& k : r.keys) bytes += k.size();
    if (bytes > n) die("a request decoded into more bytes than its frame holds");
    const std::vector<char> again = encode(r);
    wire::request back;
    try {
      back = wire::decode_request(again.data() + 4, again.size() - 4);
    } catch (const store_error&) {
      die("an accepted request does not decode once encoded again");
    }
    if (back.op != r.op || back.keys != r.keys || back.value != r.value ||
        back.number != r.number) {
      die("an accepted request changes when encoded and decoded");
    }
  }
  return 0;
}
