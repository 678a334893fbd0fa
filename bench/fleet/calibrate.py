# Calibration of the link model on recorded runs: each task's lease-to-acceptance time less its
# compute is 4 latencies + 2 overheads + bytes / bandwidth, a ready task's gap from the previous
# result to its lease 2 latencies + 1 overhead; a least-absolute-deviations fit of both (or of
# the overhead alone, the bandwidth held where the link's rate is known).

from collections import defaultdict

from .errors import FleetError


def parse_run(text):
    """FILE:W[:SECONDS]."""
    parts = text.rsplit(":", 2)
    try:
        if len(parts) == 3 and _is_int(parts[1]):
            return parts[0], int(parts[1]), float(parts[2])
        parts = text.rsplit(":", 1)
        if len(parts) == 2:
            return parts[0], int(parts[1]), None
    except ValueError:
        pass
    raise FleetError(f"--trace {text!r}: expected FILE:W or FILE:W:MEASURED_SECONDS")


def _is_int(s):
    try:
        int(s)
        return True
    except ValueError:
        return False


def lad_fit(rows):
    """Least absolute deviations of y = a x0 + b x1 over rows (x0, x1, y), by iteratively
    reweighted least squares; returns (a, b)."""
    w = [1.0] * len(rows)
    a = b = 0.0
    for _ in range(50):
        s00 = sum(wi * x0 * x0 for wi, (x0, x1, y) in zip(w, rows))
        s01 = sum(wi * x0 * x1 for wi, (x0, x1, y) in zip(w, rows))
        s11 = sum(wi * x1 * x1 for wi, (x0, x1, y) in zip(w, rows))
        t0 = sum(wi * x0 * y for wi, (x0, x1, y) in zip(w, rows))
        t1 = sum(wi * x1 * y for wi, (x0, x1, y) in zip(w, rows))
        det = s00 * s11 - s01 * s01
        if det <= 0:
            raise FleetError("calibrate: the traces do not vary enough in bytes to fit a "
                             "bandwidth")
        a, b = (t0 * s11 - t1 * s01) / det, (s00 * t1 - s01 * t0) / det
        w = [1.0 / max(abs(y - a * x0 - b * x1), 1e-6) for x0, x1, y in rows]
    return a, b


def lad_fit_held(rows, inv_bw):
    """Least absolute deviations of y = a x0 + x1 inv_bw over rows (x0, x1, y), the time per
    byte held: a weighted median of (y - x1 inv_bw) / x0 with weights x0; returns a."""
    vals = sorted(((y - x1 * inv_bw) / x0, x0) for x0, x1, y in rows if x0 > 0)
    if not vals:
        raise FleetError("calibrate: no observations")
    half, acc = sum(w for _, w in vals) / 2, 0.0
    for v, w in vals:
        acc += w
        if acc >= half:
            return v
    return vals[-1][0]


def fit_rows(records):
    """Observations for lad_fit, in (x = 2 lat + ovh, 1 / bandwidth): each task's time from
    lease to acceptance less its compute = 2 x + bytes / bw; the gap from a result to the
    same worker's next lease, when that task was ready by then, = x. Bytes in MB."""
    rows = []
    end = {r["id"]: r["end_s"] for r in records}
    by_worker = defaultdict(list)
    for r in records:
        busy = r["end_s"] - r["start_s"] - r["compute_s"] - r["rebuild_s"]
        rows.append((2.0, (r["bytes_in"] + r["bytes_out"]) / 1e6, busy))
        by_worker[r["worker"]].append(r)
    for rs in by_worker.values():
        rs.sort(key=lambda r: r["start_s"])
        for prev, nxt in zip(rs, rs[1:]):
            if max((end[d] for d in nxt["deps"]), default=0.0) <= prev["end_s"]:
                rows.append((1.0, 0.0, nxt["start_s"] - prev["end_s"]))
    return rows


def recorded_owners(records, S):
    """span -> worker index from the trace (the worker that ran most of its tasks), and W."""
    names = []
    count = defaultdict(lambda: defaultdict(int))
    for r in sorted(records, key=lambda r: r["start_s"]):
        if r["worker"] not in names:
            names.append(r["worker"])
        count[r["span"]][names.index(r["worker"])] += 1
    return [max(count[s], key=count[s].get) for s in range(S)], len(names)
