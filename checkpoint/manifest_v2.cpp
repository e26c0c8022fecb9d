// Manifest format 2: a checkpoint as boxes of the single-rank model's tensors, each stored
// as content-addressed chunks.
//
//   { "kind": "troupe-checkpoint-manifest", "format_version": 2,
//     "step": int, "world": int, "global_numel": uint, "seed": uint, "adam_t": uint,
//     "hash_algorithm": "xxh3-128", "chunk_floats": uint, "layout": string,
//     "config_json": string,
//     "tensors": [ { "name": string, "shape": [uint...], "offset": uint } ... ],
//     "pieces":  [ { "rank": int, "array": "params" | "exp_avg" | "exp_avg_sq",
//                    "tensor": string, "box": [row, col, rows, cols],
//                    "chunks": [ 32 hex digits ... ], "offset": uint } ... ],
//     "manifest_hash": 16 hex digits }
//
// The pieces of each (array, tensor) tile the tensor's [rows, cols] view exactly. A piece's
// row-major elements start at `offset` in its chunks laid end to end (0 for a large box with
// chunks of its own; small boxes are packed into shared chunks); every chunk of a piece but
// its last holds exactly chunk_floats floats.

#include <algorithm>
#include <limits>
#include <map>

#include "checkpoint/manifest.hpp"
#include "checkpoint/manifest_fields.hpp"
#include "runtime/sys/printable.hpp"

namespace troupe::ckpt::manifest_json {

using namespace detail;

namespace {

// Bounds on what a manifest may ask of the validator and the reader. Every rank of a
// data-parallel job writes its share of every tensor, so a tensor has up to one piece per rank
// and array (a few where a share crosses rows): 131,072 ranks (the largest world) fit both.
constexpr size_t max_pieces = size_t{1} << 22;
constexpr size_t max_pieces_per_tensor = size_t{1} << 19;

}  // namespace

std::vector<tensor_entry> parse_tensor_table(const doc_json& doc, const fs::path& where,
                                             int version) {
  std::vector<tensor_entry> out;
  const doc_json& tensors = get_array(doc, "tensors", where);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string ctx = "tensors/" + std::to_string(i) + "/";
    const doc_json& t = tensors[i];
    if (!t.is_object()) bad_field(where, ctx, "is not an object");
    tensor_entry e;
    e.name = get_string(t, "name", where, ctx);
    e.offset = get_uint(t, "offset", where, ctx);
    const doc_json& shape = field(t, "shape", where, ctx);
    if (!shape.is_array() || shape.size() > 8)
      bad_field(where, ctx + "shape", "is not an array of up to 8 sizes");
    for (const doc_json& d : shape) {
      if (!d.is_number_unsigned() ||
          d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
        bad_field(where, ctx + "shape", "holds something other than a size below 2^31");
      }
      e.shape.push_back(d.get<int64_t>());
    }
    if (version >= workload_format_version) parse_v3_tensor(t, where, ctx, e);
    out.push_back(std::move(e));
  }

  return out;
}

namespace {

// Appends `text` as a JSON string, byte for byte as nlohmann's dump writes it: readers
// recompute the seal from nlohmann's compact dump of what they parsed.
void put_string(std::string& out, std::string_view text) {
  const bool plain = std::all_of(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x80 && c != '"' && c != '\\';
  });
  if (!plain) {
    out += doc_json(std::string(text)).dump();  // escapes, and refuses invalid UTF-8
    return;
  }
  out += '"';
  out += text;
  out += '"';
}

template <class Int>
void put_field(std::string& out, const char* key, Int value) {
  out += '"';
  out += key;
  out += "\":";
  out += std::to_string(value);
  out += ",\n";
}

void put_string_field(std::string& out, const char* key, std::string_view value) {
  out += '"';
  out += key;
  out += "\":";
  put_string(out, value);
  out += ",\n";
}

