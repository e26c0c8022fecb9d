#include "strategies/mesh.hpp"

#include <array>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

namespace troupe::strategies {
namespace {

// The four axes of the order string. `dp` here is the x = d / ep part of the dp coordinate.
enum class axis { tp, ep, dp, pp };

std::optional<axis> parse_axis(std::string_view s) {
  if (s == "tp") return axis::tp;
  if (s == "ep") return axis::ep;
  if (s == "dp") return axis::dp;
  if (s == "pp") return axis::pp;
  return std::nullopt;
}

// The axes of `order` fastest first, or nullopt unless it names each axis exactly once.
std::optional<std::array<axis, 4>> parse_order(std::string_view order) {
  std::array<axis, 4> out{};
  size_t n = 0;
  size_t start = 0;
  while (start <= order.size()) {
    const size_t dash = order.find('-', start);
    const size_t end = dash == std::string_view::npos ? order.size() : dash;
    const auto a = parse_axis(order.substr(start, end - start));
    if (!a || n == 4) return std::nullopt;
    for (size_t i = 0; i < n; ++i)
      if (out[i] == *a) return std::nullopt;
    out[n++] = *a;
    if (dash == std::string_view::npos) break;
    start = dash + 1;
  }
  if (n != 4) return std::nullopt;
  return out;
}

int axis_size(const layout& l, axis a) {
  switch (a) {
    case axis::tp:
      return l.tp;
    case axis::ep:
      return l.ep;
    case axis::dp:
      return l.dp / l.ep;
    case axis::pp:
      return l.pp;
  }
  return 1;
}

int& axis_coord(coords& c, axis a) {
  switch (a) {
    case axis::tp:
      return c.tp;
    case axis::ep:
      return c.ep;
    case axis::dp:
      return c.edp;
    case axis::pp:
      return c.pp;
  }
  return c.tp;
}

std::array<axis, 4> axes_of(const layout& l) {
  require_layout(l);
  return *parse_order(l.order);
}

void require_rank(const layout& l, int rank) {
  if (rank < 0 || rank >= l.world())
    throw std::invalid_argument("mesh: rank " + std::to_string(rank) + " is outside the layout " +
                                describe(l) + " of " + std::to_string(l.world()) + " ranks");
}

// The rank at `c` when c.ep and c.edp are already consistent with c.dp.
int rank_at(const std::array<axis, 4>& axes, const layout& l, coords c) {
  int rank = 0;
  int stride = 1;
  for (axis a : axes) {
    rank += axis_coord(c, a) * stride;
    stride *= axis_size(l, a);
  }
  return rank;
}

coords with_dp(const layout& l, coords c, int d) {
  c.dp = d;
  c.ep = d % l.ep;
  c.edp = d / l.ep;
  return c;
}

std::string key(std::string_view kind, std::initializer_list<std::pair<const char*, int>> parts) {
  std::string out(kind);
  for (const auto& [name, value] : parts) out += "." + std::string(name) + std::to_string(value);
  return out;
}

}  // namespace

std::string check_layout(const layout& l) {
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.ep < 1)
    return "layout: dp, tp, pp and ep must all be >= 1 (got " + describe(l) + ")";
  if (l.dp % l.ep != 0)
    return "layout: ep (" + std::to_string(l.ep) + ") must divide dp (" + std::to_string(l.dp) +
           "): expert parallelism is carved out of the data-parallel ranks";
  if (!parse_order(l.order))
    return "layout: order \"" + l.order +
           "\" must name tp, ep, dp and pp once each, joined by '-', fastest first (e.g. \"" +
           std::string(default_rank_order) + "\")";
  return {};
}

void require_layout(const layout& l) {
  if (auto why = check_layout(l); !why.empty()) throw std::invalid_argument(why);
}

coords coords_of(const layout& l, int rank) {
  const auto axes = axes_of(l);
  require_rank(l, rank);
  coords c;
  for (axis a : axes) {
    const int n = axis_size(l, a);
    axis_coord(c, a) = rank % n;
    rank /= n;
  }
  c.dp = c.ep + l.ep * c.edp;
  return c;
}

int rank_of(const layout& l, const coords& c) {
  const auto axes = axes_of(l);
  if (c.dp < 0 || c.dp >= l.dp || c.tp < 0 || c.tp >= l.tp || c.pp < 0 || c.pp >= l.pp)
    throw std::invalid_argument("mesh: coordinates (dp " + std::to_string(c.dp) + ", tp " +
                                std::to_string(c.tp) + ", pp " + std::to_string(c.pp) +
                                ") are outside the layout " + describe(l));
  return rank_at(axes, l, with_dp(l, c, c.dp));
}

