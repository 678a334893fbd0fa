// A trainer's gradient source for the resume tests of both model types: in-process, as the
// default one (FamilyOf<P>::Gradient), until its n-th call, which fails UNAVAILABLE as a
// lost worker does: a run killed during that step.
#ifndef ADJSH_TESTS_TRAIN_LOST_WORKER_H_
#define ADJSH_TESTS_TRAIN_LOST_WORKER_H_

#include <memory>
#include <span>
#include <vector>

#include "engine/families/families.h"
#include "train/trainer.h"

namespace adjsh::train {

template <typename P>
GradientSourceFor<P> LostOnCall(int n) {
  auto calls = std::make_shared<int>(0);
  return [calls, n](const P& p, std::span<const GradPiece> pieces)
             -> absl::StatusOr<std::vector<typename FamilyOf<P>::Grad>> {
    if (++*calls == n) return absl::UnavailableError("worker lost");
    std::vector<typename FamilyOf<P>::Grad> out;
    for (const GradPiece& piece : pieces) out.push_back(FamilyOf<P>::Gradient(p, piece).value());
    return out;
  };
}

}  // namespace adjsh::train

#endif  // ADJSH_TESTS_TRAIN_LOST_WORKER_H_