// Format 3's top-level additions, in the same form: one line per field.
void put_v3_fields(std::string& out, const manifest& m) {
  out += "\"arrays\":[";
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    if (i > 0) out += ',';
    put_string(out, m.arrays[i]);
  }
  out += "],\n\"counters\":{";
  for (size_t i = 0; i < m.counters.size(); ++i) {
    if (i > 0) out += ',';
    put_string(out, m.counters[i].name);
    out += ':' + std::to_string(m.counters[i].value);
  }
  out += "},\n";
  if (!m.extras_json.empty()) {
    // The compact dump of the parsed object: what a reader's seal recomputes.
    out += "\"extras\":";
    out += parse_extras(m.extras_json, "(a manifest being written)", error_kind::invalid_argument)
               .dump();
    out += ",\n";
  }
}

std::optional<int> index_in(const std::vector<std::string>& names, const std::string& name) {
  const auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) return std::nullopt;
  return static_cast<int>(it - names.begin());
}

}  // namespace

// Written directly rather than through a JSON document: a commit writes one per checkpoint,
// on cores that train, and building and dumping the document twice took ~1 ms. The text has
// a line per field, tensor and piece; without its line breaks it is exactly the compact dump
// the seal covers (no string holds a raw line break: JSON escapes them).
std::string to_json_v2(const manifest& m) {
  std::string out;
  out.reserve(256 + m.config_json.size() + m.tensors.size() * 96 + m.pieces.size() * 160);
  // Format 3 only adds to this text; with v3 false it is format 2's, byte for byte.
  const bool v3 = m.format_version >= workload_format_version;
  out += "{\n";
  put_string_field(out, "kind", format::manifest_kind);
  put_field(out, "format_version", v3 ? workload_format_version : 2);
  put_field(out, "step", m.step);
  put_field(out, "world", m.world);
  put_field(out, "global_numel", m.global_numel);
  put_field(out, "seed", m.seed);
  if (!v3) put_field(out, "adam_t", m.adam_t);
  put_string_field(out, "hash_algorithm", chunk_hash_name);
  put_field(out, "chunk_floats", m.chunk_floats);
  put_string_field(out, "layout", m.layout);
  put_string_field(out, "config_json", m.config_json);
  if (v3) put_v3_fields(out, m);
  out += "\"tensors\":[";
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const tensor_entry& t = m.tensors[i];
    out += i == 0 ? "\n{\"name\":" : ",\n{\"name\":";
    put_string(out, t.name);
    out += ",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (d > 0) out += ',';
      out += std::to_string(t.shape[d]);
    }
    out += "],\"offset\":" + std::to_string(t.offset);
    if (v3 && !t.array.empty()) {
      out += ",\"array\":";
      put_string(out, t.array);
    }
    if (v3 && t.type != dtype::f32) {
      out += ",\"dtype\":";
      put_string(out, dtype_name(t.type));
    }
    out += "}";
  }
  out += "],\n\"pieces\":[";
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const saved_piece& p = m.pieces[i];
    out += i == 0 ? "\n{\"rank\":" : ",\n{\"rank\":";
    out += std::to_string(p.rank);
    out += ",\"array\":";
    put_string(out, v3 ? m.arrays.at(static_cast<size_t>(p.array))
                       : std::string(array_names.at(static_cast<size_t>(p.array))));
    out += ",\"tensor\":";
    put_string(out, p.tensor);
    out += ",\"box\":[" + std::to_string(p.where.row) + ',' + std::to_string(p.where.col) + ',' +
           std::to_string(p.where.rows) + ',' + std::to_string(p.where.cols) + "],\"chunks\":[";
    for (size_t c = 0; c < p.chunks.size(); ++c) {
      out += c == 0 ? "\"" : ",\"";
      out += p.chunks[c].hex();
      out += '"';
    }
    out += "],\"offset\":" + std::to_string(p.offset) + "}";
  }
  out += "]";
  std::string compact = out + "}";
  std::erase(compact, '\n');
  out += ",\n\"";
  out += seal_key;
  out += "\":\"" + hash_to_hex(hash64(compact.data(), compact.size())) + "\"\n}\n";
  return out;
}

