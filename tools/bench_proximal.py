"""Benchmark the skipped proximal pass: the learner step with it skipped (the default when a step is one optimizer
step) against the same step with the separate no-grad proximal forward forced, side by side on one config.

Usage: ``python tools/bench_proximal.py --config configs/demo_grpo.yaml [--rounds 5] [key=value ...]``

The learner is built from the config exactly as a run builds it (its model, its settings); the batch has
``data.train_batch_size`` groups of ``rollout.n`` responses of ``data.max_response_length`` tokens on the config's
real prompts. Rounds interleave the two variants (the order alternates each round), so drift on a shared machine
hits both alike; the ratio is forced / skipped step time (how much slower the step is with the pass), with the
spread of the per-round ratios. Single process, nothing downloaded.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl import metric_catalog as mc  # noqa: E402
from async_rl.tuning.bench import BenchLine, emit  # noqa: E402


def build(config: str, overrides: list[str], workdir: Path) -> tuple[Any, list[Any], dict[int, list[int]]]:
    """The config's learner (single process), a batch of synthetic groups on its real prompts, and those prompts."""
    from transformers import AutoTokenizer

    from async_rl.config import load_config
    from async_rl.config.resolve import learner_start
    from async_rl.learner import Learner, local_context
    from async_rl.learner.batching import local_group
    from async_rl.runtime import resources
    from async_rl.transport.protocol import make_completion

    cfg = load_config([config], overrides)
    model_path = resources.resolve_model_path(cfg.actor_rollout_ref.model.path, workdir)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    records = resources.prompt_records(cfg, tokenizer)
    start = learner_start(cfg, pad_token_id=int(tokenizer.pad_token_id or 0), total_training_steps=1000)
    learner = Learner(cfg, start, local_context(), model_path)
    rng = random.Random(0)
    vocab = int(learner.vocab_size or 64)
    length, n = cfg.data.max_response_length, cfg.actor_rollout_ref.rollout.n
    groups, prompts = [], {}
    for g in range(cfg.data.train_batch_size):
        prompts[g] = [int(t) for t in records[g % len(records)].token_ids]
        completions = [
            make_completion(
                [rng.randrange(3, vocab) for _ in range(length)], [-1.0] * length, version_min=0, reward=rng.random()
            )
            for _ in range(n)
        ]
        groups.append(local_group(g, completions))
    return learner, groups, prompts


def timed_step(learner: Any, groups: list[Any], prompts: dict[int, list[int]], *, force_proximal: bool) -> float:
    reuses = type(learner)._reuses_proximal
    if force_proximal:  # what the step did before the skip: always the separate proximal forward
        learner._reuses_proximal = lambda batch_size: False
    try:
        t0 = time.perf_counter()
        metrics = learner.train_step(groups, prompts)
        elapsed = time.perf_counter() - t0
    finally:
        learner._reuses_proximal = reuses.__get__(learner)
    skipped = metrics[mc.LEARNER_ACTOR_PROXIMAL_PASS_SKIPPED]
    assert skipped == (0.0 if force_proximal else 1.0), f"the proximal pass was not as asked: skipped={skipped}"
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--rounds", type=int, default=5, help="timed rounds, each one step of each variant")
    p.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        learner, groups, prompts = build(args.config, args.overrides, Path(tmp))
        if not learner._reuses_proximal(sum(len(g.completions) for g in groups)):
            raise SystemExit(f"{args.config}: the step is not one optimizer step, so nothing is skipped to measure")
        timed_step(learner, groups, prompts, force_proximal=False)  # warm-up, both paths
        timed_step(learner, groups, prompts, force_proximal=True)
        skip_s, force_s = [], []
        for r in range(args.rounds):
            for force in (False, True) if r % 2 == 0 else (True, False):
                (force_s if force else skip_s).append(timed_step(learner, groups, prompts, force_proximal=force))
            print(f"round {r + 1}: skipped {skip_s[-1]:.3f} s, forced {force_s[-1]:.3f} s", flush=True)
    ratios = [f / s for f, s in zip(force_s, skip_s, strict=True)]
    skip, force = statistics.median(skip_s), statistics.median(force_s)
    detail = (
        f"step {skip:.3f} s skipped vs {force:.3f} s with the proximal pass (median of {args.rounds}); "
        f"per-round ratio {min(ratios):.2f}-{max(ratios):.2f}; compute saved {1 - skip / force:.0%}"
    )
    print(detail)
    emit("proximal", [BenchLine("proximal_forced_vs_skipped", force / skip, None, detail)])


if __name__ == "__main__":
    main()
