"""The Qwen GSM8K configs' data path on a small generated GSM8K parquet file in verl's layout: chat prompts come out
as the chat-templated token ids with their ground truth, over-long prompts are filtered, and the run length is
derived from what is left (trainer.total_epochs, no trainer.total_training_steps)."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import pytest

from async_rl.config import load_config
from async_rl.models.tiny import DEFAULT_CHARSET, build_char_tokenizer
from async_rl.runtime import resources
from async_rl.runtime.dry_run import dry_run_report
from async_rl.runtime.run_length import derive_run_length

pq = pytest.importorskip("pyarrow.parquet")
pa = pytest.importorskip("pyarrow")

ROOT = Path(__file__).resolve().parents[2]
GRPO = str(ROOT / "configs" / "qwen2.5-0.5b_gsm8k_grpo.yaml")
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'  # tools/prepare_data.py's
# A chat template in the Jinja dialect transformers renders; each message becomes "<role>: <content>\n".
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
TRAIN, BATCH, MAX_PROMPT = 11, 4, 200


def _row(i: int, split: str, filler: str = "") -> dict[str, Any]:
    question = f"Tom has {i} apples and buys {i + 3} more.{filler} How many apples does Tom have?"
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(2 * i + 3)},
        "extra_info": {"index": i, "split": split},
    }


def _write(path: Path, rows: list[dict[str, Any]]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


@pytest.fixture
def gsm8k(tmp_path: Path) -> tuple[list[str], Any]:
    """Overrides pointing the GRPO config at a generated train/test parquet pair (train row 5 is over-long), and a
    tokenizer with a chat template that the prompts' characters fit (the tiny model's char tokenizer, widened to
    printable ASCII)."""
    train = [_row(i, "train", filler=" x" * 100 if i == 5 else "") for i in range(TRAIN)]
    test = [_row(100 + i, "test") for i in range(3)]
    charset = DEFAULT_CHARSET + "".join(c for c in string.printable if c not in DEFAULT_CHARSET and c.isprintable())
    tokenizer = build_char_tokenizer(charset)
    tokenizer.chat_template = CHAT_TEMPLATE
    overrides = [
        f"data.train_files={_write(tmp_path / 'train.parquet', train)}",
        f"data.val_files={_write(tmp_path / 'test.parquet', test)}",
        f"data.train_batch_size={BATCH}",
        f"data.max_prompt_length={MAX_PROMPT}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    ]
    return overrides, tokenizer


def test_prompt_records_are_chat_templated_token_ids_with_the_ground_truth(gsm8k: tuple[list[str], Any]) -> None:
    overrides, tokenizer = gsm8k
    cfg = load_config([GRPO], overrides)
    records = resources.prompt_records(cfg, tokenizer)
    kept = [i for i in range(TRAIN) if i != 5]  # row 5 is longer than data.max_prompt_length: filtered
    assert len(records) == len(kept)
    for rec, i in zip(records, kept, strict=True):
        content = _row(i, "train")["prompt"][0]["content"]
        rendered = f"user: {content}\nassistant: "  # the template, applied by hand
        expected = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        assert rec.token_ids.tolist() == expected
        assert tokenizer.decode(rec.token_ids.tolist()) == rendered
        assert rec.extras["ground_truth"] == str(2 * i + 3)
        assert rec.extras["extra"]["data_source"] == "openai/gsm8k"
        assert rec.extras["extra"]["extra_info"] == {"index": i, "split": "train"}
    val = resources.load_raw_records(cfg.data.val_files, cfg.data.prompt_key, "test", cfg.data.seed)
    assert [r["ground_truth"] for r in val] == ["203", "205", "207"]


def test_run_length_is_derived_from_the_filtered_train_set(gsm8k: tuple[list[str], Any], tmp_path: Path) -> None:
    overrides, tokenizer = gsm8k
    cfg = load_config([GRPO], overrides)
    assert (cfg.trainer.total_epochs, cfg.trainer.total_training_steps) == (15, None)
    records = resources.prompt_records(cfg, tokenizer)
    length = derive_run_length(cfg, len(records))
    assert length.steps == 10 // BATCH * 15 == 30
    assert "total_training_steps = 10 // 4 * 15 = 30" in length.how
    # The dry-run reports the same count when the data and the policy's tokenizer are on this machine ...
    policy = tmp_path / "policy"
    tokenizer.save_pretrained(policy)
    local = load_config([GRPO], [*overrides, f"actor_rollout_ref.model.path={policy}"])
    run = dry_run_report(local)["run_length"]
    assert (run["total_training_steps"], run["train_prompts"], run["note"]) == (30, 10, None)
    # ... and an upper bound, saying so, when only the data is (the hub tokenizer is not here to filter with).
    run = dry_run_report(cfg)["run_length"]
    assert (run["total_training_steps"], run["train_prompts"]) == (11 // BATCH * 15, 11)
    assert "before data.filter_overlong_prompts" in run["note"]
