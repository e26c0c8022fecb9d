#include "runtime/model/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "runtime/data/random.hpp"
#include "runtime/model/layers.hpp"

namespace troupe {
namespace {

/// Pointers to one block's parameters (or gradients) inside a flat buffer.
template <typename F>
struct block_params {
  F *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
  F *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
  F *router_w, *experts;  // MoE blocks (the mlp.* pointers are then null)
};

/// Hands out consecutive ranges of a buffer; with a null base it only counts, which is how
/// the same code both sizes and lays out a buffer.
template <typename F>
struct carver {
  F* base = nullptr;
  size_t used = 0;
  F* take(size_t n) {
    F* p = base != nullptr ? base + used : nullptr;
    used += n;
    return p;
  }
};

/// The tensors of the model in buffer order. Everything that depends on that order
/// (the table, the views below) is derived from this one list. An MoE model that is rank
/// `ep_rank` of `ep_size` keeps only its experts; `stream` receives each kept tensor's
/// index in the full (unsharded) table and `block_first` each block's first tensor.
std::vector<param_tensor> build_table(const model_config& m, int ep_rank, int ep_size,
                                      std::vector<size_t>& block_first,
                                      std::vector<size_t>& stream) {
  const int64_t C = m.d_model;
  std::vector<param_tensor> table;
  size_t offset = 0;
  size_t full_index = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape, bool keep = true) {
    const size_t index = full_index++;
    if (!keep) return;
    size_t numel = 1;
    for (int64_t s : shape) numel *= static_cast<size_t>(s);
    const bool decay = shape.size() == 2;
    table.push_back({std::move(name), std::move(shape), offset, numel, decay});
    stream.push_back(index);
    offset += numel;
  };
  add("wte.weight", {m.vocab, C});
  add("wpe.weight", {m.context, C});
  for (int l = 0; l < m.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    block_first.push_back(table.size());
    add(p + "ln_1.weight", {C});
    add(p + "ln_1.bias", {C});
    add(p + "attn.qkv.weight", {3 * C, C});
    add(p + "attn.qkv.bias", {3 * C});
    add(p + "attn.proj.weight", {C, C});
    add(p + "attn.proj.bias", {C});
    add(p + "ln_2.weight", {C});
    add(p + "ln_2.bias", {C});
    if (m.experts > 0) {
      add(p + "moe.router.weight", {m.experts, C});
      const int local = m.experts / ep_size;
      for (int e = 0; e < m.experts; ++e) {
        const bool mine = e / local == ep_rank;
        const std::string x = p + "moe.experts." + std::to_string(e) + ".";
        add(x + "fc.weight", {4 * C, C}, mine);
        add(x + "fc.bias", {4 * C}, mine);
        add(x + "proj.weight", {C, 4 * C}, mine);
        add(x + "proj.bias", {C}, mine);
      }
      continue;
    }
    add(p + "mlp.fc.weight", {4 * C, C});
    add(p + "mlp.fc.bias", {4 * C});
    add(p + "mlp.proj.weight", {C, 4 * C});
    add(p + "mlp.proj.bias", {C});
  }
  add("ln_f.weight", {C});
  add("ln_f.bias", {C});
  return table;
}

// Indices into the table, matching build_table's order.
constexpr size_t wte_index = 0;
constexpr size_t wpe_index = 1;

/// Block views from the table index `i` of the block's first tensor.
template <typename F>
block_params<F> block_view(F* base, const std::vector<param_tensor>& table, size_t i, bool moe) {
  auto at = [&](size_t k) { return base + table[i + k].offset; };
  block_params<F> b{};
  b.ln1_w = at(0);
  b.ln1_b = at(1);
  b.qkv_w = at(2);
  b.qkv_b = at(3);
  b.proj_w = at(4);
  b.proj_b = at(5);
  b.ln2_w = at(6);
  b.ln2_b = at(7);
  if (moe) {
    b.router_w = at(8);
    b.experts = at(9);  // this rank's experts follow the router, contiguous
    return b;
  }
  b.fc_w = at(8);
  b.fc_b = at(9);
  b.fcproj_w = at(10);
  b.fcproj_b = at(11);
  return b;
}

/// One block's saved activations; N rows of C channels unless noted.
template <typename F>
struct block_acts {
  F* ln1;       // LayerNorm 1 output
  F* ln1_mean;  // [N]
  F* ln1_rstd;  // [N]
  F* qkv;       // [N,3C]
  F* att;       // [B,NH,T,T] attention probabilities
  F* atty;      // attention output before its projection
  F* res2;      // residual stream after attention
  F* ln2;
  F* ln2_mean;
  F* ln2_rstd;
  F* fch;       // [N,4C] MLP hidden, before GELU
  F* fch_gelu;  // [N,4C]
  F* res3;      // residual stream after the MLP: the block's output
};

/// `hidden` is the dense MLP's width (4C), or 0 for an MoE block, which keeps its own.
template <typename F>
block_acts<F> carve_block(carver<F>& c, size_t N, size_t C, size_t att, size_t hidden) {
  block_acts<F> a{};
  a.ln1 = c.take(N * C);
  a.ln1_mean = c.take(N);
  a.ln1_rstd = c.take(N);
  a.qkv = c.take(N * 3 * C);
  a.att = c.take(att);
  a.atty = c.take(N * C);
  a.res2 = c.take(N * C);
  a.ln2 = c.take(N * C);
  a.ln2_mean = c.take(N);
  a.ln2_rstd = c.take(N);
  a.fch = c.take(N * hidden);
  a.fch_gelu = c.take(N * hidden);
  a.res3 = c.take(N * C);
  return a;
}

/// The whole activation arena: embeddings, L blocks of equal size, the head.
template <typename F>
struct model_acts {
  F* encoded;  // [N,C] embedding output: the residual stream entering block 0
  F* blocks;   // L consecutive block regions of block_size values each
  size_t block_size;
  F* proj;  // [N,C] projection output before it joins the residual (not saved)
  F* lnf;
  F* lnf_mean;
  F* lnf_rstd;
  F* logits;         // [N,V], softmax probabilities after the forward pass
  size_t N, C, att;  // rows, channels and attention values per block, at capacity
  size_t hidden;     // dense MLP width, 0 for MoE blocks
  size_t total;      // size of the whole arena

