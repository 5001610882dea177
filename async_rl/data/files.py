"""Load prompt records from jsonl files (one JSON object per line) or parquet files (verl's preprocessed layout).

Each record must hold the prompt under ``prompt_key`` (a string, or a chat list of ``{"role", "content"}`` messages)
and, for rule-based rewards, a ground truth under ``reward_model.ground_truth`` (verl's layout) or ``ground_truth``.
The result is a list of plain dicts ``{"prompt", "ground_truth", "extra"}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _ground_truth(record: dict[str, Any]) -> str:
    reward_model = record.get("reward_model")
    if isinstance(reward_model, dict) and "ground_truth" in reward_model:
        return str(reward_model["ground_truth"])
    return str(record.get("ground_truth", ""))


def _record(raw: dict[str, Any], prompt_key: str, where: str) -> dict[str, Any]:
    if prompt_key not in raw:
        raise ValueError(f"{where}: record has no key {prompt_key!r} (data.prompt_key)")
    extra = {k: v for k, v in raw.items() if k not in (prompt_key, "reward_model", "ground_truth")}
    return {"prompt": raw[prompt_key], "ground_truth": _ground_truth(raw), "extra": extra}


def _read_jsonl(path: Path) -> list[tuple[str, dict[str, Any]]]:
    rows = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append((f"{path}:{lineno}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
    return rows


def _read_parquet(path: Path) -> list[tuple[str, dict[str, Any]]]:
    import pyarrow.parquet as pq

    return [(f"{path} row {i}", row) for i, row in enumerate(pq.read_table(path).to_pylist())]


def read_rows(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """The records of a jsonl or parquet file, each with where it is (``file:line`` or ``file row i``) for errors."""
    path = Path(path).expanduser()
    if path.suffix not in (".jsonl", ".json", ".parquet"):
        raise ValueError(f"data file {str(path)!r}: expected .jsonl or .parquet (see tools/prepare_data.py)")
    if not path.is_file():
        raise ValueError(f"data file not found: {str(path)!r}")
    rows = _read_parquet(path) if path.suffix == ".parquet" else _read_jsonl(path)
    for where, raw in rows:
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: a record must be a JSON object, got {type(raw).__name__}")
    return rows


def load_prompt_records(path: str | Path, prompt_key: str) -> list[dict[str, Any]]:
    """Read a jsonl or parquet prompt file; errors name the file, line (or row) and missing key."""
    return [_record(raw, prompt_key, where) for where, raw in read_rows(path)]


Messages = list[dict[str, str]]


def read_messages(value: Any, where: str, key: str) -> Messages:
    """Field ``key`` of the record at ``where`` as chat messages: a non-empty list of objects with string ``role`` and
    ``content`` (other fields dropped); a ``ValueError`` naming the place otherwise."""
    if not isinstance(value, list) or not value:
        raise ValueError(
            f"{where}: field {key!r} is an empty message list"
            if value == []
            else f"{where}: field {key!r} must be a non-empty list of messages"
        )
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"{where}: field {key!r} message {i} must be an object with string 'role' and 'content'")
        out.append({"role": m["role"], "content": m["content"]})
    return out
