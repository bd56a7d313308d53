#pragma once
/// `cocemu tune`: for every CoC GEMM shape of a model's layer, models P = 1/2/4/8 and the fused
/// kernel (a dry run of each), picks the fastest per shape and writes it as MindSpeed's
/// `customized_coc` ("[m, k, n]" -> 1 off, 2/4/8 split, -1 fused), with the reason in words.
#include <string>
#include <vector>

#include "cocemu/bench/layer_bench.h"

namespace cocemu::bench {

struct TuneChoice {
  std::string key;                    ///< "[m, k, n]" as MindSpeed's get_parallel_num counts it
  std::vector<std::string> segments;  ///< the layer's segments with this shape
  int value = 1;                      ///< customized_coc value
  std::vector<std::pair<std::string, double>> modeled;  ///< candidate -> modeled ns (summed)
  std::string reason;
};

struct TuneResult {
  BenchConfig config;
  layers::CocConfig coc;  ///< the tuned config (customized_coc filled)
  std::vector<TuneChoice> choices;
};

/// The "[m, k, n]" key each CoC segment's op looks up (m: tokens, gathered under SP).
std::string segment_key(const BenchConfig& config, const std::string& segment);
/// Models the candidates (dry run) and picks per shape; `base` supplies the other keys.
TuneResult tune(BenchConfig config, const layers::CocConfig& base);
/// The config as YAML that `cocemu bench --coc-config` and load_coc_config accept, with the
/// explanations as comments.
std::string to_yaml(const TuneResult& result);

}  // namespace cocemu::bench
