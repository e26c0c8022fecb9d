#include "strategies/tensor_parallel/tp_gpt.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "runtime/model/layers.hpp"

namespace troupe::tensor_parallel {
namespace {

/// One block's tensors, in the order block_view and block_offsets_ use.
constexpr std::array<const char*, 12> block_tensor_names = {
    "ln_1.weight",      "ln_1.bias",      "attn.qkv.weight", "attn.qkv.bias",
    "attn.proj.weight", "attn.proj.bias", "ln_2.weight",     "ln_2.bias",
    "mlp.fc.weight",    "mlp.fc.bias",    "mlp.proj.weight", "mlp.proj.bias"};

/// Columns of a tensor viewed as 2-D ([1, n] for a vector).
int64_t cols_of(const std::vector<int64_t>& shape) { return shape.empty() ? 1 : shape.back(); }

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

/// Copies every box of `s` from a local flat buffer into a full one (to_full) or back.
void copy_boxes(const shard_tensor& s, const float* src, float* dst, bool to_full) {
  const int64_t local_cols = cols_of(s.local.shape);
  const int64_t full_cols = cols_of(s.full_shape);
  for (const shard_box& b : s.boxes) {
    for (int64_t i = 0; i < b.rows; ++i) {
      const size_t l = s.local.offset + b.local_offset + static_cast<size_t>(i * local_cols);
      const size_t f = s.full_offset + static_cast<size_t>((b.row + i) * full_cols + b.col);
      const auto bytes = sizeof(float) * static_cast<size_t>(b.cols);
      if (to_full) {
        std::memcpy(dst + f, src + l, bytes);
      } else {
        std::memcpy(dst + l, src + f, bytes);
      }
    }
  }
}

}  // namespace

/// Pointers to one block's parameters (or gradients) in the local flat buffer.
struct tp_gpt::block_view {
  float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
  float *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
};

tp_gpt::tp_gpt(const model_config& cfg, comm::communicator& tp_comm, comm::op_options opts,
               stage_span span)
    : cfg_(cfg), span_(span), group_{&tp_comm, opts, nullptr} {
  const int t = tp_comm.size();
  const int r = tp_comm.rank();
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument("tp_gpt: " + why + " (tp group '" + tp_comm.identity().group +
                                "' of size " + std::to_string(t) + ")");
  };
  if (cfg.experts != 0) {
    fail("mixture-of-experts MLPs (experts = " + std::to_string(cfg.experts) +
         ") are not tensor-parallel; use expert parallelism for them");
  }
  // The single-rank model validates the shape and is the one source of the full layout.
  std::vector<param_tensor> full_table;
  {
    const gpt reference(cfg);
    full_table = reference.param_table();
    full_numel_ = reference.num_params();
  }
  if (t < 1 || r < 0 || r >= t) fail("bad tp rank " + std::to_string(r));
  if (span_.last_layer < 0) span_.last_layer = cfg.n_layer;
  if (span_.first_layer < 0 || span_.first_layer > span_.last_layer ||
      span_.last_layer > cfg.n_layer || (span_.embedding && span_.first_layer != 0) ||
      (span_.head && span_.last_layer != cfg.n_layer)) {
    fail("bad stage span: layers [" + std::to_string(span_.first_layer) + ", " +
         std::to_string(span_.last_layer) + ") of " + std::to_string(cfg.n_layer) +
         (span_.embedding ? " with the embedding" : "") + (span_.head ? " with the head" : ""));
  }
  if (cfg.n_head % t != 0) {
    fail("n_head (" + std::to_string(cfg.n_head) +
         ") must be divisible by the tp size, so that "
         "every rank owns whole attention heads");
  }
  if (cfg.vocab % t != 0) {
    fail("vocab (" + std::to_string(cfg.vocab) +
         ") must be divisible by the tp size for the "
         "vocabulary-parallel embedding and head");
  }
  const int C = cfg.d_model;
  C_l_ = C / t;  // n_head divides d_model and t divides n_head, so t divides C and 4C
  NH_l_ = cfg.n_head / t;
  F_l_ = 4 * C / t;
  V_l_ = cfg.vocab / t;
  vocab_start_ = r * V_l_;

