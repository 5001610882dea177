"""Throughput tuning, staleness sweeps and benchmark reporting (the tools in ``tools/`` are thin entry points).

Tuner (``tools/tune.py``): ``simulator`` is a pure discrete-event model of actors, coordinator admission, learner
steps and weight broadcasts; ``probes`` and ``profile`` measure the real pieces and hold the rates (JSON);
``recommend`` searches deployments with the simulator; ``settings`` picks the learner's precision, prompt layout and
ranks x threads for the profiled host from settings the probes timed both ways; ``validate`` compares the
simulator's predictions with real runs here; ``report`` writes tables and plots.

Staleness sweep (``tools/sweep_staleness.py``): ``sweep`` plans and runs one config over max_staleness values with
and without off-policy correction; ``sweep_report`` turns the runs' metrics into a table and plots.

Benchmarks (``tools/bench_*.py``, ``tools/bench_all.py``): ``bench`` is the one result line each prints last.
"""
