// adjsh plan: the span plan of one gradient step (engine/span_plan.h), as JSON on stdout. The
// fleet simulator (bench/fleet/plan.py) reads it, so that the plan has one implementation.
//
// The JSON object (one span, chunk or task per line):
//   T, chunk, num_chunks, num_spans, layers, conv_kernel, forward_only, num_tasks
//     the plan's shape: chunk is the clamped chunk (SpanPlan::chunk), num_spans the spans it
//     made (--spans 0: SpanPlan::DefaultSpans)
//   phases   the phase names in SpanPhase order (SpanPhaseName)
//   spans    [{index, c0, c1, t0, len, halo, first_task}]: SpanPlan::range(s) (chunks
//            [c0, c1), tokens [t0, t0 + len), halo = min(W - 1, t0)); first_task is the
//            span's lowest task id, the task that starts the span from its tokens
//   chunks   [{index, t0, len, halo}]: SpanPlan::Chunk(c)
//   tasks    [{id, phase, layer, span, deps}] in id order (the order they are preferred in):
//            SpanPlan::task(id) and SpanPlan::Dependencies(id), the keys a --trace line has
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "common/config.h"
#include "common/file_io.h"
#include "common/mamba2_config.h"
#include "engine/span_plan.h"

namespace adjsh::cli {
namespace {

constexpr const char* kCmd = "plan";
// What this command prints at most: the chunk list, and the dependency lists (about K S^2
// entries in all, held twice in memory by SpanPlan: Dependencies and Successors).
constexpr int64_t kMaxChunks = int64_t{1} << 22;
constexpr int64_t kMaxDependencies = int64_t{1} << 25;

struct Shape {
  int64_t layers = 0, conv_kernel = 0;
};

// K and W from DIR/config.json (a Mamba or a Mamba-2 model).
absl::StatusOr<Shape> ShapeOfModel(const std::string& dir) {
  const std::string path = dir + "/config.json";
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  auto bad = [&path](const absl::Status& s) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  };
  absl::StatusOr<std::string> type = ModelTypeOf(*text);
  if (!type.ok()) return bad(type.status());
  if (*type == "mamba2") {
    absl::StatusOr<Mamba2Config> c = ParseMamba2ConfigJson(*text);
    if (!c.ok()) return bad(c.status());
    return Shape{c->num_hidden_layers, c->conv_kernel};
  }
  absl::StatusOr<MambaConfig> c = ParseConfigJson(*text);
  if (!c.ok()) return bad(c.status());
  return Shape{c->num_hidden_layers, c->conv_kernel};
}

std::string PlanJson(const SpanPlan& p, int64_t W) {
  std::string out = absl::StrFormat(
      "{\"T\": %d, \"chunk\": %d, \"num_chunks\": %d, \"num_spans\": %d, \"layers\": %d, "
      "\"conv_kernel\": %d, \"forward_only\": %s, \"num_tasks\": %d,\n",
      p.T(), p.chunk(), p.chunks(), p.spans(), p.layers(), W,
      p.forward_only() ? "true" : "false", p.num_tasks());
  absl::StrAppend(&out, "\"phases\": [");
  for (SpanPhase ph : {SpanPhase::kForwardSummary, SpanPhase::kForward,
                       SpanPhase::kBackwardSummary, SpanPhase::kBackward}) {
    absl::StrAppend(&out, ph == SpanPhase::kForwardSummary ? "" : ", ", "\"",
                    std::string(SpanPhaseName(ph)), "\"");
  }
  absl::StrAppend(&out, "],\n\"spans\": [\n");
  // A span's first task: the lowest id among its tasks (ids are the preference order).
  std::vector<int64_t> first(p.spans(), -1);
  for (int64_t id = p.num_tasks() - 1; id >= 0; --id) first[p.task(id).span] = id;
  for (int64_t s = 0; s < p.spans(); ++s) {
    const SpanRange& r = p.range(s);
    absl::StrAppendFormat(&out,
                          "{\"index\": %d, \"c0\": %d, \"c1\": %d, \"t0\": %d, \"len\": %d, "
                          "\"halo\": %d, \"first_task\": %d}%s\n",
                          s, r.c0, r.c1, r.t0, r.len, r.halo, first[s],
                          s + 1 < p.spans() ? "," : "");
  }
  absl::StrAppend(&out, "],\n\"chunks\": [\n");
  for (int64_t c = 0; c < p.chunks(); ++c) {
    const SpanRange r = p.Chunk(c);
    absl::StrAppendFormat(&out, "{\"index\": %d, \"t0\": %d, \"len\": %d, \"halo\": %d}%s\n", c,
                          r.t0, r.len, r.halo, c + 1 < p.chunks() ? "," : "");
  }
  absl::StrAppend(&out, "],\n\"tasks\": [\n");
  for (int64_t id = 0; id < p.num_tasks(); ++id) {
    const SpanTask& t = p.task(id);
    absl::StrAppendFormat(
        &out, "{\"id\": %d, \"phase\": \"%s\", \"layer\": %d, \"span\": %d, \"deps\": [%s]}%s\n",
        id, std::string(SpanPhaseName(t.phase)), t.layer, t.span,
        absl::StrJoin(p.Dependencies(id), ", "), id + 1 < p.num_tasks() ? "," : "");
  }
  absl::StrAppend(&out, "]}\n");
  return out;
}

}  // namespace

