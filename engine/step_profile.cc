#include "engine/step_profile.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/span_plan.h"

namespace adjsh {

StepProfile ProfileStep(const SpanPlan& plan, const std::vector<TaskRecord>& records,
                        uint64_t wire_bytes, double wall_seconds) {
  StepProfile p;
  p.tasks = plan.num_tasks();
  p.spans = plan.spans();
  p.tokens = plan.T();
  p.wire_bytes = wire_bytes;
  p.wall_seconds = wall_seconds;
  // Ids are a topological order (every dependency has a lower id).
  std::vector<double> finish(plan.num_tasks(), 0.0);
  for (int64_t id = 0; id < plan.num_tasks() && id < static_cast<int64_t>(records.size()); ++id) {
    const double t = records[id].compute_s + records[id].rebuild_s;
    double ready = 0;
    for (int64_t d : plan.Dependencies(id)) ready = std::max(ready, finish[d]);
    finish[id] = ready + t;
    p.task_seconds += t;
    p.critical_path_seconds = std::max(p.critical_path_seconds, finish[id]);
    p.rebuilt_spans += records[id].rebuild_s > 0 ? 1 : 0;
    p.device += records[id].device;
  }
  p.parallelism = p.critical_path_seconds > 0 ? p.task_seconds / p.critical_path_seconds : 0;
  return p;
}

namespace {

// A task's device traffic as trace fields (none on the CPU).
std::string DeviceFields(const DeviceTraffic& d) {
  if (d.empty()) return "";
  return absl::StrFormat(
      ", \"h2d_bytes\": %d, \"d2h_bytes\": %d, \"h2d_copies\": %d, \"d2h_copies\": %d, "
      "\"syncs\": %d, \"allocations\": %d",
      d.h2d_bytes, d.d2h_bytes, d.h2d_copies, d.d2h_copies, d.syncs, d.allocations);
}

}  // namespace

std::string TraceLine(const SpanPlan& plan, int64_t step, int64_t id, const TaskRecord& r) {
  const SpanTask& t = plan.task(id);
  return absl::StrFormat(
      "{\"step\": %d, \"id\": %d, \"phase\": \"%s\", \"layer\": %d, \"span\": %d, \"deps\": [%s], "
      "\"start_s\": %.6f, \"end_s\": %.6f, \"compute_s\": %.6f, \"rebuild_s\": %.6f, "
      "\"worker\": \"%s\", \"bytes_in\": %d, \"bytes_out\": %d, \"T\": %d, \"spans\": %d%s}",
      step, id, std::string(SpanPhaseName(t.phase)), t.layer, t.span,
      absl::StrJoin(plan.Dependencies(id), ", "), r.start_s, r.end_s, r.compute_s, r.rebuild_s,
      r.worker, r.bytes_in, r.bytes_out, plan.T(), plan.spans(), DeviceFields(r.device));
}

absl::Status AppendTrace(const std::string& path, const SpanPlan& plan, int64_t step,
                         const std::vector<TaskRecord>& records) {
  std::ofstream f(path, std::ios::app);
  for (int64_t id = 0; id < plan.num_tasks() && id < static_cast<int64_t>(records.size()); ++id)
    f << TraceLine(plan, step, id, records[id]) << "\n";
  f.flush();
  if (!f) return absl::InternalError(absl::StrCat("cannot append the trace to ", path));
  return absl::OkStatus();
}

std::string ProfileSummary(const StepProfile& p) {
  return absl::StrFormat(
      "%d tasks on %d spans | %.2f s of tasks, critical path %.2f s, parallelism %.1f | wire "
      "%.1f MB%s%s%s%s",
      p.tasks, p.spans, p.task_seconds, p.critical_path_seconds, p.parallelism,
      static_cast<double>(p.wire_bytes) / 1e6,
      p.tree_workers > 0 ? absl::StrCat(" | tree of ", p.tree_workers) : "",
      p.rebuilt_spans > 0 ? absl::StrCat(" | ", p.rebuilt_spans, " span rebuilds") : "",
      p.restarts > 0 ? absl::StrCat(" | ", p.restarts, " restarts") : "",
      p.device.empty() ? ""
                       : absl::StrFormat(" | device %.1f MB in, %.1f MB out, %d syncs",
                                         static_cast<double>(p.device.h2d_bytes) / 1e6,
                                         static_cast<double>(p.device.d2h_bytes) / 1e6,
                                         p.device.syncs));
}

}  // namespace adjsh
