# The link model: latency each way, per-RPC overhead, the long poll and poll interval of an idle
# worker's PullTask, and one FIFO server per link direction (each worker's full-duplex link and
# the coordinator's) through which every transfer passes.

from .errors import FleetError


class Net:
    """Latency (s) each way, bandwidth (bytes/s) per link direction, overhead (s) per RPC; an
    idle worker's PullTask waits long_poll (s) for a task, then it sleeps poll (s)."""

    def __init__(self, latency_us, bandwidth_gbps, overhead_us, poll_ms, long_poll_ms=100.0):
        if bandwidth_gbps <= 0:
            raise FleetError(f"--bandwidth-gbps {bandwidth_gbps}: must be positive")
        if min(latency_us, overhead_us, poll_ms, long_poll_ms) < 0:
            raise FleetError("--latency-us, --rpc-overhead-us, --poll-ms and --long-poll-ms "
                             "must be >= 0")
        self.lat, self.bw = latency_us * 1e-6, bandwidth_gbps * 1e9 / 8
        self.ovh, self.poll, self.long_poll = overhead_us * 1e-6, poll_ms * 1e-3, long_poll_ms * 1e-3

    def describe(self):
        return (f"latency {self.lat * 1e6:g} us, {self.bw * 8 / 1e9:g} Gb/s per link direction, "
                f"{self.ovh * 1e6:g} us per RPC, long poll {self.long_poll * 1e3:g} ms, poll "
                f"{self.poll * 1e3:g} ms")


class Link:
    """One direction of one link: a FIFO server (busy until `free`)."""

    def __init__(self):
        self.free = self.busy = 0.0
        self.bytes = 0


def transfer(now, nbytes, links, net):
    """Sends nbytes at `now` through `links` (held together, cut-through); returns when the
    last byte has arrived (latency included)."""
    if nbytes <= 0:
        return now + net.lat
    start = max([now] + [l.free for l in links])
    dur = nbytes / net.bw
    for l in links:
        l.free, l.busy, l.bytes = start + dur, l.busy + dur, l.bytes + nbytes
    return start + dur + net.lat
