"""The embedded arithmetic task and the jsonl prompt loader."""

from __future__ import annotations

import json

import pytest

from async_rl.data import load_prompt_records, make_arith_problems


def test_arith_problems_are_correct_seeded_and_split():
    train = make_arith_problems(200, seed=1, digits=2, ops="+-*")
    assert train == make_arith_problems(200, seed=1, digits=2, ops="+-*")
    assert train != make_arith_problems(200, seed=2, digits=2, ops="+-*")
    for rec in train:
        lhs = rec["prompt"].rstrip("=")
        assert rec["prompt"].endswith("=")
        assert str(eval(lhs)) == rec["ground_truth"]  # noqa: S307 - test oracle on generated digits
        assert int(rec["ground_truth"]) >= 0
    held_out = make_arith_problems(50, seed=1, digits=2, ops="+-*", split="eval")
    assert not {r["prompt"] for r in held_out} & {r["prompt"] for r in train}


@pytest.mark.parametrize(
    ("kwargs", "key"), [({"digits": 0}, "digits"), ({"ops": "/"}, "ops"), ({"split": "x"}, "split")]
)
def test_arith_bad_arguments(kwargs, key):
    with pytest.raises(ValueError, match=key):
        make_arith_problems(3, seed=0, **kwargs)


def test_jsonl_loader(tmp_path):
    path = tmp_path / "train.jsonl"
    rows = [
        {"prompt": "q1", "reward_model": {"ground_truth": "7"}, "data_source": "gsm8k"},
        {"prompt": [{"role": "user", "content": "q2"}], "ground_truth": "8"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    records = load_prompt_records(path, "prompt")
    assert records[0] == {"prompt": "q1", "ground_truth": "7", "extra": {"data_source": "gsm8k"}}
    assert records[1]["ground_truth"] == "8" and records[1]["prompt"][0]["content"] == "q2"
    path.write_text('{"question": "q"}\n')
    with pytest.raises(ValueError, match="data.prompt_key"):
        load_prompt_records(path, "prompt")
    with pytest.raises(ValueError, match="not found"):
        load_prompt_records(tmp_path / "missing.jsonl", "prompt")


def test_parquet_loader_reads_verl_layout(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": "Natalia sold clips... #### after"}],
            "reward_model": {"ground_truth": "72", "style": "rule"},
            "extra_info": {"index": 0, "split": "train"},
        }
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    records = load_prompt_records(path, "prompt")
    assert records[0]["ground_truth"] == "72"
    assert records[0]["prompt"][0]["role"] == "user"
    assert records[0]["extra"]["data_source"] == "openai/gsm8k"
    with pytest.raises(ValueError, match="row 0: record has no key 'question'"):
        load_prompt_records(path, prompt_key="question")


def test_chat_arithmetic_asks_the_same_held_out_problems_as_messages() -> None:
    from async_rl.data import make_arith_problems, make_chat_arith_problems

    plain = make_arith_problems(50, seed=3, split="eval")
    chat = make_chat_arith_problems(50, seed=3, split="eval")
    assert [r["ground_truth"] for r in chat] == [r["ground_truth"] for r in plain]
    a, b = plain[0]["prompt"].rstrip("=").split("+")
    assert chat[0]["prompt"] == [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}]