manifest from_json_v2(const doc_json& doc, const fs::path& where, int version) {
  manifest m;
  m.format_version = version;
  const bool v3 = version >= workload_format_version;
  m.step = get_int(doc, "step", where, std::numeric_limits<int64_t>::max());
  m.world = static_cast<int>(get_int(doc, "world", where, std::numeric_limits<int>::max()));
  m.global_numel = get_uint(doc, "global_numel", where);
  m.seed = get_uint(doc, "seed", where);
  if (!v3) m.adam_t = get_int(doc, "adam_t", where, std::numeric_limits<int64_t>::max());
  m.chunk_floats = get_uint(doc, "chunk_floats", where);
  m.layout = get_string(doc, "layout", where);
  m.config_json = get_string(doc, "config_json", where);
  if (v3) parse_v3_fields(doc, where, m);

  m.tensors = parse_tensor_table(doc, where, version);

  const doc_json& pieces = get_array(doc, "pieces", where);
  if (m.global_numel > max_global_numel) bad_field(where, "global_numel", "is beyond 2^40");
  if (pieces.size() > max_pieces)
    bad_field(where, "pieces", "lists more pieces than any layout has");
  for (size_t i = 0; i < pieces.size(); ++i) {
    const std::string ctx = "pieces/" + std::to_string(i) + "/";
    const doc_json& p = pieces[i];
    if (!p.is_object()) bad_field(where, ctx, "is not an object");
    saved_piece s;
    s.rank = static_cast<int>(get_int(p, "rank", where, std::numeric_limits<int>::max(), ctx));
    const auto array = v3 ? index_in(m.arrays, get_string(p, "array", where, ctx))
                          : array_index(get_string(p, "array", where, ctx));
    if (!array) bad_field(where, ctx + "array", "names no state array");
    s.array = *array;
    s.tensor = get_string(p, "tensor", where, ctx);
    const doc_json& b = field(p, "box", where, ctx);
    if (!b.is_array() || b.size() != 4)
      bad_field(where, ctx + "box", "is not [row, col, rows, cols]");
    int64_t v[4];
    for (size_t k = 0; k < 4; ++k) {
      if (!b[k].is_number_unsigned() ||
          b[k].get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
        bad_field(where, ctx + "box", "holds something other than a size below 2^31");
      }
      v[k] = b[k].get<int64_t>();
    }
    s.where = {v[0], v[1], v[2], v[3]};
    s.offset = get_uint(p, "offset", where, ctx);
    const doc_json& chunks = field(p, "chunks", where, ctx);
    if (!chunks.is_array()) bad_field(where, ctx + "chunks", "is not an array");
    for (const doc_json& c : chunks) {
      const auto key = c.is_string() ? chunk_key::from_hex(c.get<std::string>()) : std::nullopt;
      if (!key) bad_field(where, ctx + "chunks", "holds something other than 32 hex digits");
      s.chunks.push_back(*key);
    }
    m.pieces.push_back(std::move(s));
  }
  validate_v2(m, where, error_kind::corrupt);
  return m;
}

