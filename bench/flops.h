// GEMM floating-point operations of one gradient, per token, for the flop-rate figures in
// docs/BENCHMARKS.md. "model" counts what a keep-everything backprop needs (forward, and two
// GEMMs per projection backward); "executed" counts what the adjoint engine runs, including its
// recomputation (the recompute inside each VJP task; with the two-pass schedule also forward
// pass one and backward pass one; with S spans the summaries of S - 1 spans in each direction,
// engine/span_plan.h), less the recompute a summary's kept activations spare the pass after it
// (kernels/cpu/kept_pool.h: with all of them kept, the spans execute the wavefront's flops), and
// less the recompute a forward's activations carried to the layer's backward spare
// (kernels/cpu/mamba_block.h Carries).
#ifndef ADJSH_BENCH_FLOPS_H_
#define ADJSH_BENCH_FLOPS_H_

#include "common/config.h"

namespace adjsh::bench {

struct FlopsPerToken {
  double model = 0, executed = 0;
};

// pass_one_share: the share of the tokens whose chunks also run the pass-one (summary) tasks
// (each way: the first chunk or span has no forward summary, the last no adjoint summary): 0 for
// the wavefront, (C - 1) / C for two-pass over C chunks, (S - 1) / S for S equal spans.
// kept_share: the share of those chunks whose summaries kept their activations for the pass
// after them (spans only; an AdjointSummary that took a carried set counts as one that kept).
// carried_share: the share of all rows, every layer, whose chunk's forward set a backward pass
// took (AdjointSummary or, in a span with none, the VJP task): each spares that pass one
// recompute.
inline FlopsPerToken GradientFlopsPerToken(const MambaConfig& c, bool exact,
                                           double pass_one_share, double kept_share = 0,
                                           double carried_share = 0) {
  const double D = c.hidden_size, Di = c.inner(), R = c.time_step_rank, V = c.vocab_size;
  const double Q = R + 2 * c.state_size, K = c.num_hidden_layers;  // Q: x_proj rows
  const double recompute = 2 * D * 2 * Di + 2 * Di * Q + 2 * R * Di;  // in_proj, x_proj, dt_proj
  const double out = 2 * Di * D;
  const double forward = recompute + out;
  const double backward = 2 * forward;  // dW and dinput for every projection
  const double head = 3 * 2 * V * D;    // logits, dE, dnf
  FlopsPerToken f;
  f.model = K * (forward + backward) + head;
  // Pass one: F1 (recompute but z), A (recompute + g W_out, exact only); then F2 (forward) and
  // the VJP task (recompute + the backward GEMMs, of which g W_out = dL/do is out_proj's dinput:
  // kernels/cpu/mamba_block.cc computes it once per task). tests/kernels/gemm_flops_test.cc
  // checks this count against the GEMMs a gradient runs, per schedule.
  const double f1 = recompute - 2 * D * Di;  // the forward summary skips in_proj's gate half
  const double pass_one = pass_one_share * (f1 + (exact ? recompute + out : 0));
  // A kept forward set spares F2 all of F1; a kept backward set, the VJP task's recompute and
  // g W_out: each pass-one term once more, so kept ones cost nothing extra.
  f.executed = K * (forward + (1 - kept_share) * pass_one + (1 - carried_share) * recompute +
                    backward) +
               head;
  return f;
}

}  // namespace adjsh::bench

#endif  // ADJSH_BENCH_FLOPS_H_
