"""The learner's start-up: rank 0 loads the prompts and derives the run length, every rank of a real 2-process gloo
group gets the same step count, and bad data fails on every rank (none is left waiting for a broadcast)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
from pathlib import Path
from typing import Any

from async_rl.config import load_config
from async_rl.learner.dist import init_distributed, local_context, teardown
from async_rl.models.tiny import build_char_tokenizer
from async_rl.runtime.trainer import load_prompts

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "configs" / "demo_grpo.yaml")
BY_EPOCHS = ["trainer.total_training_steps=null", "trainer.total_epochs=2"]  # builtin:arith, 20000 prompts


def _rank_main(rank: int, port: int, cases: list[list[str]], out: Any) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    ctx = init_distributed(backend="gloo", timeout_s=120.0)
    results: list[Any] = []
    for overrides in cases:
        try:
            records, steps = load_prompts(load_config([DEMO], overrides), ctx, build_char_tokenizer())
            results.append({"records": None if records is None else len(records), "steps": steps})
        except ValueError as exc:
            results.append({"error": str(exc)})
    teardown(ctx)
    out.put((rank, results))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _too_few(tmp_path: Path) -> list[str]:
    path = tmp_path / "three.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "ground_truth": str(i + 1)}) + "\n" for i in range(3)))
    return [*BY_EPOCHS, f"data.train_files={path}"]


def test_single_process_derives_the_run_length() -> None:
    records, steps = load_prompts(load_config([DEMO], BY_EPOCHS), local_context(), build_char_tokenizer())
    assert records is not None and len(records) == 20000
    assert steps == 20000 // 64 * 2 == 624


def test_every_rank_gets_the_step_count_and_every_rank_sees_bad_data(tmp_path: Path) -> None:
    cases = [BY_EPOCHS, _too_few(tmp_path)]
    spawn = mp.get_context("spawn")
    out = spawn.Queue()
    port = _free_port()
    procs = [spawn.Process(target=_rank_main, args=(rank, port, cases, out)) for rank in range(2)]
    for p in procs:
        p.start()
    try:
        results = dict(out.get(timeout=240) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert results[0][0] == {"records": 20000, "steps": 624}
    assert results[1][0] == {"records": None, "steps": 624}  # only rank 0 holds the records (for the coordinator)
    error = "data.train_batch_size=64 is larger than the 3 training prompts"
    assert error in results[0][1]["error"] and results[1][1]["error"] == results[0][1]["error"]
