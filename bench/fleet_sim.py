#!/usr/bin/python3
"""Fleet simulation of one span-scheduled gradient step (docs/ARCHITECTURE.md "Spans" and "The
worker tree"): how long a step takes on W workers, from a recorded task trace
(`adjsh grad|train --trace FILE`) or from a plan synthesized for a model shape, with the
partials summed in the coordinator (the star, `--reduce star`) or among the workers (the
worker tree, `--reduce tree`), both as built, side by side. Python 3 standard library only.

Letters: T tokens, C chunk, S spans, K layers, D width, Di = E D inner, N state, R = ceil(D/16)
dt rank, W conv kernel (4), V vocabulary; "W workers" is the fleet size.

WHAT IT MODELS
  Plan       the binary's own (engine/span_plan.cc): `adjsh plan` prints it as JSON
             (cli/plan_cmd.cc) and bench/fleet/plan.py reads it, so there is no second
             implementation: the spans, the task ids, the dependencies (the tests compare them
             with real traces): per layer fwd_summary(k, s) for s < S-1 and fwd(k, s), then
             per layer from the top bwd_summary(k, s) for s > 0 and bwd(k, s). The binary is
             --adjsh PATH, else $ADJSH, else build/cli/adjsh (scripts/build.sh builds it);
             synth and an in-process trace's replay need it, replay checks the recorded
             dependencies with it when it is there.
  Owners     span s runs on worker s W // S (--owners block, contiguous) or s mod W
             (--owners round-robin, how the coordinator now deals spans nobody holds);
             calibrate uses the recorded owners. A worker runs its own ready tasks one at a
             time, lowest id first (as the coordinator leases), or with --priority
             critical-path the one with the longest chain of task times to the step's end.
  A task     as a worker serves it (worker/worker.cc, coordinator/task_service.cc): PullTask
             (lease), FetchInputs (its inputs down), compute, PushResult (its results up).
             Each RPC costs --latency-us each way plus --rpc-overhead-us (coordinator and gRPC
             handling, a fixed delay per RPC, not a shared resource); a result counts when it
             has reached the coordinator, and a task is ready when every dependency's has.
             A PullTask with nothing ready for its worker waits up to --long-poll-ms (the
             coordinator's long_poll, 100) and leases the moment a task becomes ready; after
             that NoTask, the worker sleeps --poll-ms (retry_after_ms, 20) and asks again, so a
             task that becomes ready in that gap waits for the next PullTask. The step starts in
             the middle of every worker's long poll (without one: of its poll interval).
  Links      every transfer costs latency + bytes / bandwidth; each worker has one full-duplex
             link, the coordinator one, each direction carrying one transfer at a time at
             --bandwidth-gbps; a transfer holds both ends' directions for the same interval, the
             earliest from its request that both are free for its length (so one waiting for a
             busy sender does not hold the receiver's link idle meanwhile: a later transfer
             that fits goes first).
  star       (adjsh --reduce star) all parameters (f32) go to each worker with its first
             fetch, every task's result (with its span's partials: layer k's gradient with
             bwd(k, s), the lookups' (V, D) with bwd(0, s), the LM head's (V, D) and norm_f's
             (D) with fwd(K-1, s)) goes to the coordinator.
  tree       (adjsh --reduce tree; engine/tree_reduce.h, engine/span_tree.h, worker/peer.cc)
             the workers that own spans are numbered 0..A-1 in the order of their first span
             (worker 0 owns span 0). Parameters: with its first task a worker fetches the whole
             copy (FetchParams) before its inputs, worker i > 0 from worker i - 1 (a chain,
             worker/peer.cc ParentOf), worker 0 from the coordinator; each relays every 1 MiB
             piece as it arrives, so worker i's stream starts lat + ovh after worker i - 1's
             began (and no sooner than worker i asks), holds worker i - 1's out link and i's in
             link like any transfer (every link carries the copy once, the last worker's out
             link none), and ends no sooner than one piece (plus latency) after worker i - 1's
             copy is in. No task of a worker starts before its whole copy is in. Partials: each of the K + 3 groups (layer k; the
             head's (V, D), leaves from fwd(K-1, s); the lookups' (V, D), from bwd(0, s);
             norm_f, from fwd(K-1, s)) is summed in the tree over span indices [0, S), node
             [lo, hi) split at lo + (hi - lo) // 2 and computed by the owner of span lo. A leaf
             is complete when its task ends, a node when both children are in; it then goes to
             the owner of its parent's first span (no transfer when that is the same worker;
             else the group's bytes over the sender's out link and the receiver's in link,
             queueing behind the sender's other sends), the root to the coordinator (the tied
             head's and lookups' roots, both at worker 0, as one (V, D) sum). Results
             carry no partials. The step ends when every task's result and every group's root
             has reached the coordinator. Adding partials costs nothing here.
  wavefront  (synth only) the retired schedule: the coordinator runs the whole forward and
             the LM head itself, serially at one worker's speed; then backward tasks (k, c),
             one per layer and chunk, (k, c) needing (k+1, c) and (k, c+1) (so at most K run at
             once), handed to any idle worker; each fetches u (halo + C, D) and g (C, D) plus
             h0 and mu (Di, N) and, once per worker, the layer's parameters, and returns
             du (C, D), du_halo, mu_out and (--wavefront-partials task, as it shipped) the
             layer's gradient partial.

WHAT IT IGNORES
  contention on a worker (its CPU or GPU shared with others: recorded task times already carry
  what the recorded run had), the coordinator's own CPU time beyond --rpc-overhead-us, the
  combines (O(S Di N)), heartbeats, leases expiring and faults, the cost of adding partials,
  stream piece boundaries (beyond the tree relay's one piece), TCP/gRPC flow control, a link
  shared by concurrent streams (each direction carries one transfer at a time: a relay or a sum
  on a worker's out link delays its results; its own result is booked before the sums it makes
  at the same moment), falling back to the coordinator when worker i - 1 does not answer FetchParams, and
  task times varying with who runs them.

COMMANDS
  fleet_sim.py replay --trace FILE [--step N] --workers 1,2,4,...,64 [--latency-us L]
      [--bandwidth-gbps B] [--rpc-overhead-us O] [--poll-ms P] [--long-poll-ms L] [--speed F]
      [--reduce star|tree|both] [--owners block|round-robin|recorded]
      [--priority id|critical-path] [--param-bytes P | --model D,K,N,V,E] [--chunk C]
      [--adjsh PATH] [--breakdown] [--json FILE]
    Replays the recorded tasks (compute_s + rebuild_s, divided by --speed) with the recorded
    "deps", on W simulated workers. The model shape (for the parameter bytes and which result
    bytes are partials) is --model, or inferred from the trace's byte counts (conv W = 4,
    R = ceil(D/16)); an in-process trace has no byte counts: give --model and --chunk, and the
    bytes come from the tensor shapes (engine/span_tensors.h). A trace of a worker-tree run
    (its results carry no partials, its fetches no parameters) needs --model; its bytes are
    taken as they are, and either mode then moves the parameters and partials as modelled.
    --owners recorded keeps the trace's own span owners (each span on the worker that ran most
    of its tasks; --workers must be the trace's count): the recorded run at other link speeds.
  fleet_sim.py calibrate --trace FILE:W[:SECONDS] [...] [--latency-us L] [--poll-ms P]
      [--long-poll-ms L] (0 for traces of a coordinator without the long poll)
      [--bandwidth-gbps B]
    Fits --rpc-overhead-us and --bandwidth-gbps of the local link (Unix sockets on one host;
    the latency is held at --latency-us, 5 by default, since on one host only latency plus
    overhead is seen) to the recorded tasks: each task's leased-to-accepted time less its
    compute is 4 latencies + 2 overheads + bytes / bandwidth, and the gap from one result to
    the next lease of a task that was ready is 2 latencies + 1 overhead (a least-absolute-
    deviations fit, robust to descheduled processes). Then it replays each trace at its
    recorded W with its recorded owners and prints measured against predicted step seconds.
    SECONDS is the measured step; without it, the trace's own (its last acceptance). A trace
    of a worker-tree run replays as the tree (give --model). With --bandwidth-gbps the link's
    rate is held and the overhead alone is fitted (a weighted median): a worker-tree run's
    tasks carry a few KB each, too alike to fit a bandwidth (the parameters and sums, which
    are not in the tasks, are most of the bytes); tests/net/test_multihost.py fits so on
    unlimited links and holds the fit against real links at 1 Gbit/s and 100 Mbit/s.
  fleet_sim.py synth --model D,K,N,V,E --T T --chunk C [--spans S] --cost-trace FILE
      [--cost-model D,K,N,V,E] --speed F [--bandwidth-gbps B] [--latency-us L]
      [--rpc-overhead-us O] [--poll-ms P] [--long-poll-ms L] --workers 1,2,...,64
      [--reduce both] [--owners block|round-robin] [--priority id|critical-path]
      [--wavefront-partials task|none] [--adjsh PATH] [--breakdown] [--json FILE]
    Asks the binary for the plan of the shape (`adjsh plan`), gives each task a time from a cost model fitted on
    --cost-trace (a real trace of a smaller model on this machine: per phase, seconds per token
    per FLOP of the phase, FLOPs from the shape as below; the LM head separately, from what the
    top layer's fwd takes beyond a layer's forward; --cost-model is that trace's shape, needed
    for a worker-tree trace) divided by --speed, and each task its bytes
    from the tensor shapes; then simulates as replay does, and the wavefront beside it.
    FLOPs per token and layer: GEMMs 2 m n k (bench/flops.h): in_proj 4 D Di, x_proj
    2 Di (R + 2N), dt_proj 2 R Di, out_proj 2 Di D; a scan pass 8 Di N.
      fwd_summary  in_proj + x_proj + dt_proj + one scan          (no out_proj)
      fwd          fwd_summary + out_proj; at k = K-1 plus the head 3 x 2 V D
      bwd_summary  in_proj + x_proj + dt_proj + out_proj (ybar) + one (adjoint) scan
      bwd          3 x (all four GEMMs: the recompute, then dW and dinput) + three scans

OUTPUT
  A markdown table, one row per W, for each of star, tree (and wavefront for synth):
    step s      predicted seconds from the step's start to its last result (star) or to the
                last result or group root reaching the coordinator (tree)
    speed-up    that mode's W = 1 step over this one
    eff         parallel efficiency = speed-up / W
    util        the workers' compute seconds / (W x step): how busy the fleet is
    coord busy  the busier direction of the coordinator's link: busy seconds / step
  --breakdown (replay, synth) then prints, per W and mode, where the W x step worker-seconds
  went: compute, waiting for dependencies (and, after a worker's last task, for the others),
  a ready task waiting for the worker's next PullTask, the RPCs' fixed costs, transfers
  (latency, waiting for the links, bytes / bandwidth), waiting for the tree's parameter copy
  (param wait), and the tail after the last task's result (the tree's last sums); beside the
  DAG's critical path (by task times, and with each task's least RPC and transfer cost) and
  the bound max(task seconds / W, critical path).
  --json FILE writes the same numbers (and the settings, bytes per link; with --breakdown each
  mode's "breakdown") as one JSON object.
  synth also prints the DAG's parallelism (task seconds / critical path). Exit 0; a bad flag or
  file, a shape the plan refuses, or no adjsh binary where a plan is needed: a message on
  stderr and exit 2.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet.cli import main  # noqa: E402  (bench/fleet/, one module per concern)

if __name__ == "__main__":
    sys.exit(main())
