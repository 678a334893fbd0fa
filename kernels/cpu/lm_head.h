// The tied LM head and the next-token cross-entropy for a block of rows, without T x V logits:
// a call holds (M, V) logits for its M rows only.
//   nf = rmsnorm(u; w_f)   (M, D);   logits = nf E^T   (M, V);
//   loss_t = logsumexp(logits_t) - logits_t[target_t]
// Rows whose target is negative (the sequence's last token) contribute no loss.
#ifndef ADJSH_KERNELS_CPU_LM_HEAD_H_
#define ADJSH_KERNELS_CPU_LM_HEAD_H_

#include <cstdint>

namespace adjsh::cpu {

template <typename T>
struct LmHeadArgs {
  int64_t M = 0, D = 0, V = 0;
  double eps = 1e-5;
  const T* E = nullptr;            // (V, D) embedding = LM head
  const T* w_f = nullptr;          // (D) final norm weight
  const T* u = nullptr;            // (M, D) last layer output u^{K+1}
  const int64_t* targets = nullptr;  // (M) next token ids, or -1
  T scale = 1;                     // dL/dloss_t: 1 / (number of loss terms)
  // Non-null: incremented for each row with a target whose logit is the largest (greedy
  // decoding is right; a tie counts as right).
  int64_t* correct = nullptr;
};

// Returns the sum of the rows' losses (unscaled, accumulated in double). Writes du (M, D) =
// dL/du, dlogits (M, V) and nf (M, D) for the caller's dE += dlogits^T nf (done in a fixed order
// across blocks), and accumulates dw_f (D).
template <typename T>
double LmHeadForwardBackward(const LmHeadArgs<T>& args, T* du, T* dlogits, T* nf, T* dw_f);

// The forward alone (evaluation): returns the sum of the rows' losses as LmHeadForwardBackward
// does, with the same sums in the same order; logits (M, V) and nf (M, D) are scratch.
template <typename T>
double LmHeadLoss(const LmHeadArgs<T>& args, T* logits, T* nf);

}  // namespace adjsh::cpu

#endif  // ADJSH_KERNELS_CPU_LM_HEAD_H_
