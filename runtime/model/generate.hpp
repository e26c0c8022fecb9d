#pragma once
// Inference with the built-in GPT: an incremental forward pass that keeps every layer's keys
// and values (the KV cache), the choice of the next token from its logits, and the loop that
// generates text with both.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "runtime/data/token.hpp"
#include "runtime/model/gpt.hpp"
#include "runtime/model/moe.hpp"

namespace troupe {

/// The logits of a growing sequence over a model's parameters. Each block keeps the keys and
/// values of every position it has seen, so appending n tokens costs n rows of every
/// projection plus their attention against the cache, not a pass over the whole sequence.
///
/// The arithmetic is basic_gpt's forward pass with the same layer kernels
/// (runtime/model/layers.hpp; attention_forward_cached for the attention): the logits after
/// the token at position t equal those basic_gpt computes for position t of the same
/// sequence, up to the rounding of a different grouping of rows. Positions are absolute (the
/// learned wpe), so the cache holds at most context() tokens; what happens past that is the
/// caller's choice (generate() crops and recomputes).
///
/// An MoE block routes each token to its top_k experts with no capacity limit: capacity is a
/// training-time bound on a micro-batch's load, and a token's output at inference must not
/// depend on which other tokens share its pass. It equals the training forward's wherever that
/// dropped nothing (always, for one token at a time).
///
/// Reads the model's parameters in place: the model must outlive the decoder and not change
/// while the decoder holds a cache (clear() after it changes). Not thread-safe.
template <typename F>
class kv_decoder {
 public:
  /// Throws std::invalid_argument for a model that is one rank of an expert-parallel group
  /// (it lacks experts), which inference cannot run alone.
  explicit kv_decoder(const basic_gpt<F>& model);
  kv_decoder(const kv_decoder&) = delete;
  kv_decoder& operator=(const kv_decoder&) = delete;

  int context() const { return cfg_.context; }
  int vocab() const { return cfg_.vocab; }
  /// Positions held in the cache: the next token appended is at this position.
  int length() const { return length_; }
  /// Forgets the cache (a new sequence starts at position 0).
  void clear() { length_ = 0; }

  /// Appends `tokens` at positions length() .. length() + n - 1 and returns the logits [V]
  /// after the last of them (valid until the next call). With `all` non-null, also writes the
  /// logits after each appended token there ([n, V], row i after tokens[i]). Throws
  /// std::invalid_argument when tokens is empty, a token is not below vocab(), or the cache
  /// would hold more than context() positions (nothing is appended then).
  const F* append(std::span<const token_id> tokens, F* all = nullptr);

 private:
  /// One block's parameters, inside the model's flat buffer.
  struct block_weights {
    const F *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b;
    const F *fc_w, *fc_b, *fcproj_w, *fcproj_b;  // dense MLP
    const F *router_w, *experts;                 // MoE MLP (this model holds every expert)
  };

  model_config cfg_;
  const F* wte_ = nullptr;
  const F* wpe_ = nullptr;
  const F* lnf_w_ = nullptr;
  const F* lnf_b_ = nullptr;
  std::vector<block_weights> blocks_;
  std::vector<moe::moe_layer<F>> moe_;  // one per block of an MoE model, dropless
  std::vector<F> k_cache_, v_cache_;    // [L, context, C] each
  int length_ = 0;
  // Row buffers for up to context() new rows at once.
  std::vector<F> x_, ln_, mean_, rstd_, qkv_, atty_, proj_, fch_, fch_gelu_, scratch_, logits_;
};

extern template class kv_decoder<float>;
extern template class kv_decoder<double>;

/// How the next token is chosen from the logits.
struct sampling_options {
  double temperature = 1.0;  ///< logits are divided by it; 0 = greedy (the largest logit)
  int top_k = 0;             ///< draw among the k largest logits only; 0 = among all
  uint64_t seed = 1337;      ///< the same seed draws the same tokens from the same logits
  /// Ids at or above this are never chosen (a model whose vocabulary is wider than its data's,
  /// --vocab: ids the data cannot hold). 0 = the whole vocabulary.
  int64_t allowed = 0;
};

/// Draws token ids from logits. Draw i is a pure function of (seed, i) and the logits: a
/// counter-based uniform (runtime/data/random.hpp) against the cumulative probabilities in
/// double, so a run is reproducible on any machine that computes the same logits.
class token_sampler {
 public:
  /// Throws std::invalid_argument for a negative or non-finite temperature or a negative top_k.
  explicit token_sampler(const sampling_options& o);

  /// The next token after `logits` [V]. Greedy (temperature 0, or top_k 1) takes the lowest id
  /// of the largest logit; otherwise softmax(logits / temperature) over the top_k largest
  /// (ties with the k-th kept, as nanoGPT's top-k keeps them) is sampled.
  template <typename F>
  token_id next(const F* logits, int V);

  /// Draws made so far.
  uint64_t draws() const { return draws_; }

 private:
  sampling_options o_;
  uint64_t draws_ = 0;
  std::vector<double> z_, sorted_;
};

/// Generates `count` tokens after `prompt` (at least one token) and returns them; `emit`, when
/// given, is called with each as soon as it is drawn. The prompt's last context() tokens are
/// fed through the decoder once; then one token per step, each against the cache. When the
/// sequence outgrows the context, the window is cropped to its last context() tokens and the
/// cache recomputed for it, every step from then on: each token is drawn from the logits of
/// the last context() tokens, as nanoGPT's generate() crops (the learned position embeddings
/// leave no cheaper exact way).
template <typename F>
std::vector<token_id> generate(kv_decoder<F>& decoder, std::span<const token_id> prompt,
                               int64_t count, token_sampler& sampler,
                               const std::function<void(token_id)>& emit = {});

}  // namespace troupe
