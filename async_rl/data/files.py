"""Load prompt records from jsonl files (one JSON object per line).

Each record must hold the prompt under ``prompt_key`` (a string, or a chat list of ``{"role", "content"}`` messages)
and, for rule-based rewards, a ground truth under ``reward_model.ground_truth`` (verl's layout) or ``ground_truth``.
The result is a list of plain dicts ``{"prompt", "ground_truth", "extra"}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _ground_truth(record: dict[str, Any]) -> str:
    reward_model = record.get("reward_model")
    if isinstance(reward_model, dict) and "ground_truth" in reward_model:
        return str(reward_model["ground_truth"])
    return str(record.get("ground_truth", ""))


def load_prompt_records(path: str | Path, prompt_key: str = "prompt") -> list[dict[str, Any]]:
    """Read a jsonl prompt file; errors name the file, line and missing key."""
    path = Path(path).expanduser()
    if path.suffix not in (".jsonl", ".json"):
        raise ValueError(f"data file {str(path)!r}: only .jsonl is supported here (convert with tools/prepare_data.py)")
    if not path.is_file():
        raise ValueError(f"data file not found: {str(path)!r}")
    records: list[dict[str, Any]] = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            if prompt_key not in raw:
                raise ValueError(f"{path}:{lineno}: record has no key {prompt_key!r} (data.prompt_key)")
            extra = {k: v for k, v in raw.items() if k not in (prompt_key, "reward_model", "ground_truth")}
            records.append({"prompt": raw[prompt_key], "ground_truth": _ground_truth(raw), "extra": extra})
    return records