std::string_view to_string(group_kind k) {
  switch (k) {
    case group_kind::tp:
      return "tp";
    case group_kind::dp:
      return "dp";
    case group_kind::pp:
      return "pp";
    case group_kind::ep:
      return "ep";
    case group_kind::edp:
      return "edp";
    case group_kind::embd:
      return "embd";
  }
  return "?";
}

std::optional<group> group_of(const layout& l, int rank, group_kind k) {
  const auto axes = axes_of(l);
  const coords c = coords_of(l, rank);
  group g;
  auto add = [&](coords at) { g.ranks.push_back(rank_at(axes, l, at)); };
  switch (k) {
    case group_kind::tp:
      g.name = key("tp", {{"pp", c.pp}, {"dp", c.dp}});
      for (int t = 0; t < l.tp; ++t) add(coords{c.dp, t, c.pp, c.ep, c.edp});
      break;
    case group_kind::dp:
      g.name = key("dp", {{"pp", c.pp}, {"tp", c.tp}});
      for (int d = 0; d < l.dp; ++d) add(with_dp(l, c, d));
      break;
    case group_kind::pp:
      g.name = key("pp", {{"dp", c.dp}, {"tp", c.tp}});
      for (int p = 0; p < l.pp; ++p) add(coords{c.dp, c.tp, p, c.ep, c.edp});
      break;
    case group_kind::ep:
      g.name = key("ep", {{"pp", c.pp}, {"tp", c.tp}, {"edp", c.edp}});
      for (int e = 0; e < l.ep; ++e) add(with_dp(l, c, e + l.ep * c.edp));
      break;
    case group_kind::edp:
      g.name = key("edp", {{"pp", c.pp}, {"tp", c.tp}, {"ep", c.ep}});
      for (int x = 0; x < l.dp / l.ep; ++x) add(with_dp(l, c, c.ep + l.ep * x));
      break;
    case group_kind::embd:
      // The output head is tied to the token embedding, so the first and last stage each
      // hold a copy whose gradients must be summed; middle stages hold neither.
      if (c.pp != 0 && c.pp != l.pp - 1) return std::nullopt;
      g.name = key("embd", {{"dp", c.dp}, {"tp", c.tp}});
      add(coords{c.dp, c.tp, 0, c.ep, c.edp});
      if (l.pp > 1) add(coords{c.dp, c.tp, l.pp - 1, c.ep, c.edp});
      break;
  }
  for (size_t i = 0; i < g.ranks.size(); ++i)
    if (g.ranks[i] == rank) g.index = static_cast<int>(i);
  return g;
}

std::vector<group> groups_of(const layout& l, group_kind k) {
  require_layout(l);
  std::vector<group> out;
  std::set<std::string> seen;
  // Visiting ranks in order lists the groups by their lowest member.
  for (int r = 0; r < l.world(); ++r) {
    auto g = group_of(l, r, k);
    if (!g || !seen.insert(g->name).second) continue;
    g->index = -1;
    out.push_back(std::move(*g));
  }
  return out;
}

rank_view view_of(const layout& l, int rank) {
  require_layout(l);
  require_rank(l, rank);
  rank_view v;
  v.rank = rank;
  v.at = coords_of(l, rank);
  v.tp = *group_of(l, rank, group_kind::tp);
  v.dp = *group_of(l, rank, group_kind::dp);
  v.pp = *group_of(l, rank, group_kind::pp);
  v.ep = *group_of(l, rank, group_kind::ep);
  v.edp = *group_of(l, rank, group_kind::edp);
  v.embd = group_of(l, rank, group_kind::embd);
  const int p = v.at.pp;
  if (p > 0) v.prev_stage = v.pp.ranks[static_cast<size_t>(p - 1)];
  if (p + 1 < l.pp) v.next_stage = v.pp.ranks[static_cast<size_t>(p + 1)];
  return v;
}

std::string describe(const layout& l) {
  std::string out =
      "dp" + std::to_string(l.dp) + "xtp" + std::to_string(l.tp) + "xpp" + std::to_string(l.pp);
  if (l.ep != 1) out += "xep" + std::to_string(l.ep);
  return out;
}

namespace {
// The order string is echoed only when well-formed, so it never needs escaping.
std::string shown_order(const layout& l) {
  return parse_order(l.order) ? l.order : std::string("invalid");
}
}  // namespace

std::string to_json(const layout& l) {
  return "{\"dp\":" + std::to_string(l.dp) + ",\"tp\":" + std::to_string(l.tp) +
         ",\"pp\":" + std::to_string(l.pp) + ",\"ep\":" + std::to_string(l.ep) + ",\"order\":\"" +
         shown_order(l) + "\",\"name\":\"" + describe(l) + "\"}";
}

nlohmann::json layout_doc(const layout& l) {
  return {{"dp", l.dp},         {"tp", l.tp}, {"pp", l.pp}, {"ep", l.ep}, {"order", shown_order(l)},
          {"name", describe(l)}};
}

}  // namespace troupe::strategies