  block_acts<F> block(int l) const {
    carver<F> c{blocks + block_size * static_cast<size_t>(l)};
    return carve_block(c, N, C, att, hidden);
  }
};

template <typename F>
model_acts<F> carve_acts(F* base, const model_config& m, int B) {
  const size_t N = static_cast<size_t>(B) * m.context;
  const size_t C = m.d_model;
  const size_t att = static_cast<size_t>(B) * m.n_head * m.context * m.context;
  const size_t hidden = m.experts > 0 ? 0 : 4 * C;
  carver<F> counter;
  carve_block(counter, N, C, att, hidden);
  carver<F> c{base};
  model_acts<F> a{};
  a.hidden = hidden;
  a.N = N;
  a.C = C;
  a.att = att;
  a.block_size = counter.used;
  a.encoded = c.take(N * C);
  a.blocks = c.take(a.block_size * static_cast<size_t>(m.n_layer));
  a.proj = c.take(N * C);
  a.lnf = c.take(N * C);
  a.lnf_mean = c.take(N);
  a.lnf_rstd = c.take(N);
  a.logits = c.take(N * static_cast<size_t>(m.vocab));
  a.total = c.used;
  return a;
}

/// Activation gradients: the residual stream's (two buffers, swapped per block) and one
/// block's worth of branch gradients, reused by every block.
template <typename F>
struct grad_acts {
  F* dres_out;  // d loss / d (output of the block being differentiated)
  F* dres_in;   // d loss / d (its input); becomes dres_out of the block below
  F* local;     // start of the per-block region, zeroed before each block
  size_t local_size;
  F *dres2, *dproj, *dfch_gelu, *dfch, *dln2, *datty, *dqkv, *dln1;
  F* scratch;  // [T,T] for the attention backward
  F* dlnf;     // [N,C]
  F* dlogits;  // [N,V]
  size_t total;
};

template <typename F>
grad_acts<F> carve_grads(F* base, const model_config& m, int B) {
  const size_t N = static_cast<size_t>(B) * m.context;
  const size_t C = m.d_model;
  const size_t hidden = m.experts > 0 ? 0 : 4 * C;
  carver<F> c{base};
  grad_acts<F> g{};
  g.dres_out = c.take(N * C);
  g.dres_in = c.take(N * C);
  g.local = c.take(0);
  g.dres2 = c.take(N * C);
  g.dproj = c.take(N * C);
  g.dfch_gelu = c.take(N * hidden);
  g.dfch = c.take(N * hidden);
  g.dln2 = c.take(N * C);
  g.datty = c.take(N * C);
  g.dqkv = c.take(N * 3 * C);
  g.dln1 = c.take(N * C);
  g.local_size = c.used - 2 * N * C;
  g.scratch = c.take(static_cast<size_t>(m.context) * m.context);
  g.dlnf = c.take(N * C);
  g.dlogits = c.take(N * static_cast<size_t>(m.vocab));
  g.total = c.used;
  return g;
}

}  // namespace

