#pragma once
// A plain single-rank f64 implementation of the training step (the decoder, cross-entropy,
// backward and Adam written out in loops over the full, unsharded weights), the reference the
// emulated step is compared with across tp, dp and pp (R-TR-8).
#include <map>
#include <string>
#include <vector>

#include "cocemu/train/trainer.h"

namespace cocemu::layers::train::reference {

struct Result {
  std::vector<double> loss;  ///< per iteration, mean over the global batch's tokens
  /// Per iteration, the norm of the gradient Adam steps with (copies × the mean's, multi-copy).
  std::vector<double> grad_norm;
  /// The updated weights cut into the shards the emulated step reports for `tp`
  /// ("layer0.attn.qkv tp1" …), f64.
  std::map<std::string, Tensor> shards;
};

/// Trains o.iterations iterations on the global batch of o.layout (its micro-batch size and
/// global batch size; tp only decides the vocabulary padding and how the result is cut).
Result train_reference(const TrainOptions& o);

}  // namespace cocemu::layers::train::reference
