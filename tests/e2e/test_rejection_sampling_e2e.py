"""A rejection-sampling job end to end on the tiny model (launchers/local.py, a real vLLM actor, ZeroMQ, the reward):
every prompt is generated exactly once, also when the job is SIGKILLed mid-run and run again; the kept rows follow
the threshold and best_k, carry the reward's score, and are SFT data as they are."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from _e2e_helpers import ROOT, kill_job, read_jsonl

PROMPTS = 24
N = 6  # smoke_grpo.yaml's rollout.n


def _command(run_dir: Path, data: Path, *overrides: str) -> list[str]:
    return [
        sys.executable, str(ROOT / "launchers" / "local.py"), "--config", str(ROOT / "configs" / "smoke_grpo.yaml"),
        "--nproc-per-node", "1", "--actors", "1", "--run-dir", str(run_dir),
        f"trainer.default_local_dir={run_dir}", "trainer.logger=['jsonl']", "trainer.n_gpus_per_node=1",
        "rejection_sampling.enable=true", f"data.train_files={data}", "data.train_batch_size=4", "data.shuffle=false",
        "async_training.checkpoint.save_every_n_steps=1", *overrides,
    ]  # fmt: skip


def _data(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": f"{a}+{a % 7}=", "ground_truth": str(a + a % 7)} for a in range(10, 10 + PROMPTS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


BEST_K = 5


@pytest.mark.slow
def test_every_prompt_once_across_a_kill_and_a_rerun_into_parquet_rows_sft_reads(tmp_path: Path, e2e_processes) -> None:
    """``threshold=0`` keeps every sample (scores are 0 or 1) and ``best_k=5`` caps each prompt at 5 of its 6: every
    prompt must end with exactly 5 rows (fewer only by samples that stopped at once), whatever the kill cut."""
    import pyarrow.parquet as pq

    from async_rl.config.sft import SFTDataConfig
    from async_rl.data.sft import load_sft_records

    run_dir, data = tmp_path / "run", _data(tmp_path)
    journal, out = run_dir / "rejection_sampling.jsonl", tmp_path / "kept" / "rows.parquet"
    slow = f"custom_reward_function.path={Path(__file__).with_name('_slow_reward.py')}"  # ~0.3 s a group
    kept = (
        "rejection_sampling.threshold=0.0",
        f"rejection_sampling.best_k={BEST_K}",
        f"rejection_sampling.output={out}",
    )
    cmd = _command(run_dir, data, *kept, slow)
    job = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while len(read_jsonl(run_dir / "metrics.jsonl")) < 2:  # two batches written (and checkpointed)
            assert job.poll() is None, "the job ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        kill_job(job)
    assert e2e_processes.wait_gone(20.0) == {}
    written_before = len(read_jsonl(journal))
    assert 8 * (BEST_K - 1) <= written_before < BEST_K * PROMPTS
    assert not out.exists()  # the parquet file is written when the job ends, from the journal
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = pq.read_table(out).to_pylist()
    assert rows == read_jsonl(journal)  # the same rows and columns, in order
    lines = read_jsonl(run_dir / "metrics.jsonl")
    empty = int(lines[-1]["rs/empty_total"])  # a kept sample that stopped at once is left out (rarely any)
    per_prompt = Counter(r["prompt_id"] for r in rows)
    assert len(rows) + empty == BEST_K * PROMPTS and lines[-1]["rs/kept_total"] == len(rows)
    assert len({(r["prompt_id"], r["sample"]) for r in rows}) == len(rows)  # no sample written twice
    assert set(per_prompt) <= set(range(PROMPTS)) and max(per_prompt.values()) == BEST_K  # no prompt twice
    assert len(per_prompt) >= PROMPTS - empty  # none lost
    source = [json.loads(line) for line in data.read_text().splitlines()]
    for r in rows:  # unshuffled: a prompt's id is its row in the file
        assert (r["prompt"], r["ground_truth"]) == (
            source[r["prompt_id"]]["prompt"],
            source[r["prompt_id"]]["ground_truth"],
        )
        assert r["score"] in (0.0, 1.0) and r["finish_reason"] in ("stop", "length")  # an exact-match reward
        assert r["response"]
    log = (run_dir / "logs" / "learner.log").read_text()
    assert "resumed after" in log and f"rejection sampling done: {len(rows)} of {N * PROMPTS} samples kept" in log
    records = load_sft_records(str(out), SFTDataConfig(), split="train")  # SFT reads the rows as they are
    assert len(records) == len(rows) and (records[0].prompt, records[0].response) == (
        rows[0]["prompt"],
        rows[0]["response"],
    )
