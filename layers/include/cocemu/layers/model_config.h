#pragma once
/// Model shapes for modeling full-size layers: `configs/models/<name>.yaml` (Megatron's argument
/// names), parsed strictly; the shape rules Megatron enforces are clear errors with file:line.
#include <cstdint>
#include <string>

namespace cocemu::layers {

struct ModelConfig {
  std::string name, source;
  std::int64_t hidden_size = 0, num_attention_heads = 0, num_query_groups = 0;
  std::int64_t ffn_hidden_size = 0, num_layers = 0, seq_length = 0, micro_batch_size = 1;
  int tensor_model_parallel_size = 1;
  bool sequence_parallel = false;
  bool swiglu = false;          ///< Megatron's --swiglu (LLaMA): MLP-up yields gate and up halves
  std::int64_t vocab_size = 0;  ///< tokenizer vocabulary (before Megatron's padding); 0: not given
  /// `attention: flash` (default) or `unfused` (Megatron's core attention over the scores in
  /// memory, as runs without --use-flash-attn); `masked_softmax_fusion: false` is
  /// --no-masked-softmax-fusion (unfused only).
  bool flash_attention = true;
  bool masked_softmax_fusion = true;
};

ModelConfig parse_model_config(const std::string& yaml_text, const std::string& origin);
/// A path, or a name under `configs/models/`.
ModelConfig load_model_config(const std::string& name_or_path);

}  // namespace cocemu::layers
