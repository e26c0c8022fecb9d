#pragma once
// The parallel mesh: maps ranks to coordinates of a dp x tp x pp x ep layout and back, and
// names every communication group a rank belongs to, as pure functions of the layout.
//
// Conventions (see layout and rank_order):
//  - world = dp * tp * pp. Expert parallelism is carved out of the data-parallel ranks
//    (ep divides dp): the dp coordinate d splits into an expert index e = d % ep and an
//    expert-data-parallel index x = d / ep, so d = e + ep * x. The MoE all-to-all runs in
//    the ep group (same tp, pp, x; e varies), which lies inside one dp group; expert
//    gradients are summed over the edp group (same tp, pp, e; x varies), dense gradients
//    over the whole dp group.
//  - The order string lists the four axes fastest-varying first; the default
//    "tp-ep-dp-pp" keeps tensor-parallel peers on adjacent ranks (one node), then expert
//    peers, and puts pipeline stages furthest apart. In the order string "dp" stands for
//    the x part of the dp coordinate (size dp / ep).
//  - Nothing here is global: a new generation builds a new layout and asks again.

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::strategies {

/// The default axis order, fastest-varying first.
inline constexpr std::string_view default_rank_order = "tp-ep-dp-pp";

/// A parallel layout of dp * tp * pp ranks, ep of the dp ranks sharing one set of experts.
struct layout {
  int dp = 1;  ///< data-parallel replicas (each sees its share of the micro-batches)
  int tp = 1;  ///< tensor-parallel shards of every matrix
  int pp = 1;  ///< pipeline stages
  int ep = 1;  ///< expert-parallel shards; divides dp
  std::string order{default_rank_order};  ///< axes fastest first, e.g. "tp-ep-dp-pp"

  /// Ranks the layout occupies: dp * tp * pp.
  int world() const { return dp * tp * pp; }
  friend bool operator==(const layout&, const layout&) = default;
};

/// Why `l` is not a well-formed mesh (a size < 1, ep not dividing dp, a bad order string),
/// or an empty string when it is. Model and batch constraints are the planner's business.
std::string check_layout(const layout& l);

/// Throws std::invalid_argument with check_layout's reason when `l` is malformed.
void require_layout(const layout& l);

/// A rank's place in the mesh. `dp == ep + layout.ep * edp` always holds.
struct coords {
  int dp = 0;
  int tp = 0;
  int pp = 0;
  int ep = 0;   ///< which expert shard, in [0, layout.ep)
  int edp = 0;  ///< which copy of that expert shard, in [0, layout.dp / layout.ep)
  friend bool operator==(const coords&, const coords&) = default;
};

/// The coordinates of `rank` (0 <= rank < l.world()). Throws std::invalid_argument otherwise.
coords coords_of(const layout& l, int rank);

/// The rank at `c`; `c.ep` and `c.edp` are ignored (they follow from `c.dp`).
/// Throws std::invalid_argument when a coordinate is out of range.
int rank_of(const layout& l, const coords& c);

/// The kinds of communication group.
enum class group_kind {
  tp,    ///< same dp, pp: shards of one matrix (all-reduce of activations)
  dp,    ///< same tp, pp: replicas (all-reduce of dense gradients)
  pp,    ///< same dp, tp: the stages of one pipeline (send/recv)
  ep,    ///< same tp, pp, edp: expert shards (all-to-all of tokens)
  edp,   ///< same tp, pp, ep: copies of one expert shard (all-reduce of expert gradients)
  embd,  ///< first and last stage of one pipeline (all-reduce of the tied embedding)
};

/// The kind's short name: "tp", "dp", "pp", "ep", "edp", "embd".
std::string_view to_string(group_kind k);

/// Every kind, in a fixed order.
inline constexpr group_kind all_group_kinds[] = {group_kind::tp, group_kind::dp,  group_kind::pp,
                                                 group_kind::ep, group_kind::edp, group_kind::embd};

/// One communication group. The name is unique within a layout and depends only on the
/// coordinates the members share, e.g. "tp.pp0.dp1", so every member derives the same name
/// (a key for the communicator's rendezvous) without talking to the others.
struct group {
  std::string name;
  std::vector<int> ranks;  ///< members ordered by their coordinate along the group's axis
  int index = -1;          ///< the asking rank's position in `ranks`; -1 in group listings
  friend bool operator==(const group&, const group&) = default;
};

/// The group of kind `k` that `rank` belongs to, or nullopt for embd when the rank is a
/// middle pipeline stage (every other kind always has a group; it may have one member).
std::optional<group> group_of(const layout& l, int rank, group_kind k);

/// Every group of kind `k`, sorted by name, with index -1. For every kind but embd they
/// partition the ranks; embd groups cover only the first and last stages.
std::vector<group> groups_of(const layout& l, group_kind k);

/// Everything one rank needs to know about its place in the mesh.
struct rank_view {
  int rank = 0;
  coords at;
  group tp, dp, pp, ep, edp;
  std::optional<group> embd;      ///< only on the first and last stage
  std::optional<int> prev_stage;  ///< rank of stage pp-1 in this pipeline, if any
  std::optional<int> next_stage;  ///< rank of stage pp+1 in this pipeline, if any
};

/// The view of `rank`. Throws std::invalid_argument for a bad layout or rank.
rank_view view_of(const layout& l, int rank);

/// A short stable name for events and logs: "dp2xtp2xpp2", with "xep2" appended when ep > 1.
std::string describe(const layout& l);

/// The layout as a JSON object: {"dp":2,"tp":2,"pp":2,"ep":1,"order":"tp-ep-dp-pp",
/// "name":"dp2xtp2xpp2"}.
std::string to_json(const layout& l);
/// The same object as a JSON value (for events, which are values until they are written).
nlohmann::json layout_doc(const layout& l);

}  // namespace troupe::strategies
