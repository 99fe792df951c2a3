"""The harness the benchmarks in benchmarks/ share.

- ``results``: benchmarks/RESULTS.md in sections, and the one CSV writer.
- ``host``: what machine and commit a result was measured on.
- ``timing``: calibrated, round-robin repeats; medians; geometric means.
- ``workers``: child processes (one per thread count, per export, per C++
  benchmark run) and their results.
- ``markdown``: table lines.
- ``charts``: matplotlib, when it is installed.

A script in benchmarks/ imports it as ``from _harness import results``
(Python puts the script's folder first on sys.path).
"""
