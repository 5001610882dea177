"""tools/bench_learner_scale.py on the tiny shape: each case runs under torchrun and the layouts agree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_learner_scale.py"


def test_shared_and_separate_cases_train_the_same_first_step() -> None:
    cmd = [sys.executable, str(TOOL), "--shape", "tiny", "--steps", "1", "--cases", "shared,separate"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith(("shared ", "separate "))}
    assert set(rows) == {"shared", "separate"}
    for row in rows.values():
        assert "[cpu, 1 rank(s)]" in row and "128 seqs" in row

    def field(row: str, name: str) -> float:
        words = row.split()
        return float(words[words.index(name) + 1])

    # the same batch, weights and seed: the first step's loss and entropy agree whatever the layout
    for name in ("pg_loss", "entropy", "grad_norm"):
        assert abs(field(rows["shared"], name) - field(rows["separate"], name)) < 1e-4, name
    result = json.loads(proc.stdout.split("BENCH_RESULT ", 1)[1].splitlines()[0])
    (line,) = result["results"]
    assert line["metric"] == "learner_scale_shared_vs_separate" and line["ratio"] > 0
    # the shared layout computes each group's prompt once: fewer tokens than the separate sequences
    computed = {k: int(v.split(" computed")[0].split()[-1]) for k, v in rows.items()}
    assert computed["shared"] < computed["separate"]
