"""Convert GSM8K-style data (``question`` / ``answer`` ending in ``#### 72``) into the jsonl prompt format.

    python tools/prepare_data.py --input train.jsonl --output ~/data/gsm8k/train.jsonl [--format gsm8k] [--split train]

The trainer reads jsonl prompt files (``async_rl.data.load_prompt_records``); this writes one record a line in verl's
layout, so files prepared here and by verl's own preprocessing look alike:

    {"prompt": [{"role": "user", "content": "<question> Let's think step by step and output the final answer after
     \\"####\\"."}], "reward_model": {"ground_truth": "72"}, "data_source": "gsm8k",
     "extra_info": {"index": 0, "split": "train"}}

Input is jsonl (one JSON object a line, e.g. openai/grade-school-math's ``train.jsonl``) or parquet (the Hugging Face
``openai/gsm8k`` files; needs ``pyarrow``). The ground truth is the text after the last ``####`` with thousands
separators removed (``1,000`` -> ``1000``). Every error names the file, the line (or parquet row) and the field. The
output is written to a temporary file and renamed, so a failed conversion leaves no partial file behind.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
FORMATS = ("gsm8k",)
SPLITS = ("train", "test", "validation")


def extract_gsm8k_answer(answer: str) -> str:
    """The final answer after the last ``####``, stripped, without thousands separators; ValueError when absent."""
    if "####" not in answer:
        raise ValueError("has no '####' final-answer marker")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not final:
        raise ValueError("has nothing after '####'")
    return final


def convert_gsm8k_record(record: Any, index: int, split: str, where: str) -> dict[str, Any]:
    """One GSM8K record as a prompt record; ``where`` (``file:line``) prefixes every error."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    fields: dict[str, str] = {}
    for name in ("question", "answer"):
        value = record.get(name)
        if not isinstance(value, str) or not value.strip():
            got = "missing" if name not in record else f"{type(value).__name__} {value!r:.40}"
            raise ValueError(f"{where}: field {name!r} must be a non-empty string ({got})")
        fields[name] = value
    try:
        truth = extract_gsm8k_answer(fields["answer"])
    except ValueError as exc:
        raise ValueError(f"{where}: field 'answer' {exc}: {fields['answer'][-60:]!r}") from None
    return {
        "prompt": [{"role": "user", "content": f"{fields['question'].strip()} {INSTRUCTION}"}],
        "reward_model": {"ground_truth": truth},
        "data_source": "gsm8k",
        "extra_info": {"index": index, "split": split},
    }


def _read_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None


def _read_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(
            f"{path}: reading parquet needs pyarrow, which is not installed: pip install pyarrow "
            "(or convert the file to jsonl first)"
        ) from None
    for row, record in enumerate(pq.read_table(path).to_pylist()):
        yield f"{path}: row {row}", record


def read_records(path: str | Path) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` pairs from a .jsonl/.json (JSON lines) or .parquet file, in file order."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"--input {str(path)!r}: no such file")
    if path.suffix == ".parquet":
        return _read_parquet(path)
    if path.suffix in (".jsonl", ".json"):
        return _read_jsonl(path)
    raise ValueError(f"--input {str(path)!r}: unknown file type {path.suffix!r}; expected .jsonl, .json or .parquet")


def infer_split(path: str | Path) -> str:
    """``train`` / ``test`` / ``validation`` from the file name; ValueError when it names none or several."""
    name = Path(path).name.lower()
    found = [s for s in SPLITS if s in name] or (["validation"] if "val" in name else [])
    if len(found) != 1:
        raise ValueError(f"cannot tell the split from the file name {Path(path).name!r}; pass --split")
    return found[0]


def prepare(input_path: str | Path, output_path: str | Path, fmt: str = "gsm8k", split: str | None = None) -> int:
    """Convert ``input_path`` into jsonl at ``output_path``; returns the number of records written."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r} is not supported; choose from {list(FORMATS)}")
    out = Path(output_path).expanduser()
    if out.suffix != ".jsonl":
        raise ValueError(f"--output {str(out)!r} must end in .jsonl (the format the trainer reads)")
    records = read_records(input_path)
    split = split or infer_split(input_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    count = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for where, record in records:
                converted = convert_gsm8k_record(record, count, split, where)
                f.write(json.dumps(converted, ensure_ascii=False) + "\n")
                count += 1
        if count == 0:
            raise ValueError(f"--input {str(input_path)!r} holds no records")
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    logger.info("wrote %d %s records to %s", count, split, out)
    return count


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(prog="python tools/prepare_data.py", description=__doc__.split("\n")[0])
    p.add_argument("--input", required=True, help="GSM8K .jsonl or .parquet file")
    p.add_argument("--output", required=True, help="prompt .jsonl to write (parent directories are created)")
    p.add_argument("--format", default="gsm8k", choices=FORMATS, help="input layout [gsm8k]")
    p.add_argument("--split", default=None, choices=SPLITS, help="extra_info.split [from the input file name]")
    args = p.parse_args(argv)
    try:
        prepare(args.input, args.output, args.format, args.split)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
