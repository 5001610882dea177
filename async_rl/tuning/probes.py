"""Measurement probes on the real pieces, each run as its own process by :mod:`async_rl.tuning.profile`.

    python -m async_rl.tuning.probes generation --params '{"config": [...], "overrides": [...], ...}' --out g.json
    torchrun --standalone --nproc_per_node 2 -m async_rl.tuning.probes learner --params '{...}' --out l.json

* ``generation``: the actor's :class:`GenerationEngine` (vLLM, the config's engine settings and sampling) keeps
  ``c`` prompt groups in flight for a few seconds at each concurrency level (closed loop, real prompts from the
  config's data) and reports generated tokens/s and the response lengths it saw;
* ``learner``: every torchrun rank builds the config's :class:`Learner` and times ``share_batch`` + ``train_batch``
  on synthetic groups shaped like the workload (real prompt lengths, measured response lengths) at one or more
  batch sizes; rank 0 reports the median step time per size.

A separate process per probe keeps vLLM's helper processes and the process group out of the tuner itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

CONTENDED_STEPS = 3
"""Learner steps timed beside generation: the last may run past generation's end, so the median is of the others."""
CONTEND_CAP_S = 900.0
"""Longest the contended generation level waits for those steps (a real model's step takes tens of seconds)."""


def _signal(params: dict[str, Any], name: str) -> None:
    """Leave a marker file for the other probe (the probes meet at markers so measurements never overlap)."""
    (Path(params["marks"]) / name).touch()


def _seen(params: dict[str, Any], name: str) -> bool:
    return (Path(params["marks"]) / name).exists()


def _await(params: dict[str, Any], name: str, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not _seen(params, name):
        if time.monotonic() > deadline:
            raise TimeoutError(f"probe marker {name!r} did not appear within {timeout_s:.0f} s")
        time.sleep(0.05)


def _config(params: dict[str, Any]) -> Any:
    from async_rl.config import load_config

    return load_config(list(params["config"]), list(params.get("overrides", [])))


def _model_and_records(cfg: Any, workdir: Path) -> tuple[str, list[Any]]:
    from transformers import AutoTokenizer

    from async_rl.runtime import resources

    workdir.mkdir(parents=True, exist_ok=True)
    model_path = resources.resolve_model_path(cfg.actor_rollout_ref.model.path, workdir)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return model_path, resources.prompt_records(cfg, tokenizer)


# ---------------------------------------------------------------------------------------------------------------------
# Generation


async def _generation(params: dict[str, Any]) -> dict[str, Any]:
    from async_rl.runtime.actor_main import build_engine
    from async_rl.transport.protocol import GroupSampling

    cfg = _config(params)
    model_path, records = _model_and_records(cfg, Path(params["workdir"]))
    sampling = GroupSampling.from_config(cfg, seed=None)
    engine = build_engine(cfg, model_path)
    await engine.start()
    paired = bool(params.get("contend_groups"))
    if paired:  # wait until the learner probe has started up too: its start-up must not overlap a measurement
        _signal(params, "gen_up")
        _await(params, "learner_up")
    cursor = 0

    def next_prompt() -> list[int]:
        nonlocal cursor
        cursor += 1
        return [int(t) for t in records[cursor % len(records)].token_ids]

    async def run_level(groups: int, seconds: float, until: str | None = None) -> tuple[int, float, list[int]]:
        """Keep ``groups`` in flight for ``seconds``, and past that until marker ``until`` appears (at most
        ``CONTEND_CAP_S``): a real model's learner step can outlast the planned seconds."""
        start = time.perf_counter()
        deadline = start + seconds
        lengths: list[int] = []

        def going() -> bool:
            now = time.perf_counter()
            if now < deadline:
                return True
            return until is not None and not _seen(params, until) and now < start + CONTEND_CAP_S

        async def worker() -> None:
            while going():
                for c in await engine.generate(next_prompt(), sampling):
                    lengths.append(len(c.token_ids))

        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(groups)])
        return sum(lengths), time.perf_counter() - t0, lengths

    try:
        await run_level(max(params["levels"]), 2.0)  # warm-up: first-request compilation, allocator growth
        levels, rates, all_lengths = [], [], []
        for groups in params["levels"]:
            tokens, elapsed, lengths = await run_level(groups, float(params["seconds"]))
            levels.append(groups * sampling.n)
            rates.append(tokens / elapsed)
            all_lengths.extend(lengths)
            print(f"generation: {groups} groups x {sampling.n} in flight: {rates[-1]:.0f} tokens/s", flush=True)
        contended = None
        if paired:
            _signal(params, "gen_alone_done")
            _await(params, "learner_alone_done")
            await asyncio.sleep(1.0)  # let the learner's first contended step start
            _signal(params, "gen_started")
            tokens, elapsed, _ = await run_level(
                int(params["contend_groups"]), float(params["contend_seconds"]), until="learner_contended_enough"
            )
            _signal(params, "gen_done")
            contended = tokens / elapsed
            print(f"generation while the learner trains: {contended:.0f} tokens/s", flush=True)
    finally:
        await engine.shutdown()
    prompt_lens = [len(rec.token_ids) for rec in records[:2000]]
    return {
        "sequences_in_flight": levels,
        "tokens_per_s": rates,
        "response_lengths": all_lengths[:4096],
        "prompt_len_mean": statistics.fmean(prompt_lens),
        "contended_tokens_per_s": contended,
    }


