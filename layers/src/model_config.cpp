#include "cocemu/layers/model_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cocemu/runtime/detail/yaml_reader.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/input_file.h"
#include "cocemu/runtime/names.h"
#include "cocemu/runtime/profile.h"

namespace cocemu::layers {

ModelConfig parse_model_config(const std::string& text, const std::string& origin) {
  auto top = detail::YamlReader::parse(text, origin, "model config");
  ModelConfig m;
  m.source = origin;
  m.name = top.string("name");
  m.hidden_size = top.integer("hidden_size", 1, 1 << 20);
  m.num_attention_heads = top.integer("num_attention_heads", 1, 1 << 14);
  m.num_query_groups = top.integer("num_query_groups", 1, 1 << 14);
  m.ffn_hidden_size = top.integer("ffn_hidden_size", 1, 1 << 22);
  m.num_layers = top.integer("num_layers", 1, 1 << 12);
  m.seq_length = top.integer("seq_length", 1, 1 << 24);
  m.micro_batch_size = top.integer("micro_batch_size", 1, 1 << 16);
  m.tensor_model_parallel_size = int(top.integer("tensor_model_parallel_size", 1, 64));
  m.sequence_parallel = top.boolean("sequence_parallel");
  m.swiglu = top.boolean_or("swiglu", false);
  if (top.has("vocab_size")) m.vocab_size = top.integer("vocab_size", 1, 1 << 24);
  const std::string attention = top.string_or("attention", "flash");
  COCEMU_CHECK(attention == "flash" || attention == "unfused", Errc::parse_error,
               "{}: attention '{}'; allowed flash, unfused", top.where(), attention);
  m.flash_attention = attention == "flash";
  m.masked_softmax_fusion = top.boolean_or("masked_softmax_fusion", true);
  COCEMU_CHECK(m.masked_softmax_fusion || !m.flash_attention, Errc::parse_error,
               "{}: masked_softmax_fusion: false needs attention: unfused (flash attention has no "
               "separate softmax)",
               top.where());
  top.finish();
  const int tp = m.tensor_model_parallel_size;
  COCEMU_CHECK(m.hidden_size % m.num_attention_heads == 0, Errc::parse_error,
               "{}: hidden_size {} must be divisible by num_attention_heads {}", top.where(),
               m.hidden_size, m.num_attention_heads);
  COCEMU_CHECK(m.num_attention_heads % m.num_query_groups == 0, Errc::parse_error,
               "{}: num_attention_heads {} must be divisible by num_query_groups {}", top.where(),
               m.num_attention_heads, m.num_query_groups);
  COCEMU_CHECK(m.num_attention_heads % tp == 0 && m.num_query_groups % tp == 0 &&
                   m.ffn_hidden_size % tp == 0,
               Errc::parse_error,
               "{}: num_attention_heads {}, num_query_groups {} and ffn_hidden_size {} must be "
               "divisible by tensor_model_parallel_size {}",
               top.where(), m.num_attention_heads, m.num_query_groups, m.ffn_hidden_size, tp);
  COCEMU_CHECK(!m.sequence_parallel || (m.seq_length * m.micro_batch_size) % tp == 0,
               Errc::parse_error,
               "{}: with sequence_parallel, seq_length × micro_batch_size = {} must be divisible "
               "by tensor_model_parallel_size {}",
               top.where(), m.seq_length * m.micro_batch_size, tp);
  return m;
}

ModelConfig load_model_config(const std::string& name) {
  const bool is_path = is_config_path(name);
  const std::string dir = config_dir() + "/models";
  const std::string path = is_path ? name : dir + "/" + name + ".yaml";
  {
    std::error_code ec;
    COCEMU_CHECK_ARG(is_path || std::filesystem::exists(path, ec), "unknown model '{}' (no {}); {}",
                     name, path, valid_names_hint(name, yaml_names_in(dir), dir));
  }
  return parse_model_config(read_input_file(path, "model config"), path);
}

}  // namespace cocemu::layers