int PlanCommand(const std::vector<std::string>& args) {
  ArgParser a(kCmd,
              "Prints the span plan of one gradient step (engine/span_plan.h) as JSON on stdout:\n"
              "the spans' chunk and token ranges and conv halos, the chunks, and every (layer,\n"
              "span) task in id order with the tasks it depends on. The plan depends on the\n"
              "tokens T, the chunk, the spans S and the model's layers K and conv kernel W only.\n"
              "bench/fleet_sim.py simulates this plan; cli/plan_cmd.cc describes the JSON.");
  a.Add("context", "T", "tokens of the sequence (a step's context)", "", true);
  a.Add("chunk", "C", "tokens per chunk (clamped to T)", "256");
  a.Add("spans", "S",
        "spans of the sequence (0: the default, about T/16384, at least 8, at most one per "
        "chunk)",
        "0");
  a.Add("layers", "K", "the model's layers (or --model)");
  a.Add("conv-kernel", "W", "the model's conv kernel (default 4, or --model's)");
  a.Add("model", "DIR", "take K and W from this model directory's config.json (Mamba or Mamba-2)");
  a.AddBool("forward-only", "the forward's tasks alone (a step that wants the loss only)");
  if (auto code = ParseOrExit(a, args)) return *code;

  absl::StatusOr<int64_t> T = a.GetInt("context", 1, int64_t{1} << 40);
  if (!T.ok()) return BadUsage(kCmd, T.status());
  absl::StatusOr<int64_t> chunk = a.GetInt("chunk", 1, int64_t{1} << 40);
  if (!chunk.ok()) return BadUsage(kCmd, chunk.status());
  absl::StatusOr<int64_t> spans = a.GetInt("spans", 0, int64_t{1} << 30);
  if (!spans.ok()) return BadUsage(kCmd, spans.status());
  Shape shape;
  if (a.Has("model")) {
    if (a.Has("layers") || a.Has("conv-kernel")) {
      return BadUsage(kCmd, absl::InvalidArgumentError(
                                "--layers and --conv-kernel come from --model's config.json: give "
                                "either --model or them"));
    }
    absl::StatusOr<Shape> s = ShapeOfModel(a.Get("model"));
    if (!s.ok()) return Fail(kCmd, s.status());
    shape = *s;
  } else {
    if (!a.Has("layers")) {
      return BadUsage(kCmd, absl::InvalidArgumentError(
                                "missing required flag --layers (or --model DIR)"));
    }
    absl::StatusOr<int64_t> K = a.GetInt("layers", 1, 1024);
    if (!K.ok()) return BadUsage(kCmd, K.status());
    shape.layers = *K;
    shape.conv_kernel = 4;
    if (a.Has("conv-kernel")) {
      absl::StatusOr<int64_t> W = a.GetInt("conv-kernel", 1, 64);
      if (!W.ok()) return BadUsage(kCmd, W.status());
      shape.conv_kernel = *W;
    }
  }
  // What the plan would hold, before it is built.
  const int64_t C = std::min(*chunk, *T), nC = (*T + C - 1) / C;
  if (nC > kMaxChunks) {
    return BadUsage(kCmd, absl::InvalidArgumentError(absl::StrFormat(
                              "--context %d in chunks of %d makes %d chunks, more than this "
                              "command lists (%d): use a longer --chunk",
                              *T, C, nC, kMaxChunks)));
  }
  const int64_t S =
      *spans == 0 ? SpanPlan::DefaultSpans(*T, *chunk, shape.conv_kernel) : std::min(*spans, nC);
  if (shape.layers * S * S > kMaxDependencies) {
    return BadUsage(kCmd, absl::InvalidArgumentError(absl::StrFormat(
                              "--spans %d%s with %d layers: the plan would list about K S^2 = %d "
                              "dependencies, more than this command prints (%d): use fewer "
                              "spans",
                              S, *spans == 0 ? " (the default for this --context)" : "",
                              shape.layers, shape.layers * S * S, kMaxDependencies)));
  }
  absl::StatusOr<SpanPlan> plan = SpanPlan::Make(*T, *chunk, *spans, shape.layers,
                                                 shape.conv_kernel, a.GetBool("forward-only"));
  // A plan the shape cannot make (more spans than chunks, a span shorter than the conv halo)
  // is a bad flag: Make's message names --spans.
  if (!plan.ok()) return BadUsage(kCmd, plan.status());
  const std::string json = PlanJson(*plan, shape.conv_kernel);
  if (std::fwrite(json.data(), 1, json.size(), stdout) != json.size() || std::fflush(stdout) != 0) {
    return Fail(kCmd, absl::UnavailableError("cannot write the plan to stdout"));
  }
  return 0;
}

}  // namespace adjsh::cli