  // Sizes as int64_t, so the offsets below are computed without int overflow.
  const auto Cz = static_cast<int64_t>(C);
  const int64_t Cl = C_l_, Fl = F_l_, Vl = V_l_, rz = r;
  // Which tensors this pipeline stage holds.
  auto in_stage = [&](const std::string& n) {
    if (n == "wte.weight") return span_.embedding || span_.head;
    if (n == "wpe.weight") return span_.embedding;
    if (n.starts_with("ln_f.")) return span_.head;
    const int l = std::stoi(n.substr(2));  // "h.<l>."
    return l >= span_.first_layer && l < span_.last_layer;
  };
  size_t offset = 0;
  for (const param_tensor& full : full_table) {
    if (!in_stage(full.name)) continue;
    shard_tensor s;
    s.full_shape = full.shape;
    s.full_offset = full.offset;
    s.local.name = full.name;
    s.local.decay = full.decay;
    const std::string& n = full.name;
    auto expect = [&](const std::vector<int64_t>& shape) {
      if (full.shape != shape) {
        throw std::logic_error("tp_gpt: the single-rank tensor '" + n +
                               "' has an unexpected shape; tp_gpt's slicing needs updating");
      }
    };
    auto row_slice = [&](int64_t first, int64_t count, int64_t cols, size_t at) {
      s.boxes.push_back({first, 0, count, cols, at});
    };
    auto col_slice = [&](int64_t rows, int64_t first, int64_t count, size_t at) {
      s.boxes.push_back({0, first, rows, count, at});
    };
    if (n == "wte.weight") {
      expect({cfg.vocab, Cz});
      s.local.shape = {Vl, Cz};
      row_slice(rz * Vl, Vl, Cz, 0);
    } else if (n.ends_with(".attn.qkv.weight")) {
      expect({3 * Cz, Cz});
      s.local.shape = {3 * Cl, Cz};
      for (int64_t k = 0; k < 3; ++k) row_slice(k * Cz + rz * Cl, Cl, Cz, size_t(k * Cl * Cz));
    } else if (n.ends_with(".attn.qkv.bias")) {
      expect({3 * Cz});
      s.local.shape = {3 * Cl};
      for (int64_t k = 0; k < 3; ++k) col_slice(1, k * Cz + rz * Cl, Cl, size_t(k * Cl));
    } else if (n.ends_with(".attn.proj.weight")) {
      expect({Cz, Cz});
      s.local.shape = {Cz, Cl};
      col_slice(Cz, rz * Cl, Cl, 0);
    } else if (n.ends_with(".mlp.fc.weight")) {
      expect({4 * Cz, Cz});
      s.local.shape = {Fl, Cz};
      row_slice(rz * Fl, Fl, Cz, 0);
    } else if (n.ends_with(".mlp.fc.bias")) {
      expect({4 * Cz});
      s.local.shape = {Fl};
      col_slice(1, rz * Fl, Fl, 0);
    } else if (n.ends_with(".mlp.proj.weight")) {
      expect({Cz, 4 * Cz});
      s.local.shape = {Cz, Fl};
      col_slice(Cz, rz * Fl, Fl, 0);
    } else {
      // wpe, LayerNorms and the row-parallel biases: every rank holds all of it.
      s.replicated = true;
      s.local.shape = full.shape;
      const int64_t cols = cols_of(full.shape);
      row_slice(0, numel_of(full.shape) / cols, cols, 0);
    }
    s.local.numel = static_cast<size_t>(numel_of(s.local.shape));
    s.local.offset = offset;
    offset += s.local.numel;
    shards_.push_back(s);
    table_.push_back(s.local);
  }

