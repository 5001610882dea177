"""Which samples a rejection-sampling job keeps, and the config rules of the job."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from async_rl.config import load_config, load_config_with_warnings
from async_rl.config.errors import ConfigError
from async_rl.runtime.rejection_sampling import select_samples, write_parquet


def test_samples_at_the_threshold_are_kept_best_k_highest_first_in_sample_order() -> None:
    scores = [0.0, 1.0, 0.5, 1.0, 0.9]
    assert select_samples(scores, threshold=1.0, best_k=None) == [1, 3]
    assert select_samples(scores, threshold=0.5, best_k=None) == [1, 2, 3, 4]
    assert select_samples(scores, threshold=0.5, best_k=2) == [1, 3]  # the two 1.0s
    assert select_samples(scores, threshold=0.5, best_k=3) == [1, 3, 4]  # then 0.9, written in sample order
    assert select_samples(scores, threshold=-1.0, best_k=1) == [1]  # a tie goes to the earlier sample
    assert select_samples(scores, threshold=2.0, best_k=None) == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.n_gpus_per_node=2"], r"runs one learner process .* \(got 2 processes\)"),
        (["actor_rollout_ref.rollout.multi_turn.enable=true"], "multi_turn.enable=true is not supported"),
        (["rejection_sampling.output=kept.csv"], "rejection_sampling.output must be a .jsonl or .parquet file"),
        (
            ["trainer.resume_mode=resume_path", "trainer.resume_from_path=x"],
            "resumes from its own run directory only",
        ),
    ],
)
def test_a_generation_job_refuses_what_it_cannot_do_naming_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["rejection_sampling.enable=true", "trainer.n_gpus_per_node=1", *overrides])


def test_run_length_keys_warn_that_a_generation_job_ignores_them() -> None:
    base = ["rejection_sampling.enable=true", "trainer.n_gpus_per_node=1"]
    _, quiet = load_config_with_warnings(None, base)
    _, warned = load_config_with_warnings(None, [*base, "trainer.total_training_steps=16"])
    assert not [w for w in quiet if "rejection-sampling job" in w]
    assert [w for w in warned if w.startswith("trainer.total_training_steps and trainer.total_epochs are ignored")]


def test_the_parquet_output_holds_the_journal_rows_and_sft_reads_text_and_chat_prompts(tmp_path: Path) -> None:
    from async_rl.config.sft import SFTDataConfig
    from async_rl.data.sft import load_sft_records

    chat = [{"role": "system", "content": "Answer."}, {"role": "user", "content": "What is 2+3?"}]
    rows = [
        {"prompt": chat, "response": "5", "score": 1.0, "prompt_id": 0, "sample": 1, "finish_reason": "stop",
         "ground_truth": "5"},
        {"prompt": chat, "response": "The answer is 5", "score": 0.5, "prompt_id": 0, "sample": 3,
         "finish_reason": "length", "ground_truth": None},
    ]  # fmt: skip
    journal = tmp_path / "rejection_sampling.jsonl"
    journal.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out" / "kept.parquet"
    write_parquet(journal, out)
    assert pq.read_table(out).to_pylist() == rows and not list(out.parent.glob("*.tmp"))
    records = load_sft_records(str(out), SFTDataConfig(), split="train")
    # a chat prompt becomes a conversation whose last message is the kept response
    assert [r.prompt for r in records] == [
        chat + [{"role": "assistant", "content": t}] for t in ("5", "The answer is 5")
    ]

    text = [{"prompt": "2+3=", "response": "5", "score": 1.0}]
    journal.write_text(json.dumps(text[0]) + "\n")
    write_parquet(journal, out)  # replaces the earlier file
    assert pq.read_table(out).to_pylist() == text
    assert [(r.prompt, r.response) for r in load_sft_records(str(out), SFTDataConfig(), split="train")] == [
        ("2+3=", "5")
    ]
