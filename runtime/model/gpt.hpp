#pragma once
// The byte-level GPT of one rank: its parameters and gradients in flat buffers, and the
// forward and backward pass over one micro-batch, composed from runtime/model/layers.hpp.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/config.hpp"
#include "runtime/data/token.hpp"
#include "runtime/model/moe.hpp"

namespace troupe {

/// One named tensor inside the flat parameter (and gradient) buffer.
struct param_tensor {
  std::string name;            ///< e.g. "h.0.attn.qkv.weight" (PyTorch-style names)
  std::vector<int64_t> shape;  ///< row-major; Linear weights are [out, in]
  size_t offset = 0;           ///< first element in the flat buffer
  size_t numel = 0;
  bool decay = false;  ///< weight decay applies: every 2-D tensor (embeddings included)
};

/// A GPT over bytes: token and position embeddings, n_layer pre-LayerNorm blocks (causal
/// self-attention with a fused QKV projection, GELU MLP of width 4C), a final LayerNorm
/// and an output head tied to the token embedding. F is float for training and double for
/// gradient checks; use `gpt` (float) everywhere else.
///
/// Parameter layout, in order: wte [V,C], wpe [context,C], then per layer ln_1 (weight,
/// bias), attn.qkv (weight [3C,C], bias), attn.proj (weight [C,C], bias), ln_2, mlp.fc
/// (weight [4C,C], bias), mlp.proj (weight [C,4C], bias); then ln_f. Each layer is one
/// contiguous range, so a pipeline stage owns a contiguous slice.
///
/// With cfg.experts = E > 0 every block's MLP is a Mixture of Experts (runtime/model/moe.hpp):
/// the four mlp.* tensors are replaced by moe.router.weight [E,C] and, per expert e this
/// rank owns, moe.experts.<e>.fc.weight [4C,C], .fc.bias, .proj.weight [C,4C], .proj.bias.
/// The loss is then the LM loss plus aux_loss_coef times the sum over blocks of the aux
/// loss. Given an expert_exchange of size p, the model holds only the E/p experts of its
/// rank (names keep the global expert index) and its MoE layers reach the others through
/// the exchange; every other tensor is the same as alone.
///
/// Not thread-safe: a forward/backward pass reuses the object's activation buffers. Give
/// each rank (thread or process) its own model.
/// Thrown by a forward or backward pass whose interrupt flag was raised (between blocks).
struct compute_interrupted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename F>
class basic_gpt {
 public:
  /// Throws std::invalid_argument when the shape is unusable (heads must divide d_model,
  /// vocab must cover the 256 byte values, sizes positive).
  explicit basic_gpt(const model_config& cfg);
  /// An MoE model that is one rank of an expert-parallel group (`exchange` not owned, must
  /// outlive the model; null = alone). Also throws when the group size does not divide E.
  basic_gpt(const model_config& cfg, moe::expert_exchange* exchange);

  const model_config& config() const { return cfg_; }
  size_t num_params() const { return params_.size(); }
  const std::vector<param_tensor>& param_table() const { return table_; }
  /// The tensor named `name`; throws std::out_of_range if there is none.
  const param_tensor& tensor(const std::string& name) const;

  /// One flat contiguous buffer of num_params() values, laid out as param_table().
  F* params() { return params_.data(); }
  const F* params() const { return params_.data(); }
  /// Gradients, same layout as params().
  F* grads() { return grads_.data(); }
  const F* grads() const { return grads_.data(); }

  /// GPT-2 initialisation, a pure function of seed: weights N(0, 0.02), the two residual
  /// projections of each block N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm 1 and 0.
  void init_params(uint64_t seed);
  void zero_grads();
  /// Exchanges the gradient buffer with `other` (num_params() values; std::invalid_argument
  /// otherwise), so that a micro-batch's gradient can be taken without a copy.
  void swap_grads(std::vector<F>& other);

  /// One micro-batch of B sequences of T <= context tokens; targets are the next bytes.
  /// Accumulates grad_scale * d(mean loss)/d(params) into grads() and returns the mean
  /// cross-entropy in nats over the B*T tokens.
  double forward_backward(const token_id* inputs, const token_id* targets, int B, int T,
                          float grad_scale);
  /// The mean loss only; grads() are untouched.
  double forward_loss(const token_id* inputs, const token_id* targets, int B, int T);

  /// Parts of the last loss returned: the mean cross-entropy, and the unscaled aux loss
  /// summed over blocks (0 for a dense model); loss = lm + aux_loss_coef * aux.
  double last_lm_loss() const { return last_lm_; }
  double last_aux_loss() const { return last_aux_; }
  /// The softmax probabilities [B*T, V] of the last forward pass (row b*T + t: the next-token
  /// distribution after token t of sequence b), valid until the next pass; null before any.
  /// What inference (runtime/model/generate.hpp) is checked against.
  const F* last_probs() const;
  /// A flag (not owned; null = none) that another thread raises to stop a pass in flight:
  /// forward and backward look at it before each block and throw compute_interrupted. An
  /// aborted generation's compute ends within a block instead of running to its end.
  void set_interrupt(const std::atomic<bool>* flag) { interrupt_ = flag; }
  /// Block l's MoE layer (routing statistics of the last forward); needs cfg.experts > 0.
  const moe::moe_layer<F>& moe_layer(int l) const { return moe_.at(static_cast<size_t>(l)); }
  /// Tokens routed to each of the E experts of block l in the last forward, over the whole
  /// micro-batch of the expert-parallel group (all top_k choices, before capacity).
  const std::vector<int64_t>& tokens_per_expert(int l) const {
    return moe_layer(l).tokens_per_expert();
  }

 private:
  void check_batch(int B, int T) const;
  void reserve(int B);
  double forward(const token_id* inputs, const token_id* targets, int B, int T);
  void backward(const token_id* inputs, const token_id* targets, int B, int T, F dloss, F aux_grad);
  void check_interrupt() const {
    if (interrupt_ != nullptr && interrupt_->load(std::memory_order_relaxed))
      throw compute_interrupted("compute interrupted: the generation was aborted");
  }

  model_config cfg_;
  std::vector<param_tensor> table_;
  std::vector<F> params_;
  std::vector<F> grads_;
  std::vector<size_t> block_first_;     // table index of each block's first tensor
  std::vector<size_t> stream_;          // init stream of each tensor: its index in the full table
  std::vector<moe::moe_layer<F>> moe_;  // one per block when cfg.experts > 0
  double last_lm_ = 0;
  double last_aux_ = 0;
  // Activations and their gradients, sized for the largest B seen and then reused: fresh
  // memory is slow to touch, so nothing is allocated per step.
  int capacity_b_ = 0;
  std::vector<F> acts_;
  std::vector<F> grad_acts_;
  const std::atomic<bool>* interrupt_ = nullptr;
};

extern template class basic_gpt<float>;
extern template class basic_gpt<double>;

/// Bytes a single-rank float model of `cfg` holds while training micro-batches of
/// `micro_batch` sequences: parameters, gradients, both AdamW moments and the activation
/// buffers. A sharded rank holds less; the figure sizes memory warmed ahead of time.
size_t working_set_bytes(const model_config& cfg, int micro_batch);

/// The float32 model every rank trains.
class gpt : public basic_gpt<float> {
 public:
  using basic_gpt<float>::basic_gpt;
};

}  // namespace troupe
