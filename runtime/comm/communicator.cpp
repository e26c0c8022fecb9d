// Names of the data plane's error codes, for messages and logs.
#include "runtime/comm/communicator.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "runtime/comm/collective_math.hpp"

namespace troupe::comm {

op_options remaining(std::chrono::steady_clock::time_point deadline, const op_options& opts) {
  op_options out = opts;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  out.timeout = std::max(left, std::chrono::milliseconds(1));
  return out;
}

namespace {

std::string tree_parts_error(int rank, int size, const tree_sum_parts& parts) {
  if (parts.M < 1) return "a tree of " + std::to_string(parts.M) + " leaves";
  if (parts.pieces == nullptr || parts.pieces->size() != static_cast<size_t>(size))
    return "the pieces of " + std::to_string(parts.pieces == nullptr ? 0 : parts.pieces->size()) +
           " ranks for a group of " + std::to_string(size);
  const auto& mine = (*parts.pieces)[static_cast<size_t>(rank)];
  if (parts.values.size() != mine.size())
    return std::to_string(parts.values.size()) + " values for this rank's " +
           std::to_string(mine.size()) + " pieces";
  for (const float* v : parts.values)
    if (v == nullptr) return "a piece without values";
  // Every rank's pieces together must tile [0, M) with nodes of the tree.
  const int width = tree_width(parts.M);
  std::map<int, int> by_lo;
  for (const auto& rank_pieces : *parts.pieces)
    for (const tree_node& n : rank_pieces) {
      if (n.size < 1 || n.size > width || (n.size & (n.size - 1)) != 0 || n.lo < 0 ||
          n.lo % n.size != 0 || n.lo >= parts.M || !by_lo.emplace(n.lo, n.size).second)
        return "a piece at " + std::to_string(n.lo) + " of size " + std::to_string(n.size) +
               " is not a node of the tree over " + std::to_string(parts.M) +
               " leaves, or is held twice";
    }
  for (int x = 0; x < parts.M;) {
    const auto it = by_lo.find(x);
    if (it == by_lo.end()) return "no rank holds a piece starting at leaf " + std::to_string(x);
    x = std::min(x + it->second, parts.M);
  }
  return {};
}

}  // namespace

namespace {

// The sum is written while the pieces are still read (an owner's slice is combined into the
// output as the others' pieces arrive, and a tree's left subtree may be summed into the output
// before a right leaf is read), so an output over a piece would lose that piece.
std::string overlap_error(const tree_sum_parts& parts, const float* out, size_t out_len, size_t lo,
                          size_t hi) {
  if (out_len == 0 || hi <= lo) return {};
  const auto at = [](const float* p) { return reinterpret_cast<std::uintptr_t>(p); };
  for (size_t t = 0; t < parts.values.size(); ++t) {
    const float* v = parts.values[t];
    if (v && at(out) < at(v + hi) && at(v + lo) < at(out + out_len))
      return "the output overlaps piece " + std::to_string(t) +
             "'s values (the sum would overwrite the piece before it is read); give the sum a "
             "buffer of its own";
  }
  return {};
}

}  // namespace

std::string tree_sum_argument_error(int rank, int size, const tree_sum_parts& parts, size_t begin,
                                    size_t end, const float* out) {
  if (auto why = tree_parts_error(rank, size, parts); !why.empty()) return why;
  if (begin > end) return "a range that ends before it begins";
  if (end > begin && out == nullptr) return "no output buffer";
  return overlap_error(parts, out + begin, end - begin, begin, end);
}

std::string tree_sum_argument_error(int rank, int size, const tree_sum_parts& parts,
                                    std::span<const extent> owned, const float* out) {
  if (auto why = tree_parts_error(rank, size, parts); !why.empty()) return why;
  if (owned.size() != static_cast<size_t>(size))
    return std::to_string(owned.size()) + " owned ranges for " + std::to_string(size) + " ranks";
  const extent mine = owned[static_cast<size_t>(rank)];
  if (mine.len > 0 && out == nullptr) return "no output buffer";
  size_t lo = SIZE_MAX, hi = 0;
  for (const extent& e : owned)
    if (e.len > 0) lo = std::min(lo, e.begin), hi = std::max(hi, e.begin + e.len);
  return overlap_error(parts, out, mine.len, lo, hi);
}

uint64_t tree_sum_shape(const tree_sum_parts& parts, size_t a, size_t b) {
  return (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xC2B2AE3D27D4EB4Full) ^ static_cast<uint64_t>(parts.M);
}

void combine_alone(const tree_sum_parts& parts, size_t begin, size_t len, float* out,
                   tree_scratch& scratch) {
  std::vector<tree_piece> pieces;
  const auto& mine = parts.pieces->front();
  for (size_t t = 0; t < mine.size(); ++t) pieces.push_back({mine[t], parts.values[t] + begin});
  combine_pieces(parts.M, pieces, len, out, scratch);
}

namespace {

[[noreturn]] void tree_invalid(const communicator& c, const char* name, const std::string& why) {
  throw comm_error(comm_errc::invalid,
                   std::string(name) + ": " + why + " (group '" + c.identity().group + "', rank " +
                       std::to_string(c.rank()) + " of " + std::to_string(c.size()) + ")");
}

// One round of the portable tree sum: every rank sends owner j floats range_of(j) of each of
// its pieces (one all_to_allv); this rank combines what it receives for its own range, in
// tree order, into `mine`.
template <class RangeOf>
void exchange_and_combine(communicator& c, const tree_sum_parts& parts, tree_sum_buffers& b,
                          RangeOf&& range_of, float* mine, const op_options& opts) {
  const auto world = static_cast<size_t>(c.size());
  const auto me = static_cast<size_t>(c.rank());
  const auto& pieces = *parts.pieces;
  const size_t my_pieces = parts.values.size();
  const size_t mine_len = range_of(me).len;
  std::vector<size_t> send_bytes(world), recv_bytes(world);
  size_t send_floats = 0, recv_floats = 0;
  for (size_t j = 0; j < world; ++j) {
    send_bytes[j] = my_pieces * range_of(j).len * sizeof(float);
    recv_bytes[j] = pieces[j].size() * mine_len * sizeof(float);
    send_floats += my_pieces * range_of(j).len;
    recv_floats += pieces[j].size() * mine_len;
  }
  b.send.resize(send_floats);
  b.recv.resize(recv_floats);
  float* at = b.send.data();
  for (size_t j = 0; j < world; ++j) {
    const extent r = range_of(j);
    for (size_t k = 0; k < my_pieces; ++k) at = std::copy_n(parts.values[k] + r.begin, r.len, at);
  }
  c.all_to_allv(b.send.data(), send_bytes, b.recv.data(), recv_bytes, opts);
  if (mine_len == 0) return;
  std::vector<tree_piece> received;
  const float* from = b.recv.data();
  for (size_t j = 0; j < world; ++j)
    for (const tree_node& node : pieces[j]) {
      received.push_back({node, from});
      from += mine_len;
    }
  combine_pieces(parts.M, received, mine_len, mine, b.combine);
}

}  // namespace

void communicator::reduce_scatter_tree(const tree_sum_parts& parts, std::span<const extent> owned,
                                       float* out, const op_options& opts) {
  if (auto why = tree_sum_argument_error(rank(), size(), parts, owned, out); !why.empty())
    tree_invalid(*this, "reduce_scatter_tree", why);
  tree_sum_buffers local;
  tree_sum_buffers& b = parts.buffers != nullptr ? *parts.buffers : local;
  const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
  // Rounds of at most round_floats per piece and owner, as many as the longest range needs
  // (the same on every rank).
  const size_t chunk = std::max<size_t>(1, parts.round_floats);
  size_t longest = 0;
  for (const extent& e : owned) longest = std::max(longest, e.len);
  for (size_t c0 = 0; c0 < longest; c0 += chunk) {
    const auto range_of = [&](size_t j) {
      const extent& e = owned[j];
      const size_t lo = std::min(e.len, c0);
      return extent{e.begin + lo, std::min(e.len - lo, chunk)};
    };
    exchange_and_combine(*this, parts, b, range_of, out + std::min(owned[rank()].len, c0),
                         remaining(deadline, opts));
  }
}

void communicator::all_reduce_tree(const tree_sum_parts& parts, size_t begin, size_t end,
                                   float* out, const op_options& opts) {
  if (auto why = tree_sum_argument_error(rank(), size(), parts, begin, end, out); !why.empty())
    tree_invalid(*this, "all_reduce_tree", why);
  tree_sum_buffers local;
  tree_sum_parts p = parts;
  if (p.buffers == nullptr) p.buffers = &local;
  tree_sum_buffers& b = *p.buffers;
  const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
  const auto world = static_cast<size_t>(size());
  const size_t bucket = std::max<size_t>(1, p.round_floats) * world;
  std::vector<extent> owned(world);
  for (size_t first = begin; first < end; first += bucket) {
    // Floats [first, first + len): rank j owns the j-th of size() equal slices (the last ones
    // shorter or empty); the combined slices are then gathered.
    const size_t len = std::min(bucket, end - first);
    const size_t slice = (len + world - 1) / world;
    for (size_t j = 0; j < world; ++j) {
      const size_t lo = std::min(len, j * slice);
      owned[j] = {first + lo, std::min(len, lo + slice) - lo};
    }
    if (b.mine.size() < slice) b.mine.resize(slice);  // past this rank's range: never read
    const op_options left = remaining(deadline, opts);
    reduce_scatter_tree(p, owned, b.mine.data(), left);
    if (slice * world == len) {  // the slices tile the bucket: gather straight into place
      all_gather(b.mine.data(), out + first, slice * sizeof(float), left);
      continue;
    }
    b.gathered.resize(slice * world);
    all_gather(b.mine.data(), b.gathered.data(), slice * sizeof(float), left);
    for (size_t j = 0; j < world; ++j)
      std::copy_n(b.gathered.data() + j * slice, owned[j].len, out + owned[j].begin);
  }
}

std::string all_to_allv_argument_error(int rank, int size, const void* in,
                                       const std::vector<size_t>& send_bytes, const void* out,
                                       const std::vector<size_t>& recv_bytes) {
  const auto p = static_cast<size_t>(size);
  const auto r = static_cast<size_t>(rank);
  if (send_bytes.size() != p || recv_bytes.size() != p) {
    return "send_bytes and recv_bytes must have " + std::to_string(p) + " entries, not " +
           std::to_string(send_bytes.size()) + " and " + std::to_string(recv_bytes.size());
  }
  if (send_bytes[r] != recv_bytes[r]) {
    return "this rank sends itself " + std::to_string(send_bytes[r]) + " bytes but expects " +
           std::to_string(recv_bytes[r]);
  }
  size_t in_total = 0;
  size_t out_total = 0;
  for (size_t j = 0; j < p; ++j) {
    in_total += send_bytes[j];
    out_total += recv_bytes[j];
  }
  if ((in_total > 0 && in == nullptr) || (out_total > 0 && out == nullptr))
    return "null buffer with a non-zero size";
  if (in == out && in_total > 0 && p > 1) return "in and out must not be the same buffer";
  return {};
}

double sum_in_rank_order(communicator& c, double value, const op_options& opts) {
  if (c.size() == 1) return value;
  std::vector<double> all(static_cast<size_t>(c.size()));
  c.all_gather(&value, all.data(), sizeof(double), opts);
  double total = 0;
  for (double v : all) total += v;
  return total;
}

void communicator::send_recv(const void*, size_t, int, void*, size_t, int, uint32_t,
                             const op_options&) {
  throw comm_error(comm_errc::invalid, "send_recv: not supported by this backend (group '" +
                                           identity().group + "', rank " + std::to_string(rank()) +
                                           ")");
}

std::unique_ptr<communicator> communicator::shrink(const comm_identity&, const std::vector<int>&) {
  return nullptr;
}

const char* to_string(comm_errc code) {
  switch (code) {
    case comm_errc::timeout:
      return "timeout";
    case comm_errc::peer_lost:
      return "peer_lost";
    case comm_errc::aborted:
      return "aborted";
    case comm_errc::invalid:
      return "invalid";
    case comm_errc::internal:
      return "internal";
  }
  return "unknown";
}

}  // namespace troupe::comm