  // Locate the tensors the passes use by name, so the order of the full table is free.
  std::unordered_map<std::string, size_t> at;
  for (const param_tensor& p : table_) at[p.name] = p.offset;
  auto find = [&](const std::string& name) {
    const auto it = at.find(name);
    if (it == at.end()) throw std::logic_error("tp_gpt: the single-rank model has no " + name);
    return it->second;
  };
  size_t known = 0;
  has_wte_ = span_.embedding || span_.head;
  has_wpe_ = span_.embedding;
  if (has_wte_) wte_ = find("wte.weight"), ++known;
  if (has_wpe_) wpe_ = find("wpe.weight"), ++known;
  if (span_.head) {
    lnf_w_ = find("ln_f.weight");
    lnf_b_ = find("ln_f.bias");
    known += 2;
  }
  for (int l = span_.first_layer; l < span_.last_layer; ++l) {
    std::array<size_t, 12> offsets{};
    for (size_t k = 0; k < offsets.size(); ++k) {
      offsets[k] = find("h." + std::to_string(l) + "." + block_tensor_names[k]);
    }
    block_offsets_.push_back(offsets);
    known += offsets.size();
  }
  if (known != table_.size()) {
    throw std::logic_error("tp_gpt: the single-rank model has tensors tp_gpt does not shard");
  }
  params_.assign(offset, 0.0f);
  grads_.assign(offset, 0.0f);
}

size_t tp_gpt::wte_offset() const {
  if (!has_wte_) throw std::logic_error("tp_gpt: this stage holds no wte");
  return wte_;
}

size_t tp_gpt::wte_numel() const {
  if (!has_wte_) throw std::logic_error("tp_gpt: this stage holds no wte");
  return static_cast<size_t>(V_l_) * static_cast<size_t>(cfg_.d_model);
}

bool tp_gpt::counts_in_norm(size_t i) const {
  const shard_tensor& s = shards_.at(i);
  if (holds_tied_copy() && s.local.name == "wte.weight") return false;
  return !s.replicated || tp_rank() == 0;
}

tp_gpt::block_view tp_gpt::block(float* base, int l) const {
  const std::array<size_t, 12>& o = block_offsets_[static_cast<size_t>(l)];
  return {base + o[0], base + o[1], base + o[2], base + o[3], base + o[4],  base + o[5],
          base + o[6], base + o[7], base + o[8], base + o[9], base + o[10], base + o[11]};
}

void tp_gpt::set_tp_comm(comm::communicator& tp_comm) {
  if (tp_comm.rank() != tp_rank() || tp_comm.size() != tp_size()) {
    throw std::invalid_argument(
        "tp_gpt: a shard of tp rank " + std::to_string(tp_rank()) + " of " +
        std::to_string(tp_size()) + " cannot move to a communicator of rank " +
        std::to_string(tp_comm.rank()) + " of " + std::to_string(tp_comm.size()));
  }
  group_.comm = &tp_comm;
}

void tp_gpt::init_params(uint64_t seed) {
  gpt full(cfg_);
  full.init_params(seed);
  load_from_full(full.params());
}

void tp_gpt::zero_grads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

void tp_gpt::swap_grads(std::vector<float>& other) {
  if (other.size() != grads_.size())
    throw std::invalid_argument("tp_gpt::swap_grads: a buffer of " + std::to_string(other.size()) +
                                " values for a shard of " + std::to_string(grads_.size()));
  grads_.swap(other);
}

void tp_gpt::load_from_full(const float* full) {
  for (const shard_tensor& s : shards_) {
    copy_boxes(s, full, params_.data(), false);
  }
}

void tp_gpt::gather_full(const float* local, float* full) {
  std::fill(full, full + full_numel_, 0.0f);
  for (const shard_tensor& s : shards_) {
    // Replicated tensors come from rank 0 alone, so the sum below does not count them t times;
    // the tied copy of wte is the first stage's to give.
    if (s.replicated && tp_rank() != 0) continue;
    if (holds_tied_copy() && s.local.name == "wte.weight") continue;
    copy_boxes(s, local, full, true);
  }
  // The boxes of the ranks are disjoint: each value is itself plus zeros, so the sum is exact.
  reduce_from_tensor_parallel_region(group_, full, full_numel_);
}