template <typename F>
basic_gpt<F>::basic_gpt(const model_config& cfg) : basic_gpt(cfg, nullptr) {}

template <typename F>
basic_gpt<F>::basic_gpt(const model_config& cfg, moe::expert_exchange* exchange) : cfg_(cfg) {
  auto fail = [](const std::string& why) { throw std::invalid_argument("gpt: " + why); };
  if (cfg.n_layer < 1 || cfg.n_head < 1 || cfg.d_model < 1 || cfg.context < 1) {
    fail("n_layer, n_head, d_model and context must all be positive");
  }
  if (cfg.d_model % cfg.n_head != 0) {
    fail("n_head (" + std::to_string(cfg.n_head) + ") must divide d_model (" +
         std::to_string(cfg.d_model) + ")");
  }
  if (cfg.vocab < 2) {
    // The data's own vocabulary is checked against it where the data is opened.
    fail("vocab must be at least 2, got " + std::to_string(cfg.vocab));
  }
  if (cfg.experts > 0) {
    const moe::moe_config mc{cfg.d_model, cfg.experts, cfg.top_k, cfg.capacity_factor};
    moe_.reserve(static_cast<size_t>(cfg.n_layer));
    for (int l = 0; l < cfg.n_layer; ++l) moe_.emplace_back(mc, exchange);  // validates
  } else if (cfg.experts < 0) {
    fail("experts must be >= 0 (0 = dense MLP)");
  }
  const int ep_size = exchange != nullptr && cfg.experts > 0 ? exchange->size() : 1;
  const int ep_rank = ep_size > 1 ? exchange->rank() : 0;
  table_ = build_table(cfg, ep_rank, ep_size, block_first_, stream_);
  const size_t n = table_.back().offset + table_.back().numel;
  params_.assign(n, F(0));
  grads_.assign(n, F(0));
}

template <typename F>
const param_tensor& basic_gpt<F>::tensor(const std::string& name) const {
  for (const param_tensor& t : table_) {
    if (t.name == name) return t;
  }
  throw std::out_of_range("gpt: no parameter tensor named '" + name + "'");
}

template <typename F>
void basic_gpt<F>::init_params(uint64_t seed) {
  const double std_dev = 0.02;
  // GPT-2 scales the projections that write into the residual stream by 1/sqrt(2L): each
  // block adds two of them, and this keeps the stream's variance independent of depth.
  const double residual_std = std_dev / std::sqrt(2.0 * cfg_.n_layer);
  for (size_t k = 0; k < table_.size(); ++k) {
    const param_tensor& t = table_[k];
    F* p = params_.data() + t.offset;
    const bool is_weight = t.name.ends_with(".weight");
    const bool is_norm = t.name.find("ln_") != std::string::npos;
    if (is_norm) {
      std::fill(p, p + t.numel, is_weight ? F(1) : F(0));
    } else if (!is_weight) {
      std::fill(p, p + t.numel, F(0));  // biases
    } else {
      const bool expert = t.name.find(".moe.experts.") != std::string::npos;
      const bool residual = t.name.ends_with("attn.proj.weight") ||
                            t.name.ends_with("mlp.proj.weight") ||
                            (expert && t.name.ends_with(".proj.weight"));
      const double sd = residual ? residual_std : std_dev;
      // Each tensor draws from its own stream (its index in the full table), so the values
      // depend neither on the sizes of the tensors before it nor on which experts a rank
      // of an expert-parallel group holds.
      const uint64_t stream = stream_[k];
      for (size_t i = 0; i < t.numel; ++i) p[i] = static_cast<F>(sd * normal_at(seed, stream, i));
    }
  }
}

template <typename F>
void basic_gpt<F>::zero_grads() {
  std::fill(grads_.begin(), grads_.end(), F(0));
}

template <typename F>
void basic_gpt<F>::swap_grads(std::vector<F>& other) {
  if (other.size() != grads_.size())
    throw std::invalid_argument("swap_grads: a buffer of " + std::to_string(other.size()) +
                                " values for a model of " + std::to_string(grads_.size()));
  grads_.swap(other);
}

