#pragma once
// The Mixture-of-Experts MLP: a router picks top_k of E GELU experts per token, experts run
// under a per-expert capacity, and a Switch-style auxiliary loss keeps the load balanced.
//
// Conventions (every parallel layout must reproduce them exactly):
//
// * Router: logits[N,E] = x W_r^T (no bias), probs = softmax(logits) over the E experts.
// * Gates: top_k = 1 uses the raw probability of the chosen expert (Switch Transformer);
//   top_k = 2 renormalises the two chosen probabilities to sum to 1 (GShard/Mixtral), so a
//   token's output is a convex mix of its two experts. Ties pick the lower expert index.
// * Capacity: cap = ceil(capacity_factor * tokens * top_k / E), evaluated in double, where
//   `tokens` is the whole micro-batch (summed over the expert-parallel group). Each
//   expert's queue holds the (token, choice) pairs routed to it in token order (a token
//   enters a queue at most once, whichever of its choices it is); the first cap entries
//   are processed, the rest are dropped: that choice contributes zero output and the
//   residual stream carries the token unchanged (a top-2 token that loses one choice keeps
//   the other's gate as it was, not renormalised again). Across ranks, token order is rank
//   order then local order, so the queue is the single-rank queue of the concatenated
//   batch. GShard instead serves every first choice before any second one; token order is
//   used here because each rank then decides its own drops from the counts of the ranks
//   before it, which the one count exchange already delivers.
// * Aux loss: aux = E * sum_e f_e * P_e, with f_e the fraction of tokens whose FIRST
//   choice is e (before capacity) and P_e the mean router probability of e. f_e is a
//   count and carries no gradient; P_e carries it into the router. The model adds
//   aux_loss_coef * aux to the loss.
//
// The layer reaches experts on other ranks only through `expert_exchange`, which the
// expert-parallel strategy implements over a communicator; alone, it runs every expert.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace troupe::moe {

/// The shape and knobs of one MoE layer.
struct moe_config {
  int C = 0;      ///< channels in and out
  int E = 0;      ///< experts
  int top_k = 1;  ///< 1 or 2
  double capacity_factor = 1.25;
};

/// Parameters of one expert in a flat buffer, in this order: fc.weight [4C,C],
/// fc.bias [4C], proj.weight [C,4C], proj.bias [C]. Experts follow each other.
inline size_t expert_param_count(int C) {
  const size_t c = static_cast<size_t>(C);
  return 8 * c * c + 5 * c;
}

/// The expert-parallel group as seen by one MoE layer: who owns which expert, and the two
/// collectives that move tokens. Rank r owns experts [r * E/size, (r+1) * E/size).
class expert_exchange {
 public:
  virtual ~expert_exchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Every rank's `bytes` of `in`, concatenated in rank order into `out` (size() * bytes).
  virtual void all_gather(const void* in, void* out, size_t bytes) = 0;
  /// `in` packs send_bytes[j] bytes for each rank j in rank order; `out` receives
  /// recv_bytes[j] bytes from each rank j in rank order.
  virtual void all_to_allv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                           const std::vector<size_t>& recv_bytes) = 0;
};

/// The exchange of a group of one: every expert is local and nothing moves.
class local_exchange final : public expert_exchange {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_gather(const void* in, void* out, size_t bytes) override;
  void all_to_allv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes) override;
};

/// One MoE MLP: C -> E experts (C -> 4C -> GELU -> C, with biases) -> C, with the routing
/// state a backward pass needs. Stateful and not thread-safe: forward then backward on
/// the same inputs, one layer object per block and per rank. Buffers grow to the largest
/// micro-batch seen and are reused.
template <typename F>
class moe_layer {
 public:
  /// `exchange` (not owned; null = alone) must outlive the layer; E must be divisible by
  /// its size(). Throws std::invalid_argument on a bad shape.
  moe_layer(const moe_config& cfg, expert_exchange* exchange);

  /// out[N,C] = sum over kept choices of gate * expert(inp) (overwritten). router_w is
  /// [E,C]; experts points at this rank's E/size experts (layout: expert_param_count).
  /// Returns the unscaled aux loss of the whole micro-batch (identical on every rank).
  double forward(F* out, const F* inp, int N, const F* router_w, const F* experts);

  /// Accumulates (+=) into dinp[N,C], drouter_w and dexperts the gradient of
  /// sum(dout * out) + aux_grad * aux, where aux's P_e is taken over this rank's N
  /// tokens (so that averaging replicated gradients over the group gives the gradient of
  /// the whole micro-batch's aux loss). Same arguments as the forward that preceded it.
  void backward(F* dinp, F* drouter_w, F* dexperts, const F* dout, const F* inp, const F* router_w,
                const F* experts, F aux_grad);

  /// Tokens routed to each expert (all top_k choices, before capacity) over the whole
  /// micro-batch of the last forward; E entries.
  const std::vector<int64_t>& tokens_per_expert() const { return routed_; }
  /// Choices dropped by capacity over the whole micro-batch of the last forward.
  int64_t dropped_tokens() const { return dropped_; }
  /// The unscaled aux loss of the last forward.
  double aux_loss() const { return aux_; }
  /// Capacity per expert used by the last forward.
  int64_t capacity() const { return capacity_; }
  /// Router probabilities [N,E] of this rank's tokens in the last forward.
  const std::vector<F>& router_probs() const { return probs_; }
  /// Chosen experts [N,top_k] of the last forward, best first.
  const std::vector<int>& choices() const { return choice_; }
  /// Whether each choice [N,top_k] of the last forward was processed (not dropped).
  std::vector<bool> kept() const;

 private:
  void route(const F* inp, int N, const F* router_w);
  void plan(int N);
  void run_experts(const F* experts);
  expert_exchange& group() { return exchange_ != nullptr ? *exchange_ : alone_; }

  moe_config cfg_;
  expert_exchange* exchange_;  // null: alone_ (not a pointer to it, so the layer can move)
  local_exchange alone_;
  int local_experts_ = 0;  // E / group size
  int first_expert_ = 0;   // global index of this rank's first expert
  int N_ = 0;              // tokens of this rank in the last forward

  // Routing of this rank's tokens.
  std::vector<F> probs_;        // [N,E]
  std::vector<int> choice_;     // [N,k] expert ids, best first
  std::vector<F> gate_;         // [N,k]
  std::vector<int> slot_row_;   // [N,k] row in the send buffer, -1 when dropped
  std::vector<int> send_slot_;  // send row -> t * k + j
  // Whole micro-batch statistics.
  std::vector<int64_t> routed_;    // [E]
  std::vector<double> top1_frac_;  // [E] f_e
  int64_t capacity_ = 0;
  int64_t dropped_ = 0;
  double aux_ = 0;
  std::vector<int64_t> kept_;  // [size, E]: choices rank r sends expert e
  std::vector<size_t> send_bytes_, recv_bytes_;
  // Rows: send order is [dest rank][its expert][token]; the experts compute in
  // [local expert][source rank][token]; recv_perm_ maps the second to the first.
  std::vector<int> recv_perm_;     // expert row -> received row
  std::vector<int> expert_rows_;   // [local_experts + 1] first row of each expert
  std::vector<F> send_, recv_;     // [rows, C] staging for the exchanges
  std::vector<F> y_;               // [send rows, C] expert outputs back at the origin
  std::vector<F> x_, h_, g_, ey_;  // expert-side input, hidden, GELU, output
  std::vector<F> dh_, dg_, dx_, dprobs_;
  std::vector<double> stats_, all_stats_;
};

extern template class moe_layer<float>;
extern template class moe_layer<double>;

}  // namespace troupe::moe
