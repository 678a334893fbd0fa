// One gradient's result, for either model type: the loss, dloss/dparam in the model's own
// parameter struct (ModelParams for Mamba-1, Mamba2Params for Mamba-2), and what the step cost.
#ifndef ADJSH_ENGINE_GRAD_RESULT_H_
#define ADJSH_ENGINE_GRAD_RESULT_H_

#include <cstdint>
#include <vector>

#include "common/model.h"
#include "engine/step_profile.h"

namespace adjsh {

template <typename T, template <typename> class Params = ModelParams>
struct GradResult {
  double loss = 0;
  Params<T> grad;
  int64_t stored_bytes = 0;  // layer inputs, adjoint buffers and chunk states held at the peak
  int64_t targets = 0;       // next-token targets counted in the loss
  // With a loss mask: how many counted targets have the largest logit (greedy decoding is
  // right); -1 without one.
  int64_t correct = -1;
  // The span schedule's cost, task by task (tasks = 0 for the other schedules).
  StepProfile profile;
  std::vector<TaskRecord> records;  // per task id, when the runner keeps them
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_GRAD_RESULT_H_