double tp_gpt::global_grad_norm() {
  double sharded = 0;
  double replicated = 0;
  for (const shard_tensor& s : shards_) {
    if (holds_tied_copy() && s.local.name == "wte.weight") continue;
    const float* g = grads_.data() + s.local.offset;
    double sum = 0;
    for (size_t i = 0; i < s.local.numel; ++i) sum += static_cast<double>(g[i]) * g[i];
    (s.replicated ? replicated : sharded) += sum;
  }
  // The data plane reduces floats; a double survives as a float pair (hi, lo) in this rank's
  // own slot of a zeroed [t, 2] buffer. The sum moves each pair exactly, and every rank then
  // adds the t pairs in rank order in double: the same norm, to double precision, everywhere.
  const int t = tp_size();
  std::vector<float> slots(2 * static_cast<size_t>(t), 0.0f);
  const auto hi = static_cast<float>(sharded);
  slots[2 * static_cast<size_t>(tp_rank())] = hi;
  slots[2 * static_cast<size_t>(tp_rank()) + 1] = static_cast<float>(sharded - hi);
  reduce_from_tensor_parallel_region(group_, slots.data(), slots.size());
  double total = replicated;
  for (float v : slots) total += static_cast<double>(v);
  return std::sqrt(total);
}

void tp_gpt::check_batch(int B, int T) const {
  if (B < 1 || T < 1 || T > cfg_.context) {
    throw std::invalid_argument("tp_gpt: a micro-batch needs B >= 1 and 1 <= T <= context (" +
                                std::to_string(cfg_.context) + "), got B=" + std::to_string(B) +
                                " T=" + std::to_string(T));
  }
}

void tp_gpt::reserve_slots(int B, int slots) {
  check_batch(B, 1);
  if (slots < 1) throw std::invalid_argument("tp_gpt: a stage needs at least one activation slot");
  if (B <= capacity_b_ && static_cast<size_t>(slots) <= slots_.size()) return;
  B = std::max(B, capacity_b_);
  slots = std::max(slots, static_cast<int>(slots_.size()));
  const size_t N = static_cast<size_t>(B) * cfg_.context;
  const size_t C = cfg_.d_model;
  const size_t Cl = C_l_, Fl = F_l_, Vl = V_l_;
  const size_t att = static_cast<size_t>(B) * NH_l_ * cfg_.context * cfg_.context;
  slots_.assign(static_cast<size_t>(slots), {});
  for (slot_acts& slot : slots_) {
    slot.encoded.assign(N * C, 0);
    slot.layers.assign(static_cast<size_t>(layers()), {});
    for (layer_acts& a : slot.layers) {
      a.ln1.assign(N * C, 0);
      a.ln1_mean.assign(N, 0);
      a.ln1_rstd.assign(N, 0);
      a.qkv.assign(N * 3 * Cl, 0);
      a.att.assign(att, 0);
      a.atty.assign(N * Cl, 0);
      a.res2.assign(N * C, 0);
      a.ln2.assign(N * C, 0);
      a.ln2_mean.assign(N, 0);
      a.ln2_rstd.assign(N, 0);
      a.fch.assign(N * Fl, 0);
      a.fch_gelu.assign(N * Fl, 0);
      a.res3.assign(N * C, 0);
    }
    if (span_.head) {
      slot.lnf.assign(N * C, 0);
      slot.lnf_mean.assign(N, 0);
      slot.lnf_rstd.assign(N, 0);
      slot.logits.assign(N * Vl, 0);
    }
  }
  for (auto* v : {&proj_, &dres_out_, &dres_in_, &dres2_, &dproj_, &dln2_, &dln1_, &dlnf_})
    v->assign(N * C, 0);
  dlogits_.assign(span_.head ? N * Vl : 0, 0);
  ce_work_.assign(cross_entropy_workspace(static_cast<int>(N), tp_size()), 0);
  dfch_gelu_.assign(N * Fl, 0);
  dfch_.assign(N * Fl, 0);
  datty_.assign(N * Cl, 0);
  dqkv_.assign(N * 3 * Cl, 0);
  scratch_.assign(static_cast<size_t>(cfg_.context) * cfg_.context, 0);
  capacity_b_ = B;
}

float* tp_gpt::stage_input(int slot) { return slots_.at(static_cast<size_t>(slot)).encoded.data(); }

const float* tp_gpt::stage_output(int slot) const {
  const slot_acts& a = slots_.at(static_cast<size_t>(slot));
  return a.layers.empty() ? a.encoded.data() : a.layers.back().res3.data();
}

