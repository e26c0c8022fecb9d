#pragma once
// `troupe ckpt export`: a committed checkpoint of the built-in GPT as a GPT-2 state dict
// (the names and shapes of HuggingFace's GPT2LMHeadModel), written as safetensors or as the
// file torch.save writes. Whatever layout wrote the checkpoint (dp, ZeRO-1, tp, pp), the
// tensors are the single-rank model's: they are read through the restore path
// (ckpt::restore_into), every chunk checked against its hash.
//
// The mapping, exact for troupe's GPT (runtime/model/gpt.hpp: pre-LayerNorm blocks with
// eps 1e-5, q|k|v fused in that order with head h in columns h*hs..(h+1)*hs of each, the
// tanh GELU ("gelu_new"), biases on every Linear, the head tied to wte):
//
//   wte.weight [V,C]                 transformer.wte.weight [V,C]; and lm_head.weight [V,C]
//   wpe.weight [T,C]                 transformer.wpe.weight [T,C]
//   h.i.ln_1.{weight,bias}           transformer.h.i.ln_1.{weight,bias}         (and ln_2)
//   h.i.attn.qkv.weight [3C,C]       transformer.h.i.attn.c_attn.weight [C,3C]  transposed
//   h.i.attn.proj.weight [C,C]       transformer.h.i.attn.c_proj.weight [C,C]   transposed
//   h.i.mlp.fc.weight [4C,C]         transformer.h.i.mlp.c_fc.weight [C,4C]     transposed
//   h.i.mlp.proj.weight [C,4C]       transformer.h.i.mlp.c_proj.weight [4C,C]   transposed
//   biases, ln_f                     the same values under the GPT-2 name
//
// Weights are in GPT-2's Conv1D orientation ([in, out], y = x W + b), so the names mean what
// they mean in GPT-2 checkpoints and the file loads into GPT2LMHeadModel as well as into
// examples/python/gpt2.py. A model with parts GPT-2 has no names for (MoE experts) is refused.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/export/tensor_file.hpp"

namespace troupe::cli::ckpt_tool {

/// Runs `troupe ckpt export ARGS...` (ARGS after "export") and returns 0. Throws usage_error
/// (exit 2: bad options, a step that has no checkpoint, a model GPT-2 cannot hold) and
/// tool_error or checkpoint_error (exit 1: no intact checkpoint, a damaged one asked for by
/// --step, the disk refusing).
int export_checkpoint(const std::vector<std::string>& args);

/// The shape of the built-in GPT a checkpoint holds, read from its tensors (vocabulary,
/// width, context, layers) and its config (heads).
struct gpt_shape {
  int64_t vocab = 0;
  int64_t d_model = 0;
  int64_t context = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
};

/// The GPT-2 tensors of a checkpoint's parameters, owning their values.
struct gpt2_state {
  gpt_shape shape;
  std::vector<std::vector<float>> values;  ///< what file's spans point into
  ckpt::tensor_file file;                  ///< GPT2LMHeadModel.state_dict() order
};

/// The model `m` holds, or a usage_error saying why GPT-2 cannot hold it (another kind of
/// checkpoint, MoE experts, a tensor of no known place).
gpt_shape gpt_shape_of(const ckpt::manifest& m);

/// Maps `params` (the single-rank flat parameters of `m`) to GPT-2's names and orientation.
gpt2_state to_gpt2(const ckpt::manifest& m, const gpt_shape& shape, std::span<const float> params);

}  // namespace troupe::cli::ckpt_tool
