"""Helpers shared by the end-to-end tests: the launcher command line, reading a run's JSONL files, free ports."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def launcher_command(
    config: str,
    run_dir: Path,
    *,
    steps: int,
    actors: int = 1,
    flags: Sequence[str] = (),
    overrides: Sequence[str] = (),
) -> list[str]:
    """``launchers/local.py`` on ``configs/<config>`` with 2 learner ranks, JSONL metrics in ``run_dir``."""
    return [
        sys.executable,
        str(ROOT / "launchers" / "local.py"),
        "--config",
        str(ROOT / "configs" / config),
        "--nproc-per-node",
        "2",
        "--actors",
        str(actors),
        "--run-dir",
        str(run_dir),
        *flags,
        f"trainer.default_local_dir={run_dir}",
        f"trainer.total_training_steps={steps}",
        "trainer.logger=['jsonl']",
        *overrides,
    ]


def read_jsonl(path: Path) -> list[dict]:
    """The complete lines of a JSONL file, which may still be written to (a line in flight is left out)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