template <typename F>
void basic_gpt<F>::check_batch(int B, int T) const {
  if (B < 1 || T < 1 || T > cfg_.context) {
    throw std::invalid_argument("gpt: a micro-batch needs B >= 1 and 1 <= T <= context (" +
                                std::to_string(cfg_.context) + "), got B=" + std::to_string(B) +
                                " T=" + std::to_string(T));
  }
}

template <typename F>
void basic_gpt<F>::reserve(int B) {
  if (B <= capacity_b_) return;
  const model_acts<F> sizing = carve_acts<F>(nullptr, cfg_, B);
  acts_.assign(sizing.total, F(0));
  grad_acts_.assign(carve_grads<F>(nullptr, cfg_, B).total, F(0));
  capacity_b_ = B;
}

template <typename F>
double basic_gpt<F>::forward(const token_id* inputs, const token_id* targets, int B, int T) {
  using namespace layers;
  const int C = cfg_.d_model;
  const int NH = cfg_.n_head;
  const int V = cfg_.vocab;
  const int N = B * T;
  const size_t NC = static_cast<size_t>(N) * C;
  const model_acts<F> a = carve_acts<F>(acts_.data(), cfg_, capacity_b_);
  F* p = params_.data();

  embedding_forward(a.encoded, inputs, p + table_[wte_index].offset, p + table_[wpe_index].offset,
                    B, T, C);
  const F* residual = a.encoded;
  const bool moe = cfg_.experts > 0;
  double aux = 0;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    check_interrupt();
    const block_params<F> w = block_view(p, table_, block_first_[l], moe);
    const block_acts<F> s = a.block(l);
    layernorm_forward(s.ln1, s.ln1_mean, s.ln1_rstd, residual, w.ln1_w, w.ln1_b, N, C);
    linear_forward(s.qkv, s.ln1, w.qkv_w, w.qkv_b, N, C, 3 * C);
    attention_forward(s.atty, s.att, s.qkv, B, T, C, NH);
    linear_forward(a.proj, s.atty, w.proj_w, w.proj_b, N, C, C);
    residual_forward(s.res2, residual, a.proj, NC);
    layernorm_forward(s.ln2, s.ln2_mean, s.ln2_rstd, s.res2, w.ln2_w, w.ln2_b, N, C);
    if (moe) {
      aux += moe_[l].forward(a.proj, s.ln2, N, w.router_w, w.experts);
    } else {
      linear_forward(s.fch, s.ln2, w.fc_w, w.fc_b, N, C, 4 * C);
      gelu_forward(s.fch_gelu, s.fch, NC * 4);
      linear_forward(a.proj, s.fch_gelu, w.fcproj_w, w.fcproj_b, N, 4 * C, C);
    }
    residual_forward(s.res3, s.res2, a.proj, NC);
    residual = s.res3;
  }
  const size_t lnf = table_.size() - 2;
  layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, residual, p + table_[lnf].offset,
                    p + table_[lnf + 1].offset, N, C);
  // The head is tied to the token embedding: logits = lnf * wte^T.
  linear_forward(a.logits, a.lnf, p + table_[wte_index].offset, static_cast<const F*>(nullptr), N,
                 C, V);
  const double lm = softmax_crossentropy_forward(a.logits, a.logits, targets, N, V) / N;
  last_lm_ = lm;
  last_aux_ = aux;
  return moe ? lm + cfg_.aux_loss_coef * aux : lm;
}

