#include "cocemu/layers/train/pipeline.h"

#include <fmt/format.h>

#include <algorithm>

#include "cocemu/runtime/error.h"

namespace cocemu::layers::train {

namespace {

/// Megatron's interleaved numbering: unit k of a stage's forwards (or backwards, chunks in
/// reverse) belongs to micro-batch group k / (pp·vpp) and to chunk (k mod pp·vpp) / pp.
PipelineAction interleaved_unit(int k, int pp, int vpp, bool forward) {
  const int in_group = k % (pp * vpp);
  const int chunk = in_group / pp;
  return {forward, (k / (pp * vpp)) * pp + in_group % pp, forward ? chunk : vpp - 1 - chunk};
}

}  // namespace

std::vector<PipelineAction> pipeline_actions(PipelineSchedule schedule, int pp, int vpp, int m,
                                             int stage) {
  COCEMU_CHECK_ARG(pp >= 1 && stage >= 0 && stage < pp && m >= 1 && vpp >= 1,
                   "pipeline_actions: stage {} of {} stages, {} micro-batches, {} chunks", stage,
                   pp, m, vpp);
  COCEMU_CHECK_ARG(vpp == 1 || schedule == PipelineSchedule::interleaved,
                   "pipeline_actions: {} chunks per stage need the interleaved schedule, not {}",
                   vpp, to_string(schedule));
  std::vector<PipelineAction> out;
  out.reserve(std::size_t(2 * m * vpp));
  switch (schedule) {
    case PipelineSchedule::gpipe:
      for (int i = 0; i < m; ++i)
        out.push_back({true, i, 0});
      for (int i = 0; i < m; ++i)
        out.push_back({false, i, 0});
      break;
    case PipelineSchedule::one_f_one_b: {
      const int warmup = std::min(pp - stage - 1, m);
      for (int i = 0; i < warmup; ++i)
        out.push_back({true, i, 0});
      for (int i = 0; i < m - warmup; ++i) {
        out.push_back({true, warmup + i, 0});
        out.push_back({false, i, 0});
      }
      for (int i = m - warmup; i < m; ++i)
        out.push_back({false, i, 0});
      break;
    }
    case PipelineSchedule::interleaved: {
      COCEMU_CHECK_ARG(m % pp == 0,
                       "the interleaved schedule needs the micro-batch count ({}) to be a "
                       "multiple of the pipeline stages ({}), as Megatron asserts",
                       m, pp);
      const int total = m * vpp;
      const int warmup = m == pp ? total : std::min((pp - stage - 1) * 2 + (vpp - 1) * pp, total);
      for (int k = 0; k < warmup; ++k)
        out.push_back(interleaved_unit(k, pp, vpp, true));
      for (int k = 0; k < total - warmup; ++k) {
        out.push_back(interleaved_unit(warmup + k, pp, vpp, true));
        out.push_back(interleaved_unit(k, pp, vpp, false));
      }
      for (int k = total - warmup; k < total; ++k)
        out.push_back(interleaved_unit(k, pp, vpp, false));
      break;
    }
  }
  return out;
}

double ideal_bubble_fraction(int pp, int vpp, int m) {
  return double(pp - 1) / double(vpp * m + pp - 1);
}

std::string action_label(const PipelineAction& a, int vpp) {
  return vpp > 1 ? fmt::format("{}{}.{}", a.forward ? 'F' : 'B', a.micro_batch, a.chunk)
                 : fmt::format("{}{}", a.forward ? 'F' : 'B', a.micro_batch);
}

}  // namespace cocemu::layers::train