double tp_gpt::forward_stage(int slot, const token_id* inputs, const token_id* targets, int B,
                             int T) {
  using namespace layers;
  check_batch(B, T);
  if (B > capacity_b_ || slot < 0 || static_cast<size_t>(slot) >= slots_.size())
    throw std::invalid_argument("tp_gpt: forward_stage needs reserve_slots first (slot " +
                                std::to_string(slot) + ", B " + std::to_string(B) + ")");
  const int C = cfg_.d_model;
  const int N = B * T;
  const size_t NC = static_cast<size_t>(N) * C;
  float* p = params_.data();
  slot_acts& acts = slots_[static_cast<size_t>(slot)];

  if (span_.embedding) {
    vocab_parallel_embedding_forward(group_, acts.encoded.data(), inputs, p + wte_, vocab_start_,
                                     V_l_, p + wpe_, B, T, C);
  }
  const float* residual = acts.encoded.data();
  for (int l = 0; l < layers(); ++l) {
    const block_view w = block(p, l);
    layer_acts& s = acts.layers[static_cast<size_t>(l)];
    layernorm_forward(s.ln1.data(), s.ln1_mean.data(), s.ln1_rstd.data(), residual, w.ln1_w,
                      w.ln1_b, N, C);
    column_parallel_linear_forward(s.qkv.data(), s.ln1.data(), w.qkv_w, w.qkv_b, N, C, 3 * C_l_);
    attention_forward(s.atty.data(), s.att.data(), s.qkv.data(), B, T, C_l_, NH_l_);
    row_parallel_linear_forward(group_, proj_.data(), s.atty.data(), w.proj_w, w.proj_b, N, C_l_,
                                C);
    residual_forward(s.res2.data(), residual, proj_.data(), NC);
    layernorm_forward(s.ln2.data(), s.ln2_mean.data(), s.ln2_rstd.data(), s.res2.data(), w.ln2_w,
                      w.ln2_b, N, C);
    column_parallel_linear_forward(s.fch.data(), s.ln2.data(), w.fc_w, w.fc_b, N, C, F_l_);
    gelu_forward(s.fch_gelu.data(), s.fch.data(), static_cast<size_t>(N) * F_l_);
    row_parallel_linear_forward(group_, proj_.data(), s.fch_gelu.data(), w.fcproj_w, w.fcproj_b, N,
                                F_l_, C);
    residual_forward(s.res3.data(), s.res2.data(), proj_.data(), NC);
    residual = s.res3.data();
  }
  if (!span_.head) return 0.0;
  layernorm_forward(acts.lnf.data(), acts.lnf_mean.data(), acts.lnf_rstd.data(), residual,
                    p + lnf_w_, p + lnf_b_, N, C);
  // The tied head is column-parallel over the vocabulary: logits_l = lnf * wte_l^T.
  column_parallel_linear_forward(acts.logits.data(), acts.lnf.data(), p + wte_, nullptr, N, C,
                                 V_l_);
  return vocab_parallel_cross_entropy_forward(group_, acts.logits.data(), acts.logits.data(),
                                              targets, N, vocab_start_, V_l_, ce_work_.data()) /
         N;
}

