// Where a job may read and write on the coordinator's filesystem. A token holder names paths in
// its spec; the coordinator reads them as training data and writes checkpoints there with its
// own rights, so every path must lie under a root the operator chose:
//   reads (model_dir and the files in it, token_file, text_files): a --data-root or the state dir
//   writes (checkpoint_dir): a --data-root or the state dir
// A path is resolved before it is checked: relative paths against the state dir, symbolic links
// followed (a link that leads out of a root is outside it), and any ".." component refused.
// The check comes before any look at the file, and its answer (PERMISSION_DENIED) is the same
// whether or not the file exists, so a spec cannot probe for files outside the roots.
#ifndef ADJSH_COORDINATOR_JOB_PATHS_H_
#define ADJSH_COORDINATOR_JOB_PATHS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/adjsh.pb.h"

namespace adjsh::coordinator {

struct PathRoots {
  std::vector<std::string> data_roots;  // absolute; may be empty (then the state dir only)
  std::string state_dir;                // absolute; empty: no state dir root
};

// Rewrites every path of the spec to its resolved absolute form, or PERMISSION_DENIED naming
// the field when one is outside the roots. The built-in corpus (no data in the spec) needs no
// root: it is the coordinator's own.
absl::Status ConfineJobPaths(v1::JobSpec& spec, const PathRoots& roots);

}  // namespace adjsh::coordinator

#endif  // ADJSH_COORDINATOR_JOB_PATHS_H_
