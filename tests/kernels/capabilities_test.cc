// The capability table (engine/capabilities.h): what each model type takes in-process and on
// workers, refusals that name the option (as a flag, or as a job spec's field) and the reason,
// and the rules that tie two options together.
#include "engine/capabilities.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace adjsh {
namespace {

// Whether text occurs in s's message (printed when it does not).
::testing::AssertionResult Says(const absl::Status& s, const std::string& text) {
  if (std::string(s.message()).find(text) != std::string::npos)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << s.message() << "' does not say '" << text << "'";
}

// One option set on default GradOptions, its flag and its spec field.
struct OptionCase {
  const char* flag;
  const char* field;
  void (*set)(RunRequest&);
  bool built[2][2];  // [model: Mamba, Mamba-2][runner: in-process, workers]
};

const std::vector<OptionCase>& Cases() {
  static const std::vector<OptionCase> cases = {
      {"--dtype f64", "dtype f64", [](RunRequest& r) { r.f64 = true; },
       {{true, false}, {true, false}}},
      {"--window", "window", [](RunRequest& r) { r.options.window = 64; },
       {{true, false}, {false, false}}},
      {"--cotangent top-of-stack", "cotangent top-of-stack",
       [](RunRequest& r) { r.options.cotangent = Cotangent::kTopOfStack; },
       {{true, false}, {false, false}}},
      {"--schedule wavefront", "schedule wavefront",
       [](RunRequest& r) { r.options.schedule = Schedule::kWavefront; },
       {{true, false}, {false, false}}},
      {"--schedule two-pass", "schedule two-pass",
       [](RunRequest& r) { r.options.schedule = Schedule::kTwoPass; },
       {{true, false}, {false, false}}},
      {"--doc-starts", "doc_starts", [](RunRequest& r) { r.doc_starts = true; },
       {{true, false}, {false, false}}},
      {"forward-only span steps", "forward_only",
       [](RunRequest& r) { r.options.forward_only = true; }, {{true, true}, {false, true}}},
  };
  return cases;
}

TEST(CapabilitiesTest, EveryOptionIsBuiltWhereTheTableSaysAndRefusedByNameElsewhere) {
  for (const OptionCase& c : Cases()) {
    for (int model = 0; model < 2; ++model) {
      for (int runner = 0; runner < 2; ++runner) {
        RunRequest r;
        r.model = model ? ModelType::kMamba2 : ModelType::kMamba;
        r.runner = runner ? Runner::kWorkers : Runner::kInProcess;
        c.set(r);
        const std::string where = std::string(c.flag) + (model ? " Mamba-2" : " Mamba") +
                                  (runner ? " workers" : " in-process");
        const absl::Status flag = Supports(r);
        const absl::Status field = Supports(r, Naming::kSpecField);
        EXPECT_EQ(flag.ok(), c.built[model][runner]) << where << ": " << flag;
        EXPECT_EQ(field.ok(), flag.ok()) << where;
        if (flag.ok()) continue;
        EXPECT_EQ(flag.code(), absl::StatusCode::kUnimplemented) << where;
        EXPECT_TRUE(Says(flag, c.flag)) << where;
        EXPECT_TRUE(Says(field, c.field)) << where;
        // The reason: the model type where it is not built for it at all, else the runner.
        if (model && !c.built[1][0] && !c.built[1][1]) {
          EXPECT_TRUE(Says(flag, "Mamba-2")) << where;
        } else if (runner) {
          EXPECT_TRUE(Says(flag, "in-process only")) << where;
        }
      }
    }
  }
}

TEST(CapabilitiesTest, TheDefaultsRunEverywhere) {
  for (ModelType model : {ModelType::kMamba, ModelType::kMamba2})
    for (Runner runner : {Runner::kInProcess, Runner::kWorkers})
      for (bool training : {false, true}) {
        RunRequest r;
        r.model = model;
        r.runner = runner;
        r.training = training;
        EXPECT_TRUE(Supports(r).ok());
      }
}

TEST(CapabilitiesTest, RulesThatTieTwoOptionsTogether) {
  RunRequest device;  // a coordinator computes nothing
  device.runner = Runner::kWorkers;
  device.options.device.kind = Device::Kind::kCuda;
  EXPECT_EQ(Supports(device).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Says(Supports(device), "--worker-device"));
  EXPECT_TRUE(Says(Supports(device, Naming::kSpecField), "adjsh worker --device"));
  device.runner = Runner::kInProcess;
  EXPECT_TRUE(Supports(device).ok());

  RunRequest two_pass;  // adjsh grad's only
  two_pass.options.schedule = Schedule::kTwoPass;
  EXPECT_TRUE(Supports(two_pass).ok());
  two_pass.training = true;
  EXPECT_TRUE(Says(Supports(two_pass), "two-pass"));

  RunRequest trace;  // a trace records span tasks
  trace.trace = true;
  EXPECT_TRUE(Supports(trace).ok());
  trace.options.schedule = Schedule::kWavefront;
  EXPECT_TRUE(Says(Supports(trace), "--trace"));
  trace.options.schedule = Schedule::kSpans;
  trace.doc_starts = true;
  EXPECT_TRUE(Says(Supports(trace), "--doc-starts"));
  trace.doc_starts = false;
  trace.model = ModelType::kMamba2;  // either model type's span tasks, in adjsh grad or a run
  EXPECT_TRUE(Supports(trace).ok());
  trace.training = true;
  EXPECT_TRUE(Supports(trace).ok());

  RunRequest forward;  // the loss alone is the span schedule's
  forward.options.forward_only = true;
  forward.options.window = 8;
  EXPECT_EQ(Supports(forward).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace adjsh
