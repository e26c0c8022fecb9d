// torch.save's zip format: a pickle of the OrderedDict with one persistent id per storage,
// and the storages' bytes as stored zip entries.

#include "checkpoint/export/torch_writer.hpp"

#include <array>
#include <limits>
#include <map>
#include <stdexcept>

#include "checkpoint/little_endian.hpp"

namespace troupe::ckpt {

namespace {

// ---- pickle, protocol 2 ------------------------------------------------------------------

/// The opcodes a state_dict's pickle needs (Python's Lib/pickle.py names them).
namespace op {
constexpr char proto = '\x80';
constexpr char global = 'c';
constexpr char empty_tuple = ')';
constexpr char empty_dict = '}';
constexpr char mark = '(';
constexpr char tuple = 't';
constexpr char reduce = 'R';
constexpr char setitems = 'u';
constexpr char build = 'b';
constexpr char binpersid = 'Q';
constexpr char binunicode = 'X';
constexpr char binint1 = 'K';
constexpr char binint2 = 'M';
constexpr char binint = 'J';
constexpr char long1 = '\x8a';
constexpr char newfalse = '\x89';
constexpr char stop = '.';
}  // namespace op

class pickler {
 public:
  void raw(char c) { out_.push_back(c); }
  void global(std::string_view module, std::string_view name) {
    raw(op::global);
    out_.append(module).append("\n").append(name).append("\n");
  }
  void text(std::string_view s) {
    if (s.size() > std::numeric_limits<uint32_t>::max())
      throw std::invalid_argument("a string is too long for a pickle");
    raw(op::binunicode);
    put_le(s.size(), 4);
    out_.append(s);
  }
  void integer(uint64_t v) {
    if (v < 0x100) {
      raw(op::binint1);
      put_le(v, 1);
    } else if (v < 0x10000) {
      raw(op::binint2);
      put_le(v, 2);
    } else if (v < 0x80000000ULL) {
      raw(op::binint);
      put_le(v, 4);
    } else {  // two's complement, little-endian, with room for a clear sign bit
      size_t n = 1;
      while (n < 9 && (v >> (8 * n - 1)) != 0) ++n;
      raw(op::long1);
      put_le(n, 1);
      for (size_t i = 0; i < n; ++i) raw(static_cast<char>(i < 8 ? (v >> (8 * i)) & 0xFF : 0));
    }
  }
  /// collections.OrderedDict(): what a state_dict and a tensor's backward hooks are.
  void ordered_dict() {
    global("collections", "OrderedDict");
    raw(op::empty_tuple);
    raw(op::reduce);
  }
  [[nodiscard]] const std::string& bytes() const { return out_; }

 private:
  void put_le(uint64_t v, size_t n) {
    for (size_t i = 0; i < n; ++i, v >>= 8) out_.push_back(static_cast<char>(v & 0xFF));
  }
  std::string out_;
};

/// One storage: the values of one or more tensors, and its key in the archive.
struct storage {
  std::string key;
  std::span<const float> values;
};

/// The pickle of `file`'s OrderedDict; `storages` receives the storages it names, in order.
std::string pickle_state_dict(const tensor_file& file, std::vector<storage>& storages) {
  std::map<std::pair<const float*, size_t>, std::string> keys;  // one storage per span
  pickler p;
  p.raw(op::proto);
  p.raw('\x02');
  p.ordered_dict();
  if (!file.tensors.empty()) {
    p.raw(op::mark);
    for (const export_tensor& t : file.tensors) {
      std::string key = std::to_string(storages.size());
      if (!t.values.empty()) {
        const auto [it, fresh] = keys.try_emplace({t.values.data(), t.values.size()}, key);
        if (fresh)
          storages.push_back({key, t.values});
        else
          key = it->second;
      } else {
        storages.push_back({key, t.values});
      }
      p.text(t.name);
      p.global("torch._utils", "_rebuild_tensor_v2");
      p.raw(op::mark);
      p.raw(op::mark);  // the persistent id of the storage
      p.text("storage");
      p.global("torch", "FloatStorage");
      p.text(key);
      p.text("cpu");
      p.integer(t.values.size());
      p.raw(op::tuple);
      p.raw(op::binpersid);
      p.integer(0);  // storage offset
      p.raw(op::mark);
      for (const int64_t d : t.shape) p.integer(static_cast<uint64_t>(d));
      p.raw(op::tuple);
      p.raw(op::mark);  // row-major strides
      std::vector<uint64_t> strides(t.shape.size(), 1);
      for (size_t i = t.shape.size(); i-- > 1;)
        strides[i - 1] = strides[i] * static_cast<uint64_t>(t.shape[i]);
      for (const uint64_t s : strides) p.integer(s);
      p.raw(op::tuple);
      p.raw(op::newfalse);  // requires_grad
      p.ordered_dict();     // backward hooks
      p.raw(op::tuple);
      p.raw(op::reduce);
    }
    p.raw(op::setitems);
  }
  if (!file.metadata.empty()) {  // BUILD: the dict's attributes {"troupe_metadata": {...}}
    p.raw(op::empty_dict);
    p.raw(op::mark);
    p.text("troupe_metadata");
    p.raw(op::empty_dict);
    p.raw(op::mark);
    for (const auto& [key, value] : file.metadata) {
      p.text(key);
      p.text(value);
    }
    p.raw(op::setitems);  // into the metadata
    p.raw(op::setitems);  // into the attributes
    p.raw(op::build);
  }
  p.raw(op::stop);
  return p.bytes();
}

// ---- zip, stored entries -----------------------------------------------------------------

constexpr uint64_t zip32_limit = 0xFFFFFFFFULL;
constexpr size_t data_alignment = 64;  // PyTorch's kFieldAlignment
constexpr size_t local_header_bytes = 30;
constexpr uint16_t zip_version = 20;      // 2.0: what a reader needs for stored entries
constexpr uint16_t dos_date_1980 = 0x21;  // 1980-01-01, the earliest date zip can say

/// A zip archive written front to back: stored entries whose size and CRC are known before
/// their bytes are written, so no data descriptors are needed.
class stored_zip {
 public:
  explicit stored_zip(const byte_sink& out) : out_(out) {}