namespace {

/// (array, tensor) -> its pieces.
using piece_groups = std::map<std::pair<int, std::string>, std::vector<const saved_piece*>>;

/// True when two of the boxes overlap. A sweep down the rows: the boxes that span the current
/// row keep their column intervals in a set, which stays pairwise disjoint (each insertion is
/// checked), so a new interval that meets any of them meets its neighbour on one side. Boxes
/// ending at a row leave before boxes starting there enter. O(k log k) for k boxes, where
/// comparing every pair took minutes at the ten thousand pieces of a 10,000-rank job's tensor.
bool any_overlap(const std::vector<const saved_piece*>& group) {
  struct event {
    int64_t row;
    bool enters;  // leaves sort first at the same row
    const box* b;
  };
  std::vector<event> events;
  events.reserve(group.size() * 2);
  for (const saved_piece* p : group) {
    events.push_back({p->where.row, true, &p->where});
    events.push_back({p->where.row + p->where.rows, false, &p->where});
  }
  std::sort(events.begin(), events.end(), [](const event& a, const event& b) {
    return a.row != b.row ? a.row < b.row : a.enters < b.enters;
  });
  std::map<int64_t, int64_t> active;  // column start -> end, of the boxes spanning the row
  for (const event& e : events) {
    const int64_t begin = e.b->col, end = e.b->col + e.b->cols;
    if (!e.enters) {
      active.erase(begin);
      continue;
    }
    const auto next = active.lower_bound(begin);
    if (next != active.end() && next->first < end) return true;
    if (next != active.begin() && std::prev(next)->second > begin) return true;
    active.emplace(begin, end);
  }
  return false;
}

/// Checks that the pieces of every tensor tile it in each array that holds it.
void check_tiling(const manifest& m, const std::vector<std::string>& arrays,
                  const piece_groups& groups, const fs::path& where, error_kind kind) {
  for (const tensor_entry& t : m.tensors) {
    const auto [rows, cols] = t.matrix();
    const auto area = static_cast<size_t>(rows) * static_cast<size_t>(cols);
    for (size_t a = 0; a < arrays.size(); ++a) {
      if (!t.array.empty() && t.array != arrays[a]) continue;  // in its own array only
      const std::string what = arrays[a] + " of " + t.name;
      const auto it = groups.find({static_cast<int>(a), t.name});
      if (it == groups.end()) {
        if (area == 0) continue;
        broken(where, kind, "no piece holds the " + what);
      }
      // Boxes inside the tensor, pairwise disjoint and as large together as the tensor:
      // exactly a tiling.
      size_t covered = 0;
      for (const saved_piece* p : it->second) covered += p->where.numel();
      if (any_overlap(it->second)) broken(where, kind, "two pieces of the " + what + " overlap");
      if (covered != area)
        broken(where, kind,
               "the pieces of the " + what + " cover " + std::to_string(covered) + " of its " +
                   std::to_string(area) + " elements");
    }
  }
}

}  // namespace

void validate_v2(const manifest& m, const fs::path& where, error_kind kind) {
  if (m.step < 0) broken(where, kind, "step is negative");
  if (m.world < 1) broken(where, kind, "world is " + std::to_string(m.world) + ", not >= 1");
  if (m.chunk_floats < 1 || m.chunk_floats > max_chunk_floats)
    broken(where, kind, "chunk_floats is " + std::to_string(m.chunk_floats) + ", not in 1..2^28");
  // Bounds every size below so that box and tensor arithmetic cannot overflow.
  if (m.global_numel > max_global_numel)
    broken(where, kind, "global_numel " + std::to_string(m.global_numel) + " is beyond 2^40");
  if (m.tensors.empty()) broken(where, kind, "it lists no tensors");
  if (m.pieces.size() > max_pieces) broken(where, kind, "it lists too many pieces");
  validate_tensors(m, where, kind);
  validate_v3_fields(m, where, kind);
  const std::vector<std::string> arrays = m.state_arrays();

  std::map<std::string, const tensor_entry*> table;
  for (const tensor_entry& t : m.tensors) table[t.name] = &t;
  // (array, tensor) -> its pieces, to check they tile the tensor
  piece_groups groups;
  for (const saved_piece& p : m.pieces) {
    const std::string name = "piece of " + p.tensor;
    if (p.rank < 0 || p.rank >= m.world)
      broken(where, kind, name + " has a rank outside the world");
    if (p.array < 0 || static_cast<size_t>(p.array) >= arrays.size())
      broken(where, kind, name + " names no state array");
    const auto it = table.find(p.tensor);
    if (it == table.end()) broken(where, kind, name + ": no such tensor in the table");
    const std::string& home = it->second->array;
    if (!home.empty() && home != arrays[static_cast<size_t>(p.array)])
      broken(where, kind,
             name + " is in array " + arrays[static_cast<size_t>(p.array)] + ", the tensor in " +
                 home);
    const auto [rows, cols] = it->second->matrix();
    const box& b = p.where;
    if (b.row < 0 || b.col < 0 || b.rows < 1 || b.cols < 1 || b.row > rows - b.rows ||
        b.col > cols - b.cols) {
      broken(where, kind,
             name + " has a box outside the tensor's [" + std::to_string(rows) + ", " +
                 std::to_string(cols) + "]");
    }
    if (p.offset >= m.chunk_floats)
      broken(where, kind, name + " starts past the end of its first chunk");
    const size_t span = p.offset + b.numel();  // below 2^41: no overflow
    const size_t expected = span / m.chunk_floats + (span % m.chunk_floats != 0);
    if (p.chunks.size() != expected) {
      broken(where, kind,
             name + " lists " + std::to_string(p.chunks.size()) + " chunks for a box that needs " +
                 std::to_string(expected));
    }
    auto& group = groups[{p.array, p.tensor}];
    if (group.size() >= max_pieces_per_tensor)
      broken(where, kind, p.tensor + " is cut into too many pieces");
    group.push_back(&p);
  }
  check_tiling(m, arrays, groups, where, kind);
}

}  // namespace troupe::ckpt::manifest_json

