// The one definition of a training job on the command line: the flags of `adjsh train` and
// `adjsh submit` that define what is trained (model, data, schedule, optimizer, evaluation,
// checkpoints), one table with one set of defaults, mapped onto a JobSpec (proto/adjsh.proto).
// Both commands then go through coordinator/job_spec.h: ValidateJobSpec, JobModelParams,
// JobData and JobTrainOptions, so `adjsh train --spec JOB.json` and `adjsh submit --spec
// JOB.json` run the same job.
#ifndef ADJSH_CLI_JOB_FLAGS_H_
#define ADJSH_CLI_JOB_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "cli/args.h"
#include "proto/adjsh.pb.h"

namespace adjsh::cli {

// Adds the job flags (without parser defaults: a flag given is a flag set; the defaults, named
// in the help, are applied by SpecFromFlags).
void AddJobFlags(ArgParser& a);

// Whether any job flag was given (they exclude --spec).
bool AnyJobFlag(const ArgParser& a);

// The JobSpec of the flags, defaults applied; paths made absolute. INVALID_ARGUMENT (bad usage)
// naming the flag.
absl::StatusOr<v1::JobSpec> SpecFromFlags(const ArgParser& a);

// A JobSpec in JSON (protobuf's JSON mapping of proto/adjsh.proto).
absl::StatusOr<v1::JobSpec> SpecFromFile(const std::string& path);

}  // namespace adjsh::cli

#endif  // ADJSH_CLI_JOB_FLAGS_H_
