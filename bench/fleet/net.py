# The link model: latency each way, per-RPC overhead, the long poll and poll interval of an idle
# worker's PullTask, and one FIFO server per link direction (each worker's full-duplex link and
# the coordinator's) through which every transfer passes.

import bisect
import math

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
    """One direction of one link: one transfer at a time, in the intervals it has reserved
    (sorted, disjoint; those over before the latest request are dropped)."""

    def __init__(self):
        self.busy = 0.0
        self.bytes = 0
        self.reserved = []  # (start, end)

    def conflict(self, t, dur):
        """The end of a reservation overlapping [t, t + dur), or None."""
        i = bisect.bisect_right(self.reserved, (t, math.inf))
        if i > 0 and self.reserved[i - 1][1] > t:
            return self.reserved[i - 1][1]
        if i < len(self.reserved) and self.reserved[i][0] < t + dur:
            return self.reserved[i][1]
        return None

    def reserve(self, now, start, dur, nbytes):
        k = 0
        while k < len(self.reserved) and self.reserved[k][1] <= now:
            k += 1
        del self.reserved[:k]
        bisect.insort(self.reserved, (start, start + dur))
        self.busy, self.bytes = self.busy + dur, self.bytes + nbytes


def transfer(now, nbytes, links, net):
    """Sends nbytes at `now` (calls come in time order) through `links` (held together,
    cut-through) at the earliest time from `now` that all of them are free for its duration;
    returns when the last byte has arrived (latency included). A link direction's transfers
    go in the order they can start, not the order asked: one waiting for a busy sender does not
    hold the receiver's link idle (a coordinator's fetch to a worker goes ahead of a tree sum
    that worker's other sender is still busy with, say)."""
    return transfer_span(now, nbytes, links, net)[1]


def transfer_span(now, nbytes, links, net):
    """transfer, returning (when its first byte leaves, when its last byte has arrived)."""
    if nbytes <= 0:
        return now, now + net.lat
    dur = nbytes / net.bw
    start, moved = now, True
    while moved:
        moved = False
        for l in links:
            end = l.conflict(start, dur)
            if end is not None:
                start, moved = end, True
    for l in links:
        l.reserve(now, start, dur, nbytes)
    return start, start + dur + net.lat