namespace troupe::ckpt {

std::string encode_pieces(const std::vector<saved_piece>& pieces) {
  manifest_json::detail::doc_json out = manifest_json::detail::doc_json::array();
  for (const saved_piece& p : pieces) {
    manifest_json::detail::doc_json chunks = manifest_json::detail::doc_json::array();
    for (const chunk_key& k : p.chunks) chunks.push_back(k.hex());
    out.push_back({p.rank,
                   p.array,
                   p.tensor,
                   {p.where.row, p.where.col, p.where.rows, p.where.cols},
                   std::move(chunks),
                   p.offset});
  }
  return out.dump();
}

std::vector<saved_piece> decode_pieces(std::string_view text) {
  using doc_json = manifest_json::detail::doc_json;
  const std::filesystem::path where("(a rank's checkpoint report)");
  const auto integer = [&](const doc_json& v, int64_t lo, int64_t hi) {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)) ||
        (!v.is_number_unsigned() && (v.get<int64_t>() < lo || v.get<int64_t>() > hi)))
      io::fail(error_kind::corrupt, where, "holds a number out of range");
    return v.get<int64_t>();
  };
  constexpr int64_t max_size = int64_t{1} << 31;
  std::vector<saved_piece> out;
  try {
    const doc_json doc = doc_json::parse(text.begin(), text.end(), [&](int depth, auto, auto&) {
      if (depth > 8) io::fail(error_kind::corrupt, where, "nests too deep");
      return true;
    });
    if (!doc.is_array()) io::fail(error_kind::corrupt, where, "is not a list of pieces");
    for (const doc_json& p : doc) {
      if (!p.is_array() || p.size() != 6)
        io::fail(error_kind::corrupt, where, "holds a malformed piece");
      saved_piece s;
      s.rank = static_cast<int>(integer(p[0], 0, 1 << 20));
      s.array = static_cast<int>(integer(p[1], 0, static_cast<int64_t>(array_names.size()) - 1));
      if (!p[2].is_string()) io::fail(error_kind::corrupt, where, "names no tensor");
      s.tensor = p[2].get<std::string>();
      const doc_json& b = p[3];
      if (!b.is_array() || b.size() != 4)
        io::fail(error_kind::corrupt, where, "holds a malformed box");
      s.where = {integer(b[0], 0, max_size), integer(b[1], 0, max_size), integer(b[2], 0, max_size),
                 integer(b[3], 0, max_size)};
      if (!p[4].is_array()) io::fail(error_kind::corrupt, where, "holds no chunk list");
      for (const doc_json& c : p[4]) {
        const auto key = c.is_string() ? chunk_key::from_hex(c.get<std::string>()) : std::nullopt;
        if (!key) io::fail(error_kind::corrupt, where, "holds a malformed chunk name");
        s.chunks.push_back(*key);
      }
      s.offset = static_cast<uint64_t>(integer(p[5], 0, int64_t{1} << 28));
      out.push_back(std::move(s));
    }
  } catch (const doc_json::exception& e) {
    io::fail(error_kind::corrupt, where,
             std::string("does not parse: ") + sys::printable(e.what(), 256));
  }
  return out;
}

}  // namespace troupe::ckpt
