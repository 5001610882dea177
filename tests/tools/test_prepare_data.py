"""tools/prepare_data.py: GSM8K question/answer records -> the jsonl prompt format the trainer reads."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from async_rl.data import load_prompt_records

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "prepare_data.py"


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prepare_data_under_test", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


tool = _load_tool()

ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "  A farm sells 1,000 eggs a day for 2 days.  ", "answer": "1000*2=2000 so... #### 2,000"},
]


def _write_jsonl(path: Path, rows: Sequence[object]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")  # a trailing blank line is skipped
    return path


def test_converts_to_the_prompt_format(tmp_path: Path) -> None:
    src = _write_jsonl(tmp_path / "train.jsonl", ROWS)
    out = tmp_path / "nested" / "dir" / "gsm8k_train.jsonl"
    assert tool.main(["--input", str(src), "--output", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert json.loads(lines[0]) == {
        "prompt": [
            {
                "role": "user",
                "content": "Tom has 3 apples and buys 4 more. How many? Let's think step by step and output the final"
                ' answer after "####".',
            }
        ],
        "reward_model": {"ground_truth": "7"},
        "data_source": "gsm8k",
        "extra_info": {"index": 0, "split": "train"},  # split read from the input name "train.jsonl"
    }
    second = json.loads(lines[1])
    assert second["prompt"][0]["content"].startswith("A farm sells 1,000 eggs a day for 2 days. Let's")  # stripped
    assert second["reward_model"]["ground_truth"] == "2000"  # "2,000" without the thousands separator
    assert second["extra_info"] == {"index": 1, "split": "train"}
    # the trainer's loader reads it back
    loaded = load_prompt_records(out, "prompt")
    assert [r["ground_truth"] for r in loaded] == ["7", "2000"]
    assert loaded[0]["extra"]["data_source"] == "gsm8k"


def test_split_flag_and_inference(tmp_path: Path) -> None:
    src = _write_jsonl(tmp_path / "gsm8k.jsonl", ROWS[:1])
    out = tmp_path / "o.jsonl"
    with pytest.raises(ValueError, match="pass --split"):
        tool.prepare(src, out)
    assert tool.prepare(src, out, split="test") == 1
    assert json.loads(out.read_text())["extra_info"] == {"index": 0, "split": "test"}
    assert tool.infer_split("data/test-00000-of-00001.parquet") == "test"
    assert tool.infer_split("gsm8k_val.jsonl") == "validation"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"answer": "#### 1"}, "field 'question' must be a non-empty string (missing)"),
        ({"question": "q", "answer": 5}, "field 'answer' must be a non-empty string (int 5)"),
        ({"question": "q", "answer": "it is 5"}, "field 'answer' has no '####' final-answer marker"),
        ({"question": "q", "answer": "it is #### "}, "field 'answer' has nothing after '####'"),
        (["q", "a"], "expected a JSON object, got list"),
    ],
)
def test_errors_name_file_line_and_field(tmp_path: Path, row: object, message: str) -> None:
    src = _write_jsonl(tmp_path / "train.jsonl", [ROWS[0], row])
    out = tmp_path / "out.jsonl"
    with pytest.raises(ValueError) as exc:
        tool.prepare(src, out)
    assert str(exc.value).startswith(f"{src}:2: ")  # the bad record is on line 2
    assert message in str(exc.value)
    assert not out.exists() and list(tmp_path.iterdir()) == [src]  # no partial output, no temp file left


def test_invalid_json_line_is_named(tmp_path: Path) -> None:
    src = tmp_path / "train.jsonl"
    src.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"train\.jsonl:2: not valid JSON"):
        tool.prepare(src, tmp_path / "out.jsonl")


def test_bad_arguments(tmp_path: Path) -> None:
    src = _write_jsonl(tmp_path / "train.jsonl", ROWS)
    with pytest.raises(ValueError, match="--output .* must end in .jsonl"):
        tool.prepare(src, tmp_path / "out.parquet")
    with pytest.raises(ValueError, match="--input .*: no such file"):
        tool.prepare(tmp_path / "missing.jsonl", tmp_path / "o.jsonl")
    csv = tmp_path / "train.csv"
    csv.write_text("question,answer\n")
    with pytest.raises(ValueError, match="unknown file type '.csv'"):
        tool.prepare(csv, tmp_path / "o.jsonl")
    with pytest.raises(ValueError, match="--format 'math'"):
        tool.prepare(src, tmp_path / "o.jsonl", fmt="math")
    empty = tmp_path / "train_empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="holds no records"):
        tool.prepare(empty, tmp_path / "o.jsonl")


def test_parquet_without_pyarrow_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import fails even where pyarrow is installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    src = tmp_path / "train.parquet"
    src.write_bytes(b"PAR1")
    with pytest.raises(ValueError, match="pip install pyarrow"):
        tool.prepare(src, tmp_path / "o.jsonl")


def test_parquet_round_trip(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "test-00000.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), src)
    out = tmp_path / "test.jsonl"
    assert tool.prepare(src, out) == 2
    assert [json.loads(x)["reward_model"]["ground_truth"] for x in out.read_text().splitlines()] == ["7", "2000"]


def test_cli_reports_errors_with_exit_2(tmp_path: Path) -> None:
    src = _write_jsonl(tmp_path / "train.jsonl", [{"question": "q"}])
    res = subprocess.run(
        [sys.executable, str(TOOL), "--input", str(src), "--output", str(tmp_path / "o.jsonl")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.strip() == f"error: {src}:1: field 'answer' must be a non-empty string (missing)"


@given(
    reasoning=st.text(st.characters(exclude_characters="#", exclude_categories=["Cs"]), max_size=40),
    value=st.integers(min_value=-(10**9), max_value=10**9),
)
def test_final_answer_survives_any_reasoning_and_thousands_separators(reasoning: str, value: int) -> None:
    # GSM8K writes large numbers with separators, e.g. 1234567 as "1,234,567"
    assert tool.extract_gsm8k_answer(f"{reasoning}\n#### {value:,}") == str(value)