void tp_gpt::backward_stage(int slot, const token_id* inputs, const token_id* targets, int B, int T,
                            float grad_scale) {
  using namespace layers;
  const int C = cfg_.d_model;
  const int N = B * T;
  const size_t NC = static_cast<size_t>(N) * C;
  float* p = params_.data();
  float* dp = grads_.data();
  const slot_acts& acts = slots_.at(static_cast<size_t>(slot));
  auto zero = [](std::vector<float>& v, size_t n) { std::fill_n(v.data(), n, 0.0f); };

  if (span_.head) {
    const auto dloss =
        static_cast<float>(static_cast<double>(grad_scale) / (static_cast<double>(B) * T));
    const float* last = acts.layers.empty() ? acts.encoded.data() : acts.layers.back().res3.data();
    zero(dlogits_, static_cast<size_t>(N) * V_l_);
    zero(dres_out_, NC);
    vocab_parallel_cross_entropy_backward(dlogits_.data(), acts.logits.data(), targets, dloss, N,
                                          vocab_start_, V_l_);
    column_parallel_linear_backward(group_, dlnf_.data(), dp + wte_, nullptr, dlogits_.data(),
                                    acts.lnf.data(), p + wte_, N, C, V_l_);
    layernorm_backward(dres_out_.data(), dp + lnf_w_, dp + lnf_b_, dlnf_.data(), last, p + lnf_w_,
                       acts.lnf_mean.data(), acts.lnf_rstd.data(), N, C);
  }
  // Otherwise dres_out_ holds the gradient the next stage sent (output_grad()).

  for (int l = layers() - 1; l >= 0; --l) {
    const block_view w = block(p, l);
    const block_view dw = block(dp, l);
    const layer_acts& s = acts.layers[static_cast<size_t>(l)];
    const float* residual =
        l > 0 ? acts.layers[static_cast<size_t>(l) - 1].res3.data() : acts.encoded.data();
    const size_t NF = static_cast<size_t>(N) * F_l_;
    zero(dres_in_, NC);
    zero(dres2_, NC);
    zero(dproj_, NC);
    zero(dfch_gelu_, NF);
    zero(dfch_, NF);
    zero(datty_, static_cast<size_t>(N) * C_l_);
    zero(dqkv_, static_cast<size_t>(N) * 3 * C_l_);

    residual_backward(dres2_.data(), dproj_.data(), dres_out_.data(), NC);
    row_parallel_linear_backward(dfch_gelu_.data(), dw.fcproj_w, dw.fcproj_b, dproj_.data(),
                                 s.fch_gelu.data(), w.fcproj_w, N, F_l_, C);
    gelu_backward(dfch_.data(), s.fch.data(), dfch_gelu_.data(), NF);
    column_parallel_linear_backward(group_, dln2_.data(), dw.fc_w, dw.fc_b, dfch_.data(),
                                    s.ln2.data(), w.fc_w, N, C, F_l_);
    layernorm_backward(dres2_.data(), dw.ln2_w, dw.ln2_b, dln2_.data(), s.res2.data(), w.ln2_w,
                       s.ln2_mean.data(), s.ln2_rstd.data(), N, C);
    zero(dproj_, NC);
    residual_backward(dres_in_.data(), dproj_.data(), dres2_.data(), NC);
    row_parallel_linear_backward(datty_.data(), dw.proj_w, dw.proj_b, dproj_.data(), s.atty.data(),
                                 w.proj_w, N, C_l_, C);
    attention_backward(dqkv_.data(), scratch_.data(), datty_.data(), s.qkv.data(), s.att.data(), B,
                       T, C_l_, NH_l_);
    column_parallel_linear_backward(group_, dln1_.data(), dw.qkv_w, dw.qkv_b, dqkv_.data(),
                                    s.ln1.data(), w.qkv_w, N, C, 3 * C_l_);
    layernorm_backward(dres_in_.data(), dw.ln1_w, dw.ln1_b, dln1_.data(), residual, w.ln1_w,
                       s.ln1_mean.data(), s.ln1_rstd.data(), N, C);
    std::swap(dres_in_, dres_out_);
  }
  if (span_.embedding) {
    vocab_parallel_embedding_backward(dp + wte_, dp + wpe_, dres_out_.data(), inputs, vocab_start_,
                                      V_l_, B, T, C);
  }
  // Otherwise dres_out_ now holds the gradient of this stage's input (input_grad()).
}

double tp_gpt::forward_backward(const token_id* inputs, const token_id* targets, int B, int T,
                                float grad_scale) {
  check_whole_model();
  check_batch(B, T);
  reserve(B);
  const double loss = forward_stage(0, inputs, targets, B, T);
  backward_stage(0, inputs, targets, B, T, grad_scale);
  return loss;
}

double tp_gpt::forward_loss(const token_id* inputs, const token_id* targets, int B, int T) {
  check_whole_model();
  check_batch(B, T);
  reserve(B);
  return forward_stage(0, inputs, targets, B, T);
}

void tp_gpt::check_whole_model() const {
  if (!span_.embedding || !span_.head)
    throw std::logic_error(
        "tp_gpt: forward_backward and forward_loss need the whole model; a pipeline stage runs "
        "forward_stage and backward_stage");
}

}  // namespace troupe::tensor_parallel