  /// One entry of `size` bytes with CRC `crc`; `emit` writes exactly those bytes to its sink.
  void add(const std::string& name, uint64_t size, uint32_t crc,
           const std::function<void(const byte_sink&)>& emit) {
    // PyTorch pads every entry's data to a 64-byte boundary with an extra field "FB".
    const uint64_t unpadded = at_ + local_header_bytes + name.size() + 4;
    const size_t pad = (data_alignment - unpadded % data_alignment) % data_alignment;
    if (at_ > zip32_limit || size >= zip32_limit || unpadded + pad + size > zip32_limit)
      throw std::invalid_argument(
          "the torch file would pass 4 GiB, which needs ZIP64 records that this writer does not "
          "write yet; use --format safetensors");
    entries_.push_back({name, size, crc, at_});
    std::string header(local_header_bytes, '\0');
    auto* h = reinterpret_cast<unsigned char*>(header.data());
    le::put(h + 0, 0x04034b50, 4);
    le::put(h + 4, zip_version, 2);
    le::put(h + 12, dos_date_1980, 2);
    le::put(h + 14, crc, 4);
    le::put(h + 18, size, 4);
    le::put(h + 22, size, 4);
    le::put(h + 26, name.size(), 2);
    le::put(h + 28, 4 + pad, 2);
    header += name;
    header += "FB";
    header.push_back(static_cast<char>(pad & 0xFF));
    header.push_back(static_cast<char>(pad >> 8));
    header.append(pad, 'Z');
    put(header.data(), header.size());
    uint64_t written = 0;
    emit([&](const void* data, size_t n) {
      written += n;
      put(data, n);
    });
    if (written != size) throw std::logic_error("stored_zip: an entry wrote the wrong size");
  }

  /// The central directory and its end record.
  void finish() {
    const uint64_t directory_at = at_;
    for (const entry& e : entries_) {
      std::string header(46, '\0');
      auto* h = reinterpret_cast<unsigned char*>(header.data());
      le::put(h + 0, 0x02014b50, 4);
      le::put(h + 4, zip_version, 2);  // made by
      le::put(h + 6, zip_version, 2);  // needed
      le::put(h + 14, dos_date_1980, 2);
      le::put(h + 16, e.crc, 4);
      le::put(h + 20, e.size, 4);
      le::put(h + 24, e.size, 4);
      le::put(h + 28, e.name.size(), 2);
      le::put(h + 42, e.offset, 4);
      header += e.name;
      put(header.data(), header.size());
    }
    if (entries_.size() > 0xFFFF || at_ > zip32_limit)
      throw std::invalid_argument("the torch file's zip directory needs ZIP64 records");
    unsigned char end[22] = {};
    le::put(end + 0, 0x06054b50, 4);
    le::put(end + 8, entries_.size(), 2);
    le::put(end + 10, entries_.size(), 2);
    le::put(end + 12, at_ - directory_at, 4);
    le::put(end + 16, directory_at, 4);
    put(end, sizeof end);
  }

 private:
  struct entry {
    std::string name;
    uint64_t size;
    uint32_t crc;
    uint64_t offset;
  };
  void put(const void* data, size_t n) {
    out_(data, n);
    at_ += n;
  }
  const byte_sink& out_;
  uint64_t at_ = 0;
  std::vector<entry> entries_;
};

void add_text(stored_zip& zip, const std::string& name, const std::string& text) {
  zip.add(name, text.size(), crc32(text.data(), text.size()),
          [&](const byte_sink& out) { out(text.data(), text.size()); });
}

}  // namespace

uint32_t crc32(const void* data, size_t size, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320U ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

void torch_writer::write(const tensor_file& file, const byte_sink& out) const {
  validate_tensor_file(file);
  std::vector<storage> storages;
  const std::string pickle = pickle_state_dict(file, storages);
  stored_zip zip(out);
  add_text(zip, "archive/data.pkl", pickle);
  for (const storage& s : storages) {
    uint32_t crc = 0;  // of the bytes as written: little-endian whatever this machine's order
    put_floats([&](const void* data, size_t n) { crc = crc32(data, n, crc); }, s.values);
    zip.add("archive/data/" + s.key, s.values.size_bytes(), crc,
            [&](const byte_sink& sink) { put_floats(sink, s.values); });
  }
  add_text(zip, "archive/version", "3\n");
  add_text(zip, "archive/byteorder", "little");
  zip.finish();
}

}  // namespace troupe::ckpt
