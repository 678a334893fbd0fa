// The wire's task kinds (proto/adjsh.proto Task.Kind) and the span schedule's phases
// (engine/span_plan.h), one to one: the coordinator names a task's kind by its phase, the worker
// reads the phase back.
#ifndef ADJSH_PROTO_SPAN_KIND_H_
#define ADJSH_PROTO_SPAN_KIND_H_

#include <optional>

#include "engine/span_plan.h"
#include "proto/adjsh.pb.h"

namespace adjsh {

inline v1::Task::Kind KindOf(SpanPhase phase) {
  switch (phase) {
    case SpanPhase::kForwardSummary: return v1::Task::SPAN_FORWARD_SUMMARY;
    case SpanPhase::kForward: return v1::Task::SPAN_FORWARD;
    case SpanPhase::kBackwardSummary: return v1::Task::SPAN_BACKWARD_SUMMARY;
    case SpanPhase::kBackward: return v1::Task::SPAN_BACKWARD;
  }
  return v1::Task::KIND_UNSPECIFIED;
}

// nullopt for a kind that is no span task (KIND_UNSPECIFIED, or one this build does not know).
inline std::optional<SpanPhase> PhaseOf(v1::Task::Kind kind) {
  switch (kind) {
    case v1::Task::SPAN_FORWARD_SUMMARY: return SpanPhase::kForwardSummary;
    case v1::Task::SPAN_FORWARD: return SpanPhase::kForward;
    case v1::Task::SPAN_BACKWARD_SUMMARY: return SpanPhase::kBackwardSummary;
    case v1::Task::SPAN_BACKWARD: return SpanPhase::kBackward;
    default: return std::nullopt;
  }
}

}  // namespace adjsh

#endif  // ADJSH_PROTO_SPAN_KIND_H_
