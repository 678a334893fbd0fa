# Fleet simulation of one span-scheduled gradient step on W workers (bench/fleet_sim.py is the
# command; its docstring describes the model). One module per concern:
#   shape      the model's shape and parameter bytes      plan       SpanPlan, from `adjsh plan`
#   wire       bytes per task, the tree's groups           cost       FLOPs and the fitted rates
#   net        latency, bandwidth, RPC overhead, polling   sim        the discrete-event simulator
#   workload   SimTasks from a plan or a trace             wavefront  the retired chunk schedule
#   trace      reading recorded traces                     calibrate  fitting the link model
#   sweep      steps per W, the table and JSON             breakdown  where worker-seconds go
#   cli        the commands and flags
"""The simulator's API, re-exported for the tests and for scripts: `import fleet as fs`."""

from .errors import FleetError
from .shape import F32, Shape, parse_shape
from .plan import (PHASES, FWD_SUMMARY, FWD, BWD_SUMMARY, BWD, AdjshMissing, SpanPlan,
                   adjsh_path, default_spans, plan_json, set_adjsh)
from .wire import (HEAD, HEAD_SCALAR_BYTES, LOOKUP, NORM_F, PARAM_PIECE_BYTES, TIED, TIMING_BYTES,
                   input_bytes, output_bytes, partial_bytes, span_start_bytes, tree_groups)
from .cost import SCAN_FLOPS, CostModel, layer_flops, span_lengths
from .net import Link, Net, transfer, transfer_span
from .sim import (Result, SimTask, Simulation, block_owners, critical_path, param_parent,
                  priority_ranks, span_tree)
from .trace import (REQUIRED, carries_partials, check_deps, has_bytes, infer_shape, load_trace,
                    trace_layers, trace_shape)
from .workload import plan_tasks, recorded_param_fetches, trace_tasks
from .wavefront import wavefront_tasks
from .calibrate import fit_rows, lad_fit, lad_fit_held, parse_run, recorded_owners
from .sweep import modes_of, simulate, sweep, table, write_json
from . import breakdown
from .cli import main, parser
