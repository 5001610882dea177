"""Staleness sweep: run one config for several max_staleness values K, with and without off-policy correction.

    python tools/sweep_staleness.py [--config configs/demo_grpo.yaml] [--staleness 0 1 2 4 8] [--correction on off]
        [--steps N] [--out outputs/sweep] [--quick] [--lock FILE] [--report-only] [dotted.key=value ...]

Writes ``sweep.csv``, ``sweep.md`` and PNG plots into ``--out``; see ``async_rl/tuning/sweep.py`` for what it runs and
``async_rl/tuning/sweep_report.py`` for what the table and plots show. ``--quick`` (K in 0 and 2, 30 steps) takes a few
minutes on the embedded demo; the default (K in 0 1 2 4 8, 200 steps) about 40 minutes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl.tuning.sweep import main  # noqa: E402 - after the sys.path tweak so the script runs from a checkout

if __name__ == "__main__":
    sys.exit(main())
