#pragma once
/// `cocemu tune`: for every CoC GEMM shape of a model's layer, models P = 1/2/4/8 and the fused
/// kernel (a dry run of each), picks the fastest per shape and writes it as MindSpeed's
/// `customized_coc` ("[m, k, n]" -> 1 off, 2/4/8 split, -1 fused), with the reason in words.
#include <string>
#include <vector>

#include "cocemu/bench/layer_bench.h"
#include "cocemu/train/report.h"

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
/// Every "[m, k, n]" key the layer's TP linears look up (forward and backward of each), sorted.
std::vector<std::string> layer_gemm_keys(const BenchConfig& config);
/// Models the candidates (dry run) and picks per shape; `base` supplies the other keys.
/// `values`: the customized_coc values tried besides 1 (off): 2/4/8 script splits, -1 fused
/// (e.g. {2, 4, 8} without the fused kernels).
TuneResult tune(BenchConfig config, const layers::CocConfig& base,
                const std::vector<int>& values = {2, 4, 8, -1});
/// A layer of `model` as the run of `setup` has it on one device: tokens per micro-batch copy on
/// one context-parallel rank (seq / cp × micro-batch / copies), its tp, sequence parallelism and
/// dtype, so tuned keys match that run's GEMMs.
BenchConfig bench_config_for_run(const TrainSetup& setup);
/// The config as YAML that `cocemu bench --coc-config` and load_coc_config accept, with the
/// explanations as comments.
std::string to_yaml(const TuneResult& result);

}  // namespace cocemu::bench
