#pragma once
// The store's wire format, shared by its client and server: length-prefixed frames of
// little-endian integers and length-prefixed byte strings. Internal to runtime/comm.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/comm/store.hpp"

namespace troupe::comm::wire {

/// A frame is a u32 body length followed by the body; the body starts with an opcode (requests)
/// or a status (responses). The client sends no request larger than this (the server's
/// default store_limits::max_frame_bytes) and accepts answers up to this plus
/// max_answer_overhead.
inline constexpr uint32_t max_frame_bytes = store_limits{}.max_frame_bytes;
inline constexpr uint32_t max_answer_overhead = 4096;
/// Most keys one wait or check names; more is a malformed request.
inline constexpr uint32_t max_keys_per_request = 65536;

enum class opcode : uint8_t { set = 1, get, wait, add, check };
enum class status : uint8_t { ok = 0, timeout = 1, error = 2, full = 3 };

/// Builds one frame; finish() patches the length in front.
class writer {
 public:
  writer() : buf_(4, '\0') {}

  writer& u8(uint8_t v) {
    buf_.push_back(static_cast<char>(v));
    return *this;
  }
  writer& u32(uint32_t v) { return le(v, 4); }
  writer& u64(uint64_t v) { return le(v, 8); }
  writer& bytes(const char* p, size_t n) {
    u32(static_cast<uint32_t>(n));
    buf_.insert(buf_.end(), p, p + n);
    return *this;
  }
  writer& str(const std::string& s) { return bytes(s.data(), s.size()); }
  writer& blob(const std::vector<char>& v) { return bytes(v.data(), v.size()); }

  /// Moves the frame out; the writer is empty afterwards.
  std::vector<char> finish() {
    const auto n = static_cast<uint32_t>(buf_.size() - 4);
    for (int i = 0; i < 4; ++i) buf_[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return std::move(buf_);
  }

 private:
  writer& le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  std::vector<char> buf_;
};

/// Reads one frame body; every read past the end throws store_error{protocol}.
class reader {
 public:
  reader(const char* p, size_t n) : p_(p), end_(p + n) {}

  uint8_t u8() { return static_cast<uint8_t>(le(1)); }
  uint32_t u32() { return static_cast<uint32_t>(le(4)); }
  uint64_t u64() { return le(8); }
  std::string str() {
    const uint32_t n = u32();
    need(n);
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  std::vector<char> blob() {
    const uint32_t n = u32();
    need(n);
    std::vector<char> v(p_, p_ + n);
    p_ += n;
    return v;
  }
  bool done() const { return p_ == end_; }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }

 private:
  void need(size_t n) const {
    if (static_cast<size_t>(end_ - p_) < n) {
      throw store_error(store_errc::protocol, "store: truncated message");
    }
  }
  uint64_t le(int n) {
    need(static_cast<size_t>(n));
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<unsigned char>(p_[i])} << (8 * i);
    p_ += n;
    return v;
  }
  const char* p_;
  const char* end_;
};

/// Reads a wait's or check's key list: a u32 count, then the keys. A count that the frame cannot
/// hold (each key takes at least its 4-byte length) or over max_keys_per_request throws
/// store_error{protocol} before anything is reserved.
inline std::vector<std::string> read_keys(reader& rd) {
  const uint32_t n = rd.u32();
  if (n > max_keys_per_request || n > rd.remaining() / 4) {
    throw store_error(store_errc::protocol, "store: a key list longer than its frame");
  }
  std::vector<std::string> keys;
  keys.reserve(n);
  for (uint32_t i = 0; i < n; ++i) keys.push_back(rd.str());
  return keys;
}

/// One decoded request. `keys` holds one key for set, get and add.
struct request {
  opcode op = opcode::set;
  std::vector<std::string> keys;
  std::vector<char> value;  ///< set
  uint64_t number = 0;      ///< get/wait: timeout in ms; add: the delta (two's complement)
};

/// Decodes a request body (the frame without its length). Throws store_error{protocol} for a
/// truncated or malformed body (the stream cannot be trusted any more) and
/// store_error{invalid} for an unknown opcode (answered, the stream goes on). Bytes after a
/// complete request are ignored.
inline request decode_request(const char* p, size_t n) {
  reader rd(p, n);
  request r;
  const uint8_t op = rd.u8();
  if (op < uint8_t(opcode::set) || op > uint8_t(opcode::check)) {
    throw store_error(store_errc::invalid, "unknown opcode " + std::to_string(op));
  }
  r.op = static_cast<opcode>(op);
  switch (r.op) {
    case opcode::set:
      r.keys.push_back(rd.str());
      r.value = rd.blob();
      break;
    case opcode::get:
      r.keys.push_back(rd.str());
      r.number = rd.u64();
      break;
    case opcode::wait:
      r.keys = read_keys(rd);
      r.number = rd.u64();
      break;
    case opcode::add:
      r.keys.push_back(rd.str());
      r.number = rd.u64();
      break;
    case opcode::check:
      r.keys = read_keys(rd);
      break;
  }
  return r;
}

/// Decodes the u32 length at the front of a frame.
inline uint32_t frame_length(const unsigned char* header) {
  return uint32_t{header[0]} | (uint32_t{header[1]} << 8) | (uint32_t{header[2]} << 16) |
         (uint32_t{header[3]} << 24);
}

}  // namespace troupe::comm::wire