template <typename F>
void basic_gpt<F>::backward(const token_id* inputs, const token_id* targets, int B, int T, F dloss,
                            F aux_grad) {
  using namespace layers;
  const int C = cfg_.d_model;
  const int NH = cfg_.n_head;
  const int V = cfg_.vocab;
  const int N = B * T;
  const size_t NC = static_cast<size_t>(N) * C;
  const model_acts<F> a = carve_acts<F>(acts_.data(), cfg_, capacity_b_);
  grad_acts<F> g = carve_grads<F>(grad_acts_.data(), cfg_, capacity_b_);
  const F* p = params_.data();
  F* dp = grads_.data();
  const size_t lnf = table_.size() - 2;
  const F* last = cfg_.n_layer > 0 ? a.block(cfg_.n_layer - 1).res3 : a.encoded;

  std::fill(g.dlogits, g.dlogits + static_cast<size_t>(N) * V, F(0));
  std::fill(g.dlnf, g.dlnf + NC, F(0));
  std::fill(g.dres_out, g.dres_out + NC, F(0));
  softmax_crossentropy_backward(g.dlogits, a.logits, targets, dloss, N, V);
  linear_backward(g.dlnf, dp + table_[wte_index].offset, static_cast<F*>(nullptr), g.dlogits, a.lnf,
                  p + table_[wte_index].offset, N, C, V);
  layernorm_backward(g.dres_out, dp + table_[lnf].offset, dp + table_[lnf + 1].offset, g.dlnf, last,
                     p + table_[lnf].offset, a.lnf_mean, a.lnf_rstd, N, C);

  const bool moe = cfg_.experts > 0;
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    check_interrupt();
    const block_params<const F> w = block_view(p, table_, block_first_[l], moe);
    const block_params<F> dw = block_view(dp, table_, block_first_[l], moe);
    const block_acts<F> s = a.block(l);
    const F* residual = l > 0 ? a.block(l - 1).res3 : a.encoded;
    std::fill(g.dres_in, g.dres_in + NC, F(0));
    std::fill(g.local, g.local + g.local_size, F(0));

    residual_backward(g.dres2, g.dproj, g.dres_out, NC);
    if (moe) {
      moe_[l].backward(g.dln2, dw.router_w, dw.experts, g.dproj, s.ln2, w.router_w, w.experts,
                       aux_grad);
    } else {
      linear_backward(g.dfch_gelu, dw.fcproj_w, dw.fcproj_b, g.dproj, s.fch_gelu, w.fcproj_w, N,
                      4 * C, C);
      gelu_backward(g.dfch, s.fch, g.dfch_gelu, NC * 4);
      linear_backward(g.dln2, dw.fc_w, dw.fc_b, g.dfch, s.ln2, w.fc_w, N, C, 4 * C);
    }
    layernorm_backward(g.dres2, dw.ln2_w, dw.ln2_b, g.dln2, s.res2, w.ln2_w, s.ln2_mean, s.ln2_rstd,
                       N, C);
    std::fill(g.dproj, g.dproj + NC, F(0));
    residual_backward(g.dres_in, g.dproj, g.dres2, NC);
    linear_backward(g.datty, dw.proj_w, dw.proj_b, g.dproj, s.atty, w.proj_w, N, C, C);
    attention_backward(g.dqkv, g.scratch, g.datty, s.qkv, s.att, B, T, C, NH);
    linear_backward(g.dln1, dw.qkv_w, dw.qkv_b, g.dqkv, s.ln1, w.qkv_w, N, C, 3 * C);
    layernorm_backward(g.dres_in, dw.ln1_w, dw.ln1_b, g.dln1, residual, w.ln1_w, s.ln1_mean,
                       s.ln1_rstd, N, C);
    std::swap(g.dres_in, g.dres_out);
  }
  embedding_backward(dp + table_[wte_index].offset, dp + table_[wpe_index].offset, g.dres_out,
                     inputs, B, T, C);
}

template <typename F>
double basic_gpt<F>::forward_backward(const token_id* inputs, const token_id* targets, int B, int T,
                                      float grad_scale) {
  check_batch(B, T);
  reserve(B);
  const double loss = forward(inputs, targets, B, T);
  // d(mean)/d(loss_i) = 1/(B*T) for each token.
  // The aux loss enters the objective as aux_loss_coef * aux, scaled like the rest.
  backward(inputs, targets, B, T, static_cast<F>(static_cast<double>(grad_scale) / (B * T)),
           static_cast<F>(static_cast<double>(grad_scale) * cfg_.aux_loss_coef));
  return loss;
}

template <typename F>
double basic_gpt<F>::forward_loss(const token_id* inputs, const token_id* targets, int B, int T) {
  check_batch(B, T);
  reserve(B);
  return forward(inputs, targets, B, T);
}

template <typename F>
const F* basic_gpt<F>::last_probs() const {
  if (capacity_b_ == 0) return nullptr;
  // The forward pass leaves the probabilities where it computed the logits.
  return carve_acts<F>(const_cast<F*>(acts_.data()), cfg_, capacity_b_).logits;
}

template class basic_gpt<float>;
template class basic_gpt<double>;

size_t working_set_bytes(const model_config& cfg, int micro_batch) {
  std::vector<size_t> block_first, stream;
  const auto table = build_table(cfg, 0, 1, block_first, stream);
  const size_t params = table.back().offset + table.back().numel;
  const int B = std::max(1, micro_batch);
  const size_t floats = 4 * params + carve_acts<float>(nullptr, cfg, B).total +
                        carve_grads<float>(nullptr, cfg, B).total;
  return floats * sizeof(float);
}

}  // namespace troupe
