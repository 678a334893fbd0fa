// What one span-scheduled step cost, task by task (engine/span_plan.h): the records a
// coordinator (or the in-process engine) keeps, the step's summary, and the trace line of each
// task that bench/fleet_sim.py replays.
//   task_seconds           sum over tasks of their compute time (a rebuild counts with its task)
//   critical_path_seconds  the longest chain of dependent tasks, by the same times
//   parallelism            task_seconds / critical_path_seconds: how many workers the step's
//                          dependencies could keep busy at best
#ifndef ADJSH_ENGINE_STEP_PROFILE_H_
#define ADJSH_ENGINE_STEP_PROFILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/device_memory.h"

namespace adjsh {

class SpanPlan;

struct TaskRecord {
  double start_s = 0, end_s = 0;        // handed out, result accepted (seconds into the step)
  double compute_s = 0, rebuild_s = 0;  // the worker's time on the task, and on rebuilding first
  std::string worker;                   // who ran it
  uint64_t bytes_in = 0, bytes_out = 0;  // tensor bytes fetched and pushed for it
  DeviceTraffic device;  // what its compute moved to and from its device (zero on the CPU)
};

struct StepProfile {
  int64_t tasks = 0, spans = 0, rebuilt_spans = 0, tokens = 0;  // tokens: T
  double task_seconds = 0, critical_path_seconds = 0, parallelism = 0, wall_seconds = 0;
  uint64_t wire_bytes = 0;  // every tensor byte in and out of the coordinator during the step
  int64_t tree_workers = 0;  // workers of the worker tree that reduced it; 0: the coordinator
  int64_t restarts = 0;      // times it began again after losing a worker of its tree
  DeviceTraffic device;      // the tasks' device traffic, summed
};

// records: one per task id of plan.
StepProfile ProfileStep(const SpanPlan& plan, const std::vector<TaskRecord>& records,
                        uint64_t wire_bytes, double wall_seconds);

// One JSON object (no newline): {"step", "id", "phase", "layer", "span", "deps", "start_s",
// "end_s", "compute_s", "rebuild_s", "worker", "bytes_in", "bytes_out", "T", "spans"}, and with
// device traffic "h2d_bytes", "d2h_bytes", "h2d_copies", "d2h_copies", "syncs", "allocations".
std::string TraceLine(const SpanPlan& plan, int64_t step, int64_t id, const TaskRecord& r);

// Appends TraceLine of every task (records: one per task id of plan) to the file at path, one
// per line. INTERNAL naming the path when it cannot be written.
absl::Status AppendTrace(const std::string& path, const SpanPlan& plan, int64_t step,
                         const std::vector<TaskRecord>& records);

// "tasks 480 | 3.10 s of tasks, critical path 0.41 s, parallelism 7.6 | wire 1.2 MB", and with
// device traffic "| device 12.0 MB in, 3.1 MB out, 960 syncs": for progress lines.
std::string ProfileSummary(const StepProfile& p);

}  // namespace adjsh

#endif  // ADJSH_ENGINE_STEP_PROFILE_H_
