"""Timing: systems calibrated to a time per repeat and timed round-robin,
medians, geometric means.

Round-robin in one process (each repeat times every system once, the first
one rotating) so that the machine's drift and other work hit all systems
of a comparison alike: on a shared machine repeats minutes apart differ by
20-30 %, repeats interleaved much less."""
import math
import statistics
import time


class Timed:
    """A system bound to its inputs: ``run(n, start)`` runs n batches from
    batch ``start``; ``output(b)`` returns batch b's result (for checks).
    ``times`` collects seconds per batch, one per repeat."""

    def __init__(self, name, run, output=None, n=1):
        self.name = name
        self.run = run
        self.output = output
        self.start = 0
        self.n = n
        self.times = []

    def call(self, n):
        t0 = time.perf_counter()
        self.run(n, self.start)
        dt = time.perf_counter() - t0
        self.start += n
        return dt


def calibrate(sysm, warmup_s, target_s):
    """One untimed call (tracing, first touch), then calls of doubling
    batch counts for at least ``warmup_s``; sets ``sysm.n`` so one repeat
    takes about ``target_s``."""
    sysm.call(1)
    n, spent, per = 1, 0.0, None
    while True:
        dt = sysm.call(n)
        spent += dt
        per = dt / n
        if spent >= warmup_s and dt >= min(target_s, warmup_s) * 0.5:
            break
        if dt < target_s:
            n = min(n * 2, max(1, int(2 * target_s / max(per, 1e-9))))
    sysm.n = max(1, int(round(target_s / per)))


def round_robin(systems, repeats, rotate=True, on_step=None):
    """``repeats`` rounds, each timing every system once (``n`` batches);
    ``rotate``: round r starts at system r mod len."""
    for r in range(repeats):
        if on_step:
            on_step(f"repeat {r + 1}/{repeats}")
        k = r % len(systems) if rotate else 0
        for s in systems[k:] + systems[:k]:
            s.times.append(s.call(s.n) / s.n)


def measure(systems, repeats, warmup_s, target_s, on_step=None):
    """Calibrates each system, times them round-robin, then repeats up to
    ``repeats`` more rounds of the systems whose median is over 1.5x their
    best repeat (a repeat disturbed by other work)."""
    for s in systems:
        if on_step:
            on_step(f"warm-up {s.name}")
        calibrate(s, warmup_s, target_s)
    round_robin(systems, repeats, on_step=on_step)
    unstable = [s for s in systems
                if statistics.median(s.times) > 1.5 * min(s.times)]
    for r in range(repeats if unstable else 0):
        if on_step:
            on_step(f"stability {r + 1}/{repeats} ({len(unstable)} systems)")
        for s in unstable:
            s.times.append(s.call(s.n) / s.n)


def median_time(fn, repeats, per_call=1):
    """One untimed call of ``fn()``, then the median over ``repeats`` calls
    of its time / ``per_call`` (the batches one call runs), in seconds."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) / per_call)
    return statistics.median(times)


def geomean(xs):
    """Geometric mean of the positive numbers in xs ("" and None, for a
    missing value, are left out); None if there are none."""
    xs = [x for x in xs if x not in ("", None) and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None
