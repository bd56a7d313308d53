#include "cocemu/train/pipeline.h"

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

P2PMode p2p_mode(const TrainLayout& l) {
  switch (l.schedule) {
    case PipelineSchedule::one_f_one_b:
      return P2PMode::blocking_1f1b;
    case PipelineSchedule::interleaved:
      return l.overlap_p2p_comm ? P2PMode::overlapped : P2PMode::blocking_interleaved;
    case PipelineSchedule::gpipe:
      break;
  }
  return P2PMode::overlapped;
}

const char* to_string(P2PMode m) {
  switch (m) {
    case P2PMode::overlapped:
      return "overlapped";
    case P2PMode::blocking_1f1b:
      return "blocking (1F1B)";
    case P2PMode::blocking_interleaved:
      return "blocking (interleaved)";
  }
  return "?";
}

void PipelineStep::Passes::push_back(const PipelineAction& a) {
  COCEMU_CHECK(n_ < a_.size(), Errc::internal, "a p2p call with more than {} sends or receives",
               a_.size());
  a_[n_++] = a;
}

bool receives_input(const PipelineAction& a, int pp, int vpp, int stage) {
  return a.forward ? !(stage == 0 && a.chunk == 0) : !(stage == pp - 1 && a.chunk == vpp - 1);
}

bool sends_output(const PipelineAction& a, int pp, int vpp, int stage) {
  return a.forward ? !(stage == pp - 1 && a.chunk == vpp - 1) : !(stage == 0 && a.chunk == 0);
}

std::vector<PipelineStep> pipeline_steps(PipelineSchedule schedule, P2PMode mode, int pp, int vpp,
                                         int m, int stage) {
  std::vector<PipelineStep> out;
  pipeline_steps(pipeline_actions(schedule, pp, vpp, m, stage), schedule, mode, pp, vpp, stage,
                 out);
  return out;
}

void pipeline_steps(const std::vector<PipelineAction>& actions, PipelineSchedule schedule,
                    P2PMode mode, int pp, int vpp, int stage, std::vector<PipelineStep>& out) {
  COCEMU_CHECK_ARG(mode != P2PMode::blocking_1f1b || schedule == PipelineSchedule::one_f_one_b,
                   "pipeline_steps: blocking 1F1B p2p needs the 1f1b schedule, not {}",
                   to_string(schedule));
  COCEMU_CHECK_ARG(
      mode != P2PMode::blocking_interleaved || schedule == PipelineSchedule::interleaved,
      "pipeline_steps: blocking interleaved p2p needs the interleaved schedule, not {}",
      to_string(schedule));
  out.clear();
  const auto n = actions.size();
  // One p2p call: the sends of `sent` that leave this stage, the receives of `next` that come in.
  auto call = [&](std::initializer_list<const PipelineAction*> sent,
                  std::initializer_list<const PipelineAction*> next, bool blocking) {
    PipelineStep x{.kind = PipelineStep::exchange, .blocking = blocking};
    for (const auto* a : sent)
      if (a && sends_output(*a, pp, vpp, stage)) x.sends.push_back(*a);
    for (const auto* a : next)
      if (a && receives_input(*a, pp, vpp, stage)) x.recvs.push_back(*a);
    if (!x.sends.empty() || !x.recvs.empty()) out.push_back(std::move(x));
  };
  auto compute = [&](const PipelineAction& a) {
    out.push_back({.kind = PipelineStep::compute, .action = a});
  };
  switch (mode) {
    case P2PMode::overlapped:
      // A pass's send and the next pass's receive in one call: the send is not waited for.
      call({}, {&actions[0]}, false);
      for (std::size_t i = 0; i < n; ++i) {
        compute(actions[i]);
        call({&actions[i]}, {i + 1 < n ? &actions[i + 1] : nullptr}, false);
      }
      break;
    case P2PMode::blocking_1f1b:
      // Megatron's forward_backward_pipelining_without_interleaving: a pass's send and the next
      // pass's receive are one call when the direction changes (send_forward_recv_backward,
      // send_backward_recv_forward), two calls otherwise (send_forward then recv_forward in the
      // warm-up, send_backward then recv_backward in the cool-down).
      call({}, {&actions[0]}, true);
      for (std::size_t i = 0; i < n; ++i) {
        compute(actions[i]);
        const PipelineAction* next = i + 1 < n ? &actions[i + 1] : nullptr;
        if (next && next->forward != actions[i].forward) {
          call({&actions[i]}, {next}, true);
        } else {
          call({&actions[i]}, {}, true);
          call({}, {next}, true);
        }
      }
      break;
    case P2PMode::blocking_interleaved: {
      // Megatron's forward_backward_pipelining_with_interleaving without overlap_p2p_comm.
      // The actions start with the warm-up forwards and the first steady forward (or every
      // forward when all are warm-up).
      const std::size_t total = n / 2;
      std::size_t lead = 0;
      while (lead < n && actions[lead].forward)
        ++lead;
      const bool all_warmup = lead == total;
      const std::size_t warmup = all_warmup ? total : lead - 1;
      const std::size_t steady = total - warmup;
      // The i-th forward and backward passes in order.
      thread_local std::vector<const PipelineAction*> fwd, bwd;
      fwd.clear();
      bwd.clear();
      for (const auto& a : actions)
        (a.forward ? fwd : bwd).push_back(&a);
      auto f = [&](std::size_t k) { return k < fwd.size() ? fwd[k] : nullptr; };
      auto b = [&](std::size_t k) { return k < bwd.size() ? bwd[k] : nullptr; };
      call({}, {f(0)}, true);
      for (std::size_t k = 0; k < warmup; ++k) {
        compute(*f(k));
        if (k + 1 == warmup && !all_warmup)
          call({f(k)}, {f(k + 1), b(0)}, true);  // send_forward_backward_recv_forward_backward
        else
          call({f(k)}, {f(k + 1)}, true);  // send_forward_recv_forward
      }
      for (std::size_t k = 0; k < steady; ++k) {
        compute(*f(warmup + k));
        compute(*b(k));
        call({f(warmup + k), b(k)}, {k + 1 < steady ? f(warmup + k + 1) : nullptr, b(k + 1)}, true);
      }
      if (all_warmup) call({}, {b(0)}, true);  // recv_backward
      for (std::size_t k = steady; k < total; ++k) {
        compute(*b(k));
        call({b(k)}, {b(k + 1)}, true);  // send_backward_recv_backward
      }
      break;
    }
  }
}

double ideal_bubble_fraction(int pp, int vpp, int m) {
  return double(pp - 1) / double(vpp * m + pp - 1);
}

std::string action_label(const PipelineAction& a, int vpp) {
  return vpp > 1 ? fmt::format("{}{}.{}", a.forward ? 'F' : 'B', a.micro_batch, a.chunk)
                 : fmt::format("{}{}", a.forward ? 'F' : 'B', a.micro_batch);
}

}  // namespace cocemu::layers::train
