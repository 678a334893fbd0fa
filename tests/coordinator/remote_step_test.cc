// The exact backward run as remote tasks: a coordinator (GradientStep + TaskQueue) hands the
// (layer, chunk) tasks of one gradient to simulated workers that receive their inputs as
// tensors (f32 bytes, as on the wire), build their own blocks from the parameters, and return
// their outputs as tensors; some workers abandon tasks (the lease expires and the task is
// handed out again) and some results arrive twice. The gradient must be bitwise the
// in-process one, for any number of workers.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "common/tensor.h"
#include "coordinator/task_queue.h"
#include "engine/gradient_step.h"
#include "tests/kernels/test_util.h"

namespace adjsh {
namespace {

using coordinator::TaskQueue;

MambaConfig Config() {
  MambaConfig c;
  c.hidden_size = 16, c.num_hidden_layers = 3, c.state_size = 8, c.time_step_rank = 2;
  c.vocab_size = 37;
  return c;
}

// Through raw bytes and back, as a tensor message would carry it (bf16: as the coordinator
// sends values it stores as bf16).
std::vector<float> Wire(const std::vector<float>& v, DType dtype = DType::kF32) {
  const HostTensor t = HostTensor::From<float>(v, {static_cast<int64_t>(v.size())}, dtype);
  return t.To<float>().value();
}

struct Options {
  int workers = 1;
  double abandon = 0;    // probability that a worker drops a leased task (never reports)
  double duplicate = 0;  // probability that a worker reports a result twice
};

GradResult<float> RemoteGradient(const ModelParams<float>& params,
                                 const std::vector<uint32_t>& tokens, const GradOptions& opt,
                                 const Options& o, int64_t* expired) {
  GradientStep<float> step(params, tokens, opt);
  step.ForwardAndHead();
  // Real time, with leases far longer than a task (milliseconds): only abandoned leases expire.
  TaskQueue queue;
  for (int64_t t = 0; t < step.num_backward_tasks(); ++t)
    EXPECT_TRUE(queue.AddTask(t, "", step.BackwardDependencies(t)).ok());
  std::mutex mu;  // the coordinator's state: inputs are gathered and results applied under it
  std::vector<std::thread> workers;
  for (int w = 0; w < o.workers; ++w) {
    workers.emplace_back([&, w] {
      std::mt19937 rng(1234 + w);
      std::uniform_real_distribution<double> coin(0, 1);
      const std::string name = "worker-" + std::to_string(w);
      for (;;) {
        BackwardTaskInputs<float> in;
        int64_t task = 0, lease = 0;
        {
          std::lock_guard<std::mutex> lock(mu);
          auto leased = queue.Lease(name, absl::Milliseconds(300));
          ASSERT_TRUE(leased.ok());
          if (leased->finished) return;
          if (leased->task) {
            task = leased->task->task_id, lease = leased->task->lease_id;
            step.GatherInputs(task, in);
          }
        }
        if (in.u.empty()) {  // nothing ready yet
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
        if (coin(rng) < o.abandon) continue;  // the worker "dies" holding the lease
        // The worker side: its own block from the parameters, inputs off the wire.
        const DType stored = opt.storage == Storage::kBF16 ? DType::kBF16 : DType::kF32;
        in.u = Wire(in.u, stored), in.g = Wire(in.g), in.h0 = Wire(in.h0, stored);
        in.mu = Wire(in.mu);
        const cpu::MambaBlockCpu<float> block(params.config, params.layers[in.layer]);
        BackwardTaskOutputs<float> out;
        RunBackwardTask(block, params.config, in, out);
        out.du = Wire(out.du), out.du_halo = Wire(out.du_halo), out.mu_out = Wire(out.mu_out);
        const int sends = coin(rng) < o.duplicate ? 2 : 1;
        for (int s = 0; s < sends; ++s) {
          std::lock_guard<std::mutex> lock(mu);
          const absl::Status accepted = queue.Complete(task, lease);
          if (accepted.ok()) step.ApplyResult(task, out);  // exactly once per task
        }
      }
    });
  }
  for (auto& t : workers) t.join();
  *expired = queue.Stats().leases_expired_total;
  return step.Finish();
}

::testing::AssertionResult SameBits(const GradResult<float>& a, const GradResult<float>& b) {
  if (a.loss != b.loss) return ::testing::AssertionFailure() << "loss differs";
  return testing::BitwiseEqual(a.grad, b.grad);
}

TEST(RemoteStepTest, BitwiseEqualToInProcessForAnyWorkerCountAndFaults) {
  const ModelParams<float> params = InitParams<float>(Config(), 8);
  std::mt19937 rng(3);
  std::vector<uint32_t> tokens(333);
  for (auto& t : tokens) t = rng() % 37;
  GradOptions opt;
  opt.chunk = 32;  // 11 chunks x 3 layers = 33 tasks
  opt.threads = 2;
  const GradResult<float> local = ComputeGradient<float>(params, tokens, opt).value();
  for (const Options& o : {Options{1}, Options{2}, Options{4}, Options{4, 0.2, 0.3}}) {
    int64_t expired = 0;
    const GradResult<float> remote = RemoteGradient(params, tokens, opt, o, &expired);
    EXPECT_TRUE(SameBits(local, remote)) << o.workers << " workers, abandon " << o.abandon;
    if (o.abandon > 0) {
      EXPECT_GT(expired, 0);
    }
  }
}

// Layer inputs and states stored as bf16 and sent as bf16: still bitwise the in-process result.
TEST(RemoteStepTest, Bf16StorageIsBitwiseEqualToInProcess) {
  const ModelParams<float> params = InitParams<float>(Config(), 9);
  std::mt19937 rng(5);
  std::vector<uint32_t> tokens(300);
  for (auto& t : tokens) t = rng() % 37;
  GradOptions opt;
  opt.chunk = 32;
  opt.threads = 2;
  opt.storage = Storage::kBF16;
  const GradResult<float> local = ComputeGradient<float>(params, tokens, opt).value();
  for (const Options& o : {Options{1}, Options{3, 0.2, 0.3}}) {
    int64_t expired = 0;
    EXPECT_TRUE(SameBits(local, RemoteGradient(params, tokens, opt, o, &expired)))
        << o.workers << " workers";
  }
}

}  // namespace
}  // namespace adjsh