# ---------------------------------------------------------------------------------------------------------------------
# Learner


def _synthetic_groups(
    records: list[Any], lengths: list[int], num: int, n: int, vocab: int, seed: int
) -> tuple[list[Any], dict[int, list[int]]]:
    """``num`` groups of ``n`` random completions and their prompts (drawn from ``records``) by prompt id."""
    from async_rl.learner.batching import local_group
    from async_rl.transport.protocol import make_completion

    rng = random.Random(seed)
    groups, prompts = [], {}
    for g in range(num):
        prompts[g] = [int(t) for t in records[rng.randrange(len(records))].token_ids]
        completions = []
        for _ in range(n):
            length = max(1, rng.choice(lengths))
            tokens = [rng.randrange(3, vocab) for _ in range(length)]
            completions.append(make_completion(tokens, [-1.0] * length, version_min=0, reward=rng.random()))
        groups.append(local_group(g, completions))
    return groups, prompts


def _shared_step(ctx: Any, learner: Any, groups: list[Any], prompts: dict[int, list[int]]) -> None:
    """One step as a training run takes it: rank 0 collates, the ranks get the tensors, every rank trains."""
    from async_rl.learner.dist import share_batch

    rank0 = ctx.is_rank0
    batch, ids = share_batch(
        ctx, learner.collate(groups, prompts) if rank0 else None, [g.prompt_id for g in groups] if rank0 else None
    )
    learner.train_batch(batch, ids)


def _learner(params: dict[str, Any]) -> dict[str, Any] | None:
    import torch

    from async_rl.config.resolve import learner_start
    from async_rl.learner import init_distributed, teardown
    from async_rl.learner.step import Learner

    cfg = _config(params)
    ctx = init_distributed(backend="auto", timeout_s=cfg.async_training.timeouts.collective_s)
    workdir = Path(params["workdir"])
    if ctx.rank == 0:
        _model_and_records(cfg, workdir)
    ctx.barrier()
    model_path, records = _model_and_records(cfg, workdir)
    # synthetic groups: pad id 0 (the probe's token ids are drawn from the vocabulary, never padded by a tokenizer)
    learner = Learner(cfg, learner_start(cfg, pad_token_id=0, total_training_steps=None), ctx, model_path)
    vocab = int(getattr(learner.model.config, "vocab_size", 64))
    paired = bool(params.get("contend"))
    if paired:  # measure alone only after the generation probe has measured alone
        ctx.barrier()
        if ctx.is_rank0:
            _signal(params, "learner_up")
            _await(params, "gen_alone_done")
        ctx.barrier()
    n = cfg.actor_rollout_ref.rollout.n
    actor_cfg = cfg.actor_rollout_ref.actor  # the learner reads this section: set per batch size below
    minis_per_step = max(1, cfg.data.train_batch_size // actor_cfg.ppo_mini_batch_size)
    results = []
    for size in params["batch_sizes"]:
        mini = size // minis_per_step if size % minis_per_step == 0 else size
        actor_cfg.ppo_mini_batch_size = mini
        groups, prompts = _synthetic_groups(records, params["response_lengths"], size, n, vocab, seed=size)
        tokens = sum(len(prompts[g.prompt_id]) + c.token_ids.length for g in groups for c in g.completions)
        times = []
        for rep in range(params["steps"] + 1):
            t0 = time.perf_counter()
            _shared_step(ctx, learner, groups, prompts)
            if rep:  # the first step of each size is a warm-up
                times.append(time.perf_counter() - t0)
        results.append({"groups": size, "tokens": tokens, "step_s": statistics.median(times), "all_s": times})
        if ctx.is_rank0:
            print(f"learner: world {ctx.world_size}, {size} groups ({tokens} tokens): {results[-1]['step_s']:.3f} s")
    contended: list[float] = []
    if paired:  # keep training the full batch while the generation probe runs beside it
        if ctx.is_rank0:
            _signal(params, "learner_alone_done")
        while True:
            flag = None
            if ctx.is_rank0:
                flag = b"stop" if _seen(params, "gen_done") else b"time" if _seen(params, "gen_started") else b"warm"
            flag = ctx.broadcast_bytes(flag)
            if flag == b"stop":
                break
            t0 = time.perf_counter()
            _shared_step(ctx, learner, groups, prompts)
            if flag == b"time":
                contended.append(time.perf_counter() - t0)
                if len(contended) == CONTENDED_STEPS and ctx.is_rank0:
                    _signal(params, "learner_contended_enough")  # generation may stop once its seconds are up
        if ctx.is_rank0:
            if contended:
                median = statistics.median(contended)
                print(f"learner while generation runs: {len(contended)} steps, median {median:.3f} s")
            else:
                print("learner while generation runs: no step fitted in the generation probe's time")
    teardown(ctx)
    del torch
    if ctx.rank != 0:
        return None
    out: dict[str, Any] = {"world_size": ctx.world_size, "points": results}
    if len(contended) > 2:
        out["contended_step_s"] = statistics.median(contended[:-1])  # the last one may run past generation's end
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("probe", choices=["generation", "learner"])
    p.add_argument("--params", required=True, help="JSON object of probe parameters")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    params = json.loads(args.params)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    result = asyncio.run(_generation(params)) if args.probe == "generation" else _learner(params)
    if result is not None:
        Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
