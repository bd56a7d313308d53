// Model configs (R-BE-2): the shipped models load with their published shapes; parsing is strict.
#include <gtest/gtest.h>

#include "cocemu/layers/model_config.h"
#include "testing.h"

namespace cocemu::layers {
namespace {

TEST(ModelConfig, ShippedModelsLoadWithPublishedShapes) {
  const ModelConfig l70 = load_model_config("llama2-70b");
  EXPECT_EQ(l70.hidden_size, 8192);
  EXPECT_EQ(l70.num_query_groups, 8);
  EXPECT_EQ(l70.ffn_hidden_size, 28672);
  EXPECT_EQ(l70.num_layers, 80);
  EXPECT_EQ(load_model_config("llama2-7b").ffn_hidden_size, 11008);
  EXPECT_EQ(load_model_config("bloom-7b").num_layers, 30);
  EXPECT_EQ(load_model_config("bloom-176b").num_attention_heads, 112);
  const ModelConfig g = load_model_config("gpt3-175b");
  EXPECT_EQ(g.hidden_size, 12288);
  EXPECT_EQ(g.seq_length, 2048);
  EXPECT_TRUE(g.sequence_parallel);
  EXPECT_TRUE(l70.swiglu);
  EXPECT_FALSE(g.swiglu);
}

TEST(ModelConfig, StrictParsingAndShapeRules) {
  const std::string ok =
      "name: t\nhidden_size: 64\nnum_attention_heads: 8\nnum_query_groups: 2\n"
      "ffn_hidden_size: 256\nnum_layers: 2\nseq_length: 128\nmicro_batch_size: 1\n"
      "tensor_model_parallel_size: 2\nsequence_parallel: true\n";
  EXPECT_EQ(parse_model_config(ok, "ok.yaml").num_query_groups, 2);
  cocemu::testing::expect_error([&] { parse_model_config(ok + "dropout: 0.1\n", "u.yaml"); },
                                Errc::parse_error, {"u.yaml:", "unknown key 'dropout'"});
  std::string bad = ok;
  bad.replace(bad.find("num_query_groups: 2"), 19, "num_query_groups: 3");
  cocemu::testing::expect_error([&] { parse_model_config(bad, "g.yaml"); }, Errc::parse_error,
                                {"g.yaml", "num_attention_heads 8", "num_query_groups 3"});
  bad = ok;
  bad.replace(bad.find("tensor_model_parallel_size: 2"), 29, "tensor_model_parallel_size: 3");
  cocemu::testing::expect_error([&] { parse_model_config(bad, "t.yaml"); }, Errc::parse_error,
                                {"t.yaml", "tensor_model_parallel_size 3"});
  bad = ok;  // Megatron: the KV groups are split across TP ranks too
  bad.replace(bad.find("tensor_model_parallel_size: 2"), 29, "tensor_model_parallel_size: 4");
  cocemu::testing::expect_error([&] { parse_model_config(bad, "k.yaml"); }, Errc::parse_error,
                                {"k.yaml", "num_query_groups 2", "tensor_model_parallel_size 4"});
  cocemu::testing::expect_error([] { load_model_config("no-such-model"); }, Errc::invalid_argument,
                                {"no-such-model.yaml"});
}

}  // namespace
}  // namespace cocemu::layers
